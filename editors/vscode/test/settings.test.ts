import './setup';
import assert from 'node:assert/strict';
import { chmodSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeEach, test } from 'node:test';
import {
    parseTcpAddress, readSettings, RESTART_KEYS, serverArgs, tcpTokenLine, toggleInlineMode, toInitializationOptions,
} from '../src/settings';
import * as mock from './vscode-mock';

beforeEach(() => mock.reset());

test('defaults map to the protocol defaults and leave the model to the server', () => {
    const options = toInitializationOptions(readSettings(mock.configuration({})));
    assert.deepEqual(options, { inlineMode: 'speed', rewriteMode: 'quality', maxCompletionTokens: 64, contextTokens: 1024,
                                nextEdit: true, nextEditDelayMs: 400, revise: true });
    assert.equal('model' in options, false);
});

test('settings map to camelCase initializationOptions without the client-side keys', () => {
    const settings = readSettings(mock.configuration({
        'model': ' GSAI-ML/LLaDA-8B-Instruct ',
        'inlineMode': 'quality',
        'rewriteMode': 'speed',
        'maxCompletionTokens': 128,
        'contextTokens': 2048,
        'revise': false,
        'server.path': '/opt/llada/bin/llada-lsp',
        'server.args': ['--device', 'cuda'],
        'server.tcp': '127.0.0.1:2087',
        'engine': 'local',
        'engineTokenFile': '/run/token',
        'trace.server': 'verbose',
        'nextEdit': false,
        'nextEditDelayMs': 250,
    }));
    assert.deepEqual(toInitializationOptions(settings), {
        model: 'GSAI-ML/LLaDA-8B-Instruct', inlineMode: 'quality', rewriteMode: 'speed', maxCompletionTokens: 128, contextTokens: 2048,
        nextEdit: false, nextEditDelayMs: 250,
        revise: false,
    });
    assert.deepEqual(settings.server, {
        path: '/opt/llada/bin/llada-lsp', args: ['--device', 'cuda'], tcp: '127.0.0.1:2087', engine: 'local', tokenFile: '/run/token',
    });
});

test('the engine settings become --engine and --token-file after the server args', () => {
    const server = readSettings(mock.configuration({
        'server.args': ['--device', 'cuda'],
        'engine': ' tcp://127.0.0.1:7077 ',
        'engineTokenFile': '~/.config/llada/token',
    })).server;
    assert.deepEqual(serverArgs(server, '/home/me'), [
        '--device', 'cuda', '--engine', 'tcp://127.0.0.1:7077', '--token-file', '/home/me/.config/llada/token',
    ]);
    assert.deepEqual(serverArgs(readSettings(mock.configuration({ engine: 'unix:/run/llada.sock' })).server),
        ['--engine', 'unix:/run/llada.sock']);
    assert.deepEqual(serverArgs({ ...server, tokenFile: '/abs/~token' }, '/home/me').slice(-2), ['--token-file', '/abs/~token']);
    // Empty (the default): the server's own default, `auto`; nothing is added.
    assert.deepEqual(serverArgs(readSettings(mock.configuration({ 'server.args': ['--threads', '2'] })).server), ['--threads', '2']);
    assert.ok(RESTART_KEYS.includes('engine') && RESTART_KEYS.includes('engineTokenFile'), 'a new engine needs a new server');
});

test('the engine settings are declared, and restricted in untrusted workspaces', () => {
    const manifest = JSON.parse(readFileSync(join(__dirname, '..', '..', '..', 'package.json'), 'utf8'));
    const properties = manifest.contributes.configuration.properties;
    assert.equal(properties['llada.engine'].default, '');
    assert.equal(properties['llada.engineTokenFile'].default, '');
    const pattern = new RegExp(properties['llada.engine'].pattern);
    for (const good of ['', 'auto', 'local', 'unix:/run/user/1000/llada-lsp/engine.sock', 'tcp://127.0.0.1:7077', 'tcp://[::1]:7077']) {
        assert.ok(pattern.test(good), good);
    }
    for (const bad of ['gpu', 'unix:', 'tcp://host', '127.0.0.1:7077']) {
        assert.ok(!pattern.test(bad), bad);
    }
    const restricted = manifest.capabilities.untrustedWorkspaces.restrictedConfigurations;
    assert.ok(restricted.includes('llada.engine') && restricted.includes('llada.engineTokenFile'), restricted);
});

test('every setting that picks what runs, what it loads or what it connects to is restricted in untrusted workspaces', () => {
    // A workspace's own settings must not send the user's documents to a server it names (server.tcp),
    // nor run a command or load a model of its choosing.
    const manifest = JSON.parse(readFileSync(join(__dirname, '..', '..', '..', 'package.json'), 'utf8'));
    const restricted: string[] = manifest.capabilities.untrustedWorkspaces.restrictedConfigurations;
    for (const key of ['llada.server.path', 'llada.server.args', 'llada.server.tcp', 'llada.model', 'llada.engine', 'llada.engineTokenFile']) {
        assert.ok(restricted.includes(key), key);
        assert.ok(key in manifest.contributes.configuration.properties, `${key} is a declared setting`);
    }
});

test('an empty server path falls back to llada-lsp on PATH', () => {
    assert.equal(readSettings(mock.configuration({ 'server.path': '  ' })).server.path, 'llada-lsp');
});

test('tcp addresses parse as host:port, IPv6 in brackets', () => {
    assert.deepEqual(parseTcpAddress('localhost:2087'), { host: 'localhost', port: 2087 });
    assert.deepEqual(parseTcpAddress('[::1]:9000'), { host: '::1', port: 9000 });
    for (const bad of ['localhost', ':2087', 'host:0', 'host:70000', 'a b:1', 'host:port']) {
        assert.throws(() => parseTcpAddress(bad), /host:port/, bad);
    }
});

test('a server on TCP is sent the token of llada.engineTokenFile first, from a file closed to others', () => {
    const home = mkdtempSync(join(tmpdir(), 'llada-token-'));
    const file = join(home, 'token');
    writeFileSync(file, '  s3cret \n');
    chmodSync(file, 0o600);
    const server = readSettings(mock.configuration({ 'server.tcp': '127.0.0.1:2087', engineTokenFile: '~/token' })).server;
    assert.equal(tcpTokenLine(server, home), 's3cret\n', 'one line, as the server reads it before any message');
    assert.throws(() => tcpTokenLine({ ...server, tokenFile: '' }, home), /needs llada.engineTokenFile/);
    if (process.platform !== 'win32') {
        chmodSync(file, 0o644);
        assert.throws(() => tcpTokenLine(server, home), /closed to others/);
    }
});

test('toggle mode flips the user setting between speed and quality', async () => {
    const config = mock.configuration({ inlineMode: 'speed' });
    assert.equal(await toggleInlineMode(config), 'quality');
    assert.equal(await toggleInlineMode(config), 'speed');
    assert.deepEqual(mock.recorded.configUpdates, [
        { key: 'inlineMode', value: 'quality', target: mock.ConfigurationTarget.Global },
        { key: 'inlineMode', value: 'speed', target: mock.ConfigurationTarget.Global },
    ]);
});

test('toggle mode writes the workspace value when one shadows the user value', async () => {
    const config = mock.configuration({ inlineMode: 'speed' }, { inlineMode: 'quality' });
    assert.equal(await toggleInlineMode(config), 'speed');
    assert.deepEqual(mock.recorded.configUpdates, [{ key: 'inlineMode', value: 'speed', target: mock.ConfigurationTarget.Workspace }]);
    assert.equal(config.get('inlineMode'), 'speed');
});
