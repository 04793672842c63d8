import './setup';
import assert from 'node:assert/strict';
import { beforeEach, test } from 'node:test';
import { TraceChannel } from '../src/trace';
import * as mock from './vscode-mock';

beforeEach(() => mock.reset());

test('llada.trace.server switches the trace on and off, and tells the client when it changes', () => {
    let setting = 'off';
    const channel = new TraceChannel('LLaDA Trace', () => setting);
    const levels: unknown[] = [];
    channel.onDidChangeLogLevel((level) => levels.push(level));
    assert.equal(channel.logLevel, mock.LogLevel.Off);
    channel.trace("Sending request 'initialize - (0)'.");
    assert.deepEqual(mock.recorded.outputLines, []);

    setting = 'verbose';
    channel.refresh();
    channel.refresh();
    assert.deepEqual(levels, [mock.LogLevel.Trace]);
    channel.trace("Sending request 'initialize - (0)'.");
    assert.equal(mock.recorded.outputLines.length, 1);
    assert.match(mock.recorded.outputLines[0], /\[trace\] Sending request 'initialize - \(0\)'\.$/);

    setting = 'off';
    channel.refresh();
    assert.deepEqual(levels, [mock.LogLevel.Trace, mock.LogLevel.Off]);
});
