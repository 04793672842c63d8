/** The `llada.*` settings: how they are read, how they become the server's initializationOptions, and
 *  how the server is reached. Knows nothing about the language client. */
import * as fs from 'fs';
import * as os from 'os';
import * as vscode from 'vscode';

export type Mode = 'speed' | 'quality';

export interface ServerSettings {
    path: string;
    args: string[];
    /** "host:port" of a running `llada-lsp --tcp`; empty starts the server over stdio. */
    tcp: string;
    /** `--engine`: auto, local, unix:PATH or tcp://HOST:PORT; empty leaves it to the server. */
    engine: string;
    /** The token file for TCP: `--token-file` of a server started over stdio (for an engine service on
     *  TCP), and the token sent first to a server at `tcp`; empty passes none. */
    tokenFile: string;
}

export interface LladaSettings {
    model: string;
    inlineMode: Mode;
    rewriteMode: Mode;
    maxCompletionTokens: number;
    contextTokens: number;
    nextEdit: boolean;
    nextEditDelayMs: number;
    revise: boolean;
    server: ServerSettings;
}

/** The object of docs/protocol.md "initializationOptions / workspace/didChangeConfiguration". */
export interface InitializationOptions {
    model?: string;
    inlineMode: Mode;
    rewriteMode: Mode;
    maxCompletionTokens: number;
    contextTokens: number;
    nextEdit: boolean;
    nextEditDelayMs: number;
    revise: boolean;
}

export interface TcpAddress {
    host: string;
    port: number;
}

/** The part of vscode.WorkspaceConfiguration that reading needs. */
export interface SettingsSource {
    get<T>(section: string, defaultValue: T): T;
}

export const SECTION = 'llada';

/** Keys (below `llada.`) whose change needs a new server process or connection. */
export const RESTART_KEYS = ['server.path', 'server.args', 'server.tcp', 'engine', 'engineTokenFile'];

export function readSettings(config: SettingsSource): LladaSettings {
    return {
        model: config.get<string>('model', '').trim(),
        inlineMode: config.get<Mode>('inlineMode', 'speed'),
        rewriteMode: config.get<Mode>('rewriteMode', 'quality'),
        maxCompletionTokens: config.get<number>('maxCompletionTokens', 64),
        contextTokens: config.get<number>('contextTokens', 1024),
        nextEdit: config.get<boolean>('nextEdit', true),
        nextEditDelayMs: config.get<number>('nextEditDelayMs', 400),
        revise: config.get<boolean>('revise', true),
        server: {
            path: config.get<string>('server.path', 'llada-lsp').trim() || 'llada-lsp',
            args: config.get<string[]>('server.args', []),
            tcp: config.get<string>('server.tcp', '').trim(),
            engine: config.get<string>('engine', '').trim(),
            tokenFile: config.get<string>('engineTokenFile', '').trim(),
        },
    };
}

/** Values are passed as the user wrote them: the server validates them and reports a bad one with
 *  window/showMessage, so the two sides cannot disagree about what is valid. */
export function toInitializationOptions(settings: LladaSettings): InitializationOptions {
    const options: InitializationOptions = {
        inlineMode: settings.inlineMode,
        rewriteMode: settings.rewriteMode,
        maxCompletionTokens: settings.maxCompletionTokens,
        contextTokens: settings.contextTokens,
        nextEdit: settings.nextEdit,
        nextEditDelayMs: settings.nextEditDelayMs,
        revise: settings.revise,
    };
    // An empty model means "the embedded model", which the server picks when the key is absent.
    if (settings.model !== '') {
        options.model = settings.model;
    }
    return options;
}

/** The arguments of a server started over stdio: `llada.server.args`, then `--engine` and `--token-file`
 *  where those settings are set (after the user's arguments, so the dedicated settings win). */
export function serverArgs(server: ServerSettings, home: string = os.homedir()): string[] {
    const args = [...server.args];
    if (server.engine !== '') {
        args.push('--engine', server.engine);
    }
    if (server.tokenFile !== '') {
        args.push('--token-file', expandHome(server.tokenFile, home));
    }
    return args;
}

/** The first line a server on TCP reads before any message (docs/protocol.md, "Over TCP"): the token
 *  of `llada.engineTokenFile`, a file that must be the user's alone, as the server's own is. Throws
 *  with a message fit for the user. */
export function tcpTokenLine(server: ServerSettings, home: string = os.homedir()): string {
    if (server.tokenFile === '') {
        throw new Error('llada.server.tcp needs llada.engineTokenFile: the token file the server was started with (--token-file)');
    }
    const file = expandHome(server.tokenFile, home);
    if (process.platform !== 'win32' && (fs.statSync(file).mode & 0o077) !== 0) {
        throw new Error(`the token file ${file} must be closed to others (chmod 600)`);
    }
    const token = fs.readFileSync(file, 'utf8').trim();
    if (token === '' || /[\r\n]/.test(token)) {
        throw new Error(`the token file ${file} must hold the token on one line`);
    }
    return `${token}\n`;
}

/** No shell runs the server or reads the token, so a leading `~` is expanded here. */
function expandHome(file: string, home: string): string {
    return file.replace(/^~(?=$|[\\/])/, home);
}

/** Parses "host:port" or "[v6-host]:port"; throws with a message fit for the user. */
export function parseTcpAddress(value: string): TcpAddress {
    const match = /^(?:\[([^\]]+)\]|([^:\s]+)):(\d{1,5})$/.exec(value.trim());
    const port = match ? Number(match[3]) : NaN;
    if (!match || port < 1 || port > 65535) {
        throw new Error(`llada.server.tcp must look like "host:port", got "${value}"`);
    }
    return { host: match[1] ?? match[2], port };
}

export function nextMode(mode: Mode): Mode {
    return mode === 'speed' ? 'quality' : 'speed';
}

/** Flips llada.inlineMode where the user set it: a workspace value shadows the user value, so
 *  writing the user value under it would change nothing. */
export async function toggleInlineMode(config: vscode.WorkspaceConfiguration): Promise<Mode> {
    const mode = nextMode(config.get<Mode>('inlineMode', 'speed'));
    const inspected = config.inspect<Mode>('inlineMode');
    const target = inspected?.workspaceValue !== undefined
        ? vscode.ConfigurationTarget.Workspace
        : vscode.ConfigurationTarget.Global;
    await config.update('inlineMode', mode, target);
    return mode;
}
