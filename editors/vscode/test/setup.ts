/** Makes `require('vscode')` load the mock; every test file imports this first. The real module exists
 *  only inside VS Code's extension host. */
import Module = require('module');

const resolving = Module as unknown as { _resolveFilename(request: string, ...rest: unknown[]): string };
const resolveFilename = resolving._resolveFilename;
resolving._resolveFilename = function (request: string, ...rest: unknown[]): string {
    return request === 'vscode' ? require.resolve('./vscode-mock') : resolveFilename.call(this, request, ...rest);
};
