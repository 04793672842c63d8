/** The "LLaDA Trace" output, handed to the language client as its trace channel and switched by
 *  `llada.trace.server`. Knows nothing about the client beyond the LogOutputChannel it reads. */
import * as vscode from 'vscode';

/** The client traces only while its trace channel's log level is Trace, and a plain output's level is
 *  out of reach of any setting; this channel reports Trace exactly while llada.trace.server is not "off",
 *  so the setting alone turns the trace on and off (the client reads "messages"/"verbose" itself). */
export class TraceChannel implements vscode.LogOutputChannel {
    private readonly output: vscode.OutputChannel;
    private readonly levelChanged = new vscode.EventEmitter<vscode.LogLevel>();
    private level: vscode.LogLevel;
    readonly onDidChangeLogLevel = this.levelChanged.event;

    constructor(readonly name: string, private readonly setting: () => string) {
        this.output = vscode.window.createOutputChannel(name);
        this.level = levelFor(setting());
    }

    get logLevel(): vscode.LogLevel {
        return this.level;
    }

    /** Call when llada.trace.server may have changed. */
    refresh(): void {
        const level = levelFor(this.setting());
        if (level !== this.level) {
            this.level = level;
            this.levelChanged.fire(level);
        }
    }

    trace(message: string): void {
        this.log('trace', message);
    }

    debug(message: string): void {
        this.log('debug', message);
    }

    info(message: string): void {
        this.log('info', message);
    }

    warn(message: string): void {
        this.log('warning', message);
    }

    error(error: string | Error): void {
        this.log('error', typeof error === 'string' ? error : error.message);
    }

    append(value: string): void {
        this.output.append(value);
    }

    appendLine(value: string): void {
        this.output.appendLine(value);
    }

    replace(value: string): void {
        this.output.replace(value);
    }

    clear(): void {
        this.output.clear();
    }

    show(columnOrPreserveFocus?: vscode.ViewColumn | boolean, preserveFocus?: boolean): void {
        this.output.show(typeof columnOrPreserveFocus === 'boolean' ? columnOrPreserveFocus : preserveFocus);
    }

    hide(): void {
        this.output.hide();
    }

    dispose(): void {
        this.levelChanged.dispose();
        this.output.dispose();
    }

    private log(kind: string, message: string): void {
        if (this.level === vscode.LogLevel.Trace) {
            this.output.appendLine(`${new Date().toISOString()} [${kind}] ${message}`);
        }
    }
}

function levelFor(setting: string): vscode.LogLevel {
    return setting === 'off' ? vscode.LogLevel.Off : vscode.LogLevel.Trace;
}
