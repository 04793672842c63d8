"""`llada-lsp complete` and `llada-lsp rewrite`: the server started over stdio by a headless client."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llada_lsp.model import EMBEDDED_MODEL

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = float(os.environ.get("LLADA_TEST_TIMEOUT", "120"))
pytestmark = pytest.mark.skipif(not (EMBEDDED_MODEL / "config.json").is_file(), reason="no embedded model")


def llada(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "llada_lsp", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT)


def test_complete_prints_the_completion_of_the_line():
    done = llada("complete", "examples/hello.py:12:15", "--max-tokens", "32", "--drafts")
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("\n") and done.stdout.count("\n") == 1, "one line: the rest of line 12"
    assert "[draft step 1]" in done.stderr and "final]" in done.stderr


def test_rewrite_applies_the_edit_through_the_server(tmp_path: Path):
    file = tmp_path / "hello.py"
    shutil.copy(ROOT / "examples" / "hello.py", file)
    before = file.read_text().splitlines(keepends=True)
    done = llada("rewrite", f"{file}:4:1-5:29", "--write")
    assert done.returncode == 0, done.stderr
    # lines 4-5 (the whole of greet(), up to the end of its return line) became the printed text
    assert file.read_text() == "".join(before[:3]) + done.stdout + "".join(before[5:])


def test_a_missing_model_fails_with_the_reason():
    done = llada("complete", "examples/hello.py:12:15", "--model", "/nonexistent/model")
    assert done.returncode == 1 and "/nonexistent/model" in done.stderr
