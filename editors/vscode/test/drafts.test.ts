import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Draft, DraftStore, shownText } from '../src/drafts';

const URI = 'file:///work/a.py';

function draft(overrides: Partial<Draft> = {}): Draft {
    return {
        uri: URI, version: 3, requestId: 7, step: 1, final: false,
        range: { start: { line: 2, character: 4 }, end: { line: 2, character: 4 } }, text: 'ret', ...overrides,
    };
}

test('a draft for another version than the open one is ignored', () => {
    const store = new DraftStore();
    assert.equal(store.offer(draft({ version: 2 }), 3), false);
    assert.equal(store.offer(draft(), undefined), false);
    assert.equal(store.lookup(URI, 2, { line: 2, character: 4 }), undefined);
    assert.equal(store.lookup(URI, 3, { line: 2, character: 4 }), undefined);
});

test('the latest draft wins and a late earlier step does not replace it', () => {
    const store = new DraftStore();
    assert.equal(store.offer(draft({ step: 1, text: 'ret' }), 3), true);
    assert.equal(store.offer(draft({ step: 2, text: 'return x' }), 3), true);
    assert.equal(store.offer(draft({ step: 1, text: 'ret' }), 3), false);
    assert.equal(store.lookup(URI, 3, { line: 2, character: 4 })?.text, 'return x');
    assert.equal(store.offer(draft({ step: 3, final: true, text: 'return x + 1' }), 3), true);
    assert.equal(store.lookup(URI, 3, { line: 2, character: 4 })?.text, 'return x + 1');
});

test('a draft of a newer request replaces the previous request at any step', () => {
    const store = new DraftStore();
    store.offer(draft({ step: 5, text: 'old' }), 3);
    assert.equal(store.offer(draft({ requestId: 8, step: 1, text: 'new' }), 3), true);
    assert.equal(store.lookup(URI, 3, { line: 2, character: 4 })?.text, 'new');
});

test('a kept draft is dropped once its document moves on', () => {
    const store = new DraftStore();
    store.offer(draft(), 3);
    assert.equal(store.offer(draft({ version: 3, step: 2 }), 4), false);
    assert.equal(store.lookup(URI, 3, { line: 2, character: 4 }), undefined);
});

test('lookup finds a draft only at the position it inserts at', () => {
    const store = new DraftStore();
    store.offer(draft(), 3);
    assert.equal(store.lookup(URI, 3, { line: 2, character: 5 }), undefined);
    assert.equal(store.lookup('file:///work/b.py', 3, { line: 2, character: 4 }), undefined);
    store.forget(URI);
    assert.equal(store.lookup(URI, 3, { line: 2, character: 4 }), undefined);
});

test('a draft shows its text up to its last visible character; the final one as it is', () => {
    assert.equal(shownText(draft({ text: 'return x\n    ' })), 'return x');
    assert.equal(shownText(draft({ text: '    return x ' })), '    return x');
    assert.equal(shownText(draft({ text: ' \n\t' })), '');
    assert.equal(shownText(draft({ text: '' })), '');
    assert.equal(shownText(draft({ final: true, text: 'return x\n' })), 'return x\n');
    assert.equal(shownText(draft({ final: true, text: '\n  ' })), '');
});
