"""End-to-end tests of the Neovim plugin: a real headless Neovim, the plugin, and the llada-lsp server.

The server is `python -m llada_lsp` (LLADA_TEST_SERVER_CMD overrides it). The assertions hold whatever
text the model proposes, as long as it proposes some at the completion point of SOURCE.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

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


@pytest.fixture
def open_editor(tmp_path: Path) -> Iterator:
    editors: list[Editor] = []

    def start(**setup_opts) -> Editor:
        editor = Editor(BINARY, tmp_path, setup_opts)
        editors.append(editor)
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


def test_rewrite_range_applies_server_edit(open_editor):
    editor = open_editor()
    before = editor.lines()
    tick = editor.lua("return vim.api.nvim_buf_get_changedtick(0)")

    editor.nvim.command("1,2LladaRewrite add a docstring")
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
