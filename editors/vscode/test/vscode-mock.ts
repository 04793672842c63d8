/** A hand-written stand-in for the parts of the `vscode` API the extension's modules use, with hooks for
 *  tests to script the user's answers and to see what was shown. Not a VS Code: no editor, no events. */

import type * as vscode from 'vscode';

export class Position {
    constructor(readonly line: number, readonly character: number) {}
}

export class Range {
    readonly start: Position;
    readonly end: Position;
    constructor(start: Position, end: Position) {
        this.start = start;
        this.end = end;
    }
    get isEmpty(): boolean {
        return this.start.line === this.end.line && this.start.character === this.end.character;
    }
}

export class Selection extends Range {
    constructor(readonly anchor: Position, readonly active: Position) {
        super(anchor, active);
    }
}

export class Uri {
    private constructor(readonly scheme: string, readonly path: string, readonly query: string) {}

    static parse(value: string): Uri {
        const match = /^([a-z][a-z0-9+.-]*):(?:\/\/)?([^?]*)(?:\?(.*))?$/i.exec(value);
        if (!match) {
            throw new Error(`not a URI: ${value}`);
        }
        return new Uri(match[1], match[2].startsWith('/') ? match[2] : `/${match[2]}`, match[3] ?? '');
    }

    static from(parts: { scheme: string; path?: string; query?: string }): Uri {
        return new Uri(parts.scheme, parts.path ?? '', parts.query ?? '');
    }

    toString(): string {
        return `${this.scheme}://${this.path}${this.query === '' ? '' : `?${this.query}`}`;
    }
}

export class Disposable {
    constructor(private readonly onDispose: () => void) {}
    dispose(): void {
        this.onDispose();
    }
}

export class CancellationTokenSource {
    private listeners: ((e: unknown) => unknown)[] = [];
    readonly token = {
        isCancellationRequested: false,
        onCancellationRequested: (listener: (e: unknown) => unknown) => {
            this.listeners.push(listener);
            return new Disposable(() => {
                this.listeners = this.listeners.filter((l) => l !== listener);
            });
        },
    };

    cancel(): void {
        if (!this.token.isCancellationRequested) {
            this.token.isCancellationRequested = true;
            [...this.listeners].forEach((listener) => listener(undefined));
        }
    }

    dispose(): void {
        this.listeners = [];
    }
}

export class InlineCompletionItem {
    constructor(readonly insertText: string, readonly range?: Range, readonly command?: vscode.Command) {}
}

export class ThemeColor {
    constructor(readonly id: string) {}
}

export class TabInputTextDiff {
    constructor(readonly original: Uri, readonly modified: Uri) {}
}

export class EventEmitter<T> {
    private listeners: ((e: T) => unknown)[] = [];
    readonly event = (listener: (e: T) => unknown) => {
        this.listeners.push(listener);
        return new Disposable(() => {
            this.listeners = this.listeners.filter((l) => l !== listener);
        });
    };

    fire(e: T): void {
        [...this.listeners].forEach((listener) => listener(e));
    }

    dispose(): void {
        this.listeners = [];
    }
}

export enum LogLevel { Off = 0, Trace = 1, Debug = 2, Info = 3, Warning = 4, Error = 5 }
export enum ConfigurationTarget { Global = 1, Workspace = 2, WorkspaceFolder = 3 }
export enum StatusBarAlignment { Left = 1, Right = 2 }

/** A document whose offsets follow VS Code's: positions past a line's end clamp to it. */
export class TextDocument {
    constructor(readonly uri: Uri, private text: string, readonly version: number) {}

    getText(): string {
        return this.text;
    }

    get lineCount(): number {
        return this.text.split('\n').length;
    }

    lineAt(line: number): { text: string } {
        return { text: this.text.split('\n')[line] ?? '' };
    }

    offsetAt(position: Position): number {
        const lines = this.text.split('\n');
        const line = Math.min(Math.max(position.line, 0), lines.length - 1);
        let offset = 0;
        for (let i = 0; i < line; i++) {
            offset += lines[i].length + 1;
        }
        return offset + Math.min(Math.max(position.character, 0), lines[line].length);
    }
}

export interface Tab {
    input: unknown;
}

/** What the code under test did, and how the scripted user answers. */
export const recorded = {
    commands: [] as { command: string; args: unknown[] }[],
    messages: [] as { message: string; items: string[]; severity: 'information' | 'warning' | 'error' }[],
    closedTabs: [] as Tab[],
    outputLines: [] as string[],
    contentProviders: new Map<string, { provideTextDocumentContent(uri: Uri): string | undefined }>(),
    configUpdates: [] as { key: string; value: unknown; target: ConfigurationTarget }[],
    /** Inline completion providers registered and not yet disposed, oldest first. */
    inlineProviders: [] as vscode.InlineCompletionItemProvider[],
};

export const scripted = {
    /** The button the user clicks on the next information message; undefined dismisses it. */
    informationAnswer: undefined as string | undefined,
    openDocuments: [] as TextDocument[],
    tabs: [] as Tab[],
};

export function reset(): void {
    recorded.commands.length = 0;
    recorded.messages.length = 0;
    recorded.closedTabs.length = 0;
    recorded.outputLines.length = 0;
    recorded.contentProviders.clear();
    recorded.configUpdates.length = 0;
    recorded.inlineProviders.length = 0;
    scripted.informationAnswer = undefined;
    scripted.openDocuments = [];
    scripted.tabs = [];
}

export const commands = {
    executeCommand(command: string, ...args: unknown[]): Promise<unknown> {
        recorded.commands.push({ command, args });
        if (command === 'vscode.diff') {
            const [original, modified] = args as Uri[];
            scripted.tabs.push({ input: new TabInputTextDiff(original, modified) });
        }
        return Promise.resolve(undefined);
    },
};

export const languages = {
    registerInlineCompletionItemProvider(_selector: unknown, provider: vscode.InlineCompletionItemProvider) {
        recorded.inlineProviders.push(provider);
        return new Disposable(() => recorded.inlineProviders.splice(recorded.inlineProviders.indexOf(provider), 1));
    },
};

export const workspace = {
    get textDocuments(): TextDocument[] {
        return scripted.openDocuments;
    },
    registerTextDocumentContentProvider(scheme: string, provider: { provideTextDocumentContent(uri: Uri): string | undefined }) {
        recorded.contentProviders.set(scheme, provider);
        return new Disposable(() => recorded.contentProviders.delete(scheme));
    },
};

export const window = {
    showInformationMessage(message: string, ...items: string[]): Promise<string | undefined> {
        recorded.messages.push({ message, items, severity: 'information' });
        return Promise.resolve(scripted.informationAnswer);
    },
    showWarningMessage(message: string, ...items: string[]): Promise<string | undefined> {
        recorded.messages.push({ message, items, severity: 'warning' });
        return Promise.resolve(undefined);
    },
    showErrorMessage(message: string, ...items: string[]): Promise<string | undefined> {
        recorded.messages.push({ message, items, severity: 'error' });
        return Promise.resolve(undefined);
    },
    tabGroups: {
        get all() {
            return [{ tabs: scripted.tabs }];
        },
        close(tabs: Tab[]): Promise<boolean> {
            recorded.closedTabs.push(...tabs);
            scripted.tabs = scripted.tabs.filter((tab) => !tabs.includes(tab));
            return Promise.resolve(true);
        },
    },
    createOutputChannel(name: string) {
        return { name, appendLine: (line: string) => recorded.outputLines.push(line), dispose() {} };
    },
    createStatusBarItem(id: string, alignment: StatusBarAlignment, priority: number) {
        return { id, alignment, priority, text: '', tooltip: '', name: '', command: '', backgroundColor: undefined, show() {}, dispose() {} };
    },
};

/** A WorkspaceConfiguration over a flat map of user values, optionally shadowed by workspace values. */
export function configuration(user: Record<string, unknown>, workspaceValues: Record<string, unknown> = {}): vscode.WorkspaceConfiguration {
    const config = {
        get<T>(key: string, defaultValue?: T): T | undefined {
            return (key in workspaceValues ? workspaceValues[key] : key in user ? user[key] : defaultValue) as T | undefined;
        },
        inspect(key: string) {
            return { key, globalValue: user[key], workspaceValue: workspaceValues[key] };
        },
        update(key: string, value: unknown, target: ConfigurationTarget): Promise<void> {
            recorded.configUpdates.push({ key, value, target });
            (target === ConfigurationTarget.Global ? user : workspaceValues)[key] = value;
            return Promise.resolve();
        },
    };
    return config as unknown as vscode.WorkspaceConfiguration;
}
