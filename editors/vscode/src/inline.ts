/** Inline-completion middleware: one request in flight per cursor position, whose drafts are served as
 *  ghost text until its answer lands. Knows the language client only through the middleware's `next`.
 *
 *  What is shown is what Tab accepts: every item served inserts at the cursor exactly the text it shows
 *  (no whitespace that cannot be seen, no range that replaces anything), and accepting one ends the
 *  request it came from, so nothing of that request shows again. */
import * as vscode from 'vscode';
import { Draft, DraftStore, shownText } from './drafts';
import { Shown, restAfterTyping } from './through';

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
    /** The cursor line's text (not compared: the version says it). */
    lineText: string;
}

interface InFlight {
    /** Names the request in the command of the items it served. */
    id: number;
    key: Key;
    source: vscode.CancellationTokenSource;
    /** The texts of the answer that can be inserted at the cursor; undefined when there are none. */
    answer: Promise<string[] | undefined>;
    settled: boolean;
    result: string[] | undefined;
    /** Whether a draft of it was served, and may be on screen. */
    servedDraft: boolean;
}

export const TRIGGER_INLINE_SUGGEST = 'editor.action.inlineSuggest.trigger';
export const HIDE_INLINE_SUGGEST = 'editor.action.inlineSuggest.hide';
/** The documents inline completions are given for (the language client's selector). */
export const DOCUMENTS = [{ scheme: 'file' }, { scheme: 'untitled' }];
/** Run by VS Code after an item is accepted (InlineCompletionItem.command), with the request's id. */
export const ACCEPTED_COMMAND = 'llada.inlineCompletionAccepted';
/** Context key, true while an item of ours may be on screen: package.json binds Tab to accepting it
 *  even where VS Code would indent instead (ghost text that starts with a tab's worth of whitespace). */
export const SHOWN_CONTEXT = 'llada.inlineSuggestionShown';

export class InlineCompletions {
    private readonly drafts = new DraftStore();
    private inFlight: InFlight | undefined;
    private nextId = 1;
    private shown = false;
    /** The suggestion last served: typed through, its rest is served until the revised one comes. */
    private lastShown: Shown | undefined;
    /** The document's version when `lastShown` was served. */
    private lastShownVersion: number | undefined;
    /** The language client's request, as the middleware last got it (the provider of `showAgain` sends it). */
    private next: ProvideInlineCompletions | undefined;
    /** The provider registered by the last `showAgain`. */
    private registration: vscode.Disposable | undefined;

    /** `extensionId` names this extension's inline providers to VS Code's trigger command. */
    constructor(
        private readonly events: InlineEvents,
        private readonly asUri: (uri: vscode.Uri) => string,
        private readonly extensionId: string,
        private readonly now: () => number = () => Date.now(),
        /** Told each answer given to VS Code, with the document as it is then (the test hook of testHook.ts). */
        private readonly observe?: (
            document: vscode.TextDocument, position: vscode.Position, result: InlineResult, token: vscode.CancellationToken,
        ) => void,
    ) {}

    /** The `provideInlineCompletionItems` middleware. Each kept draft re-triggers the inline
     *  suggestion, and VS Code cancels the previous provider call when it does; the request therefore
     *  runs on its own token and outlives the calls that wait for it. */
    readonly provide = async (
        document: vscode.TextDocument,
        position: vscode.Position,
        context: vscode.InlineCompletionContext,
        token: vscode.CancellationToken,
        next: ProvideInlineCompletions,
    ): Promise<InlineResult> => {
        const result = await this.serve(document, position, context, token, next);
        this.observe?.(document, position, result, token);
        return result;
    };

    private async serve(
        document: vscode.TextDocument,
        position: vscode.Position,
        context: vscode.InlineCompletionContext,
        token: vscode.CancellationToken,
        next: ProvideInlineCompletions,
    ): Promise<InlineResult> {
        this.next = next;
        const key: Key = {
            uri: this.asUri(document.uri),
            version: document.version,
            line: position.line,
            character: position.character,
            selected: context.selectedCompletionInfo?.text,
            lineText: lineText(document, position.line),
        };
        let inFlight = this.inFlight;
        if (inFlight === undefined || !sameKey(inFlight.key, key)) {
            this.cancel();
            inFlight = this.send(key, (requestToken) => next(document, position, context, requestToken));
        }
        if (inFlight.settled) {
            return this.items(inFlight, inFlight.result, position);
        }
        const draft = this.drafts.lookup(key.uri, key.version, position);
        if (draft !== undefined) {
            const text = shownText(draft);
            if (text !== '') {
                inFlight.servedDraft = true;
                return this.items(inFlight, [text], position);
            }
            if (draft.final) {
                // The completion ended empty: an empty list takes an earlier draft off the screen.
                return [];
            }
        }
        const rest = restAfterTyping(this.lastShown, key);
        if (rest !== undefined) {
            // Typed through: what is left of it stays on screen; its request's drafts replace it.
            inFlight.servedDraft = true;
            return this.items(inFlight, [rest], position);
        }
        const request = inFlight;
        return untilCancelled(request.answer, token).then((texts) => this.items(request, texts, position));
    }

    /** The command of every item served: the request the accepted item came from is done, and is
     *  stopped so that none of its later drafts, nor its answer, shows again. */
    accepted(id: number): void {
        if (this.inFlight?.id === id) {
            this.cancel();
        }
    }

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
        // A draft that shows nothing changes nothing on screen, unless it ends a request whose drafts are
        // shown. Triggering for it anyway would ask again once an empty answer has landed, and the new
        // request's drafts would trigger again: the model would run forever at this position.
        const onScreen = this.inFlight?.key.uri === draft.uri && this.inFlight.servedDraft;
        const text = shownText(draft);
        if (text === '' && !(draft.final && onScreen)) {
            return false;
        }
        // A draft (or the answer) that shows what is on screen already changes nothing there.
        const last = this.lastShown;
        if (onScreen && last !== undefined && last.text === text && last.line === cursor.line && last.character === cursor.character) {
            return false;
        }
        this.showAgain();
        return true;
    }

    /** Drops everything kept for a closed document. */
    forget(uri: string): void {
        this.drafts.forget(uri);
        if (this.lastShown?.uri === uri) {
            this.lastShown = undefined;
        }
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
        // Its drafts must not be served to a later request at the same position.
        this.drafts.forget(inFlight.key.uri);
        this.setShown(false);
    }

    /** Stops the request in flight unless the cursor of its document is still where it was sent. A cursor
     *  moved off the suggestion last shown without an edit (`version` is the document's, unchanged since
     *  the suggestion was served) also takes the suggestion off the screen: VS Code keeps it, away from the
     *  cursor, when it came while the editor had no focus (the go-to-line box open), and a partial accept
     *  then inserts it there. Typing moves the cursor with a new version, and keeps it. */
    cursorMoved(uri: string, position: vscode.Position, version?: number): void {
        const key = this.inFlight?.key;
        if (key !== undefined && key.uri === uri && (key.line !== position.line || key.character !== position.character)) {
            this.cancel();
        }
        const shown = this.lastShown;
        if (shown !== undefined && shown.uri === uri && version !== undefined && version === this.lastShownVersion
            && (shown.line !== position.line || shown.character !== position.character)) {
            this.lastShown = undefined;
            void vscode.commands.executeCommand(HIDE_INLINE_SUGGEST);
        }
    }

    private send(key: Key, request: (token: vscode.CancellationToken) => ReturnType<ProvideInlineCompletions>): InFlight {
        const source = new vscode.CancellationTokenSource();
        const sentAt = this.now();
        const inFlight: InFlight = {
            id: this.nextId++, key, source, answer: Promise.resolve(undefined), settled: false, result: undefined, servedDraft: false,
        };
        this.events.started();
        inFlight.answer = new Promise<InlineResult>((resolve) => resolve(request(source.token))).then(
            (result) => {
                const texts = source.token.isCancellationRequested ? [] : textsAt(result, key);
                const answered = texts.length > 0;
                this.settle(inFlight, answered ? texts : undefined, answered ? this.now() - sentAt : undefined);
                return inFlight.result;
            },
            () => {
                const draftShown = inFlight.servedDraft && this.inFlight === inFlight;
                this.settle(inFlight, undefined, undefined);
                if (draftShown) {
                    // A failed request sends no final draft that would take its drafts off the screen: VS Code
                    // is asked again, and gets the empty answer kept for it.
                    this.setShown(false);
                    this.showAgain();
                }
                return inFlight.result;
            },
        );
        this.inFlight = inFlight;
        return inFlight;
    }

    private settle(inFlight: InFlight, result: string[] | undefined, latencyMs: number | undefined): void {
        inFlight.settled = true;
        inFlight.result = result;
        inFlight.source.dispose();
        if (result === undefined && this.inFlight === inFlight) {
            if (inFlight.servedDraft) {
                // Its drafts were shown: the empty answer is kept, so that the call the final draft
                // triggered takes them off the screen instead of asking the model again.
                inFlight.result = [];
            } else {
                // An empty or failed answer is not kept, so the next call at this position asks again.
                this.inFlight = undefined;
            }
        }
        this.events.settled(latencyMs);
    }

    /** Items that insert `texts` at `position` and, once accepted, end the request they came from. */
    private items(inFlight: InFlight, texts: string[] | undefined, position: vscode.Position): vscode.InlineCompletionItem[] | undefined {
        if (texts === undefined) {
            return undefined;
        }
        if (texts.length > 0 && this.inFlight === inFlight) {
            this.setShown(true);
            const { uri, line, character, lineText } = inFlight.key;
            this.lastShown = { uri, line, character, lineText, text: texts[0] };
            this.lastShownVersion = inFlight.key.version;
        } else if (this.inFlight === inFlight) {
            this.lastShown = undefined; // the empty answer takes it off the screen: nothing to type through
        }
        const command: vscode.Command = { title: 'Accept LLaDA completion', command: ACCEPTED_COMMAND, arguments: [inFlight.id] };
        return texts.map((text) => new vscode.InlineCompletionItem(text, new vscode.Range(position, position), command));
    }

    /** Makes VS Code ask again now and show what `provide` serves, in place of what it shows.
     *
     *  A plain trigger does not: VS Code keeps a suggestion on screen through an explicit trigger while it
     *  stays valid (it heads the new list), and answers an automatic one at the same place and version
     *  from what it fetched last, so the drafts after the first and the final answer never showed. Hiding
     *  first would work, at the price of a frame without ghost text on every draft. What VS Code does
     *  fetch again, and shows in place of the old suggestion, is an automatic request to a provider that
     *  the last fetch did not ask: so each time a provider is registered anew (serving `provide`, like the
     *  client's), and the trigger names this extension's providers, of which VS Code takes the newest. A
     *  VS Code that does not know the trigger's arguments triggers explicitly, as before. */
    private showAgain(): void {
        const next = this.next;
        if (next === undefined) {
            return;
        }
        const previous = this.registration;
        this.registration = vscode.languages.registerInlineCompletionItemProvider(DOCUMENTS, {
            provideInlineCompletionItems: (document, position, context, token) => this.provide(document, position, context, token, next),
        });
        previous?.dispose();
        void vscode.commands.executeCommand(TRIGGER_INLINE_SUGGEST, { providerId: this.extensionId, explicit: false });
    }

    dispose(): void {
        this.cancel();
        this.registration?.dispose();
        this.registration = undefined;
    }

    private setShown(shown: boolean): void {
        if (this.shown !== shown) {
            this.shown = shown;
            void vscode.commands.executeCommand('setContext', SHOWN_CONTEXT, shown);
        }
    }
}

/** The text of a line (a document that cannot say: none). */
function lineText(document: vscode.TextDocument, line: number): string {
    return line < document.lineCount ? document.lineAt(line).text : '';
}

function sameKey(a: Key, b: Key): boolean {
    return a.uri === b.uri && a.version === b.version && a.line === b.line
        && a.character === b.character && a.selected === b.selected;
}

/** The texts of `result` that insert at the cursor of `key` and show something. The server sends the
 *  empty range at the cursor; an item with another range would replace text that its ghost text does
 *  not show, and is not served. An item without a range is served at the cursor, since VS Code would
 *  replace the word at the cursor through the end of the line with it. A snippet inserts other text
 *  than it shows; whitespace alone shows nothing. */
export function textsAt(result: InlineResult, key: { line: number; character: number }): string[] {
    if (result === null || result === undefined) {
        return [];
    }
    const atCursor = (p: vscode.Position) => p.line === key.line && p.character === key.character;
    return (Array.isArray(result) ? result : result.items)
        .filter((item) => item.range === undefined || (atCursor(item.range.start) && atCursor(item.range.end)))
        .map((item) => item.insertText)
        .filter((text): text is string => typeof text === 'string' && text.trim() !== '');
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
