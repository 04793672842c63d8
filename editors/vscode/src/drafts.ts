/** The latest `llada/draft` of each document, kept so the ghost text can show a completion while it is
 *  still being denoised. Pure data: knows nothing about editors, the client or VS Code. */

export interface ProtocolPosition {
    line: number;
    character: number;
}

/** params of the `llada/draft` notification (docs/protocol.md "Live drafts"). */
export interface Draft {
    uri: string;
    version: number;
    requestId: number | string;
    step: number;
    final: boolean;
    range: { start: ProtocolPosition; end: ProtocolPosition };
    text: string;
}

export const DRAFT_METHOD = 'llada/draft';

/** The text a draft shows as ghost text, which is exactly what accepting it inserts. A draft still being
 *  denoised stops where its text is still masked, so whitespace at its end is not followed by anything
 *  yet and cannot be seen: it is left out. A draft of whitespace alone shows nothing (''). The final
 *  draft equals the answer and is shown as it is. */
export function shownText(draft: Draft): string {
    const text = draft.final ? draft.text : draft.text.trimEnd();
    return text.trim() === '' ? '' : text;
}

export class DraftStore {
    private readonly latest = new Map<string, Draft>();

    /** Keeps `draft` if it is for `currentVersion` of its document and newer than the one kept;
     *  returns whether it was kept. `currentVersion` is undefined when the document is not open. */
    offer(draft: Draft, currentVersion: number | undefined): boolean {
        const kept = this.latest.get(draft.uri);
        if (kept !== undefined && kept.version !== currentVersion) {
            this.latest.delete(draft.uri);
        }
        if (draft.version !== currentVersion) {
            return false;
        }
        const current = this.latest.get(draft.uri);
        if (current !== undefined && current.requestId === draft.requestId && current.step >= draft.step) {
            return false;
        }
        this.latest.set(draft.uri, draft);
        return true;
    }

    /** The kept draft that inserts at `position` of `version`, if any. */
    lookup(uri: string, version: number, position: ProtocolPosition): Draft | undefined {
        const draft = this.latest.get(uri);
        if (draft === undefined || draft.version !== version) {
            return undefined;
        }
        const start = draft.range.start;
        return start.line === position.line && start.character === position.character ? draft : undefined;
    }

    forget(uri: string): void {
        this.latest.delete(uri);
    }
}
