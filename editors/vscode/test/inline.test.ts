import './setup';
import assert from 'node:assert/strict';
import { beforeEach, test } from 'node:test';
import * as vscode from 'vscode';
import { Draft } from '../src/drafts';
import { InlineCompletions, ProvideInlineCompletions, TRIGGER_INLINE_SUGGEST } from '../src/inline';
import * as mock from './vscode-mock';

const URI = 'file:///work/a.py';
const document = new mock.TextDocument(mock.Uri.parse(URI), 'def f(x):\n    ', 3) as unknown as vscode.TextDocument;
const cursor = new mock.Position(1, 4) as vscode.Position;
const context = { triggerKind: 1, selectedCompletionInfo: undefined } as vscode.InlineCompletionContext;

interface Sent {
    token: vscode.CancellationToken;
    answer(items: vscode.InlineCompletionItem[] | null): void;
}

/** A server stand-in: records each request and lets the test answer it. */
function server(): { next: ProvideInlineCompletions; sent: Sent[] } {
    const sent: Sent[] = [];
    const next: ProvideInlineCompletions = (_document, _position, _context, token) =>
        new Promise((resolve) => sent.push({ token, answer: resolve }));
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
        now,
    );
    return { inline, events };
}

function texts(result: unknown): string[] {
    const items = (Array.isArray(result) ? result : (result as { items: vscode.InlineCompletionItem[] }).items);
    return items.map((item) => item.insertText as string);
}

const triggers = () => mock.recorded.commands.filter((c) => c.command === TRIGGER_INLINE_SUGGEST).length;

beforeEach(() => mock.reset());

test('a draft for the active editor at its version and cursor re-triggers the suggestion', () => {
    const { inline } = inlineCompletions();
    assert.equal(inline.receive(draft(), editor()), true);
    assert.equal(triggers(), 1);
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

test('an empty answer is not kept: the next call asks again', async () => {
    const { next, sent } = server();
    const { inline } = inlineCompletions();
    const waiting = inline.provide(document, cursor, context, new mock.CancellationTokenSource().token, next);
    sent[0].answer([]);
    assert.equal(await waiting, undefined);
    void inline.provide(document, cursor, context, new mock.CancellationTokenSource().token, next);
    assert.equal(sent.length, 2);
});
