"""Drives a headless Neovim that runs the llada plugin against a llada-lsp server over stdio.

Owns the editor process and polling with deadlines; knows nothing about the model behind the server.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pynvim
import pytest

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]
PLUGIN_DIR = REPO / "editors" / "nvim"

# The model runs on a small shared CPU: loading it and denoising the first completion can take a while.
TIMEOUT_S = float(os.environ.get("LLADA_TEST_TIMEOUT", "300"))

# Lua the tests install next to the plugin: a log of what the user saw, in the order it happened.
# Every draft render records the ghost text on screen right after the plugin drew it.
_PROBE_LUA = r"""
local api = vim.api
local probe = { log = {} }
_G.llada_probe = probe
local namespaces = {
  llada = api.nvim_create_namespace('llada'),
  builtin = api.nvim_create_namespace('nvim.lsp.inline_completion'),
}

local function chunks_text(chunks)
  local parts = {}
  for _, chunk in ipairs(chunks or {}) do
    parts[#parts + 1] = chunk[1]
  end
  return table.concat(parts)
end

-- The ghost text on screen: {source, row, col, text}, or nil when there is none.
function probe.ghost(bufnr)
  bufnr = bufnr or api.nvim_get_current_buf()
  for _, source in ipairs({ 'llada', 'builtin' }) do
    local mark = api.nvim_buf_get_extmarks(bufnr, namespaces[source], 0, -1, { details = true })[1]
    if mark then
      local lines = { chunks_text(mark[4].virt_text) }
      for _, virt_line in ipairs(mark[4].virt_lines or {}) do
        lines[#lines + 1] = chunks_text(virt_line)
      end
      return { source = source, row = mark[2], col = mark[3], text = table.concat(lines, '\n') }
    end
  end
end

local group = api.nvim_create_augroup('llada_probe', { clear = true })
api.nvim_create_autocmd('User', {
  group = group,
  pattern = 'LladaDraft',
  callback = function(args)
    local d = args.data
    probe.log[#probe.log + 1] =
      { kind = 'draft', step = d.step, final = d.final, text = d.text, ghost = probe.ghost(d.bufnr) }
  end,
})
api.nvim_create_autocmd('User', {
  group = group,
  pattern = 'LladaRewrite',
  callback = function(args)
    probe.log[#probe.log + 1] = { kind = 'rewrite', result = args.data.result, error = args.data.error }
  end,
})
api.nvim_create_autocmd('LspRequest', {
  group = group,
  callback = function(args)
    local request = args.data.request
    probe.log[#probe.log + 1] = { kind = 'request', method = request.method, type = request.type }
  end,
})

-- Each inline completion answer as the server sent it, logged before anyone draws it: the text of its
-- first item ('' for none), so a test can hold what is on screen against it.
local wrapped = {}
api.nvim_create_autocmd('LspAttach', {
  group = group,
  callback = function(args)
    local client = vim.lsp.get_client_by_id(args.data.client_id)
    if not client or client.name ~= 'llada' or wrapped[client.id] then
      return
    end
    wrapped[client.id] = true
    local request = client.request
    function client.request(self, method, params, handler, ...)
      if method == 'textDocument/inlineCompletion' and handler then
        local on_reply = handler
        handler = function(err, result, ctx)
          local item = (result and (result.items or result) or {})[1]
          local text = item and (type(item.insertText) == 'table' and item.insertText.value or item.insertText)
          probe.log[#probe.log + 1] = { kind = 'answer', text = text or '', error = err and err.message }
          return on_reply(err, result, ctx)
        end
      end
      return request(self, method, params, handler, ...)
    end
  end,
})

local notify = vim.notify
vim.notify = function(msg, level, opts)
  probe.log[#probe.log + 1] = { kind = 'notify', msg = msg, level = level }
  return notify(msg, level, opts)
end
"""


# The error lines of `:messages` (Neovim says an error as "Error ...", "E123: ..." or a Lua traceback)
# and v:errmsg, which holds the last error message even once the message area was cleared.
_ERRORS_LUA = r"""
local out = {}
local messages = vim.api.nvim_exec2('messages', { output = true }).output
for _, line in ipairs(vim.split(messages, '\n', { plain = true })) do
  if line:find('^Error') or line:find('^E%d+:') or line:find('stack traceback') or line:find('^%s*%S+%.lua:%d+:') then
    out[#out + 1] = line
  end
end
if vim.v.errmsg ~= '' then
  out[#out + 1] = 'v:errmsg: ' .. vim.v.errmsg
end
return out
"""


_GHOST_PROBLEMS_LUA = r"""
local api = vim.api
local buf, win = api.nvim_get_current_buf(), api.nvim_get_current_win()
local inserting = api.nvim_get_mode().mode:find('^i') ~= nil
local cursor_row = api.nvim_win_get_cursor(win)[1] - 1
local out = {}
local inline = {
  llada = api.nvim_create_namespace('llada'),
  builtin = api.nvim_create_namespace('nvim.lsp.inline_completion'),
}
local others = { next_edit = api.nvim_create_namespace('llada.next_edit') }
local function check(bufnr, name, ns, at_cursor)
  local count = api.nvim_buf_line_count(bufnr)
  for _, m in ipairs(api.nvim_buf_get_extmarks(bufnr, ns, 0, -1, { details = true })) do
    local row, col = m[2], m[3]
    local where = ('%s mark in buffer %d at (%d, %d)'):format(name, bufnr, row, col)
    local line = row < count and api.nvim_buf_get_lines(bufnr, row, row + 1, true)[1]
    if not line then
      out[#out + 1] = where .. ': past the last line (' .. count .. ')'
    elseif col > #line then
      out[#out + 1] = where .. ': past the end of its line ' .. vim.inspect(line)
    end
    if at_cursor then
      if bufnr ~= buf or not inserting then
        out[#out + 1] = where .. ': shown outside insert mode in the current buffer'
      elseif row ~= cursor_row then
        out[#out + 1] = where .. ': not on the cursor line ' .. cursor_row
      end
    end
  end
end
for _, bufnr in ipairs(api.nvim_list_bufs()) do
  if api.nvim_buf_is_loaded(bufnr) then
    for name, ns in pairs(inline) do
      check(bufnr, name, ns, true)
    end
    for name, ns in pairs(others) do
      check(bufnr, name, ns, false)
    end
  end
end
return out
"""


def server_cmd() -> list[str]:
    """The server the plugin starts: the real one, unless LLADA_TEST_SERVER_CMD names another."""
    override = os.environ.get("LLADA_TEST_SERVER_CMD")
    return shlex.split(override) if override else [sys.executable, "-m", "llada_lsp"]


def nvim_binary() -> str | None:
    """LLADA_TEST_NVIM, else the nvim installed in this virtual environment, else the one on PATH."""
    explicit = os.environ.get("LLADA_TEST_NVIM")
    if explicit:
        return explicit
    venv_nvim = Path(sys.executable).parent / "nvim"
    return str(venv_nvim) if venv_nvim.exists() else shutil.which("nvim")


def nvim_version(binary: str) -> tuple[int, int]:
    first_line = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    major, minor = first_line.split()[1].lstrip("v").split(".")[:2]
    return int(major), int(minor)


def wait_for(
    condition: Callable[[], T], what: str, timeout_s: float = TIMEOUT_S, detail: Callable[[], str] | None = None
) -> T:
    """Polls {condition} until it returns something truthy, and returns that; fails after the deadline,
    with {detail}() in the message."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = f"; {detail()}" if detail else ""
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}{extra}")
        time.sleep(0.05)


class Editor:
    """One headless Neovim with the plugin set up, editing one file."""

    def __init__(self, binary: str, workdir: Path, setup_opts: dict[str, Any], env: dict[str, str] | None = None):
        self.nvim = pynvim.attach("child", argv=[binary, "--embed", "--clean", "--headless"])
        # The server inherits the editor's environment (e.g. LLADA_LSP_TEST_STEP_DELAY_MS).
        for name, value in (env or {}).items():
            self.nvim.exec_lua("vim.env[...] = select(2, ...)", name, value)
        self.nvim.exec_lua("vim.opt.runtimepath:prepend(...)", str(PLUGIN_DIR))
        self.nvim.exec_lua(_PROBE_LUA)
        opts = {"cmd": server_cmd(), **setup_opts}
        self.nvim.exec_lua("require('llada').setup(...)", opts)
        self.workdir = workdir

    def lua(self, code: str, *args: Any) -> Any:
        return self.nvim.exec_lua(code, *args)

    def open(self, name: str, text: str, wait_loaded: bool = True) -> None:
        """Opens a file with {text} and waits until the llada server has attached and initialized, and
        (unless not {wait_loaded}) until its model has loaded."""
        path = self.workdir / name
        path.write_text(text)
        self.nvim.command(f"edit {path}")
        wait_for(
            lambda: self.lua(
                "local c = vim.lsp.get_clients({ bufnr = 0, name = 'llada' })[1] return c ~= nil and c.initialized"
            ),
            "the llada server to attach",
        )
        if not wait_loaded:
            return
        # A test that types starts once the load has ended: what it times is then the completion alone.
        wait_for(
            lambda: self.lua("return require('llada').statusline()") not in ("llada: starting", "llada: loading"),
            "the model to load",
        )

    def lines(self) -> list[str]:
        return self.nvim.current.buffer[:]

    def text(self) -> str:
        return "\n".join(self.lines())

    def mode(self) -> str:
        return self.nvim.api.get_mode()["mode"]

    def cursor(self) -> tuple[int, int]:
        row, col = self.nvim.current.window.cursor
        return row, col

    def ghost(self) -> dict[str, Any] | None:
        return self.lua("return llada_probe.ghost()")

    def ghost_problems(self) -> list[str]:
        """Ghost text where it must not be: an inline completion's mark (the plugin's or the built-in
        completer's) off the cursor's line, past its end, or shown outside insert mode; any of the
        plugin's marks (next edits included) past the end of its line."""
        return self.lua(_GHOST_PROBLEMS_LUA)

    def errors(self) -> list[str]:
        """What the editor said went wrong since the last clear_errors(): error lines of `:messages`
        (an autocommand's or a callback's error, a Lua traceback), and v:errmsg."""
        return self.lua(_ERRORS_LUA)

    def clear_errors(self) -> None:
        self.lua("vim.cmd.messages('clear') vim.v.errmsg = ''")

    def ghost_and_generating(self) -> tuple[dict[str, Any] | None, bool]:
        """The ghost text on screen and whether an inline request is still pending, read at one moment:
        between two calls the answer may land, and a draft read before it would pass for the answer."""
        now = self.lua(
            "return { ghost = llada_probe.ghost(),"
            " generating = require('llada.draft').is_pending(vim.api.nvim_get_current_buf()) }"
        )
        return now.get("ghost"), now["generating"]

    def log(self) -> list[dict[str, Any]]:
        return self.lua("return llada_probe.log")

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.log() if e["kind"] == kind]

    def wait_ghost(self) -> dict[str, Any]:
        """The final ghost text of the latest inline request: shown once no inline request is pending."""

        def settled() -> dict[str, Any] | None:
            ghost, generating = self.ghost_and_generating()
            return ghost if ghost and ghost["text"] and not generating else None

        return wait_for(
            settled,
            "an inline completion to be shown",
            detail=lambda: f"ghost {self.ghost()!r}, latest events {self.log()[-6:]!r}",
        )

    def screen(self, width: int = 120, height: int = 40) -> Screen:
        """A UI attached to this Neovim: the screen a user would see, kept up to date."""
        return Screen(self.nvim.eval("serverstart()"), width, height)

    def close(self) -> None:
        """Stops the servers (politely, then by force) so no model process outlives the test."""
        stop = "vim.lsp.stop_client(vim.lsp.get_clients(), ...)"
        self.lua(stop, False)
        try:
            wait_for(lambda: self.lua("return #vim.lsp.get_clients() == 0"), "the server to stop", 15)
        finally:
            self.lua(stop, True)
            self.nvim.command("qa!", async_=True)
            self.nvim.close()


class Screen:
    """What a terminal showing this Neovim shows: a UI attached over a second connection (the editor's own
    may be blocked, e.g. while inputlist() waits), which applies the `redraw` events of the one composed
    grid (ext_linegrid without ext_multigrid: floats and messages are drawn into it) on its own thread.
    text() is the screen as of the last `flush`, which is when a terminal UI paints."""

    def __init__(self, address: str, width: int, height: int):
        self._lock = threading.Lock()
        self._grid: list[list[str]] = [[" "] * width for _ in range(height)]
        self._painted = ""
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(address, width, height), daemon=True)
        self._thread.start()
        assert self._ready.wait(30), "the UI did not attach"

    def _run(self, address: str, width: int, height: int) -> None:
        self._nvim = pynvim.attach("socket", path=address)
        self._nvim.ui_attach(width, height, rgb=True, ext_linegrid=True)
        self._ready.set()
        self._nvim.run_loop(None, self._on_notification)

    def _on_notification(self, name: str, args: list) -> None:
        if name != "redraw":
            return
        for event, *calls in args:
            for call in calls:
                self._apply(event, call)

    def _apply(self, event: str, call: list) -> None:
        grid = self._grid
        if event == "grid_resize":
            _, width, height = call
            self._grid = [[" "] * width for _ in range(height)]
        elif event == "grid_clear":
            for row in grid:
                row[:] = [" "] * len(row)
        elif event == "grid_line":
            _, row, col, cells = call[:4]
            for cell in cells:
                text, repeat = cell[0], cell[2] if len(cell) > 2 else 1
                for _ in range(repeat):
                    grid[row][col] = text  # "" for the second half of a wide character
                    col += 1
        elif event == "grid_scroll":
            _, top, bot, left, right, rows, _cols = call
            moved = {r: grid[r + rows][left:right] for r in range(top, bot) if top <= r + rows < bot}
            for r, cells in moved.items():
                grid[r][left:right] = cells
        elif event == "flush":
            with self._lock:
                self._painted = "\n".join("".join(row).rstrip() for row in grid)

    def text(self) -> str:
        with self._lock:
            return self._painted

    def close(self) -> None:
        self._nvim.async_call(self._nvim.stop_loop)
        self._thread.join(10)


def skip_unless_path(path: str) -> None:
    """Skips a test of the built-in path (vim.lsp.inline_completion) on a Neovim older than 0.12."""
    binary = nvim_binary()
    if path == "builtin" and (nvim_version(binary) if binary else (0, 0)) < (0, 12):
        pytest.skip("vim.lsp.inline_completion needs Neovim 0.12")


@pytest.fixture
def open_editor(tmp_path: Path):
    """Starts Editors (`open_editor(env=..., **setup_opts)`) in tmp_path, and closes them after the test."""
    editors: list[Editor] = []

    def start(*, env: dict[str, str] | None = None, **setup_opts) -> Editor:
        editor = Editor(nvim_binary(), tmp_path, setup_opts, env)
        editors.append(editor)
        return editor

    yield start
    for editor in editors:
        editor.close()
