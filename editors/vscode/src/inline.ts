/** Inline-completion middleware: one request in flight per cursor position, whose drafts are served as
 *  ghost text until its answer lands. Knows the language client only through the middleware's `next`. */
import * as vscode from 'vscode';
import { Draft, DraftStore } from './drafts';

type InlineResult = vscode.InlineCompletionItem[] | vscode.InlineCompletionList | null | undefined;

export type ProvideInlineCompletions = (
    document: vscode.TextDocument,
    position: vscode.Position,
    context: vscode.InlineCompletionContext,
    token: vscode.CancellationToken,
) => vscode.ProviderResult<vscode.InlineCompletionItem[] | vscode.InlineCompletionList>;

/** Every `started` is followed by exactly one `settled`; a superseded request may settle after its
 *  successor started. */
export interface InlineEvents {
    started(): void;
    /** latencyMs is set when the server answered with a completion. */
    settled(latencyMs: number | undefined): void;
}

interface Key {
    uri: string;
    version: number;
    line: number;
    character: number;
    /** The suggest widget's selected item changes what the completion continues from. */
    selected: string | undefined;
}

interface InFlight {
    key: Key;
    source: vscode.CancellationTokenSource;
    answer: Promise<InlineResult>;
    settled: boolean;
    result: InlineResult;
}

export const TRIGGER_INLINE_SUGGEST = 'editor.action.inlineSuggest.trigger';

export class InlineCompletions {
    private readonly drafts = new DraftStore();
    private inFlight: InFlight | undefined;

    constructor(
        private readonly events: InlineEvents,
        private readonly asUri: (uri: vscode.Uri) => string,
        private readonly now: () => number = () => Date.now(),
    ) {}

    /** The `provideInlineCompletionItems` middleware. Each accepted draft re-triggers the inline
     *  suggestion, and VS Code cancels the previous provider call when it does; the request therefore
     *  runs on its own token and outlives the calls that wait for it. */
    readonly provide = async (
        document: vscode.TextDocument,
        position: vscode.Position,
        context: vscode.InlineCompletionContext,
        token: vscode.CancellationToken,
        next: ProvideInlineCompletions,
    ): Promise<InlineResult> => {
        const key: Key = {
            uri: this.asUri(document.uri),
            version: document.version,
            line: position.line,
            character: position.character,
            selected: context.selectedCompletionInfo?.text,
        };
        let inFlight = this.inFlight;
        if (inFlight === undefined || !sameKey(inFlight.key, key)) {
            this.cancel();
            inFlight = this.send(key, (requestToken) => next(document, position, context, requestToken));
        }
        if (inFlight.settled) {
            return inFlight.result;
        }
        const draft = this.drafts.lookup(key.uri, key.version, position);
        if (draft !== undefined && draft.text !== '') {
            return [new vscode.InlineCompletionItem(draft.text, new vscode.Range(position, position))];
        }
        return untilCancelled(inFlight.answer, token);
    };

    /** The `llada/draft` handler: keeps a draft for the current version of the active editor's
     *  document and re-triggers the inline suggestion, which then shows the draft. Returns whether it
     *  re-triggered. */
    receive(draft: Draft, editor: vscode.TextEditor | undefined): boolean {
        if (editor === undefined || this.asUri(editor.document.uri) !== draft.uri) {
            return false;
        }
        if (!this.drafts.offer(draft, editor.document.version)) {
            return false;
        }
        // Only where the cursor still is: elsewhere the trigger would ask for a new completion.
        const cursor = editor.selection.active;
        if (!editor.selection.isEmpty || cursor.line !== draft.range.start.line || cursor.character !== draft.range.start.character) {
            return false;
        }
        void vscode.commands.executeCommand(TRIGGER_INLINE_SUGGEST);
        return true;
    }

    /** Drops everything kept for a closed document. */
    forget(uri: string): void {
        this.drafts.forget(uri);
        this.cancel(uri);
    }

    /** Stops the request in flight; with `uri`, only if it is for that document. */
    cancel(uri?: string): void {
        const inFlight = this.inFlight;
        if (inFlight === undefined || (uri !== undefined && inFlight.key.uri !== uri)) {
            return;
        }
        this.inFlight = undefined;
        inFlight.source.cancel();
    }

    /** Stops the request in flight unless the cursor of its document is still where it was sent. */
    cursorMoved(uri: string, position: vscode.Position): void {
        const key = this.inFlight?.key;
        if (key !== undefined && key.uri === uri && (key.line !== position.line || key.character !== position.character)) {
            this.cancel();
        }
    }

    private send(key: Key, request: (token: vscode.CancellationToken) => ReturnType<ProvideInlineCompletions>): InFlight {
        const source = new vscode.CancellationTokenSource();
        const sentAt = this.now();
        const inFlight: InFlight = { key, source, answer: Promise.resolve(undefined), settled: false, result: undefined };
        this.events.started();
        inFlight.answer = new Promise<InlineResult>((resolve) => resolve(request(source.token))).then(
            (result) => {
                const answered = !source.token.isCancellationRequested && hasItems(result);
                this.settle(inFlight, answered ? result : undefined, answered ? this.now() - sentAt : undefined);
                return answered ? result : undefined;
            },
            () => {
                this.settle(inFlight, undefined, undefined);
                return undefined;
            },
        );
        this.inFlight = inFlight;
        return inFlight;
    }

    private settle(inFlight: InFlight, result: InlineResult, latencyMs: number | undefined): void {
        inFlight.settled = true;
        inFlight.result = result;
        inFlight.source.dispose();
        // An empty or failed answer is not kept, so the next call at this position asks again.
        if (result === undefined && this.inFlight === inFlight) {
            this.inFlight = undefined;
        }
        this.events.settled(latencyMs);
    }
}

function sameKey(a: Key, b: Key): boolean {
    return a.uri === b.uri && a.version === b.version && a.line === b.line
        && a.character === b.character && a.selected === b.selected;
}

function hasItems(result: InlineResult): boolean {
    if (result === null || result === undefined) {
        return false;
    }
    return (Array.isArray(result) ? result : result.items).length > 0;
}

function untilCancelled<T>(answer: Promise<T>, token: vscode.CancellationToken): Promise<T | undefined> {
    if (token.isCancellationRequested) {
        return Promise.resolve(undefined);
    }
    return new Promise((resolve) => {
        const listener = token.onCancellationRequested(() => {
            listener.dispose();
            resolve(undefined);
        });
        void answer.then((value) => {
            listener.dispose();
            resolve(value);
        });
    });
}
