"""`llada-lsp complete --drafts` prints each live draft that has text: the first step's may have none
yet (docs/protocol.md, "Live drafts"), and `[draft step 1] ''` was printed, through the engine and in
the server alike."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

TIMEOUT = float(os.environ.get("LLADA_TEST_TIMEOUT", "120"))
pytestmark = pytest.mark.slow  # starts the real server


def test_a_draft_without_text_is_not_printed(tmp_path: Path):
    # After `total = ` the embedded model's first step fills nothing at the cursor; the completion is
    # ` sum(values)` or the like, drafted from a later step.
    file = tmp_path / "mean.py"
    file.write_text("def mean(values):\n    total = \n")
    command = [sys.executable, "-m", "llada_lsp", "complete", f"{file}:2:13", "--drafts", "--threads", "1",
               "--engine", "local"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    drafts = re.findall(r"^\[draft step (\d+)( final)?\] (.*)$", done.stderr, re.MULTILINE)
    assert drafts and drafts[-1][1] == " final" and drafts[-1][2] == repr(done.stdout.rstrip("\n")), done.stderr
    assert all(text != "''" for _, _, text in drafts), done.stderr
    assert int(drafts[0][0]) > 1, "the case needs a first step without text; it drafted at step 1"
