"""`llada-lsp complete` and `llada-lsp rewrite`: the server started over stdio by a headless client."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = float(os.environ.get("LLADA_TEST_TIMEOUT", "120"))
pytestmark = pytest.mark.slow  # each test starts the real server


def llada(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "llada_lsp", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT)


def test_complete_prints_the_completion_of_the_line():
    done = llada("complete", "examples/hello.py:12:15", "--max-tokens", "32", "--drafts")
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("\n") and done.stdout.count("\n") == 1, "one line: the rest of line 12"
    assert done.stdout.strip(), "the embedded model completes `return sum` here"
    assert "[draft step 1]" in done.stderr and "final]" in done.stderr


def test_an_indented_empty_line_completes_at_the_indentation_typed(tmp_path: Path):
    """The embedded model proposes ` pass` here (a space too many after the 4 typed): accepting that
    would indent by 5. The completion starts at the indentation already typed."""
    file = tmp_path / "imports.py"
    file.write_text("try:\n    import uvloop\nexcept ImportError:\n    \n")
    done = llada("complete", f"{file}:4:5")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "pass\n"


SOURCE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\nprint(add(1, 2))\n"


def test_rewrite_applies_the_edit_through_the_server(tmp_path: Path):
    file = tmp_path / "calc.py"
    file.write_text(SOURCE)
    done = llada("rewrite", f"{file}:6:1-7:1", "--write")
    assert done.returncode == 0, done.stderr
    # What the embedded model does with line 6 (deterministic on the CPU): it changes the operator.
    assert done.stdout == "    return a + b\n\n"
    assert file.read_text() == SOURCE.replace("a - b", "a + b")


def test_a_rewrite_that_would_break_the_file_is_not_written(tmp_path: Path):
    file = tmp_path / "calc.py"
    file.write_text(SOURCE)
    done = llada("rewrite", f"{file}:6:1-9:1", "--write")
    assert done.returncode == 1 and done.stdout == ""
    assert "not applied: the rewrite would leave the file unparsable" in done.stderr
    assert file.read_text() == SOURCE


def test_a_missing_model_fails_with_the_reason():
    done = llada("complete", "examples/hello.py:12:15", "--model", "/nonexistent/model")
    assert done.returncode == 1 and "/nonexistent/model" in done.stderr
