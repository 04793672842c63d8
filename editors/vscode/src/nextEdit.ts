/** Next-edit suggestions (`llada/nextEdit`, docs/protocol.md): asked after an edit and `nextEditDelayMs`
 *  of idle time; a suggestion that stays on the cursor's line is an inline completion item with a range
 *  (VS Code draws it); any other is drawn as decorations (removed text struck through, new text after
 *  it) with a hint on the cursor's line, and "Accept Next Edit" (Tab) jumps to it, then applies it;
 *  "Dismiss Next Edit" (Escape), or typing on, takes it away. The logic (`NextEdits`) knows the
 *  editor only through `NextEditUi` and the server only through `request`; `vscodeUi` is VS Code's. */
import * as vscode from 'vscode';

export const NEXT_EDIT_METHOD = 'llada/nextEdit';
export const ACCEPT_NEXT_EDIT = 'llada.acceptNextEdit';
export const DISMISS_NEXT_EDIT = 'llada.dismissNextEdit';
/** Context key, true while a suggestion is drawn as decorations: package.json binds Tab and Escape. */
export const NEXT_EDIT_SHOWN = 'llada.nextEditShown';

export interface LspPosition { line: number; character: number }
export interface LspRange { start: LspPosition; end: LspPosition }
export interface NextEdit { range: LspRange; newText: string }
export interface NextEditAnswer { edits: NextEdit[]; version?: number }

export type NextEditRequest = (uri: string, version: number, position: LspPosition,
                               token: vscode.CancellationToken) => Thenable<NextEditAnswer | null | undefined>;

export interface NextEditUi {
    /** Draws the edits; `hintLine`: the cursor's line when they are elsewhere. */
    show(uri: string, edits: NextEdit[], hintLine: number | undefined): void;
    clear(): void;
    /** Asks VS Code for inline completions again (it then calls `inlineItem`). */
    triggerInline(): void;
    jump(position: LspPosition): void;
    /** Applies the edits if the document is still at `version`; whether it was. */
    apply(uri: string, version: number, edits: NextEdit[]): Thenable<boolean>;
    /** What the key does when there is nothing to accept (Tab indents). */
    fallback(): Thenable<unknown>;
}

interface Shown {
    uri: string;
    version: number;
    edits: NextEdit[];
    inline: boolean;
    jumped: boolean;
}

export interface Timers {
    set(callback: () => void, ms: number): unknown;
    clear(handle: unknown): void;
}

const realTimers: Timers = { set: (callback, ms) => setTimeout(callback, ms), clear: (h) => clearTimeout(h as NodeJS.Timeout) };

/** Whether every edit lies on `line` (one-line ranges there, one-line new text). */
export function onLine(edits: NextEdit[], line: number): boolean {
    return edits.every((e) => e.range.start.line === line && e.range.end.line === line && !e.newText.includes('\n'));
}

/** The edits of one line as one replacement: from the first's start to the last's end. */
export function mergeOnLine(lineText: string, edits: NextEdit[]): { start: number; end: number; text: string } {
    const start = edits[0].range.start.character;
    const end = edits[edits.length - 1].range.end.character;
    let text = '';
    let at = start;
    for (const edit of edits) {
        text += lineText.slice(at, edit.range.start.character) + edit.newText;
        at = edit.range.end.character;
    }
    return { start, end, text };
}

export class NextEdits {
    private shown: Shown | undefined;
    private timer: unknown;
    private inFlight: vscode.CancellationTokenSource | undefined;
    private asked: { uri: string; version: number } | undefined;
    /** The server said it cannot suggest (the SGLang backend): asking on every pause would only fail. */
    private off = false;

    constructor(
        private readonly request: NextEditRequest,
        private readonly ui: NextEditUi,
        private readonly settings: () => { enabled: boolean; delayMs: number },
        private readonly currentVersion: (uri: string) => number | undefined,
        private readonly timers: Timers = realTimers,
    ) {}

    get isShown(): boolean {
        return this.shown !== undefined;
    }

    /** The document changed (typing): what was shown goes, and a request waits for the idle time. */
    changed(uri: string, version: number, cursor: LspPosition): void {
        this.dismiss();
        this.schedule(uri, version, cursor);
    }

    /** The cursor moved: the idle time starts again, if a request is waiting for it. */
    moved(uri: string, version: number, cursor: LspPosition): void {
        if (this.timer !== undefined) {
            this.schedule(uri, version, cursor);
        }
    }

    dismiss(): void {
        this.inFlight?.cancel();
        this.inFlight = undefined;
        if (this.shown !== undefined) {
            this.shown = undefined;
            this.ui.clear();
        }
    }

    dispose(): void {
        this.timers.clear(this.timer);
        this.timer = undefined;
        this.dismiss();
    }

    private schedule(uri: string, version: number, cursor: LspPosition): void {
        this.timers.clear(this.timer);
        const { enabled, delayMs } = this.settings();
        if (!enabled || this.off) {
            this.timer = undefined;
            return;
        }
        this.timer = this.timers.set(() => {
            this.timer = undefined;
            void this.ask(uri, version, cursor);
        }, delayMs);
    }

    private async ask(uri: string, version: number, cursor: LspPosition): Promise<void> {
        if (this.currentVersion(uri) !== version || (this.asked?.uri === uri && this.asked.version === version)) {
            return;
        }
        this.asked = { uri, version };
        this.inFlight?.cancel();
        const source = new vscode.CancellationTokenSource();
        this.inFlight = source;
        let answer: NextEditAnswer | null | undefined;
        try {
            answer = await this.request(uri, version, cursor, source.token);
        } catch (error) {
            this.off = /not supported/.test((error as Error)?.message ?? '');
            return; // cancelled, or the server could not: nothing to show
        } finally {
            if (this.inFlight === source) {
                this.inFlight = undefined;
            }
        }
        const edits = answer?.edits ?? [];
        if (source.token.isCancellationRequested || edits.length === 0 || answer?.version !== version
            || this.currentVersion(uri) !== version) {
            return;
        }
        const inline = onLine(edits, cursor.line);
        this.shown = { uri, version, edits, inline, jumped: false };
        if (inline) {
            this.ui.triggerInline();
            return;
        }
        const first = edits[0].range.start.line;
        const last = edits[edits.length - 1].range.end.line;
        this.ui.show(uri, edits, cursor.line < first || cursor.line > last ? cursor.line : undefined);
    }

    /** The inline completion item for a suggestion on the cursor's line, if one is shown there. */
    inlineItem(uri: string, version: number, cursor: LspPosition, lineText: string):
        { range: LspRange; insertText: string } | undefined {
        const shown = this.shown;
        if (!shown?.inline || shown.uri !== uri || shown.version !== version || !onLine(shown.edits, cursor.line)) {
            return undefined;
        }
        const merged = mergeOnLine(lineText, shown.edits);
        return { range: { start: { line: cursor.line, character: merged.start }, end: { line: cursor.line, character: merged.end } },
                 insertText: merged.text };
    }

    /** Tab: jumps to the suggestion when the cursor is away from it, else applies it; where Tab would
     *  indent (the cursor in the line's leading whitespace, before any jump) it indents. */
    async accept(uri: string, version: number, cursor: LspPosition, lineText: string): Promise<void> {
        const shown = this.shown;
        if (shown === undefined || shown.inline || shown.uri !== uri || shown.version !== version) {
            await this.ui.fallback();
            return;
        }
        if (!shown.jumped && /^\s*$/.test(lineText.slice(0, cursor.character))) {
            await this.ui.fallback();
            return;
        }
        const first = shown.edits[0].range.start;
        const last = shown.edits[shown.edits.length - 1].range.end;
        if (!shown.jumped && (cursor.line < first.line || cursor.line > last.line)) {
            shown.jumped = true;
            this.ui.jump(first);
            this.ui.show(uri, shown.edits, undefined);
            return;
        }
        this.shown = undefined;
        this.ui.clear();
        await this.ui.apply(uri, version, shown.edits);
    }
}

/** VS Code's side: decorations, the context key, the jump and the versioned edit. */
export function vscodeUi(asUri: (uri: string) => vscode.Uri): NextEditUi & vscode.Disposable {
    const removed = vscode.window.createTextEditorDecorationType({
        textDecoration: 'line-through',
        backgroundColor: new vscode.ThemeColor('diffEditor.removedTextBackground'),
    });
    const added = vscode.window.createTextEditorDecorationType({});
    const hint = vscode.window.createTextEditorDecorationType({});
    const editorOf = (uri: string) => vscode.window.visibleTextEditors.find((e) => e.document.uri.toString() === asUri(uri).toString());
    const range = (r: LspRange) => new vscode.Range(r.start.line, r.start.character, r.end.line, r.end.character);
    const setShown = (value: boolean) => void vscode.commands.executeCommand('setContext', NEXT_EDIT_SHOWN, value);
    const clear = () => {
        for (const editor of vscode.window.visibleTextEditors) {
            editor.setDecorations(removed, []);
            editor.setDecorations(added, []);
            editor.setDecorations(hint, []);
        }
        setShown(false);
    };
    return {
        show(uri, edits, hintLine) {
            const editor = editorOf(uri);
            if (editor === undefined) {
                return;
            }
            editor.setDecorations(removed, edits.filter((e) => !range(e.range).isEmpty).map((e) => range(e.range)));
            editor.setDecorations(added, edits.filter((e) => e.newText !== '').map((e) => ({
                range: new vscode.Range(e.range.end.line, e.range.end.character, e.range.end.line, e.range.end.character),
                renderOptions: { after: {
                    contentText: e.newText.split('\n').join(' ⏎ '),
                    backgroundColor: new vscode.ThemeColor('diffEditor.insertedTextBackground'),
                } },
            })));
            editor.setDecorations(hint, hintLine === undefined ? [] : [{
                range: new vscode.Range(hintLine, Number.MAX_SAFE_INTEGER, hintLine, Number.MAX_SAFE_INTEGER),
                renderOptions: { after: {
                    contentText: `  ⇥ next edit at line ${edits[0].range.start.line + 1} (Tab)`,
                    color: new vscode.ThemeColor('editorGhostText.foreground'),
                } },
            }]);
            setShown(true);
        },
        clear,
        triggerInline() {
            void vscode.commands.executeCommand('editor.action.inlineSuggest.trigger');
        },
        jump(position) {
            const editor = vscode.window.activeTextEditor;
            if (editor !== undefined) {
                const at = new vscode.Position(position.line, position.character);
                editor.selection = new vscode.Selection(at, at);
                editor.revealRange(new vscode.Range(at, at));
            }
        },
        async apply(uri, version, edits) {
            const editor = editorOf(uri);
            if (editor === undefined || editor.document.version !== version) {
                return false;
            }
            return editor.edit((builder) => edits.forEach((e) => builder.replace(range(e.range), e.newText)));
        },
        fallback() {
            return vscode.commands.executeCommand('tab');
        },
        dispose() {
            clear();
            removed.dispose();
            added.dispose();
            hint.dispose();
        },
    };
}
