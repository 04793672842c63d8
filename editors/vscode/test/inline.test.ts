import './setup';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { beforeEach, test } from 'node:test';
import * as vscode from 'vscode';
import { Draft } from '../src/drafts';
import { ACCEPTED_COMMAND, HIDE_INLINE_SUGGEST, InlineCompletions, ProvideInlineCompletions, SHOWN_CONTEXT, TRIGGER_INLINE_SUGGEST } from '../src/inline';
import * as mock from './vscode-mock';

const URI = 'file:///work/a.py';
const EXTENSION_ID = 'llada-lsp.llada-lsp';
const document = new mock.TextDocument(mock.Uri.parse(URI), 'def f(x):\n    ', 3) as unknown as vscode.TextDocument;
const cursor = new mock.Position(1, 4) as vscode.Position;
const context = { triggerKind: 1, selectedCompletionInfo: undefined } as vscode.InlineCompletionContext;

interface Sent {
    token: vscode.CancellationToken;
    answer(items: vscode.InlineCompletionItem[] | null): void;
    /** An error response, as the language client passes it on. */
    fail(error: Error): void;
}

/** A server stand-in: records each request and lets the test answer it. */
function server(): { next: ProvideInlineCompletions; sent: Sent[] } {
    const sent: Sent[] = [];
    const next: ProvideInlineCompletions = (_document, _position, _context, token) =>
        new Promise((resolve, reject) => sent.push({ token, answer: resolve, fail: reject }));
    return { next, sent };
}

function draft(overrides: Partial<Draft> = {}): Draft {
    return {
        uri: URI, version: 3, requestId: 1, step: 1, final: false,
        range: { start: { line: 1, character: 4 }, end: { line: 1, character: 4 } }, text: 'ret', ...overrides,
    };
}

function editor(version = 3, position = cursor): vscode.TextEditor {
    const doc = new mock.TextDocument(mock.Uri.parse(URI), 'def f(x):\n    ', version);
    return { document: doc, selection: new mock.Selection(position, position) } as unknown as vscode.TextEditor;
}

function inlineCompletions(now = () => 0) {
    const events: string[] = [];
    const inline = new InlineCompletions(
        { started: () => events.push('started'), settled: (ms) => events.push(`settled ${ms}`) },
        (uri) => uri.toString(),
        EXTENSION_ID,
        now,
    );
    return { inline, events };
}

function texts(result: unknown): string[] {
    const items = (Array.isArray(result) ? result : (result as { items: vscode.InlineCompletionItem[] }).items);
    return items.map((item) => item.insertText as string);
}

function items(result: unknown): vscode.InlineCompletionItem[] {
    return Array.isArray(result) ? result : (result as { items: vscode.InlineCompletionItem[] }).items;
}

const triggers = () => mock.recorded.commands.filter((c) => c.command === TRIGGER_INLINE_SUGGEST).length;
const shownContext = () => mock.recorded.commands.filter((c) => c.command === 'setContext' && c.args[0] === SHOWN_CONTEXT).map((c) => c.args[1]);
const call = () => new mock.CancellationTokenSource().token as vscode.CancellationToken;
const atCursor = (item: vscode.InlineCompletionItem) =>
    item.range !== undefined && item.range.isEmpty && item.range.start.line === cursor.line && item.range.start.character === cursor.character;

beforeEach(() => mock.reset());

test('a draft for the active editor at its version and cursor re-triggers the suggestion', () => {
    const { inline } = inlineCompletions();
    void inline.provide(document, cursor, context, call(), server().next);
    assert.equal(inline.receive(draft(), editor()), true);
    assert.equal(triggers(), 1);
});

test('each draft shows through a provider registered anew, which VS Code asks again instead of keeping the old text', async () => {
    // VS Code keeps a suggestion on screen through an explicit trigger, and answers an automatic one
    // from its cache unless a provider it did not ask last time is named: the provider is registered
    // anew for each draft, and the trigger names this extension's providers and is not explicit.
    const { next, sent } = server();
    const { inline } = inlineCompletions();
    void inline.provide(document, cursor, context, call(), next);
    inline.receive(draft({ step: 1, text: 'ret' }), editor());
    const triggered = mock.recorded.commands.filter((c) => c.command === TRIGGER_INLINE_SUGGEST);
    assert.deepEqual(triggered.map((c) => c.args), [[{ providerId: EXTENSION_ID, explicit: false }]]);
    assert.equal(mock.recorded.inlineProviders.length, 1);
    const first = mock.recorded.inlineProviders[0];
    assert.deepEqual(texts(await first.provideInlineCompletionItems(document, cursor, context, call())), ['ret']);

    inline.receive(draft({ step: 2, text: 'return x' }), editor());
    assert.equal(mock.recorded.inlineProviders.length, 1, 'the previous registration is disposed');
    assert.notEqual(mock.recorded.inlineProviders[0], first);
    assert.deepEqual(texts(await mock.recorded.inlineProviders[0].provideInlineCompletionItems(document, cursor, context, call())), ['return x']);
    assert.equal(sent.length, 1, 'the registered provider serves the request in flight, and sends none');

    inline.dispose();
    assert.equal(mock.recorded.inlineProviders.length, 0);
});

test('a draft that shows what is on screen already triggers nothing (no refetch, no flicker)', async () => {
    const { next, sent } = server();
    const { inline } = inlineCompletions();
    void inline.provide(document, cursor, context, call(), next);
    inline.receive(draft({ step: 1, text: 'return x' }), editor());
    assert.deepEqual(texts(await inline.provide(document, cursor, context, call(), next)), ['return x']);
    assert.equal(inline.receive(draft({ step: 2, final: true, text: 'return x' }), editor()), false);
    assert.equal(triggers(), 1);
    sent[0].answer([new mock.InlineCompletionItem('return x') as vscode.InlineCompletionItem]);
});

test('drafts for a stale version, another document, another cursor or no editor are ignored', () => {
    const { inline } = inlineCompletions();
    assert.equal(inline.receive(draft({ version: 2 }), editor()), false);
    assert.equal(inline.receive(draft({ uri: 'file:///work/b.py' }), editor()), false);
    assert.equal(inline.receive(draft(), editor(3, new mock.Position(0, 0) as vscode.Position)), false);
    assert.equal(inline.receive(draft(), undefined), false);
    assert.equal(triggers(), 0);
});

test('while a request is in flight, re-triggered calls get the latest draft and send nothing', async () => {
    const { next, sent } = server();
    const { inline } = inlineCompletions();
    const first = new mock.CancellationTokenSource();
    const waiting = inline.provide(document, cursor, context, first.token as vscode.CancellationToken, next);
    assert.equal(sent.length, 1);

    inline.receive(draft({ step: 1, text: 'ret' }), editor());
    first.cancel(); // what VS Code does to the previous call when the trigger asks again
    assert.equal(await waiting, undefined);
    assert.equal(sent[0].token.isCancellationRequested, false, 'the request outlives the call that started it');
    assert.deepEqual(texts(await inline.provide(document, cursor, context, new mock.CancellationTokenSource().token, next)), ['ret']);

    inline.receive(draft({ step: 2, text: 'return x' }), editor());
    assert.deepEqual(texts(await inline.provide(document, cursor, context, new mock.CancellationTokenSource().token, next)), ['return x']);
    assert.equal(sent.length, 1);
});

test('the answer is served once it lands, and its latency is reported', async () => {
    const { next, sent } = server();
    let clock = 1000;
    const { inline, events } = inlineCompletions(() => clock);
    const waiting = inline.provide(document, cursor, context, new mock.CancellationTokenSource().token, next);
    clock = 1250;
    sent[0].answer([new mock.InlineCompletionItem('return x + 1') as vscode.InlineCompletionItem]);
    assert.deepEqual(texts(await waiting), ['return x + 1']);
    assert.deepEqual(texts(await inline.provide(document, cursor, context, new mock.CancellationTokenSource().token, next)), ['return x + 1']);
    assert.equal(sent.length, 1);
    assert.deepEqual(events, ['started', 'settled 250']);
});

test('the answer replaces the drafts once it lands', async () => {
    const { next, sent } = server();
    const { inline } = inlineCompletions();
    void inline.provide(document, cursor, context, new mock.CancellationTokenSource().token, next);
    inline.receive(draft({ step: 1, text: 'ret' }), editor());
    sent[0].answer([new mock.InlineCompletionItem('return x') as vscode.InlineCompletionItem]);
    await new Promise(setImmediate);
    assert.deepEqual(texts(await inline.provide(document, cursor, context, new mock.CancellationTokenSource().token, next)), ['return x']);
});

test('a call at another position cancels the request in flight and sends a new one', async () => {
    const { next, sent } = server();
    const { inline, events } = inlineCompletions();
    void inline.provide(document, cursor, context, new mock.CancellationTokenSource().token, next);
    void inline.provide(document, new mock.Position(1, 3) as vscode.Position, context, new mock.CancellationTokenSource().token, next);
    assert.equal(sent.length, 2);
    assert.equal(sent[0].token.isCancellationRequested, true);
    assert.equal(sent[1].token.isCancellationRequested, false);
    sent[0].answer(null);
    await new Promise(setImmediate);
    assert.deepEqual(events, ['started', 'started', 'settled undefined']);
});

test('moving the cursor away or editing the document cancels the request', () => {
    const { next, sent } = server();
    const { inline } = inlineCompletions();
    void inline.provide(document, cursor, context, new mock.CancellationTokenSource().token, next);
    inline.cursorMoved(URI, cursor);
    assert.equal(sent[0].token.isCancellationRequested, false);
    inline.cursorMoved(URI, new mock.Position(0, 0) as vscode.Position);
    assert.equal(sent[0].token.isCancellationRequested, true);

    void inline.provide(document, cursor, context, new mock.CancellationTokenSource().token, next);
    inline.cancel('file:///work/b.py');
    assert.equal(sent[1].token.isCancellationRequested, false);
    inline.cancel(URI);
    assert.equal(sent[1].token.isCancellationRequested, true);
});

test('a cursor moved off the suggestion shown without an edit takes it off the screen; typing does not', async () => {
    const { next, sent } = server();
    const { inline } = inlineCompletions();
    const waiting = inline.provide(document, cursor, context, call(), next);
    sent[0].answer([new mock.InlineCompletionItem('return x') as vscode.InlineCompletionItem]);
    assert.deepEqual(texts(await waiting), ['return x']);
    const hides = () => mock.recorded.commands.filter((c) => c.command === HIDE_INLINE_SUGGEST).length;
    inline.cursorMoved(URI, cursor, 3);
    assert.equal(hides(), 0, 'the cursor where the suggestion is');
    inline.cursorMoved(URI, new mock.Position(1, 5) as vscode.Position, 4);
    assert.equal(hides(), 0, 'typed: a new version');
    inline.cursorMoved(URI, new mock.Position(1, 0) as vscode.Position, 3);
    assert.equal(hides(), 1, 'moved with no edit');
});

test('an empty answer is not kept: the next call asks again', async () => {
    const { next, sent } = server();
    const { inline } = inlineCompletions();
    const waiting = inline.provide(document, cursor, context, new mock.CancellationTokenSource().token, next);
    sent[0].answer([]);
    assert.equal(await waiting, undefined);
    void inline.provide(document, cursor, context, new mock.CancellationTokenSource().token, next);
    assert.equal(sent.length, 2);
});

test('a draft is served at the cursor as the text it shows, without the whitespace still to be followed', async () => {
    const { next } = server();
    const { inline } = inlineCompletions();
    void inline.provide(document, cursor, context, call(), next);
    inline.receive(draft({ step: 2, text: 'return x\n    ' }), editor());
    const [item] = items(await inline.provide(document, cursor, context, call(), next));
    assert.equal(item.insertText, 'return x');
    assert.ok(atCursor(item), 'the item inserts at the cursor and replaces nothing');
});

test('a draft of whitespace alone is not shown and does not re-trigger: Tab would insert a blank', async () => {
    const { next, sent } = server();
    const { inline } = inlineCompletions();
    const first = new mock.CancellationTokenSource();
    void inline.provide(document, cursor, context, first.token as vscode.CancellationToken, next);
    assert.equal(inline.receive(draft({ step: 1, text: '    ' }), editor()), false);
    assert.equal(inline.receive(draft({ step: 2, text: '\n' }), editor()), false);
    assert.equal(triggers(), 0);
    const waiting = inline.provide(document, cursor, context, call(), next);
    sent[0].answer([new mock.InlineCompletionItem('return x') as vscode.InlineCompletionItem]);
    assert.deepEqual(texts(await waiting), ['return x'], 'the call waits for the answer instead of serving the blank');
});

test('drafts of a completion that ends empty do not start the model again', async () => {
    const { next, sent } = server();
    const { inline } = inlineCompletions();
    void inline.provide(document, cursor, context, call(), next);
    assert.equal(inline.receive(draft({ step: 1, text: '' }), editor()), false);
    assert.equal(inline.receive(draft({ step: 2, final: true, text: '' }), editor()), false);
    sent[0].answer([]);
    await new Promise(setImmediate);
    assert.equal(triggers(), 0, 'a trigger here would ask again, and the new request would trigger again');
    assert.equal(sent.length, 1);
});

test('an empty final draft takes the shown draft off the screen, and the empty answer is not asked again', async () => {
    const { next, sent } = server();
    const { inline } = inlineCompletions();
    void inline.provide(document, cursor, context, call(), next);
    inline.receive(draft({ step: 1, text: 'ret' }), editor());
    assert.deepEqual(texts(await inline.provide(document, cursor, context, call(), next)), ['ret']);
    assert.equal(inline.receive(draft({ step: 2, final: true, text: '' }), editor()), true);
    const hiding = inline.provide(document, cursor, context, call(), next);
    const pending = new Promise((resolve) => setImmediate(() => resolve('still waiting')));
    assert.deepEqual(await Promise.race([hiding, pending]), [], 'an empty list at once, not a wait for the answer');
    sent[0].answer(null);
    await new Promise(setImmediate);
    const again = inline.provide(document, cursor, context, call(), next);
    assert.equal(sent.length, 1, 'the call the final draft triggered does not run the model again');
    assert.deepEqual(await again, []);
});

test('a request that fails takes its shown draft off the screen, and is not asked again at once', async () => {
    const { next, sent } = server();
    const { inline } = inlineCompletions();
    void inline.provide(document, cursor, context, call(), next);
    inline.receive(draft({ step: 1, text: 'ret' }), editor());
    assert.deepEqual(texts(await inline.provide(document, cursor, context, call(), next)), ['ret']);
    const before = triggers();
    sent[0].fail(new Error('the engine service at unix:/tmp/engine.sock is gone'));
    await new Promise(setImmediate);
    assert.equal(triggers(), before + 1, 'VS Code must ask again: no final draft will replace the one on screen');
    assert.deepEqual(await inline.provide(document, cursor, context, call(), next), []);
    assert.equal(sent.length, 1);
    assert.equal(shownContext().at(-1), false);
});

test('a request that fails before any draft showed triggers nothing', async () => {
    const { next, sent } = server();
    const { inline } = inlineCompletions();
    const first = inline.provide(document, cursor, context, call(), next);
    sent[0].fail(new Error('the engine service at unix:/tmp/engine.sock is gone'));
    assert.equal(await first, undefined);
    assert.equal(triggers(), 0);
});

test('accepting a draft cancels the rest of its request, so its answer never shows', async () => {
    const { next, sent } = server();
    const { inline } = inlineCompletions();
    void inline.provide(document, cursor, context, call(), next);
    inline.receive(draft({ step: 1, text: 'ret' }), editor());
    const [item] = items(await inline.provide(document, cursor, context, call(), next));
    assert.equal(item.command?.command, ACCEPTED_COMMAND);
    inline.accepted(...(item.command?.arguments ?? []) as [number]);
    assert.equal(sent[0].token.isCancellationRequested, true);
    sent[0].answer([new mock.InlineCompletionItem('return x') as vscode.InlineCompletionItem]);
    await new Promise(setImmediate);
    const waiting = inline.provide(document, cursor, context, call(), next);
    assert.equal(sent.length, 2, 'the next call asks anew instead of serving the answer of the accepted request');
    sent[1].answer(null);
    assert.equal(await waiting, undefined);
});

test('an accepted item of an older request leaves the newer request alone', async () => {
    const { next, sent } = server();
    const { inline } = inlineCompletions();
    const first = inline.provide(document, cursor, context, call(), next);
    sent[0].answer([new mock.InlineCompletionItem('return x') as vscode.InlineCompletionItem]);
    const [item] = items(await first);
    const after = new mock.Position(1, 12) as vscode.Position; // VS Code asks at the new cursor before it runs the command
    void inline.provide(document, after, context, call(), next);
    inline.accepted(...(item.command?.arguments ?? []) as [number]);
    assert.equal(sent[1].token.isCancellationRequested, false);
});

test('answer items are served only where they insert what they show', async () => {
    const { next, sent } = server();
    const { inline } = inlineCompletions();
    const waiting = inline.provide(document, cursor, context, call(), next);
    const line = (from: number, to: number) => new mock.Range(new mock.Position(1, from), new mock.Position(1, to)) as vscode.Range;
    sent[0].answer([
        new mock.InlineCompletionItem('elsewhere', line(0, 0)),
        new mock.InlineCompletionItem('replacing', line(0, 4)),
        new mock.InlineCompletionItem('  \n'),
        { insertText: { value: 'snippet($1)' } } as unknown as mock.InlineCompletionItem,
        new mock.InlineCompletionItem('no range'),
        new mock.InlineCompletionItem('return x', line(4, 4)),
    ] as vscode.InlineCompletionItem[]);
    const served = items(await waiting);
    assert.deepEqual(served.map((item) => item.insertText), ['no range', 'return x']);
    assert.ok(served.every(atCursor), 'an item without a range would replace the word at the cursor to the end of the line');
});

test('the context key says when an item of ours may be on screen', async () => {
    const { next } = server();
    const { inline } = inlineCompletions();
    void inline.provide(document, cursor, context, call(), next);
    assert.deepEqual(shownContext(), []);
    inline.receive(draft({ step: 1, text: 'ret' }), editor());
    await inline.provide(document, cursor, context, call(), next);
    inline.receive(draft({ step: 2, text: 'return x' }), editor());
    await inline.provide(document, cursor, context, call(), next);
    assert.deepEqual(shownContext(), [true]);
    inline.cancel(URI);
    assert.deepEqual(shownContext(), [true, false]);
});

test('Tab accepts our ghost text even where it starts with indentation, where VS Code would indent', () => {
    const manifest = JSON.parse(readFileSync(join(__dirname, '..', '..', '..', 'package.json'), 'utf8')) as {
        contributes: { keybindings?: { key: string; command: string; when: string }[] };
    };
    const tab = manifest.contributes.keybindings?.find((k) => k.key === 'tab' && k.command === 'editor.action.inlineSuggest.commit');
    assert.ok(tab, 'package.json binds Tab to accepting the inline suggestion');
    const terms = tab.when.split('&&').map((term) => term.trim());
    for (const term of ['inlineSuggestionVisible', SHOWN_CONTEXT, '!suggestWidgetVisible', '!editorTabMovesFocus']) {
        assert.ok(terms.includes(term), `${term} in ${tab.when}`);
    }
    assert.ok(!terms.includes('inlineSuggestionHasIndentationLessThanTabSize'));
});

test('typing through the suggestion serves its rest at once; the revised draft then replaces it', async () => {
    const { next, sent } = server();
    const { inline } = inlineCompletions();
    const waiting = inline.provide(document, cursor, context, call(), next);
    sent[0].answer([new mock.InlineCompletionItem('return x') as vscode.InlineCompletionItem]);
    assert.deepEqual(texts(await waiting), ['return x']);

    const typed = new mock.TextDocument(mock.Uri.parse(URI), 'def f(x):\n    re', 4) as unknown as vscode.TextDocument;
    const after = new mock.Position(1, 6) as vscode.Position;
    const [item] = items(await inline.provide(typed, after, context, call(), next));
    assert.equal(item.insertText, 'turn x', 'what is left of it, without waiting for the server');
    assert.ok(item.range !== undefined && item.range.isEmpty && item.range.start.character === 6);
    assert.equal(sent.length, 2, 'the revised suggestion is asked for meanwhile');

    const moved = { range: { start: { line: 1, character: 6 }, end: { line: 1, character: 6 } } };
    assert.equal(inline.receive(draft({ version: 4, text: 'turn x + 1', ...moved }), editor(4, after)), true);
    assert.deepEqual(texts(await inline.provide(typed, after, context, call(), next)), ['turn x + 1']);

    // Tab takes what is shown, and ends the request it came from.
    assert.deepEqual(item.command?.arguments, [2]);
    inline.accepted(2);
    assert.equal(sent[1].token.isCancellationRequested, true);
});

test('a keystroke the suggestion does not go on with shows nothing of it', async () => {
    const { next, sent } = server();
    const { inline } = inlineCompletions();
    const waiting = inline.provide(document, cursor, context, call(), next);
    sent[0].answer([new mock.InlineCompletionItem('return x') as vscode.InlineCompletionItem]);
    await waiting;
    const typed = new mock.TextDocument(mock.Uri.parse(URI), 'def f(x):\n    x', 4) as unknown as vscode.TextDocument;
    const later = inline.provide(typed, new mock.Position(1, 5) as vscode.Position, context, call(), next);
    sent[1].answer([new mock.InlineCompletionItem(' = 1') as vscode.InlineCompletionItem]);
    assert.deepEqual(texts(await later), [' = 1'], 'the call waited for the new answer');
});
