/** Entry point: starts llada-lsp (or connects to a running one) and wires the client to the ghost-text
 *  drafts, the reviewed rewrites, the status bar and the commands. The wired pieces know nothing of each other. */
import { randomUUID } from 'crypto';
import * as net from 'net';
import * as vscode from 'vscode';
import {
    CancellationToken, ClientCapabilities, DidChangeConfigurationNotification, ExecuteCommandRequest, LanguageClient,
    LanguageClientOptions, ProgressToken, ServerOptions, State, StaticFeature, StreamInfo,
    WorkDoneProgress, WorkDoneProgressCreateRequest,
} from 'vscode-languageclient/node';
import { Draft, DRAFT_METHOD } from './drafts';
import { ACCEPTED_COMMAND, DOCUMENTS, InlineCompletions } from './inline';
import { ACCEPT_NEXT_EDIT, DISMISS_NEXT_EDIT, NEXT_EDIT_METHOD, NextEditAnswer, NextEdits, vscodeUi } from './nextEdit';
import { EditReview } from './review';
import { errorNotice, resultNotice, RewriteResult, showNotice } from './rewrite';
import {
    LladaSettings, parseTcpAddress, readSettings, RESTART_KEYS, SECTION, serverArgs, ServerSettings, tcpTokenLine,
    toggleInlineMode, toInitializationOptions,
} from './settings';
import { ServerStatus, STATUS_NOTIFICATION, StatusIndicator } from './status';
import { TestLog } from './testHook';
import { TraceChannel } from './trace';

const REWRITE_COMMAND = 'llada.rewriteSelection';
const TOGGLE_COMMAND = 'llada.toggleMode';
const RESTART_COMMAND = 'llada.restartServer';
const SERVER_STATUS_COMMAND = 'llada.status';
/** Commands the server advertises that this extension registers itself, adding the editor's state. */
const OWN_SERVER_COMMANDS = new Set([REWRITE_COMMAND]);
const STATUS_POLL_MS = 2000;
const SHOW_OUTPUT = 'Show Output';
/** How long the client is given to restart a failed server before the failure is notified. */
const FAILURE_SETTLE_MS = 1000;

/** The parts of the extension that outlive a server restart. */
interface Shared {
    status: StatusIndicator;
    review: EditReview;
    output: vscode.LogOutputChannel;
    trace: TraceChannel;
    extensionId: string;
    /** The test hook (testHook.ts): undefined unless LLADA_VSCODE_TEST_LOG is set. */
    testLog: TestLog | undefined;
}

// VS Code calls deactivate() without the context, so the running extension has to be found here.
let extension: LladaExtension | undefined;

export function activate(context: vscode.ExtensionContext): void {
    extension = new LladaExtension(context.extension.id);
    context.subscriptions.push(extension);
    // Not awaited: activation should not wait for the server's initialize answer.
    void extension.restart();
}

export function deactivate(): Thenable<void> | undefined {
    const stopping = extension?.stop();
    extension = undefined;
    return stopping;
}

class LladaExtension implements vscode.Disposable {
    private readonly shared: Shared;
    private readonly disposables: vscode.Disposable[];
    private session: Session | undefined;
    private stopped = false;
    /** Restarts and stops run one after another, so two sessions never race for the server's commands. */
    private queue: Promise<void> = Promise.resolve();

    constructor(extensionId: string) {
        this.shared = {
            extensionId,
            testLog: TestLog.fromEnvironment(),
            status: new StatusIndicator(TOGGLE_COMMAND),
            review: new EditReview(),
            output: vscode.window.createOutputChannel('LLaDA', { log: true }),
            trace: new TraceChannel('LLaDA Trace', () => vscode.workspace.getConfiguration(SECTION).get('trace.server', 'off')),
        };
        this.disposables = [
            this.shared.status, this.shared.review, this.shared.output, this.shared.trace,
            vscode.commands.registerCommand(REWRITE_COMMAND, (options?: { instruction?: string }) => this.rewriteSelection(options)),
            vscode.commands.registerCommand(TOGGLE_COMMAND, () => toggleInlineMode(vscode.workspace.getConfiguration(SECTION))),
            vscode.commands.registerCommand(RESTART_COMMAND, () => this.restart()),
            vscode.workspace.onDidChangeConfiguration((event) => this.configurationChanged(event)),
        ];
        if (this.shared.testLog !== undefined) {
            this.disposables.push(this.shared.testLog.register());
        }
    }

    restart(): Promise<void> {
        return this.serialized(async () => {
            await this.stopSession();
            if (this.stopped) {
                return;
            }
            const settings = readSettings(vscode.workspace.getConfiguration(SECTION));
            this.shared.status.setInlineMode(settings.inlineMode);
            this.session = new Session(settings, this.shared);
            await this.session.start();
        });
    }

    /** Stops the server for good; returns the client's stop(). */
    stop(): Promise<void> {
        this.stopped = true;
        return this.serialized(() => this.stopSession());
    }

    dispose(): void {
        void this.stop();
        this.disposables.forEach((d) => d.dispose());
    }

    /** Failures are logged here, so callers may drop the promise. */
    private serialized(work: () => Promise<void>): Promise<void> {
        this.queue = this.queue.then(work).catch((error: Error) => this.shared.output.error('Restarting or stopping llada-lsp failed', error));
        return this.queue;
    }

    private async stopSession(): Promise<void> {
        const session = this.session;
        this.session = undefined;
        await session?.stop();
    }

    private configurationChanged(event: vscode.ConfigurationChangeEvent): void {
        if (!event.affectsConfiguration(SECTION)) {
            return;
        }
        this.shared.trace.refresh();
        if (RESTART_KEYS.some((key) => event.affectsConfiguration(`${SECTION}.${key}`))) {
            void this.restart();
            return;
        }
        const settings = readSettings(vscode.workspace.getConfiguration(SECTION));
        this.shared.status.setInlineMode(settings.inlineMode);
        this.session?.sendSettings(settings);
    }

    private async rewriteSelection(options?: { instruction?: string }): Promise<void> {
        const editor = vscode.window.activeTextEditor;
        const session = this.session;
        if (session === undefined || !session.client.isRunning()) {
            void vscode.window.showWarningMessage('LLaDA: llada-lsp is not running; see the "LLaDA" output.');
            return;
        }
        if (editor === undefined || editor.selection.isEmpty) {
            void vscode.window.showInformationMessage('LLaDA: select the code to rewrite first.');
            return;
        }
        const instruction = options?.instruction ?? await vscode.window.showInputBox({
            title: 'LLaDA: Rewrite Selection',
            prompt: 'How should the selection change? Leave empty to let the model improve it.',
            placeHolder: 'e.g. add type hints',
        });
        if (instruction === undefined) {
            return;
        }
        // Every way the rewrite can end without an edit is told, except the user's own discard or cancel.
        const cancel = new vscode.CancellationTokenSource();
        try {
            showNotice(resultNotice(await session.rewrite(editor, instruction.trim(), cancel)));
        } catch (error) {
            showNotice(errorNotice(error, cancel.token.isCancellationRequested));
        } finally {
            cancel.dispose();
        }
    }
}

/** One server process or connection, with every listener that belongs to it; stop() ends both. */
class Session {
    readonly client: LanguageClient;
    private readonly inline: InlineCompletions;
    private settings: LladaSettings;
    private readonly disposables: vscode.Disposable[] = [];
    private started: Promise<void> = Promise.resolve();
    private pollTimer: NodeJS.Timeout | undefined;
    private stopped = false;
    private starting = false;
    private failureTimer: NodeJS.Timeout | undefined;
    /** Set while a rewrite waits for its proposal, which the review then shows. */
    private proposalArrived: (() => void) | undefined;

    constructor(settings: LladaSettings, private readonly shared: Shared) {
        const { status, review } = shared;
        this.inline = new InlineCompletions(
            {
                started: () => status.requestStarted(),
                settled: (latencyMs) => {
                    status.requestSettled(latencyMs);
                    // An answer means the model is loaded, even if no progress said so.
                    if (latencyMs !== undefined && status.state !== 'ready') {
                        void this.refreshStatus();
                    }
                },
            },
            (uri) => this.client.code2ProtocolConverter.asUri(uri),
            shared.extensionId,
            undefined,
            shared.testLog && ((document, position, result, token) => shared.testLog?.served(document, position, result, token)),
        );
        const clientOptions: LanguageClientOptions = {
            documentSelector: DOCUMENTS,
            initializationOptions: toInitializationOptions(settings),
            outputChannel: shared.output,
            traceOutputChannel: shared.trace,
            middleware: {
                provideInlineCompletionItems: this.inline.provide,
                // VS Code shows completions as ghost text; the server's completion fallback would run the
                // model a second time per keystroke and supersede the inline request.
                provideCompletionItem: () => undefined,
                workspace: {
                    handleApplyEdit: (params, next) => {
                        this.proposalArrived?.();
                        return review.review(params, (p) => next(p, CancellationToken.None));
                    },
                },
            },
        };
        // The id "llada" makes the client read llada.trace.server itself.
        this.client = new LanguageClient('llada', 'LLaDA', serverOptions(settings.server), clientOptions);
        this.client.registerFeature(new LladaFeature(this));
        this.keepOwnCommands();
        this.settings = settings;
        this.startNextEdits();
        this.disposables.push(
            this.client.onDidChangeState((event) => {
                if (event.newState === State.Running) {
                    void this.refreshStatus();
                } else if (event.newState === State.Stopped && !this.stopped && !this.starting) {
                    // Not asked to stop: the server exited (the client may restart it).
                    this.failed('llada-lsp exited and was not restarted');
                } else if (event.newState === State.Stopped && status.state !== 'error') {
                    status.setState('stopped');
                }
            }),
            // Sent once per change of state (the engine service gone, back, not responding): shown at once.
            this.client.onNotification(STATUS_NOTIFICATION, (pushed: ServerStatus) => status.setServerStatus(pushed)),
            this.client.onNotification(DRAFT_METHOD, (draft: Draft) => {
                this.inline.receive(draft, vscode.window.activeTextEditor);
            }),
            vscode.workspace.onDidChangeTextDocument((event) => {
                if (event.contentChanges.length > 0) {
                    this.inline.cancel(this.client.code2ProtocolConverter.asUri(event.document.uri));
                }
            }),
            vscode.window.onDidChangeTextEditorSelection((event) =>
                this.inline.cursorMoved(this.client.code2ProtocolConverter.asUri(event.textEditor.document.uri), event.selections[0].active,
                    event.textEditor.document.version)),
            vscode.workspace.onDidCloseTextDocument((document) =>
                this.inline.forget(this.client.code2ProtocolConverter.asUri(document.uri))),
            // Run by VS Code once an inline item is accepted: the rest of its request is stopped.
            vscode.commands.registerCommand(ACCEPTED_COMMAND, (id: number) => {
                shared.testLog?.accepted(id);
                this.inline.accepted(id);
            }),
        );
    }

    start(): Promise<void> {
        this.shared.status.setState('starting');
        this.starting = true;
        this.started = this.client.start().then(
            () => {
                this.starting = false;
            },
            (error: unknown) => {
                this.starting = false;
                this.failed(`llada-lsp did not start (${error instanceof Error ? error.message : 'no reason given'})`);
            },
        );
        return this.started;
    }

    /** A server that did not start or went away is said in the status item at once and, in a notification,
     *  once the client is done: it restarts a crashing server a few times, each failure with messages of its
     *  own that name neither the server nor what to do, and ours comes last, on top of them. */
    private failed(what: string): void {
        this.shared.status.setState('error', what);
        if (this.stopped) {
            return;
        }
        this.shared.output.error(what);
        clearTimeout(this.failureTimer);
        this.failureTimer = setTimeout(() => {
            // A server that crashed once is back by now: nothing to tell.
            if (!this.stopped && !this.client.isRunning() && this.client.state !== State.Starting) {
                void vscode.window.showErrorMessage(`LLaDA: ${what}. The "LLaDA" output has the server's messages.`, SHOW_OUTPUT)
                    .then((choice) => choice === SHOW_OUTPUT && this.shared.output.show());
            }
        }, FAILURE_SETTLE_MS);
    }

    /** Disposes the session's listeners and returns the client's stop(). */
    async stop(): Promise<void> {
        this.stopped = true;
        clearTimeout(this.pollTimer);
        clearTimeout(this.failureTimer);
        this.inline.dispose();
        this.disposables.forEach((d) => d.dispose());
        // A client that is still starting cannot be stopped.
        await this.started;
        if (this.client.needsStop()) {
            return this.client.stop();
        }
    }

    sendSettings(settings: LladaSettings): void {
        this.settings = settings;
        if (this.client.isRunning()) {
            void this.client.sendNotification(DidChangeConfigurationNotification.type, {
                settings: { [SECTION]: toInitializationOptions(settings) },
            });
        }
    }

    /** Next-edit suggestions (nextEdit.ts): asked on edits, drawn, accepted and dismissed. */
    private startNextEdits(): void {
        const c2p = this.client.code2ProtocolConverter;
        const ui = vscodeUi((uri) => this.client.protocol2CodeConverter.asUri(uri));
        const versionOf = (uri: string) => vscode.workspace.textDocuments.find((d) => c2p.asUri(d.uri) === uri)?.version;
        const nextEdits = new NextEdits(
            (uri, version, position, token) => this.client.sendRequest<NextEditAnswer>(NEXT_EDIT_METHOD,
                { textDocument: { uri, version }, position }, token),
            ui, () => ({ enabled: this.settings.nextEdit, delayMs: this.settings.nextEditDelayMs }), versionOf);
        const at = (editor: vscode.TextEditor) => ({ line: editor.selection.active.line, character: editor.selection.active.character });
        this.disposables.push(
            ui, { dispose: () => nextEdits.dispose() },
            vscode.workspace.onDidChangeTextDocument((event) => {
                const editor = vscode.window.activeTextEditor;
                if (event.contentChanges.length > 0 && editor?.document === event.document) {
                    nextEdits.changed(c2p.asUri(event.document.uri), event.document.version, at(editor));
                }
            }),
            vscode.window.onDidChangeTextEditorSelection((event) =>
                nextEdits.moved(c2p.asUri(event.textEditor.document.uri), event.textEditor.document.version, at(event.textEditor))),
            vscode.languages.registerInlineCompletionItemProvider(DOCUMENTS, {
                provideInlineCompletionItems: (document, position) => {
                    const item = nextEdits.inlineItem(c2p.asUri(document.uri), document.version,
                        { line: position.line, character: position.character }, document.lineAt(position.line).text);
                    return item === undefined ? [] : [new vscode.InlineCompletionItem(item.insertText,
                        new vscode.Range(item.range.start.line, item.range.start.character, item.range.end.line, item.range.end.character))];
                },
            }),
            vscode.commands.registerCommand(ACCEPT_NEXT_EDIT, async () => {
                const editor = vscode.window.activeTextEditor;
                if (editor !== undefined) {
                    await nextEdits.accept(c2p.asUri(editor.document.uri), editor.document.version, at(editor),
                        editor.document.lineAt(editor.selection.active.line).text);
                }
            }),
            vscode.commands.registerCommand(DISMISS_NEXT_EDIT, () => nextEdits.dismiss()),
        );
    }

    /** `cancel` is cancelled if the user cancels the progress notification. */
    async rewrite(editor: vscode.TextEditor, instruction: string, cancel: vscode.CancellationTokenSource): Promise<RewriteResult | null> {
        const c2p = this.client.code2ProtocolConverter;
        const argument = {
            textDocument: { uri: c2p.asUri(editor.document.uri), version: editor.document.version },
            range: c2p.asRange(editor.selection),
            ...(instruction === '' ? {} : { instruction }),
        };
        const workDoneToken = randomUUID();
        // The notice follows the request until the proposal is up for review: the Apply/Discard question
        // must not wait under a notice that still says the selection is being rewritten.
        const proposal = new Promise<void>((resolve) => {
            this.proposalArrived = resolve;
        });
        try {
            const { request } = await vscode.window.withProgress(
                { location: vscode.ProgressLocation.Notification, title: 'LLaDA: rewriting the selection', cancellable: true },
                async (progress, token) => {
                    const cancelled = token.onCancellationRequested(() => cancel.cancel());
                    const listener = this.client.onProgress(WorkDoneProgress.type, workDoneToken, (value) => {
                        if (value.kind !== 'end' && value.message !== undefined) {
                            progress.report({ message: value.message });
                        }
                    });
                    const sent = this.client.sendRequest(ExecuteCommandRequest.type,
                        { command: REWRITE_COMMAND, arguments: [argument], workDoneToken }, cancel.token) as Promise<RewriteResult | null>;
                    try {
                        await Promise.race([sent, proposal]);
                    } finally {
                        listener.dispose();
                        cancelled.dispose();
                    }
                    return { request: sent };  // not the promise itself, which would keep the notice up
                });
            return await request;
        } finally {
            this.proposalArrived = undefined;
        }
    }

    /** Server-created work-done progress (the model load) is shown in the status bar item. */
    watchProgress(token: ProgressToken): void {
        let title = '';
        const listener = this.client.onProgress(WorkDoneProgress.type, token, (value) => {
            if (value.kind === 'begin') {
                title = value.title;
            }
            if (value.kind === 'end') {
                listener.dispose();
                this.shared.status.setProgress(undefined);
                void this.refreshStatus();
                return;
            }
            const percentage = value.percentage === undefined ? '' : ` ${Math.round(value.percentage)}%`;
            this.shared.status.setProgress(`${value.message ?? title}${percentage}`);
        });
        this.disposables.push(listener);
    }

    private async refreshStatus(): Promise<void> {
        if (this.stopped || !this.client.isRunning()) {
            return;
        }
        clearTimeout(this.pollTimer);
        try {
            const status = await this.client.sendRequest(ExecuteCommandRequest.type,
                { command: SERVER_STATUS_COMMAND, arguments: [] }) as ServerStatus | null;
            if (this.stopped || status === null) {
                return;
            }
            this.shared.status.setServerStatus(status);
            // The server need not report progress while it loads, so ask again until it is ready.
            if (status.state === 'loading' || status.state === 'unavailable') {  // until it loads, or the service is back
                this.pollTimer = setTimeout(() => void this.refreshStatus(), STATUS_POLL_MS);
            }
        } catch (error) {
            this.shared.output.warn(`${SERVER_STATUS_COMMAND} failed: ${(error as Error).message}`);
            this.shared.status.setState('ready');
        }
    }

    /** The client registers a VS Code command for each command the server advertises; the ones the
     *  extension registers itself would collide, so they are left out of the client's registration. */
    private keepOwnCommands(): void {
        const feature = this.client.getFeature(ExecuteCommandRequest.method);
        const register = feature.register.bind(feature);
        feature.register = (data) => register({
            ...data,
            registerOptions: {
                ...data.registerOptions,
                commands: data.registerOptions.commands.filter((command) => !OWN_SERVER_COMMANDS.has(command)),
            },
        });
    }
}

/** Asks for live drafts, and takes over the server's progress from the client's own progress UI: a
 *  progress token can have one handler only, and this server's progress belongs in the status bar item. */
class LladaFeature implements StaticFeature {
    constructor(private readonly session: Session) {}

    fillClientCapabilities(capabilities: ClientCapabilities): void {
        capabilities.experimental = { ...(capabilities.experimental as object | undefined), lladaDrafts: true };
    }

    initialize(): void {
        // Runs after the client's ProgressFeature registered its handler, and replaces it.
        this.session.client.onRequest(WorkDoneProgressCreateRequest.type, (params) => this.session.watchProgress(params.token));
    }

    getState(): { kind: 'static' } {
        return { kind: 'static' };
    }

    clear(): void {}
}

function serverOptions(server: ServerSettings): ServerOptions {
    if (server.tcp === '') {
        // No transport: vscode-languageclient then talks over the process's stdio without appending
        // `--stdio` to its arguments, which a server older than the flag refused (exit 2).
        return { command: server.path, args: serverArgs(server) };
    }
    return () => new Promise<StreamInfo>((resolve, reject) => {
        // Read here so a malformed address or a missing token fails the start, where the user is told about it.
        const { host, port } = parseTcpAddress(server.tcp);
        const token = tcpTokenLine(server);
        const socket = net.connect(port, host);
        socket.once('connect', () => {
            socket.write(token); // the server reads the token line before any message
            resolve({ reader: socket, writer: socket });
        });
        socket.once('error', reject);
    });
}
