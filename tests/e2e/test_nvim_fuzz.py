"""Short runs of the editing fuzzer (tests/e2e/fuzz_nvim.py) in a real headless Neovim (0.12 for the built-in path) with the
plugin and the real server, on both ghost text paths, with fixed seeds: random but realistic editing
(typing, Backspace and Delete across line starts, undo, paste, moves to other lines and files, accepts
of all, a word or a line, mode switches, pauses while drafts land) never raises an error in the editor,
never leaves ghost text off the cursor's line, and changes the buffers only as the keys do. A failure
names the seed; `python tests/e2e/fuzz_nvim.py --path PATH --seed SEED --actions N` replays it."""

from __future__ import annotations

import pytest
from fuzz_nvim import fuzz
from nvim_helpers import nvim_binary, nvim_version

BINARY = nvim_binary()
VERSION = nvim_version(BINARY) if BINARY else (0, 0)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(VERSION < (0, 11), reason="needs Neovim 0.11+ (nvim not found or too old)"),
]

ACTIONS = 250


@pytest.mark.timeout(600)
@pytest.mark.parametrize("path, seed", [("builtin", 53), ("fallback", 53)])
def test_random_editing_raises_no_error_and_keeps_the_text(path, seed):
    if path == "builtin" and VERSION < (0, 12):
        pytest.skip("vim.lsp.inline_completion needs Neovim 0.12")
    figures = fuzz(path, seed, ACTIONS)
    assert figures["actions"] == ACTIONS
