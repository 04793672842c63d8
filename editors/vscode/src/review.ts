/** Review of the server's workspace/applyEdit: the proposed text is shown against the current one in a
 *  diff, and the edit is applied only on "Apply". Knows nothing about which command asked for the edit. */
import * as vscode from 'vscode';
import type {
    ApplyWorkspaceEditParams, ApplyWorkspaceEditResult, HandlerResult, Range, WorkspaceEdit,
} from 'vscode-languageclient';

export const PROPOSAL_SCHEME = 'llada-proposal';
export const APPLY = 'Apply';
export const DISCARD = 'Discard';
/** The failureReason of a proposal the user did not apply. */
export const DISCARDED = 'Discarded in the editor.';

export type ApplyNext = (params: ApplyWorkspaceEditParams) => HandlerResult<ApplyWorkspaceEditResult, void>;

export interface Proposal {
    document: vscode.TextDocument;
    text: string;
}

interface PlainEdit {
    range: Range;
    newText: string;
}

export class EditReview implements vscode.TextDocumentContentProvider, vscode.Disposable {
    private readonly proposals = new Map<string, string>();
    private readonly registration: vscode.Disposable;
    private nextId = 0;

    constructor() {
        this.registration = vscode.workspace.registerTextDocumentContentProvider(PROPOSAL_SCHEME, this);
    }

    provideTextDocumentContent(uri: vscode.Uri): string | undefined {
        return this.proposals.get(uri.toString());
    }

    /** The `workspace.handleApplyEdit` middleware. */
    async review(params: ApplyWorkspaceEditParams, next: ApplyNext): Promise<ApplyWorkspaceEditResult | Awaited<ReturnType<ApplyNext>>> {
        let proposals: Proposal[];
        try {
            proposals = proposeTexts(params.edit, vscode.workspace.textDocuments);
        } catch (error) {
            return { applied: false, failureReason: (error as Error).message };
        }
        const shown = proposals.map((proposal) => this.show(proposal));
        try {
            for (const { proposal, uri } of shown) {
                await vscode.commands.executeCommand('vscode.diff', proposal.document.uri, uri,
                    `${basename(proposal.document.uri)}: current ↔ LLaDA proposal`, { preview: true });
            }
            const choice = await vscode.window.showInformationMessage(question(params.label), APPLY, DISCARD);
            if (choice !== APPLY) {
                return { applied: false, failureReason: DISCARDED };
            }
            // The client's own handler applies the edit and refuses it if the document moved on meanwhile.
            return await next(params);
        } finally {
            await this.close(shown.map(({ uri }) => uri));
        }
    }

    dispose(): void {
        this.registration.dispose();
        this.proposals.clear();
    }

    private show(proposal: Proposal): { proposal: Proposal; uri: vscode.Uri } {
        // The path keeps the file name so the diff gets the document's language; the query keeps
        // proposals for the same file apart.
        const uri = vscode.Uri.from({ scheme: PROPOSAL_SCHEME, path: proposal.document.uri.path, query: String(this.nextId++) });
        this.proposals.set(uri.toString(), proposal.text);
        return { proposal, uri };
    }

    private async close(uris: vscode.Uri[]): Promise<void> {
        const keys = new Set(uris.map((uri) => uri.toString()));
        const tabs = vscode.window.tabGroups.all.flatMap((group) => group.tabs).filter((tab) =>
            tab.input instanceof vscode.TabInputTextDiff && keys.has(tab.input.modified.toString()));
        if (tabs.length > 0) {
            await vscode.window.tabGroups.close(tabs);
        }
        keys.forEach((key) => this.proposals.delete(key));
    }
}

/** The text each edited document would have after `edit`; throws if a document is not open, has moved
 *  past the edit's version, or the edit does more than change text. */
export function proposeTexts(edit: WorkspaceEdit, open: readonly vscode.TextDocument[]): Proposal[] {
    const edits = new Map<string, { version: number | null; edits: PlainEdit[] }>();
    const entry = (uri: string, version: number | null) => {
        const found = edits.get(uri) ?? { version, edits: [] };
        edits.set(uri, found);
        return found;
    };
    for (const change of edit.documentChanges ?? []) {
        if (!('textDocument' in change)) {
            throw new Error(`The server asked to ${change.kind} a file, which a rewrite never does.`);
        }
        entry(change.textDocument.uri, change.textDocument.version).edits.push(
            ...change.edits.map((e) => ({ range: e.range, newText: 'newText' in e ? e.newText : e.snippet.value })));
    }
    for (const [uri, changes] of Object.entries(edit.changes ?? {})) {
        entry(uri, null).edits.push(...changes);
    }
    return [...edits].map(([uri, { version, edits: documentEdits }]) => {
        const key = vscode.Uri.parse(uri).toString();
        const document = open.find((d) => d.uri.toString() === key);
        if (document === undefined) {
            throw new Error(`${uri} is not open.`);
        }
        if (version !== null && version !== document.version) {
            throw new Error(`${basename(document.uri)} changed after the rewrite was asked for.`);
        }
        return { document, text: applyTextEdits(document, documentEdits) };
    });
}

/** LSP semantics: ranges refer to the original text, and inserts at one position keep their order. */
function applyTextEdits(document: vscode.TextDocument, edits: PlainEdit[]): string {
    const offsetAt = (p: Range['start']) => document.offsetAt(new vscode.Position(p.line, p.character));
    const spans = edits
        .map((e) => ({ start: offsetAt(e.range.start), end: offsetAt(e.range.end), newText: e.newText }))
        .sort((a, b) => a.start - b.start || a.end - b.end);
    const text = document.getText();
    let result = '';
    let cursor = 0;
    for (const span of spans) {
        if (span.start < cursor) {
            throw new Error('The server sent overlapping edits.');
        }
        result += text.slice(cursor, span.start) + span.newText;
        cursor = span.end;
    }
    return result + text.slice(cursor);
}

/** The question under the diff, titled like the commands ("LLaDA: ..."); the server's label (this server
 *  sends "llada: rewrite") names what is proposed. */
export function question(label: string | undefined): string {
    const what = (label ?? '').trim().replace(/^llada:\s*/i, '') || 'change';
    return `LLaDA: apply the proposed ${what}?`;
}

function basename(uri: vscode.Uri): string {
    return uri.path.slice(uri.path.lastIndexOf('/') + 1);
}
