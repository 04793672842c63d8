/** The status bar item: whether the server is loading its model, ready or generating, and how long the
 *  last completion took. Knows nothing about the language client; it is told what happened. */
import * as vscode from 'vscode';

/** 'unavailable': the engine service the server uses is gone (it may come back); 'not responding': it is
 *  connected but answers nothing. */
export type ServerState = 'starting' | 'loading' | 'ready' | 'error' | 'unavailable' | 'not responding' | 'stopped';

/** The server's push of its status, sent once per change of state, with the `llada.status` result. */
export const STATUS_NOTIFICATION = 'llada/status';

/** The result of the server's `llada.status` command, and the params of `llada/status` (docs/protocol.md). */
export interface ServerStatus {
    model: string;
    state: 'loading' | 'ready' | 'error' | 'unavailable' | 'not responding';
    /** "local", or the address of the engine service. */
    engine?: string;
    error?: string;
    inlineMode: string;
    rewriteMode: string;
}

export interface StatusView {
    state: ServerState;
    /** The server's work-done progress, e.g. "Loading model 40%", while it reports one. */
    progress: string | undefined;
    pending: number;
    latencyMs: number | undefined;
    inlineMode: string;
    model: string | undefined;
    error: string | undefined;
}

export function statusText(view: StatusView): string {
    if (view.progress !== undefined || view.state === 'loading' || view.state === 'starting') {
        return `$(loading~spin) LLaDA ${view.progress ?? (view.state === 'starting' ? 'starting' : 'loading')}`;
    }
    if (view.state === 'error') {
        return '$(error) LLaDA';
    }
    if (view.state === 'unavailable' || view.state === 'not responding') {
        return `$(debug-disconnect) LLaDA ${view.state}`;
    }
    if (view.state === 'stopped') {
        return '$(circle-slash) LLaDA';
    }
    const icon = view.pending > 0 ? '$(sync~spin)' : '$(sparkle)';
    const latency = view.latencyMs === undefined ? '' : ` ${Math.round(view.latencyMs)} ms`;
    return `${icon} LLaDA ${view.inlineMode}${latency}`;
}

export function statusTooltip(view: StatusView): string {
    const lines = [
        `llada-lsp: ${view.state}${view.pending > 0 ? ', generating' : ''}`,
        `Model: ${view.model ?? 'unknown'}`,
        `Inline mode: ${view.inlineMode} (click to toggle)`,
    ];
    if (view.latencyMs !== undefined) {
        lines.push(`Last completion: ${Math.round(view.latencyMs)} ms`);
    }
    if (view.error !== undefined) {
        lines.push(`Error: ${view.error}`);
    }
    return lines.join('\n');
}

export class StatusIndicator implements vscode.Disposable {
    private readonly item: vscode.StatusBarItem;
    private readonly view: StatusView = {
        state: 'starting', progress: undefined, pending: 0, latencyMs: undefined, inlineMode: 'speed', model: undefined, error: undefined,
    };

    constructor(toggleCommand: string) {
        this.item = vscode.window.createStatusBarItem('llada.status', vscode.StatusBarAlignment.Right, 100);
        this.item.name = 'LLaDA';
        this.item.command = toggleCommand;
        this.render();
        this.item.show();
    }

    get state(): ServerState {
        return this.view.state;
    }

    setState(state: ServerState, error?: string): void {
        this.view.state = state;
        this.view.error = error;
        if (state !== 'loading') {
            this.view.progress = undefined;
        }
        if (state === 'stopped' || state === 'starting') {
            this.view.pending = 0;
        }
        this.render();
    }

    setServerStatus(status: ServerStatus): void {
        this.view.model = status.model;
        this.view.inlineMode = status.inlineMode;
        this.setState(status.state, status.error);
    }

    setProgress(progress: string | undefined): void {
        this.view.progress = progress;
        this.render();
    }

    setInlineMode(mode: string): void {
        this.view.inlineMode = mode;
        this.render();
    }

    requestStarted(): void {
        this.view.pending += 1;
        this.render();
    }

    requestSettled(latencyMs: number | undefined): void {
        this.view.pending = Math.max(0, this.view.pending - 1);
        if (latencyMs !== undefined) {
            this.view.latencyMs = latencyMs;
        }
        this.render();
    }

    dispose(): void {
        this.item.dispose();
    }

    private render(): void {
        this.item.text = statusText(this.view);
        this.item.tooltip = statusTooltip(this.view);
        this.item.backgroundColor = ['error', 'unavailable', 'not responding'].includes(this.view.state)
            ? new vscode.ThemeColor('statusBarItem.errorBackground')
            : undefined;
    }
}
