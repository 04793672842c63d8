"""Everyday editing with a suggestion on screen, in a real headless Neovim with the plugin and the real
server, on both ghost text paths (0.12's vim.lsp.inline_completion, "builtin"; the plugin's own,
"fallback"): keys that are not an accept never raise an error and never leave ghost text where the line
no longer has room for it (issue 53).

The assertions hold whatever text the model proposes, as long as it proposes some after `self.`.
"""

from __future__ import annotations

import pytest
from nvim_helpers import Editor, nvim_binary, nvim_version, open_editor, skip_unless_path, wait_for  # noqa: F401 (a fixture)

BINARY = nvim_binary()
VERSION = nvim_version(BINARY) if BINARY else (0, 0)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(VERSION < (0, 11), reason="needs Neovim 0.11+ (nvim not found or too old)"),
]
PATHS = ["builtin", "fallback"]

SOURCE = "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        \n"
BODY_LINE = 4
INDENT = "        "
TYPED = "self."


def settle(editor: Editor) -> None:
    """Lets the editor run what the last keys started (autocommands, then what they scheduled)."""
    editor.lua("vim.wait(50) return true")


def press(editor: Editor, keys: str, line: str) -> None:
    """Presses {keys} in insert mode, waits until the body line reads {line}, then checks the editor said
    no error and shows no ghost text off the line."""
    editor.nvim.input(keys)
    wait_for(lambda: editor.lines()[BODY_LINE - 1] == line, f"the line to read {line!r}",
             detail=lambda: f"it reads {editor.lines()[BODY_LINE - 1]!r}, errors {editor.errors()!r}")  # fmt: skip
    settle(editor)
    assert editor.errors() == [], f"after {keys!r}"
    assert editor.ghost_problems() == [], f"after {keys!r}"


@pytest.mark.parametrize("path", PATHS)
def test_backspace_with_a_suggestion_on_screen_raises_no_error(open_editor, path):
    """One Backspace while ghost text is shown at the end of the line: the built-in completer kept the
    suggestion's range at the old cursor, past the end of the now shorter line, and failed on this key
    and every later one (`inline_completion.lua:237: Invalid 'col': out of range`)."""
    skip_unless_path(path)
    editor = open_editor(force_fallback=path == "fallback")
    editor.open("point.py", SOURCE)
    editor.nvim.input(f"{BODY_LINE}GA{TYPED}")
    wait_for(lambda: editor.lines()[BODY_LINE - 1] == INDENT + TYPED, "the typed text")
    ghost = editor.wait_ghost()
    assert (ghost["row"], ghost["col"]) == (BODY_LINE - 1, len(INDENT + TYPED)), ghost
    editor.clear_errors()

    press(editor, "<BS>", INDENT + "self")
    press(editor, "<BS>", INDENT + "sel")  # the second key failed again
    press(editor, "f", INDENT + "self")
    press(editor, ".", INDENT + "self.")
    # Whatever is on screen once the answers for this line are in, it is at the cursor.
    shown = editor.wait_ghost()
    assert (shown["row"], shown["col"]) == (BODY_LINE - 1, len(INDENT + TYPED)), shown
    press(editor, "<BS><BS><BS>", INDENT + "se")
    assert editor.errors() == [] and editor.mode() == "i"


@pytest.mark.parametrize("path", PATHS)
def test_the_place_waiting_during_the_load_gets_its_suggestion(open_editor, path, tmp_path):
    """Issue 53, the first minute: with the cursor placed (insert mode) while the model loads, the screen
    says it loads, and once it has loaded that place gets its ghost text without another key. The load
    is held by the test hook until the test lets it go, so the request surely waits."""
    skip_unless_path(path)
    gate = tmp_path / "load-gate"
    editor = open_editor(env={"LLADA_LSP_TEST_LOAD_GATE": str(gate)}, force_fallback=path == "fallback")
    editor.nvim.command("set cmdheight=2")
    screen = editor.screen()
    try:
        editor.open("point.py", SOURCE, wait_loaded=False)
        editor.nvim.input(f"{BODY_LINE}GA{TYPED}")
        wait_for(lambda: editor.lines()[BODY_LINE - 1] == INDENT + TYPED, "the typed text")
        wait_for(lambda: "llada: loading the model" in screen.text(), "the load said on screen", 30, screen.text)
        inline = "textDocument/inlineCompletion"
        wait_for(lambda: any(e.get("method") == inline for e in editor.events("request")), "an inline request")
        assert editor.lua("return require('llada').statusline()") == "llada: loading"
        assert editor.ghost() is None
        keys_before = editor.lua("return vim.api.nvim_buf_get_changedtick(0)")
        gate.touch()  # the load goes on; no key is pressed from here
        ghost = editor.wait_ghost()
        assert (ghost["row"], ghost["col"]) == (BODY_LINE - 1, len(INDENT + TYPED)), ghost
        assert editor.lua("return vim.api.nvim_buf_get_changedtick(0)") == keys_before
        wait_for(lambda: "llada: model ready" in screen.text(), "the end of the load said on screen", 30, screen.text)
        assert editor.errors() == []
    finally:
        gate.touch()
        screen.close()


def test_delete_that_leaves_the_line_as_it_was_clears_what_no_accept_would_take(open_editor):
    """Delete at the end of the line joins the empty line below: the cursor's line and the cursor stay as
    they were, but the text changed. The fallback path kept its ghost text (it took the change for the
    second event of a keystroke it had already handled), while its accept refuses a suggestion made for
    an older text: the suggestion stayed on screen and <Tab> inserted an indent instead (found by the
    fuzzer, seed 7 of a run without the server's timing). Whatever is on screen after the Delete, <Tab>
    must insert it; the debounce is long, so no newer answer is asked for meanwhile."""
    editor = open_editor(force_fallback=True, debounce_ms=3000)
    editor.open("point.py", SOURCE + "\n")
    editor.nvim.input(f"{BODY_LINE}GA{TYPED}")
    wait_for(lambda: editor.lines()[BODY_LINE - 1] == INDENT + TYPED, "the typed text")
    ghost = editor.wait_ghost()
    assert (ghost["row"], ghost["col"]) == (BODY_LINE - 1, len(INDENT + TYPED)), ghost
    lines = editor.lines()
    press(editor, "<Del>", INDENT + TYPED)
    assert editor.lines() == lines[:BODY_LINE] + lines[BODY_LINE + 1 :]  # the empty line joined
    shown = editor.ghost()
    editor.nvim.input("<Tab>")
    settle(editor)
    line = editor.lines()[BODY_LINE - 1]
    if shown:  # what was on screen is what the key inserted
        assert "\n".join(editor.lines()[BODY_LINE - 1 :]).startswith(INDENT + TYPED + shown["text"]), (shown, line)
    else:  # nothing on screen: the key indents
        assert line.startswith(INDENT + TYPED) and line[len(INDENT + TYPED) :].strip() == "" and line != INDENT + TYPED
    assert editor.errors() == []
