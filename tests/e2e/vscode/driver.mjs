// Drives code-server's web VS Code in headless Chromium for tests/e2e/test_vscode.py, one request per
// line: stdin takes {"id", "op", ...}, stdout answers {"id", "ok", "value"} or {"id", "ok": false,
// "error"}. The ops are what a user does (keys, typing, clicks) and what a user sees (ghost text, the
// status bar, notifications, tabs, screenshots); the test decides what to wait for.
// A failed op leaves a screenshot of the page in FAILURES (the answer's error names it).
// Usage: node driver.mjs PLAYWRIGHT_CORE_DIR CHROMIUM URL FAILURES
import { createInterface } from 'node:readline';
import { createRequire } from 'node:module';

const [playwrightDir, chromium, url, failures] = process.argv.slice(2);
const { chromium: browserType } = createRequire(import.meta.url)(playwrightDir);

// The ghost text of the active editor as the user sees it: the inline part on the cursor's line (one
// or more injected spans) and the lines of the view zone under it, '' when none shows.
function readGhost() {
    const editor = document.querySelector('.editor-instance .monaco-editor.focused')
        ?? document.querySelector('.editor-instance .monaco-editor');
    if (editor === null) {
        return '';
    }
    const inline = [...editor.querySelectorAll('.view-lines [class*="ghost-text-decoration"]')]
        .map((span) => span.textContent).join('');
    const below = [...editor.querySelectorAll('.ghost-text .view-line, .ghost-text-view-zone .view-line')]
        .map((line) => line.textContent);
    return [inline, ...below].join('\n').replace(/\u00a0/g, ' ').replace(/\n+$/, '');
}

// Records every change of the ghost text, frame by frame, so a test can see what showed in between.
function recordGhost(read) {
    const log = [];
    let last = null;
    const tick = () => {
        const now = read();
        if (now !== last) {
            log.push({ t: performance.now(), text: now });
            last = now;
        }
        window.__lladaGhostTimer = requestAnimationFrame(tick);
    };
    cancelAnimationFrame(window.__lladaGhostTimer);
    window.__lladaGhostLog = log;
    tick();
}

let browser;
let page;

const ops = {
    async open({ width, height }) {
        browser = await browserType.launch({
            executablePath: chromium,
            headless: true,
            args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update',
                '--disable-sync', '--no-first-run', '--disable-dev-shm-usage'],
        });
        page = await browser.newPage({ viewport: { width, height } });
        // Paste reads the system clipboard, which a page may write only with this permission.
        await page.context().grantPermissions(['clipboard-read', 'clipboard-write']);
        // The page's own errors go to the driver's log (stderr), for a failing test to be read by.
        page.on('pageerror', (error) => process.stderr.write(`page error: ${error.stack ?? error}\n`));
        page.on('console', (message) => {
            if (message.type() === 'error') {
                process.stderr.write(`console: ${message.text()}\n`);
            }
        });
        await page.goto(url);
        await page.waitForSelector('.monaco-workbench .statusbar', { timeout: 60000 });
        return true;
    },
    async press({ keys }) {
        for (const key of keys) {
            await page.keyboard.press(key);
        }
        return true;
    },
    async type({ text, delay }) {
        await page.keyboard.type(text, { delay: delay ?? 40 });
        return true;
    },
    ghost: () => page.evaluate(readGhost),
    /** Where the ghost text is drawn against the cursor of the active editor, in pixels: the inline part's
     *  first span and the view zone's first line (each null when none shows), the cursor's box, and the
     *  height of a line. */
    ghostPlace: () => page.evaluate(() => {
        const editor = document.querySelector('.editor-instance .monaco-editor.focused')
            ?? document.querySelector('.editor-instance .monaco-editor');
        const box = (node) => {
            if (node === null || node === undefined) {
                return null;
            }
            const r = node.getBoundingClientRect();
            return { left: r.left, top: r.top, width: r.width, height: r.height };
        };
        const inline = [...(editor?.querySelectorAll('.view-lines [class*="ghost-text-decoration"]') ?? [])]
            .find((span) => span.textContent !== '');
        return {
            inline: box(inline),
            below: box(editor?.querySelector('.ghost-text .view-line, .ghost-text-view-zone .view-line')),
            cursor: box(editor?.querySelector('.cursors-layer .cursor')),
            lineHeight: box(editor?.querySelector('.view-lines .view-line'))?.height ?? null,
        };
    }),
    async recordGhost() {
        await page.evaluate(`(${recordGhost.toString()})(${readGhost.toString()})`);
        return true;
    },
    ghostLog: () => page.evaluate(() => window.__lladaGhostLog ?? []),
    /** innerText of every element matching the selector. */
    texts: ({ selector }) => page.$$eval(selector, (nodes) => nodes.map((n) => n.innerText)),
    /** The status bar items with their text and accessible label. */
    status: () => page.$$eval('.statusbar-item', (nodes) =>
        nodes.map((n) => ({ id: n.id, text: n.innerText, label: n.getAttribute('aria-label') ?? '', className: n.className }))),
    notifications: () => page.$$eval('.notifications-toasts .notification-list-item',
        (nodes) => nodes.map((n) => ({
            message: n.querySelector('.notification-list-item-message')?.innerText ?? '',
            buttons: [...n.querySelectorAll('.monaco-button')].map((b) => b.innerText),
            progress: n.querySelector('.monaco-progress-container.active') !== null,
        }))),
    /** The toasts on screen with their severity (error, warning, info), as the icon beside each says. */
    toasts: () => page.$$eval('.notifications-toasts .notification-list-item', (nodes) => nodes.map((n) => {
        const icon = n.querySelector('.notification-list-item-icon')?.className ?? '';
        const severity = ['error', 'warning', 'info'].find((s) => icon.includes(`codicon-${s}`)) ?? '';
        return { message: n.querySelector('.notification-list-item-message')?.innerText ?? '', severity };
    })),
    /** Puts `text` on the clipboard and presses `key`, bound to VS Code's paste (headless Chromium makes
     *  no paste event of Ctrl+V). */
    async paste({ text, key }) {
        await page.evaluate((t) => navigator.clipboard.writeText(t), text);
        await page.keyboard.press(key);
        return true;
    },
    /** The messages in the notification center (the bell), newest first, as a user opening it sees them. */
    async notificationCenter() {
        await ops.command({ title: 'Notifications: Show Notifications' });
        const center = page.locator('.notifications-center');
        await center.waitFor({ state: 'visible' });
        const messages = await page.$$eval('.notifications-center .notification-list-item-message', (nodes) => nodes.map((n) => n.innerText));
        await page.keyboard.press('Escape');
        return messages;
    },
    async clickButton({ label }) {
        await page.locator('.notifications-toasts .notification-list-item .monaco-button', { hasText: label }).first().click();
        return true;
    },
    /** Runs a command by its title from the command palette, as a user would. */
    async command({ title }) {
        await page.keyboard.press('F1');
        const input = page.locator('.quick-input-widget input');
        await input.waitFor({ state: 'visible' });
        await input.fill(`>${title}`);
        const row = page.locator('.quick-input-list .monaco-list-row', { hasText: title }).first();
        await row.waitFor({ state: 'visible' });
        await input.press('Enter');
        return true;
    },
    /** The title of the quick input on screen (a command's input box, the palette), '' when none is. */
    quickInput: () => page.evaluate(() => {
        const widget = document.querySelector('.quick-input-widget');
        return widget !== null && widget.style.display !== 'none' && widget.offsetParent !== null
            ? widget.querySelector('.quick-input-title')?.textContent ?? '' : null;
    }),
    /** The cursor as the status bar says it: "Ln 4, Col 9". */
    cursor: () => page.evaluate(() => [...document.querySelectorAll('.statusbar-item')]
        .map((n) => n.innerText).find((text) => /^Ln \d+, Col \d+/.test(text)) ?? ''),
    /** Opens a workspace file by name with Quick Open. */
    async openFile({ name }) {
        await page.keyboard.press('Control+P');
        const input = page.locator('.quick-input-widget input');
        await input.waitFor({ state: 'visible' });
        await input.fill(name);
        // The list filters after the input changed: until then the recent files' list, where the file may
        // show but not first, is on screen, and Enter would open the first of it.
        const row = page.locator('.quick-input-list .monaco-list-row.focused', { hasText: name }).first();
        await row.waitFor({ state: 'visible' });
        await input.press('Enter');
        await page.locator('.tab.active', { hasText: name }).waitFor({ state: 'visible' });
        await page.waitForFunction(() => document.activeElement?.closest('.monaco-editor') !== null);
        return true;
    },
    tabs: () => page.$$eval('.tabs-container .tab', (nodes) => nodes.map((n) => ({
        label: n.getAttribute('aria-label') ?? n.innerText, active: n.classList.contains('active'),
        dirty: n.classList.contains('dirty'),
    }))),
    /** The decorated text of the active editor: struck-through spans, and the text drawn after a span. */
    decorations: () => page.evaluate(() => {
        const editor = document.querySelector('.editor-instance .monaco-editor.focused')
            ?? document.querySelector('.editor-instance .monaco-editor');
        const found = [];
        for (const span of editor?.querySelectorAll('.view-lines span span') ?? []) {
            const struck = getComputedStyle(span).textDecorationLine.includes('line-through');
            const after = getComputedStyle(span, '::after').content;
            const drawn = after !== 'none' && after !== 'normal' && after !== '' ? JSON.parse(after) : '';
            if (struck || drawn !== '') {
                found.push({ text: span.textContent.replace(/\u00a0/g, ' '), struck, after: drawn.replace(/\u00a0/g, ' ') });
            }
        }
        return found;
    }),
    diffShown: () => page.evaluate(() => document.querySelector('.editor-instance .monaco-diff-editor') !== null),
    async screenshot({ path }) {
        await page.screenshot({ path });
        return path;
    },
    async close() {
        await browser?.close();
        return true;
    },
};

const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
    const { id, op, ...args } = JSON.parse(line);
    let answer;
    try {
        answer = { id, ok: true, value: await ops[op](args) };
    } catch (error) {
        let shot = '';
        if (page !== undefined) {
            shot = `${failures}/failed-${id}-${op}.png`;
            await page.screenshot({ path: shot }).catch(() => { shot = ''; });
        }
        answer = { id, ok: false, error: `${error?.stack ?? error}${shot === '' ? '' : `\n(the page: ${shot})`}` };
    }
    process.stdout.write(`${JSON.stringify(answer)}\n`);
    if (op === 'close') {
        break;
    }
}
await browser?.close();
