import './setup';
import assert from 'node:assert/strict';
import { beforeEach, test } from 'node:test';
import { DISCARDED } from '../src/review';
import { errorNotice, resultNotice, showNotice } from '../src/rewrite';
import * as mock from './vscode-mock';

beforeEach(() => mock.reset());

/** A JSON-RPC error as vscode-jsonrpc rejects with it. */
function responseError(code: number, message: string): Error {
    return Object.assign(new Error(message), { code });
}

test('each refusal of the server reaches the user as a warning with its reason', () => {
    const refusals = [
        { applied: false, changed: true, text: 'def f(:', reason: 'the rewrite would leave a.py unparsable: invalid syntax at line 3' },
        { applied: false, changed: false, text: 'x + 1', reason: 'the model proposed no change' },
        { applied: false, changed: true, text: 'x', reason: 'a.py changed after the rewrite was asked for.' },
    ];
    for (const result of refusals) {
        showNotice(resultNotice(result));
    }
    assert.deepEqual(mock.recorded.messages.map((m) => [m.severity, m.message]), [
        ['warning', 'LLaDA: the rewrite was not applied: the rewrite would leave a.py unparsable: invalid syntax at line 3.'],
        ['warning', 'LLaDA: the rewrite was not applied: the model proposed no change.'],
        ['warning', 'LLaDA: the rewrite was not applied: a.py changed after the rewrite was asked for.'],
    ]);
});

test('a refusal without a reason, or no result at all, is still told', () => {
    assert.equal(resultNotice({ applied: false, changed: false, text: 'x' })?.message, 'LLaDA: the rewrite was not applied: the model proposed no change.');
    assert.equal(resultNotice({ applied: false, text: 'x', reason: '' })?.message, 'LLaDA: the rewrite was not applied: llada-lsp gave no reason.');
    assert.equal(resultNotice(null)?.severity, 'warning');
    assert.equal(resultNotice(undefined)?.severity, 'warning');
});

test('an applied rewrite, or one the user discarded, needs no message', () => {
    assert.equal(resultNotice({ applied: true, changed: true, text: 'x + 1' }), undefined);
    assert.equal(resultNotice({ applied: false, changed: true, text: 'x + 1', reason: DISCARDED }), undefined);
});

test('an instruction the model cannot follow is a warning with the server message', () => {
    const error = responseError(-32803, 'llada: tiny is a fill-in-the-middle model and cannot follow an instruction; rewrite without one');
    showNotice(errorNotice(error, false));
    assert.deepEqual(mock.recorded.messages.map((m) => [m.severity, m.message]), [
        ['warning', 'LLaDA: the rewrite was refused: tiny is a fill-in-the-middle model and cannot follow an instruction; rewrite without one.'],
    ]);
    assert.equal(errorNotice(responseError(-32602, 'the range is outside the document'), false)?.severity, 'warning');
});

test('a cancellation is silent only when the user cancelled', () => {
    const cancelled = responseError(-32800, 'Request got cancelled');
    assert.equal(errorNotice(cancelled, true), undefined);
    assert.deepEqual(errorNotice(cancelled, false), { severity: 'warning', message: 'LLaDA: the rewrite was cancelled by llada-lsp: Request got cancelled.' });
});

test('other failures are errors', () => {
    assert.deepEqual(errorNotice(new Error('Client is not running'), false), { severity: 'error', message: 'LLaDA: the rewrite failed: Client is not running.' });
    assert.deepEqual(errorNotice(responseError(-32603, 'llada: internal error'), false), { severity: 'error', message: 'LLaDA: the rewrite failed: internal error.' });
});
