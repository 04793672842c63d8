"""End-to-end tests of the Neovim plugin: a real headless Neovim, the plugin, and the llada-lsp server.

The server is `python -m llada_lsp` (LLADA_TEST_SERVER_CMD overrides it). The assertions hold whatever
text the model proposes, as long as it proposes some at the completion point of SOURCE.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pynvim
import pytest
from nvim_helpers import Editor, nvim_binary, nvim_version, wait_for

BINARY = nvim_binary()
VERSION = nvim_version(BINARY) if BINARY else (0, 0)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(VERSION < (0, 11), reason="needs Neovim 0.11+ (nvim not found or too old)"),
]
needs_builtin = pytest.mark.skipif(VERSION < (0, 12), reason="vim.lsp.inline_completion needs Neovim 0.12")

# The completion point must be one where the embedded model proposes some text: mid-statement after
# `self.` it does, while at a fresh `return` or on an empty line it may rightly propose nothing.
SOURCE = "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        \n"
BODY_LINE = 4
INDENT = "        "
TYPED = "self."


# Each denoising step of the server sleeps this long: a draft stays on screen for a while.
SLOW_STEPS = {"LLADA_LSP_TEST_STEP_DELAY_MS": "600"}


@pytest.fixture
def open_editor(tmp_path: Path) -> Iterator:
    editors: list[Editor] = []

    def start(*, env: dict[str, str] | None = None, open_file: bool = True, **setup_opts) -> Editor:
        editor = Editor(BINARY, tmp_path, setup_opts, env)
        editors.append(editor)
        if open_file:
            editor.open("sample.py", SOURCE)
        return editor

    yield start
    for editor in editors:
        editor.close()


def type_in_function_body(editor: Editor) -> dict:
    """Types TYPED at the end of the indented line, stays in insert mode, returns the ghost text shown."""
    editor.nvim.input(f"{BODY_LINE}GA{TYPED}")
    wait_for(lambda: editor.lines()[BODY_LINE - 1] == INDENT + TYPED, "the typed text")
    assert editor.mode() == "i"
    return editor.wait_ghost()


def assert_accepted(editor: Editor, before: list[str], ghost: dict) -> None:
    """Presses the accept key and checks the ghost text landed at the cursor, with the cursor after it."""
    row, col = editor.cursor()  # col counts bytes
    line = before[row - 1].encode()
    inserted = (line[:col] + ghost["text"].encode() + line[col:]).decode()
    expected = before[: row - 1] + inserted.split("\n") + before[row:]
    editor.nvim.input("<Tab>")
    wait_for(
        lambda: editor.lines() == expected,
        f"the buffer to become {expected!r}",
        detail=lambda: f"it is {editor.lines()!r}",
    )
    last = ghost["text"].split("\n")[-1]
    end_col = (col if "\n" not in ghost["text"] else 0) + len(last.encode())
    assert editor.cursor() == (row + ghost["text"].count("\n"), end_col)


@needs_builtin
def test_typing_shows_inline_completion(open_editor):
    editor = open_editor()
    ghost = type_in_function_body(editor)
    row, col = editor.cursor()
    assert ghost["source"] == "builtin"
    assert (ghost["row"], ghost["col"]) == (row - 1, col)
    assert editor.lines()[BODY_LINE - 1] == INDENT + TYPED, "showing a completion must not edit the buffer"


@needs_builtin
def test_accept_inserts_completion(open_editor):
    editor = open_editor()
    ghost = type_in_function_body(editor)
    assert_accepted(editor, editor.lines(), ghost)


@pytest.mark.parametrize("path", ["builtin", "fallback"])
def test_draft_updates_ghost_before_final_answer(open_editor, path):
    if path == "builtin" and VERSION < (0, 12):
        pytest.skip("vim.lsp.inline_completion needs Neovim 0.12")
    editor = open_editor(force_fallback=path == "fallback", inline_mode="quality")
    final_ghost = type_in_function_body(editor)
    log = editor.log()

    drafts = [i for i, e in enumerate(log) if e["kind"] == "draft"]
    answers = [
        i
        for i, e in enumerate(log)
        if e["kind"] == "request" and e["method"] == "textDocument/inlineCompletion" and e["type"] == "complete"
    ]
    assert drafts, f"no draft was rendered: {log!r}"
    live = [i for i in drafts if not log[i]["final"] and log[i]["text"]]
    assert live, f"no intermediate draft with text was rendered: {log!r}"
    first = live[0]
    assert log[first]["ghost"] == {
        "source": "llada",
        "row": final_ghost["row"],
        "col": final_ghost["col"],
        "text": log[first]["text"],
    }, "the ghost text on screen must be the draft just received"
    answered = [i for i in answers if i > first]
    assert answered, "the draft must come before the answer of its request"
    last_draft = log[max(i for i in drafts if i < answered[-1])]
    assert last_draft["final"], "the last draft before the answer must be the final one"
    assert final_ghost["text"] == last_draft["text"], "the answer replaces the draft and equals the final draft"
    answer = [e for e in log if e["kind"] == "answer"][-1]
    assert final_ghost["text"] == answer["text"], "what is on screen once the answer is in is that answer"


def test_rewrite_range_applies_server_edit(open_editor):
    editor = open_editor(review=False)
    before = editor.lines()
    tick = editor.lua("return vim.api.nvim_buf_get_changedtick(0)")

    editor.nvim.command("1,2LladaRewrite")
    entry = wait_for(lambda: next((e for e in editor.log() if e["kind"] == "rewrite"), None), "the rewrite result")

    sent = [e for e in editor.log() if e["kind"] == "request" and e["method"] == "workspace/executeCommand"]
    assert sent, "LladaRewrite must send workspace/executeCommand"
    assert entry.get("error") is None, entry
    result = entry["result"]
    assert result["applied"], result
    assert editor.lines() == result["text"].split("\n") + before[2:]
    assert editor.lua("return vim.api.nvim_buf_get_changedtick(0)") > tick


def test_fallback_shows_and_accepts(open_editor):
    editor = open_editor(force_fallback=True)
    ghost = type_in_function_body(editor)
    row, col = editor.cursor()
    assert ghost["source"] == "llada"
    assert (ghost["row"], ghost["col"]) == (row - 1, col)
    builtin_enabled = "return vim.lsp.inline_completion ~= nil and vim.lsp.inline_completion.is_enabled({ bufnr = 0 })"
    assert not editor.lua(builtin_enabled)
    assert_accepted(editor, editor.lines(), ghost)


def test_mode_command_reaches_server(open_editor):
    editor = open_editor()
    statusline = "return require('llada').statusline()"
    wait_for(lambda: editor.lua(statusline) == "llada: ready speed", "the server to be ready")

    editor.nvim.command("LladaMode quality")
    assert editor.lua(statusline) == "llada: ready quality"
    editor.nvim.command("LladaStatus")
    wait_for(
        lambda: "inline quality" in editor.lua("return vim.api.nvim_exec2('messages', { output = true }).output"),
        "LladaStatus to echo the mode the server reports",
    )


@pytest.mark.parametrize("path", ["builtin", "fallback"])
def test_accept_key_takes_the_visible_draft(open_editor, path):
    if path == "builtin" and VERSION < (0, 12):
        pytest.skip("vim.lsp.inline_completion needs Neovim 0.12")
    editor = open_editor(env=SLOW_STEPS, force_fallback=path == "fallback", inline_mode="quality")
    editor.nvim.input(f"{BODY_LINE}GA{TYPED}")
    wait_for(lambda: editor.lines()[BODY_LINE - 1] == INDENT + TYPED, "the typed text")
    pending = "return require('llada.draft').is_pending(vim.api.nvim_get_current_buf())"

    def live_draft() -> dict | None:
        ghost = editor.ghost()
        return ghost if ghost and ghost["text"] and editor.lua(pending) else None

    wait_for(live_draft, "a draft on screen before the answer", detail=lambda: f"events {editor.log()[-6:]!r}")
    before, (row, col), seen = editor.lines(), editor.cursor(), len(editor.log())
    # Reads the screen and presses the key in one call: the next draft is a whole step away.
    shown = editor.lua("local g = llada_probe.ghost() vim.api.nvim_input('<Tab>') return g")
    assert shown and shown["source"] == "llada" and shown["text"], shown

    line = before[row - 1].encode()
    inserted = (line[:col] + shown["text"].encode() + line[col:]).decode()
    expected = before[: row - 1] + inserted.split("\n") + before[row:]
    wait_for(
        lambda: editor.lines() == expected, f"the buffer to become {expected!r}", 10, lambda: f"{editor.lines()!r}"
    )
    last = shown["text"].split("\n")[-1].encode()
    assert editor.cursor() == (row + shown["text"].count("\n"), (col if "\n" not in shown["text"] else 0) + len(last))

    # The rest of the request is cancelled: its answer never lands in the buffer, and no tab was typed.
    def cancel_acknowledged() -> bool:
        inline = [e["type"] for e in editor.log()[seen:] if e.get("method") == "textDocument/inlineCompletion"]
        return "cancel" in inline and "complete" in inline[inline.index("cancel") :]

    wait_for(cancel_acknowledged, "the rest of the request to be cancelled", 10, lambda: f"{editor.log()[-6:]!r}")
    time.sleep(1)  # more than a step: whatever else the server was sending has arrived
    assert editor.lines() == expected
    assert "\t" not in editor.text()


# Stands in for the user at the review prompt: records what vim.ui.select() asked and which floats showed,
# edits the buffer first when told to, then answers (after a tick, as an asynchronous picker would, or
# at once, as the default inputlist() one does).
_REVIEW_STUB = r"""
local answer, edit_first, at_once = ...
_G.llada_review = {}
vim.ui.select = function(items, opts, on_choice)
  local floats = {}
  for _, win in ipairs(vim.api.nvim_tabpage_list_wins(0)) do
    if vim.api.nvim_win_get_config(win).relative ~= '' then
      local buf = vim.api.nvim_win_get_buf(win)
      floats[#floats + 1] = { filetype = vim.bo[buf].filetype, lines = vim.api.nvim_buf_get_lines(buf, 0, -1, false) }
    end
  end
  llada_review.seen = { items = items, prompt = opts.prompt, floats = floats }
  if edit_first then
    vim.api.nvim_buf_set_lines(0, -1, -1, false, { '# typed during the review' })
  end
  local function choose()
    on_choice(answer)
    llada_review.floats_after = #vim.tbl_filter(function(win)
      return vim.api.nvim_win_get_config(win).relative ~= ''
    end, vim.api.nvim_tabpage_list_wins(0))
  end
  if at_once then
    choose()
  else
    vim.schedule(choose)
  end
end
"""


@pytest.mark.parametrize(
    "answer, edit_first, at_once",
    [("Apply", False, False), ("Apply", False, True), ("Discard", False, False), ("Apply", True, False)],
    ids=["apply", "apply-at-once", "discard", "edited-during-review"],
)
def test_rewrite_review(open_editor, answer, edit_first, at_once):
    editor = open_editor()
    before = editor.lines()
    editor.lua(_REVIEW_STUB, answer, edit_first, at_once)

    editor.nvim.command("1,2LladaRewrite")
    entry = wait_for(lambda: next(iter(editor.events("rewrite")), None), "the rewrite result")
    assert entry.get("error") is None, entry
    result = entry["result"]
    proposed = result["text"].split("\n")
    assert proposed != before[:2], "the model proposed no change; the review cannot be checked"

    seen = editor.lua("return llada_review.seen")
    assert seen, "the rewrite must be offered for review"
    assert seen["items"] == ["Apply", "Discard"]
    diff = [f for f in seen["floats"] if f["filetype"] == "diff"]
    assert len(diff) == 1, seen["floats"]
    shown = diff[0]["lines"]
    removed = [line[1:] for line in shown if line.startswith("-") and not line.startswith("---")]
    added = [line[1:] for line in shown if line.startswith("+") and not line.startswith("+++")]
    assert removed or added, shown
    assert set(removed) <= set(before[:2]) and set(added) <= set(proposed), shown
    assert editor.lua("return llada_review.floats_after") == 0, "the review float must close with the answer"

    notes = [e for e in editor.events("notify") if e["msg"].startswith("llada: ")]
    if answer == "Apply" and not edit_first:
        assert result["applied"], result
        assert editor.lines() == proposed + before[2:]
        assert not [e for e in notes if e["level"] >= 3], notes  # no warning
    elif answer == "Discard":
        assert not result["applied"] and result["reason"] == "Discarded in the editor.", result
        assert editor.lines() == before
        assert [e["msg"] for e in notes] == ["llada: rewrite discarded"]
    else:
        assert not result["applied"] and result["reason"] == "The document changed during the review.", result
        assert editor.lines() == before + ["# typed during the review"], "the user's edit wins"
        assert [(e["msg"], e["level"]) for e in notes] == [
            ("llada: rewrite not applied: The document changed during the review.", 3)
        ]


def answer_on_screen(editor: Editor, screen, keys: str) -> None:
    """Types {keys} as a user answering a blocking prompt would (nvim_input and nvim_get_mode are answered
    even while Neovim blocks), then presses Enter at any hit-enter prompt, until Neovim waits for nothing."""
    editor.nvim.api.input(keys)

    def settled() -> bool:
        lines = screen.text().rstrip().splitlines()
        if lines and lines[-1].startswith("Press ENTER"):
            editor.nvim.api.input("<CR>")
            return False
        return not editor.nvim.api.get_mode()["blocking"] and not any("Type number" in line for line in lines)

    wait_for(settled, "Neovim to take the answer", 30, screen.text)


def test_rewrite_review_shows_the_diff_on_screen_before_asking(open_editor):
    """With the default vim.ui.select() (inputlist(), which blocks until answered), the screen the user
    looks at while asked holds the proposed diff."""
    editor = open_editor()
    before = editor.lines()
    # Room for inputlist()'s lines and the messages after it: no hit-enter prompt blocks the editor.
    editor.nvim.command("set cmdheight=10")
    screen = editor.screen()
    asked = None
    try:
        editor.nvim.command("1,2LladaRewrite")
        asked = wait_for(
            lambda: next((text for text in [screen.text()] if "apply this change?" in text), None),
            "the Apply/Discard question on screen",
            detail=screen.text,
        )
    finally:
        answer_on_screen(editor, screen, "1<CR>")  # also when the check fails, so the editor is not left blocked
        screen.close()
    entry = wait_for(lambda: next(iter(editor.events("rewrite")), None), "the rewrite result")
    assert entry.get("error") is None, entry
    proposed = entry["result"]["text"].split("\n")
    assert proposed != before[:2], "the model proposed no change; the review cannot be checked"
    changed = [f"-{line}" for line in before[:2] if line not in proposed]
    changed += [f"+{line}" for line in proposed if line not in before[:2]]
    missing = [line for line in ["(proposed)", *changed] if line not in asked]
    assert not missing, f"asked to apply with {missing!r} not on screen:\n{asked}"
    assert entry["result"]["applied"] and editor.lines() == proposed + before[2:], entry


def test_checkhealth_reports_version_path_server_and_status(open_editor):
    editor = open_editor()
    wait_for(lambda: editor.lua("return require('llada').statusline()") == "llada: ready speed", "the server")
    editor.nvim.command("set notermguicolors | checkhealth llada")
    report = lambda: "\n".join(editor.lines())  # noqa: E731
    wait_for(lambda: "state ready" in report(), "the health report", 30, lambda: report())
    text = report()
    assert "OK Neovim 0." in text, text
    path = "the plugin draws it" if VERSION < (0, 12) else "vim.lsp.inline_completion draws completions"
    assert f"Ghost text: {path}" in text, text
    assert "OK Server command:" in text, text
    assert re.search(r"OK client \d+, attached to 1 buffer: model \S+, engine \S+, state ready", text), text
    assert "'termguicolors' is off" in text, text
    assert "ERROR" not in text and "WARNING" not in text, text


def test_engine_option_reaches_the_server_command(open_editor):
    editor = open_editor(engine="local")
    client = "vim.lsp.get_clients({ bufnr = 0, name = 'llada' })[1]"
    cmd = editor.lua(f"return {client}.config.cmd")
    assert cmd[-2:] == ["--engine", "local"], cmd
    status = editor.lua(
        f"local r = {client}:request_sync('workspace/executeCommand', {{ command = 'llada.status' }}, 10000)"
        " return r and r.result"
    )
    assert status["engine"] == "local", status

    # No server needed for the rest: the command setup() builds, and what it refuses.
    server_cmd = "local config = require('llada.config') return config.server_cmd(config.resolve(...))"
    home = editor.lua("return vim.fs.normalize('~')")
    opts = {"cmd": ["llada-lsp"], "engine": "tcp://127.0.0.1:7077", "token_file": "~/token"}
    assert editor.lua(server_cmd, opts) == [
        "llada-lsp",
        "--engine",
        "tcp://127.0.0.1:7077",
        "--token-file",
        f"{home}/token",
    ]
    assert editor.lua(server_cmd, {"cmd": ["llada-lsp"]}) == ["llada-lsp"], "no engine: the server's default"
    for bad in ["gpu", "unix:", "tcp://host", 7077]:
        with pytest.raises(pynvim.NvimError, match="engine"):
            editor.lua("require('llada.config').resolve(...)", {"engine": bad})


def test_ghost_highlight_without_termguicolors(open_editor):
    editor = open_editor(open_file=False)
    editor.lua("vim.o.termguicolors = false vim.cmd.colorscheme('default')")  # ColorScheme redefines them
    resolved = "return vim.api.nvim_get_hl(0, { name = ..., link = false })"
    groups = ["LladaGhost"] + (["ComplHint"] if VERSION >= (0, 12) else [])
    for group in groups:
        hl = editor.lua(resolved, group)
        assert hl.get("ctermfg") is not None or hl.get("cterm"), f"{group} looks like typed text: {hl!r}"
        assert hl.get("ctermfg") != editor.lua(resolved, "Normal").get("ctermfg"), hl
    # `default`: a user's definition survives setup() being called again.
    editor.nvim.command("highlight LladaGhost ctermfg=1")
    editor.lua("require('llada').setup(...)", {"cmd": ["llada-lsp"]})
    assert editor.lua(resolved, "LladaGhost").get("ctermfg") == 1


def test_rewrite_without_change_warns_and_asks_nothing(open_editor):
    editor = open_editor()
    before = editor.lines()
    editor.lua(_REVIEW_STUB, "Apply", False, True)

    editor.nvim.command("1LladaRewrite")  # the model leaves `class Point:` as it is
    result = wait_for(lambda: next(iter(editor.events("rewrite")), None), "the rewrite result")["result"]
    assert result["text"] == before[0], "the model changed the line; pick one it keeps"
    assert not editor.lua("return llada_review.seen"), "an edit that changes nothing is not offered for review"
    assert editor.lines() == before
    # The server refuses it with a reason, or sends it and the review finds nothing to apply.
    warnings = [e["msg"] for e in editor.events("notify") if e["level"] == 3]
    assert len(warnings) == 1 and (
        warnings[0].startswith("llada: rewrite not applied: ") or warnings[0] == "llada: the rewrite proposes no change"
    ), editor.events("notify")


class EngineService:
    """`llada-lsp engine` on a Unix socket, which the editor's server uses instead of its own model; the
    test kills it and starts it again on the same socket."""

    def __init__(self) -> None:
        folder = tempfile.mkdtemp(prefix="ll")  # a Unix socket path must be short
        self.socket, self.log = os.path.join(folder, "engine.sock"), os.path.join(folder, "engine.log")
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        """Returns once the model is loaded."""

        def loads() -> int:
            return Path(self.log).read_text().count("load embedded: done") if os.path.exists(self.log) else 0

        before = loads()
        with open(self.log, "a") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "llada_lsp", "engine", "--listen", f"unix:{self.socket}",
                                             "--threads", "1", "--log-level", "info"], stderr=log)  # fmt: skip
        process = self.process
        wait_for(lambda: loads() > before or process.poll() is not None, "the engine service to load its model")
        assert process.poll() is None, Path(self.log).read_text()

    def kill(self) -> None:
        """As `kill -9` would: nothing is said to the clients. The socket file it leaves is removed, so
        that start() listens on the same address again."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)
        os.unlink(self.socket)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)


@pytest.fixture
def engine_service() -> Iterator[EngineService]:
    service = EngineService()
    service.start()
    yield service
    service.stop()


STATUSLINE = "return require('llada').statusline()"
PUSH_STATUS = r"""
local client = vim.lsp.get_clients({ bufnr = 0, name = 'llada' })[1]
local method = 'llada/status'
-- What Neovim's dispatcher runs when the notification arrives.
local handler = client.handlers[method] or vim.lsp.handlers[method]
handler(nil, ..., { method = method, client_id = client.id })
"""


def show_statusline(editor: Editor) -> None:
    editor.nvim.command("set laststatus=2 statusline=%f\\ %=%{v:lua.require'llada'.statusline()}")


def test_pushed_status_reaches_the_statusline_on_screen(open_editor):
    """The server's `llada/status` push (simulated here: its params as Neovim's dispatcher passes them)
    redraws the statusline at once, without :LladaStatus, for a failure and for the way back."""
    editor = open_editor()
    wait_for(lambda: editor.lua(STATUSLINE) == "llada: ready speed", "the server to be ready")
    show_statusline(editor)
    screen = editor.screen()
    try:
        base = {"engine": "unix:/tmp/ll/engine.sock", "model": "tiny", "inlineMode": "speed", "rewriteMode": "quality"}
        for state, shown in [("unavailable", "llada: unavailable"), ("not responding", "llada: not responding"),
                             ("ready", "llada: ready speed")]:  # fmt: skip
            error = {} if state == "ready" else {"error": "the engine service at unix:/tmp/ll/engine.sock is gone"}
            editor.lua(PUSH_STATUS, {**base, "state": state, **error})
            wait_for(
                lambda shown=shown: shown in screen.text(), f"{shown!r} in the statusline on screen", 10, screen.text
            )
    finally:
        screen.close()


def wait_answered(editor: Editor, seen: int) -> None:
    """Waits until an inline request sent after the first {seen} events of the log has been answered."""

    def answered() -> bool:
        inline = [e["type"] for e in editor.log()[seen:] if e.get("method") == "textDocument/inlineCompletion"]
        return "complete" in inline

    wait_for(answered, "an inline request to be answered", 30, lambda: f"{editor.log()[-6:]!r}")


@pytest.mark.timeout(120)
@needs_builtin
def test_failed_inline_request_takes_its_ghost_text_off_the_screen(open_editor, engine_service):
    """The engine service dies with a completion on screen; typing what it shows makes the built-in
    completer show the rest of it again, and the request that fails must take it away."""
    editor = open_editor(engine=f"unix:{engine_service.socket}")
    ghost = type_in_function_body(editor)
    assert ghost["source"] == "builtin" and ghost["text"][:1].isalnum(), ghost
    engine_service.kill()
    seen = len(editor.log())
    editor.nvim.input(ghost["text"][0])
    wait_answered(editor, seen)
    wait_for(lambda: editor.ghost() is None, "no ghost text", 5, lambda: f"ghost {editor.ghost()!r}")


@pytest.mark.timeout(120)
def test_statusline_follows_the_engine_service(open_editor, engine_service):
    """Needs the server's `llada/status` push and its window/showMessage (issue 24, item 2): kill the
    engine service and the statusline on screen says so, once, with a message; start it again and the
    statusline says ready, without :LladaStatus."""
    editor = open_editor(engine=f"unix:{engine_service.socket}")
    wait_for(lambda: editor.lua(STATUSLINE) == "llada: ready speed", "the server to be ready")
    show_statusline(editor)
    screen = editor.screen()
    try:
        wait_for(lambda: "llada: ready speed" in screen.text(), "the statusline on screen", 10, screen.text)
        engine_service.kill()
        seen = len(editor.log())
        # Typing asks for completions, which fail; the statusline must say so on its own.
        editor.nvim.input(f"{BODY_LINE}GA{TYPED}")
        failed = re.compile(r"llada: (unavailable|not responding)")
        wait_for(lambda: failed.search(screen.text()), "the statusline to show the service gone", 60, screen.text)
        typed = len(editor.log())
        editor.nvim.input("x")
        wait_answered(editor, typed)
        messages = [e for e in editor.log()[seen:] if e["kind"] == "notify" and e["level"] >= 3]
        assert len(messages) == 1, f"one message per change of state, not per request: {messages!r}"

        engine_service.start()
        editor.nvim.input("<BS>")  # a keystroke: the server's next request finds the service back
        wait_for(lambda: "llada: ready speed" in screen.text(), "the statusline to say ready again", 60, screen.text)
    finally:
        screen.close()


# Records the ghost text on screen after every keystroke's handlers have run (scheduled: after the
# built-in completer's and the plugin's autocmds), so a test sees whether it ever left the screen.
_SCREEN_PROBE = r"""
local api = vim.api
_G.llada_screen = {}
api.nvim_create_autocmd({ 'TextChangedI', 'CursorMovedI' }, {
  group = api.nvim_create_augroup('llada_screen', { clear = true }),
  callback = function(args)
    vim.schedule(function()
      local line = api.nvim_get_current_line()
      llada_screen[#llada_screen + 1] = { line = line, ghost = llada_probe.ghost(args.buf) or vim.NIL }
    end)
  end,
})
"""


@pytest.mark.parametrize("path", ["builtin", "fallback"])
def test_typing_through_a_suggestion_keeps_it_on_screen_and_tab_takes_the_rest(open_editor, path):
    """Issue 26: the suggestion stays visible, trimmed by what was typed, while the user types three of
    its characters (each step of the server is slow: the revised answers land well after each keystroke),
    and Tab then inserts the rest as shown."""
    if path == "builtin" and VERSION < (0, 12):
        pytest.skip("vim.lsp.inline_completion needs Neovim 0.12")
    editor = open_editor(env={"LLADA_LSP_TEST_STEP_DELAY_MS": "300"}, force_fallback=path == "fallback")
    first = type_in_function_body(editor)
    assert len(first["text"]) > 4 and "\n" not in first["text"][:3], first
    editor.lua(_SCREEN_PROBE)
    for k in range(1, 4):
        editor.nvim.input(first["text"][k - 1].replace("<", "<lt>"))
        wait_for(lambda: editor.lines()[BODY_LINE - 1] == INDENT + TYPED + first["text"][:k], "the typed character")
        ghost = editor.ghost()
        assert ghost and first["text"][k:].startswith(ghost["text"][:1]) and ghost["text"], (k, ghost)
    screens = editor.lua("return llada_screen")
    assert screens and all(s["ghost"] for s in screens), f"the suggestion left the screen: {screens!r}"
    for s in screens:
        typed = s["line"][len(INDENT + TYPED) :]
        assert first["text"].startswith(typed), s
        assert s["ghost"]["text"] and s["ghost"]["col"] == len(s["line"].encode()), s
    shown = editor.lua("local g = llada_probe.ghost() vim.api.nvim_input('<Tab>') return g")
    expected = INDENT + TYPED + first["text"][:3] + shown["text"].split("\n")[0]
    wait_for(lambda: editor.lines()[BODY_LINE - 1] == expected, f"Tab to insert what is shown: {expected!r}", 10,
             lambda: f"{editor.lines()!r}")  # fmt: skip
    assert "\t" not in editor.text()
