/** Test-only record of what the extension shows, for the editing fuzzer (tests/e2e/vscode/fuzz.py). Off by
 *  default: it exists only when the extension host's environment names a file in LLADA_VSCODE_TEST_LOG, and
 *  then appends one JSON object a line to it:
 *  - `served`: each answer the inline provider gives VS Code (the texts, where they insert, whether VS
 *    Code cancelled the call, and the document's version and the cursor line's length at that moment);
 *  - `change`: each change of a file's text (its version and whole text after it);
 *  - `accepted`: each inline item VS Code accepted in full (the request's id);
 *  - `mark`: on the command `llada.test.mark` (bound to a key by the test), the open files' versions and
 *    texts and the active editor's cursor. A key press is handled after the keys before it, and its
 *    command after the document changes they made, so a mark is a snapshot of everything typed before it.
 *  Nothing else of the extension reads it or depends on it. */
import { appendFileSync } from 'fs';
import * as vscode from 'vscode';

export const MARK_COMMAND = 'llada.test.mark';

export class TestLog {
    private constructor(private readonly path: string) {}

    /** The log named by LLADA_VSCODE_TEST_LOG; undefined (no hook at all) when it names none. */
    static fromEnvironment(): TestLog | undefined {
        const path = process.env.LLADA_VSCODE_TEST_LOG;
        return path ? new TestLog(path) : undefined;
    }

    served(
        document: vscode.TextDocument, position: vscode.Position,
        items: vscode.InlineCompletionItem[] | vscode.InlineCompletionList | null | undefined, token: vscode.CancellationToken,
    ): void {
        const list = items === null || items === undefined ? undefined : Array.isArray(items) ? items : items.items;
        this.write({
            event: 'served',
            uri: document.uri.toString(),
            version: document.version,
            line: position.line,
            character: position.character,
            lineCount: document.lineCount,
            // VS Code shows nothing of an answer to a call it cancelled.
            cancelled: token.isCancellationRequested,
            lineLength: position.line < document.lineCount ? document.lineAt(position.line).text.length : -1,
            items: list?.map((item) => ({
                text: typeof item.insertText === 'string' ? item.insertText : { snippet: item.insertText.value },
                range: item.range && {
                    start: [item.range.start.line, item.range.start.character],
                    end: [item.range.end.line, item.range.end.character],
                },
            })) ?? null,
        });
    }

    accepted(id: number): void {
        this.write({ event: 'accepted', id });
    }

    /** Registers the mark command and the listener of changes. */
    register(): vscode.Disposable {
        const changes = vscode.workspace.onDidChangeTextDocument((event) => {
            if (event.document.uri.scheme === 'file' && event.contentChanges.length > 0) {
                this.write({ event: 'change', uri: event.document.uri.toString(), version: event.document.version, text: event.document.getText() });
            }
        });
        const mark = vscode.commands.registerCommand(MARK_COMMAND, (n?: number) => {
            const editor = vscode.window.activeTextEditor;
            this.write({
                event: 'mark',
                n: n ?? null,
                active: editor?.document.uri.toString() ?? null,
                cursor: editor ? [editor.selection.active.line, editor.selection.active.character] : null,
                selectionEmpty: editor?.selection.isEmpty ?? null,
                documents: Object.fromEntries(vscode.workspace.textDocuments
                    .filter((d) => d.uri.scheme === 'file')
                    .map((d) => [d.uri.toString(), { version: d.version, text: d.getText() }])),
            });
        });
        return vscode.Disposable.from(changes, mark);
    }

    private write(record: object): void {
        appendFileSync(this.path, `${JSON.stringify({ t: Date.now(), ...record })}\n`);
    }
}
