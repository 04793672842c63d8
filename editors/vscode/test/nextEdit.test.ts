import './setup';
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as vscode from 'vscode';
import { mergeOnLine, NextEdit, NextEditAnswer, NextEdits, NextEditUi, onLine } from '../src/nextEdit';

const URI = 'file:///work/total.py';
const edit = (line: number, a: number, b: number, newText: string): NextEdit =>
    ({ range: { start: { line, character: a }, end: { line, character: b } }, newText });
const RENAME: NextEdit[] = [edit(3, 8, 13, 'acc'), edit(4, 11, 16, 'acc')];

/** A scripted editor and server: what was drawn, jumped to and applied; the timer fired by hand. */
function rig(answer: NextEditAnswer | null, version = 5) {
    const calls: string[] = [];
    const asked: { uri: string; version: number }[] = [];
    let fire: (() => void) | undefined;
    let resolveAnswer: (() => void) | undefined;
    const answered = new Promise<void>((resolve) => { resolveAnswer = resolve; });
    const ui: NextEditUi = {
        show: (_uri, edits, hintLine) => calls.push(`show ${edits.length} hint ${hintLine}`),
        clear: () => calls.push('clear'),
        triggerInline: () => calls.push('inline'),
        jump: (p) => calls.push(`jump ${p.line}:${p.character}`),
        apply: (_uri, v, edits) => { calls.push(`apply v${v} ${edits.map((e) => e.newText).join(',')}`); return Promise.resolve(true); },
        fallback: () => { calls.push('tab'); return Promise.resolve(); },
    };
    const doc = { version };
    const nextEdits = new NextEdits(
        (uri, v) => { asked.push({ uri, version: v }); setImmediate(() => resolveAnswer?.()); return Promise.resolve(answer); },
        ui, () => ({ enabled: true, delayMs: 400 }), () => doc.version,
        { set: (callback) => { fire = callback; return 1; }, clear: () => { fire = undefined; } },
    );
    const fireNow = () => { const callback = fire; fire = undefined; callback?.(); };
    return { nextEdits, calls, asked, doc, fire: fireNow, answered, pending: () => fire !== undefined };
}

const settle = () => new Promise((resolve) => setImmediate(resolve));

test('an edit elsewhere is drawn with a hint, Tab jumps, Tab applies it at its version', async () => {
    const r = rig({ edits: RENAME, version: 5 });
    r.nextEdits.changed(URI, 5, { line: 1, character: 7 });
    assert.equal(r.asked.length, 0, 'nothing is asked before the idle time');
    r.fire();
    await r.answered; await settle();
    assert.deepEqual(r.asked, [{ uri: URI, version: 5 }]);
    assert.deepEqual(r.calls, ['show 2 hint 1']);
    await r.nextEdits.accept(URI, 5, { line: 1, character: 7 }, '    acc = 0');
    assert.deepEqual(r.calls.slice(1), ['jump 3:8', 'show 2 hint undefined']);
    await r.nextEdits.accept(URI, 5, { line: 3, character: 8 }, '        count += v');
    assert.deepEqual(r.calls.slice(3), ['clear', 'apply v5 acc,acc']);
    assert.equal(r.nextEdits.isShown, false);
});

test('typing on dismisses, a stale answer is never shown, and Tab in leading whitespace indents', async () => {
    const r = rig({ edits: RENAME, version: 5 });
    r.nextEdits.changed(URI, 5, { line: 1, character: 7 });
    r.fire();
    r.doc.version = 6; // typed on while the server worked
    await r.answered; await settle();
    assert.deepEqual(r.calls, [], 'an answer for version 5 is not drawn over version 6');

    const s = rig({ edits: RENAME, version: 5 });
    s.nextEdits.changed(URI, 5, { line: 1, character: 0 });
    s.fire();
    await s.answered; await settle();
    await s.nextEdits.accept(URI, 5, { line: 1, character: 2 }, '    acc = 0');
    assert.deepEqual(s.calls, ['show 2 hint 1', 'tab'], 'Tab where it would indent indents');
    s.nextEdits.changed(URI, 6, { line: 1, character: 3 });
    assert.deepEqual(s.calls.slice(2), ['clear'], 'typing on dismisses');
    assert.ok(s.pending(), 'and waits for the next idle time');
});

test('an edit on the cursor line is an inline completion item with a range', async () => {
    const r = rig({ edits: [edit(2, 4, 9, 'acc'), edit(2, 12, 17, 'acc')], version: 5 });
    r.nextEdits.changed(URI, 5, { line: 2, character: 0 });
    r.fire();
    await r.answered; await settle();
    assert.deepEqual(r.calls, ['inline']);
    const item = r.nextEdits.inlineItem(URI, 5, { line: 2, character: 3 }, '    count = count + 1');
    assert.deepEqual(item, { range: { start: { line: 2, character: 4 }, end: { line: 2, character: 17 } }, insertText: 'acc = acc' });
    assert.equal(r.nextEdits.inlineItem(URI, 6, { line: 2, character: 3 }, '    count = count + 1'), undefined);
});

test('no edits, or the same version asked twice, shows nothing and asks once', async () => {
    const r = rig({ edits: [] });
    r.nextEdits.changed(URI, 5, { line: 0, character: 0 });
    r.fire();
    await r.answered; await settle();
    r.nextEdits.moved(URI, 5, { line: 1, character: 0 }); // no request waits: nothing scheduled
    assert.equal(r.pending(), false);
    r.nextEdits.changed(URI, 5, { line: 0, character: 1 });
    r.fire();
    await settle();
    assert.equal(r.asked.length, 1);
    assert.deepEqual(r.calls, []);
});

test('a server that cannot suggest is not asked again', async () => {
    let asked = 0;
    let fire: (() => void) | undefined;
    const ui = { show() {}, clear() {}, triggerInline() {}, jump() {}, apply: () => Promise.resolve(true), fallback: () => Promise.resolve() };
    const nextEdits = new NextEdits(() => { asked++; return Promise.reject(new Error('llada: next-edit suggestions are not supported on the SGLang backend')); },
        ui, () => ({ enabled: true, delayMs: 1 }), () => 5, { set: (callback) => { fire = callback; return 1; }, clear: () => { fire = undefined; } });
    nextEdits.changed(URI, 5, { line: 0, character: 0 });
    fire?.();
    await settle();
    fire = undefined;
    nextEdits.changed(URI, 6, { line: 0, character: 1 });
    assert.equal(fire, undefined, 'no request is scheduled any more');
    assert.equal(asked, 1);
});

test('the helpers: edits on one line merge into one replacement', () => {
    assert.ok(onLine([edit(2, 0, 1, 'x')], 2) && !onLine(RENAME, 3));
    assert.deepEqual(mergeOnLine('a = b + b', [edit(0, 4, 5, 'c'), edit(0, 8, 9, 'c')]), { start: 4, end: 9, text: 'c + c' });
    void vscode;
});
