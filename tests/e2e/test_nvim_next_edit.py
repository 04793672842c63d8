"""Next-edit suggestions in a real headless Neovim 0.12 with the plugin and the real server: after a
rename, the other uses are suggested (struck through, the new name as ghost text) away from the
cursor with a jump hint; <Tab> jumps, <Tab> accepts, <Esc> dismisses; the buffer is exactly what the
user expects. The model is the scripted one of tests/hooks/scripted_next_edit.py (the embedded model
was not trained on edits): what is tested is everything between it and the screen."""

from __future__ import annotations

from pathlib import Path

import pytest
from nvim_helpers import Editor, nvim_binary, nvim_version, wait_for

BINARY = nvim_binary()
VERSION = nvim_version(BINARY) if BINARY else (0, 0)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(VERSION < (0, 12), reason="needs Neovim 0.12 (nvim not found or too old)"),
]

SOURCE = "def total(values):\n    count = 0\n    for v in values:\n        count += v\n    return count\n"
SCRIPTED = {"LLADA_LSP_TEST_SCRIPTED_NEXT_EDIT": "1"}

MARKS = """
local ns = require('llada.next_edit').ns
local out = {}
for _, m in ipairs(vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, { details = true })) do
  local d = m[4]
  local text = {}
  for _, chunk in ipairs(d.virt_text or {}) do text[#text + 1] = chunk[1] end
  out[#out + 1] = { row = m[2], col = m[3], end_row = d.end_row, end_col = d.end_col, hl = d.hl_group,
                    text = table.concat(text), pos = d.virt_text_pos }
end
return out
"""


@pytest.fixture
def editor(tmp_path: Path):
    editor = Editor(BINARY, tmp_path, {"next_edit_delay_ms": 100}, SCRIPTED)
    editor.open("total.py", SOURCE)
    yield editor
    editor.close()


def shown(editor: Editor) -> bool:
    return editor.lua("return require('llada.next_edit').is_shown(0)")


def test_a_rename_suggests_the_other_uses_tab_jumps_and_accepts(editor):
    editor.nvim.input("2G^cwacc<Esc>")
    wait_for(lambda: editor.mode() == "n" and editor.lines()[1] == "    acc = 0", "the rename")
    wait_for(lambda: shown(editor), "a next edit to be shown", detail=lambda: f"lines {editor.lines()!r}")
    marks = editor.lua(MARKS)
    struck = sorted(
        (m["row"], m["col"], m["end_row"], m["end_col"]) for m in marks if m.get("hl") == "LladaNextEditDelete"
    )
    assert struck == [(3, 8, 3, 13), (4, 11, 4, 16)], marks  # both `count`s, struck through
    added = sorted((m["row"], m["col"], m["text"]) for m in marks if m.get("pos") == "inline")
    assert added == [(3, 13, "acc"), (4, 16, "acc")], marks  # the new name right after each
    hints = [m for m in marks if m.get("pos") == "eol"]
    assert [h["row"] for h in hints] == [1] and "line 4" in hints[0]["text"], "the hint is on the cursor's line"
    assert editor.lines() == SOURCE.replace("count", "acc", 1).splitlines(), "showing it must not edit the buffer"

    editor.nvim.input("<Tab>")
    wait_for(lambda: editor.cursor() == (4, 8), "the jump to the suggestion", detail=lambda: f"{editor.cursor()}")
    assert shown(editor) and editor.lines()[3] == "        count += v"
    editor.nvim.input("<Tab>")
    expected = SOURCE.replace("count", "acc").splitlines()
    wait_for(
        lambda: editor.lines() == expected, f"the buffer to become {expected!r}", detail=lambda: f"{editor.lines()!r}"
    )
    assert not shown(editor) and editor.lua(MARKS) == []
    assert editor.cursor() == (5, 13), "the cursor ends on the last character of the last edit"


def test_esc_dismisses_and_the_buffer_is_left_as_typed(editor):
    editor.nvim.input("2G^cwn<Esc>")
    wait_for(lambda: shown(editor), "a next edit to be shown", detail=lambda: f"lines {editor.lines()!r}")
    # In the line's leading whitespace Tab is left alone: no jump, the suggestion stays.
    editor.lua("vim.api.nvim_win_set_cursor(0, { 2, 1 })")
    editor.lua("vim.api.nvim_feedkeys(vim.keycode('<Tab>'), 'mx', false)")
    editor.lua("vim.cmd('redraw')")  # after the scheduled work a jump would have queued
    assert editor.cursor() == (2, 1) and shown(editor)
    editor.nvim.input("<Esc>")
    wait_for(lambda: not shown(editor), "the suggestion to be dismissed")
    assert editor.lua(MARKS) == []
    assert editor.lines() == SOURCE.replace("count", "n", 1).splitlines()
    # Tab with nothing shown is Tab again (here: <C-i>, the jump list's forward): no jump, no edit.
    editor.lua("vim.api.nvim_feedkeys(vim.keycode('<Tab>'), 'mx', false)")  # run now, mappings included
    assert editor.lines() == SOURCE.replace("count", "n", 1).splitlines() and not shown(editor)
