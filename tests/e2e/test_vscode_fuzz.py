"""The editing fuzzer of the VS Code extension (tests/e2e/vscode/fuzz.py) in CI: fixed seeds, a few hundred
actions in all, each run in its own code-server against the real server on the embedded model. Skips, with
the reason, exactly where tests/e2e/test_vscode.py does (the tools of tests/e2e/vscode/install.sh missing).
A failure names the seed and the command that replays it; the long run is that command with its default
5,000 actions.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "vscode"))
import fuzz  # noqa: E402

ACTIONS = 150

# Measured in code-server: ghost text after `x = text.` at the end of a line, and the cursor (a 19 px line).
CURSOR = {"left": 232, "top": 206, "width": 2, "height": 19}
AT_CURSOR = {"left": 232.6, "top": 207, "width": 59.0, "height": 16}


def test_ghost_text_is_misplaced_unless_drawn_at_the_caret():
    place = {"inline": AT_CURSOR, "below": None, "cursor": CURSOR, "lineHeight": 19}
    assert fuzz.misplaced(place) is None
    # The cursor gone to the line's start (the fault fixed in 95489a9), or to the next line.
    assert "px from the caret" in fuzz.misplaced({**place, "cursor": {**CURSOR, "left": 156}})
    assert "another line" in fuzz.misplaced({**place, "cursor": {**CURSOR, "top": 225}})
    # Lines of ghost text alone go under the cursor's line, not two lines down.
    below = {"inline": None, "below": {**AT_CURSOR, "top": 226}, "cursor": CURSOR, "lineHeight": 19}
    assert fuzz.misplaced(below) is None
    assert fuzz.misplaced({**below, "below": {**AT_CURSOR, "top": 245}}) is not None
    # No ghost text, or no cursor drawn (the editor without focus): nothing to say.
    assert fuzz.misplaced({**place, "inline": None}) is None
    assert fuzz.misplaced({**place, "cursor": {**CURSOR, "height": 0}}) is None


@pytest.mark.slow
# Each run starts its own code-server and model: more than the suite's 300 s default on a busy machine.
@pytest.mark.timeout(600)
@pytest.mark.parametrize("seed", [53, 54])
def test_random_editing_shows_no_error_and_accepts_what_is_shown(seed, tmp_path):
    try:
        summary = fuzz.run(seed, ACTIONS, tmp_path)
    except fuzz.FuzzFailure as failure:
        pytest.fail(str(failure), pytrace=False)
    print(summary)
    assert summary["steps"] >= ACTIONS
