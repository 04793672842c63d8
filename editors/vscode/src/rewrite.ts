/** What the user is told when **LLaDA: Rewrite Selection** ends without applying anything. The server
 *  refuses a rewrite that would break the code, that changes nothing, or whose instruction the model
 *  cannot follow; each refusal is shown as a warning with the server's reason, never as silence. Only
 *  what the user did (discarding the proposal, cancelling the progress) goes unsaid. */
import * as vscode from 'vscode';
import { DISCARDED } from './review';

/** The server's answer to `llada.rewriteSelection` (docs/protocol.md). */
export interface RewriteResult {
    applied: boolean;
    /** False when the model proposed no change; absent from older servers. */
    changed?: boolean;
    text: string;
    /** Why nothing was applied. */
    reason?: string;
}

export interface Notice {
    severity: 'warning' | 'error';
    message: string;
}

const REQUEST_CANCELLED = -32800;
/** Codes of a request the server understood and declined (LSP RequestFailed, JSON-RPC InvalidParams). */
const REFUSALS = new Set([-32803, -32602]);

/** The notice for a command result; undefined when the rewrite was applied or the user discarded it. */
export function resultNotice(result: unknown): Notice | undefined {
    if (typeof result !== 'object' || result === null) {
        return { severity: 'warning', message: 'LLaDA: the rewrite was not applied: llada-lsp gave no result.' };
    }
    const { applied, changed, reason } = result as Partial<RewriteResult>;
    if (applied === true || reason === DISCARDED) {
        return undefined;
    }
    const why = typeof reason === 'string' && reason.trim() !== ''
        ? withoutPrefix(reason)
        : changed === false ? 'the model proposed no change' : 'llada-lsp gave no reason';
    return { severity: 'warning', message: `LLaDA: the rewrite was not applied: ${sentence(why)}` };
}

/** The notice for a failed command request; undefined when the user cancelled it. */
export function errorNotice(error: unknown, cancelledByUser: boolean): Notice | undefined {
    const code = (error as { code?: unknown } | null)?.code;
    const message = withoutPrefix(error instanceof Error ? error.message : String(error)) || 'llada-lsp gave no reason';
    if (code === REQUEST_CANCELLED) {
        return cancelledByUser ? undefined : { severity: 'warning', message: `LLaDA: the rewrite was cancelled by llada-lsp: ${sentence(message)}` };
    }
    if (typeof code === 'number' && REFUSALS.has(code)) {
        return { severity: 'warning', message: `LLaDA: the rewrite was refused: ${sentence(message)}` };
    }
    return { severity: 'error', message: `LLaDA: the rewrite failed: ${sentence(message)}` };
}

export function showNotice(notice: Notice | undefined): void {
    if (notice?.severity === 'warning') {
        void vscode.window.showWarningMessage(notice.message);
    } else if (notice?.severity === 'error') {
        void vscode.window.showErrorMessage(notice.message);
    }
}

/** The server starts its messages with "llada: ", which the notices already say. */
function withoutPrefix(message: string): string {
    return message.trim().replace(/^llada:\s*/i, '');
}

function sentence(text: string): string {
    return /[.!?]$/.test(text) ? text : `${text}.`;
}
