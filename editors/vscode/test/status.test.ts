import './setup';
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { StatusView, statusText } from '../src/status';

const ready: StatusView = {
    state: 'ready', progress: undefined, pending: 0, latencyMs: undefined, inlineMode: 'speed', model: 'tiny', error: undefined,
};

test('the item says loading while the model loads, with the server progress when reported', () => {
    assert.equal(statusText({ ...ready, state: 'loading' }), '$(loading~spin) LLaDA loading');
    assert.equal(statusText({ ...ready, state: 'loading', progress: 'Loading model 40%' }), '$(loading~spin) LLaDA Loading model 40%');
});

test('the item shows the mode, the last latency, and a spinner while generating', () => {
    assert.equal(statusText(ready), '$(sparkle) LLaDA speed');
    assert.equal(statusText({ ...ready, latencyMs: 183.4, inlineMode: 'quality' }), '$(sparkle) LLaDA quality 183 ms');
    assert.equal(statusText({ ...ready, latencyMs: 183.4, pending: 1 }), '$(sync~spin) LLaDA speed 183 ms');
});

test('errors and a stopped server are visible', () => {
    assert.equal(statusText({ ...ready, state: 'error', error: 'no such model' }), '$(error) LLaDA');
    assert.equal(statusText({ ...ready, state: 'stopped' }), '$(circle-slash) LLaDA');
    assert.equal(statusText({ ...ready, state: 'unavailable', error: 'the engine service is gone' }), '$(debug-disconnect) LLaDA unavailable');
    assert.equal(statusText({ ...ready, state: 'not responding' }), '$(debug-disconnect) LLaDA not responding');
});

