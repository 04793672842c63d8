"""Partial accept and what the screen ends on, in a real headless Neovim with the plugin and the real
server, on both ghost text paths: 0.12's vim.lsp.inline_completion ("builtin") and the plugin's own
("fallback", forced with `force_fallback`, the only one on 0.11).

The word and line boundaries are pure Lua (llada.partial), tested through the editor's Lua without a
server. The end-to-end tests hold whatever text the model proposes, as long as it proposes some.
"""

from __future__ import annotations

import pytest
from nvim_helpers import Editor, nvim_binary, nvim_version, open_editor, skip_unless_path, wait_for  # noqa: F401 (a fixture)

BINARY = nvim_binary()
VERSION = nvim_version(BINARY) if BINARY else (0, 0)

pytestmark = pytest.mark.skipif(VERSION < (0, 11), reason="needs Neovim 0.11+ (nvim not found or too old)")
PATHS = ["builtin", "fallback"]

ACCEPT_WORD, ACCEPT_LINE = "<M-Right>", "<M-C-Right>"  # the defaults of keymaps.accept_word / accept_line

# On an empty line the server proposes a block (several lines); anywhere else the rest of the line.
BLOCK_SOURCE = "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        \n"
BLOCK_LINE = 4

# Each denoising step of the server sleeps this long: between two keystrokes of a test, which take a
# few milliseconds, no revision can land (the plugins wait 150-200 ms before they even ask for one).
SLOW_STEPS = {"LLADA_LSP_TEST_STEP_DELAY_MS": "500"}


# --- word and line boundaries (no server) ---------------------------------------------------------

# Splits a text into the pieces that successive accepts of llada.partial.{kind} take.
_PIECES = r"""
local kind, text = ...
local take, pieces = require('llada.partial')[kind], {}
while #text > 0 do
  local n = take(text)
  assert(n > 0, 'no progress')
  pieces[#pieces + 1], text = text:sub(1, n), text:sub(n + 1)
end
return pieces
"""


@pytest.mark.parametrize(
    "text, words",
    [
        ("split(';')", ["split", "(';')"]),
        ("x = foo_bar(1, 2)", ["x", " =", " foo_bar", "(", "1", ",", " 2", ")"]),
        ("  .append(item)", ["  .", "append", "(", "item", ")"]),
        ("x)\n        return x", ["x", ")", "\n        return", " x"]),
        ("naïve + 名前", ["naïve", " +", " 名前"]),  # a multibyte character is never cut
        ("a  \n", ["a", "  \n"]),  # only blanks left: they go in one piece
    ],
)
def test_next_word_is_an_identifier_or_punctuation_with_the_blanks_before_it(open_editor, text, words):
    editor = open_editor()
    assert editor.lua(_PIECES, "word", text) == words
    assert editor.lua("return require('llada.partial').word('')") == 0


@pytest.mark.parametrize(
    "text, lines",
    [
        ("self.x = x", ["self.x = x"]),
        ("x = x\n    y = y\n", ["x = x", "\n    y = y", "\n"]),
        ("a\n\nb", ["a", "\n", "\nb"]),
    ],
)
def test_next_line_ends_before_the_line_break_and_then_takes_it_with_the_next(open_editor, text, lines):
    editor = open_editor()
    assert editor.lua(_PIECES, "line", text) == lines


def test_partial_keys_are_validated_and_can_be_disabled(open_editor):
    editor = open_editor()
    resolve = "return require('llada.config').resolve(...).keymaps"
    defaults = editor.lua(resolve, {})
    assert (defaults["accept_word"], defaults["accept_line"]) == (ACCEPT_WORD, ACCEPT_LINE)
    assert editor.lua(resolve, {"keymaps": {"accept_word": False}})["accept_word"] is False
    error = editor.lua("return select(2, pcall(require('llada.config').resolve, ...))", {"keymaps": {"accept_line": 3}})
    assert "keymaps.accept_line" in error, error


# --- partial accept in the editor -------------------------------------------------------------------

# Records the ghost text on screen right after each keystroke's handlers have run (scheduled after the
# completers' autocmds): what the user sees once a partial accept has changed the buffer.
_SCREEN_PROBE = r"""
local api = vim.api
_G.llada_screen = {}
api.nvim_create_autocmd('TextChangedI', {
  group = api.nvim_create_augroup('llada_screen', { clear = true }),
  callback = function(args)
    vim.schedule(function()
      local row, col = unpack(api.nvim_win_get_cursor(0))
      llada_screen[#llada_screen + 1] = { row = row - 1, col = col, ghost = llada_probe.ghost(args.buf) or vim.NIL }
    end)
  end,
})
"""

# Reads the ghost text on screen and presses the key in one call, so no revision lands in between.
_PRESS = "local g = llada_probe.ghost() vim.api.nvim_input(...) return g"


def take(editor: Editor, kind: str, text: str) -> str:
    """The piece of {text} one accept of llada.partial.{kind} inserts (the Lua counts bytes)."""
    n = editor.lua(f"return require('llada.partial').{kind}(...)", text)
    return text.encode()[:n].decode()


def inserted_at(lines: list[str], row: int, col: int, text: str) -> list[str]:
    """{lines} with {text} inserted at 1-based {row}, byte {col}."""
    line = lines[row - 1].encode()
    new = (line[:col] + text.encode() + line[col:]).decode()
    return lines[: row - 1] + new.split("\n") + lines[row:]


def end_of(row: int, col: int, text: str) -> tuple[int, int]:
    """The cursor (1-based row, byte col) after inserting {text} at ({row}, {col})."""
    last = text.split("\n")[-1].encode()
    return row + text.count("\n"), (col if "\n" not in text else 0) + len(last)


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS)
def test_accept_a_word_another_then_the_line_leaves_the_rest_shown(open_editor, path):
    """On an empty line the server proposes a block; <M-Right> twice and <M-C-Right> insert its next
    word, the next, and the rest of its first line: after each the buffer holds exactly that prefix of
    the suggestion, and the rest of it stays on screen, drawn at the cursor; <Tab> then takes the rest."""
    skip_unless_path(path)
    editor = open_editor(env=SLOW_STEPS, force_fallback=path == "fallback", max_completion_tokens=24)
    editor.open("point.py", BLOCK_SOURCE)
    editor.nvim.input(f"{BLOCK_LINE}GA")
    suggestion = editor.wait_ghost()
    assert suggestion["source"] == ("builtin" if path == "builtin" else "llada"), suggestion
    text = suggestion["text"]
    first_line = text.split("\n")[0]
    assert "\n" in text and len(first_line.split()) >= 2, f"the model proposed no block to take apart: {text!r}"
    editor.lua(_SCREEN_PROBE)
    before = editor.lines()
    start = editor.cursor()

    accepted, shown_rest = "", text
    for key, kind in [(ACCEPT_WORD, "word"), (ACCEPT_WORD, "word"), (ACCEPT_LINE, "line")]:
        row, col = editor.cursor()
        seen = len(editor.lua("return llada_screen"))
        shown = editor.lua(_PRESS, key)
        assert shown and (shown["row"], shown["col"]) == (row - 1, col), f"{key}: nothing shown at the cursor: {shown}"
        assert shown["text"] == shown_rest, f"{key}: the rest left by the previous accept is not what is shown"
        piece = take(editor, kind, shown["text"])
        accepted += piece
        expected = inserted_at(before, *start, accepted)
        wait_for(lambda: editor.lines() == expected, f"{key} to insert {piece!r}", 10, lambda: f"{editor.lines()!r}")
        assert editor.cursor() == end_of(*start, accepted)
        shown_rest = text[len(accepted) :]
        screens = wait_for(lambda: editor.lua("return llada_screen")[seen:], f"the screen after {key}", 10)
        row, col = editor.cursor()
        rest = {"source": "llada", "row": row - 1, "col": col, "text": shown_rest}
        assert screens[0]["ghost"] == rest, f"{key}: the rest of the suggestion must stay shown: {screens[0]!r}"

    assert accepted == first_line, "two words and the line take the suggestion's first line"
    shown = editor.lua(_PRESS, "<Tab>")
    assert shown["text"] == shown_rest, shown
    expected = inserted_at(before, *start, text)
    wait_for(lambda: editor.lines() == expected, "<Tab> to insert the rest", 10, lambda: f"{editor.lines()!r}")
    assert editor.cursor() == end_of(*start, text)


_GHOST_MARKS = """
local count = 0
for _, name in ipairs({ 'llada', 'nvim.lsp.inline_completion' }) do
  count = count + #vim.api.nvim_buf_get_extmarks(0, vim.api.nvim_create_namespace(name), 0, -1, {})
end
return count
"""


@pytest.mark.slow
@pytest.mark.parametrize("drafts", [True, False], ids=["drafts", "no-drafts"])
@pytest.mark.parametrize("path", PATHS)
def test_a_revision_replaces_the_rest_of_a_partly_accepted_suggestion(open_editor, path, drafts):
    """After <M-Right>, the server (revise on, the default) is asked again at the new cursor; what is on
    screen once it answers is its answer, not the rest left over, nor both. Without drafts (a draft
    replaces the rest on its own) the answer alone must take the rest's place."""
    skip_unless_path(path)
    editor = open_editor(force_fallback=path == "fallback")
    if not drafts:
        editor.lua("vim.lsp.config('llada', { handlers = { ['llada/draft'] = function() end } })")
    editor.open("point.py", BLOCK_SOURCE)
    editor.nvim.input(f"{BLOCK_LINE}GA")
    editor.wait_ghost()
    seen = len(editor.log())
    editor.lua(_PRESS, ACCEPT_WORD)
    answer = wait_for(
        lambda: next((e for e in editor.log()[seen:] if e["kind"] == "answer"), None),
        "the server to answer at the new cursor",
        60,
        lambda: f"{editor.log()[-6:]!r}",
    )
    assert answer.get("error") is None, answer

    def drawn() -> tuple[dict | None] | None:
        ghost, generating = editor.ghost_and_generating()
        return (ghost,) if (ghost["text"] if ghost else "") == answer["text"] and not generating else None

    (ghost,) = wait_for(drawn, f"the answer {answer['text']!r} on screen", 10, lambda: f"ghost {editor.ghost()!r}")
    if ghost:
        assert ghost["source"] == ("builtin" if path == "builtin" else "llada"), ghost
        row, col = editor.cursor()
        assert (ghost["row"], ghost["col"]) == (row - 1, col), ghost
        assert editor.lua(_GHOST_MARKS) == 1, "one ghost text, not the rest left over beside the answer"


# --- live drafts end on the final answer ---------------------------------------------------------

PROMPTS = [
    ("point.py", "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        \n", "4GAself."),
    ("lines.py", "import os\n\n\ndef read_lines(path):\n    \n", "5GAwith open("),
    ("split.py", "words = text.", "1GA"),
]


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name, source, keys", PROMPTS, ids=[p[0] for p in PROMPTS])
def test_the_screen_ends_on_the_final_answer_not_a_draft(open_editor, path, name, source, keys):
    """VS Code once froze on an early draft (issue 41): the live drafts are drawn as they come, and once
    the answer is in, the ghost text on screen is the server's answer, drawn by whoever draws answers on
    this path."""
    skip_unless_path(path)
    editor = open_editor(env={"LLADA_LSP_TEST_STEP_DELAY_MS": "200"}, inline_mode="quality",
                         force_fallback=path == "fallback")  # fmt: skip
    editor.open(name, source)
    screen = editor.screen()
    try:
        editor.nvim.input(keys)
        shown = editor.wait_ghost()
        answers = editor.events("answer")
        drafts = [e for e in editor.events("draft") if e["text"]]
        assert answers and answers[-1].get("error") is None, answers
        assert drafts, "no draft with text was drawn before the answer"
        answer = answers[-1]["text"]
        assert shown["text"] == answer, f"the ghost text is {shown['text']!r}, the answer {answer!r}"
        assert shown["source"] == ("builtin" if path == "builtin" else "llada"), shown
        row, col = editor.cursor()
        assert (shown["row"], shown["col"]) == (row - 1, col), shown
        # As a terminal paints it: the line typed, the answer's first line after it, its other lines below.
        first, *below = answer.split("\n")
        painted = [editor.lines()[row - 1] + first, *below]

        def on_screen() -> bool:
            rows = screen.text().split("\n")
            return any(rows[i : i + len(painted)] == painted for i in range(len(rows)))

        wait_for(on_screen, f"{painted!r} painted", 10, screen.text)
    finally:
        screen.close()
