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

pytestmark = [pytest.mark.slow]

ACTIONS = 150


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
