import './setup';
import assert from 'node:assert/strict';
import { afterEach, beforeEach, test } from 'node:test';
import * as vscode from 'vscode';
import type { ApplyWorkspaceEditParams, ApplyWorkspaceEditResult } from 'vscode-languageclient';
import { APPLY, DISCARD, EditReview, PROPOSAL_SCHEME, proposeTexts, question } from '../src/review';
import * as mock from './vscode-mock';

const URI = 'file:///work/a.py';
const TEXT = 'def f(x):\n    return x+1\n';

/** What the server sends for a rewrite of `x+1` on line 1 (docs/protocol.md). */
function rewriteEdit(version = 5): ApplyWorkspaceEditParams {
    return {
        label: 'LLaDA rewrite',
        edit: {
            documentChanges: [{
                textDocument: { uri: URI, version },
                edits: [{ range: { start: { line: 1, character: 11 }, end: { line: 1, character: 14 } }, newText: 'x + 1' }],
            }],
        },
    };
}

/** The client's own applyEdit handler, recording what reached it. */
function clientHandler() {
    const applied: ApplyWorkspaceEditParams[] = [];
    const next = (params: ApplyWorkspaceEditParams): Promise<ApplyWorkspaceEditResult> => {
        applied.push(params);
        return Promise.resolve({ applied: true });
    };
    return { next, applied };
}

let review: EditReview;

beforeEach(() => {
    mock.reset();
    mock.scripted.openDocuments = [new mock.TextDocument(mock.Uri.parse(URI), TEXT, 5)];
    review = new EditReview();
});

afterEach(() => review.dispose());

test('the proposal is shown in a diff against the current text before anything is applied', async () => {
    mock.scripted.informationAnswer = DISCARD;
    let diffed: { original: string; proposed: string | undefined } | undefined;
    const executeCommand = mock.commands.executeCommand;
    mock.commands.executeCommand = (command: string, ...args: unknown[]) => {
        if (command === 'vscode.diff') {
            const [original, proposed] = args as mock.Uri[];
            diffed = { original: original.toString(), proposed: mock.recorded.contentProviders.get(proposed.scheme)?.provideTextDocumentContent(proposed) };
        }
        return executeCommand(command, ...args);
    };
    try {
        await review.review(rewriteEdit(), clientHandler().next);
    } finally {
        mock.commands.executeCommand = executeCommand;
    }
    assert.deepEqual(diffed, { original: URI, proposed: 'def f(x):\n    return x + 1\n' });
    assert.deepEqual(mock.recorded.messages.map((m) => m.items), [[APPLY, DISCARD]]);
});

test('Apply hands the edit to the client and answers applied: true', async () => {
    mock.scripted.informationAnswer = APPLY;
    const { next, applied } = clientHandler();
    const params = rewriteEdit();
    assert.deepEqual(await review.review(params, next), { applied: true });
    assert.deepEqual(applied, [params]);
});

test('Discard, or dismissing the question, answers applied: false and applies nothing', async () => {
    for (const answer of [DISCARD, undefined]) {
        mock.scripted.informationAnswer = answer;
        const { next, applied } = clientHandler();
        const result = await review.review(rewriteEdit(), next);
        assert.equal((result as ApplyWorkspaceEditResult).applied, false);
        assert.deepEqual(applied, []);
    }
});

test('the diff closes and its proposal is forgotten once decided', async () => {
    mock.scripted.informationAnswer = APPLY;
    await review.review(rewriteEdit(), clientHandler().next);
    const diff = mock.recorded.commands.find((c) => c.command === 'vscode.diff');
    const proposal = diff?.args[1] as mock.Uri;
    assert.equal(proposal.scheme, PROPOSAL_SCHEME);
    assert.equal(mock.recorded.closedTabs.length, 1);
    assert.equal(mock.scripted.tabs.length, 0);
    assert.equal(mock.recorded.contentProviders.get(PROPOSAL_SCHEME)?.provideTextDocumentContent(proposal), undefined);
});

test('an edit for a version the document has moved past is refused without asking', async () => {
    mock.scripted.informationAnswer = APPLY;
    const { next, applied } = clientHandler();
    const result = await review.review(rewriteEdit(4), next);
    assert.deepEqual(result, { applied: false, failureReason: 'a.py changed after the rewrite was asked for.' });
    assert.deepEqual(applied, []);
    assert.deepEqual(mock.recorded.messages, []);
    assert.equal(mock.recorded.commands.length, 0);
});

test('several edits apply against the original text, inserts at one point in order', () => {
    const at = (line: number, character: number) => ({ line, character });
    const [proposal] = proposeTexts({
        changes: {
            [URI]: [
                { range: { start: at(1, 11), end: at(1, 14) }, newText: 'x * 2' },
                { range: { start: at(0, 0), end: at(0, 0) }, newText: '# a\n' },
                { range: { start: at(0, 0), end: at(0, 0) }, newText: '# b\n' },
            ],
        },
    }, mock.scripted.openDocuments as unknown as vscode.TextDocument[]);
    assert.equal(proposal.text, '# a\n# b\ndef f(x):\n    return x * 2\n');
});

test('edits for a document that is not open are refused', () => {
    assert.throws(() => proposeTexts({ changes: { 'file:///work/b.py': [] } }, []), /not open/);
});

test('the question is titled like the commands, whatever case the server labels the edit in', () => {
    assert.equal(question('llada: rewrite'), 'LLaDA: apply the proposed rewrite?');
    assert.equal(question(undefined), 'LLaDA: apply the proposed change?');
});
