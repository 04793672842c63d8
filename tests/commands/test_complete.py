"""`llada-lsp complete` and `llada-lsp rewrite`: the server started over stdio by a headless client."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = float(os.environ.get("LLADA_TEST_TIMEOUT", "120"))
pytestmark = pytest.mark.slow  # each test starts the real server


def llada(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "llada_lsp", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT)


def test_complete_prints_the_completion_of_the_line():
    done = llada("complete", "examples/hello.py:12:15", "--max-tokens", "32", "--drafts", "--threads", "1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("\n") and done.stdout.count("\n") == 1, "one line: the rest of line 12"
    assert done.stdout.strip(), "the embedded model completes `return sum` here"
    assert "[draft step 1]" in done.stderr and "final]" in done.stderr


def test_one_answer_loads_no_cpu_kernels(tmp_path: Path):
    """For one answer the CPU kernels cost more than they save (numba's import and cache load, ~0.7 s
    of CPU; a first start compiled them, 45 s here): the server `complete` starts runs the torch path
    and leaves numba's cache alone (the first start of a machine is as quick as any)."""
    cache = tmp_path / "numba"
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    env.pop("LLADA_LSP_KERNELS", None)
    command = [sys.executable, "-m", "llada_lsp", "complete", "examples/hello.py:12:15", "--engine", "local"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, env=env, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr
    assert not cache.exists() or not any(cache.rglob("*")), sorted(cache.rglob("*"))


def test_an_indented_empty_line_completes_at_the_indentation_typed(tmp_path: Path):
    """The embedded model proposes ` pass` here (a space too many after the 4 typed): accepting that
    would indent by 5. The completion starts at the indentation already typed."""
    file = tmp_path / "imports.py"
    file.write_text("try:\n    import uvloop\nexcept ImportError:\n    \n")
    done = llada("complete", f"{file}:4:5")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "pass\n"


SOURCE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\nprint(add(1, 2))\n"


DIFF = "".join(f"{line}\n" for line in ["@@ -3,6 +3,6 @@", " ", " ", " def sub(a, b):", "-    return a - b",
                                        "+    return a + b", " ", " print(add(1, 2))"])  # fmt: skip


def test_rewrite_applies_the_edit_through_the_server(tmp_path: Path):
    """--write says what it changed: a unified diff on stdout (a patch), `wrote FILE` on stderr."""
    file = tmp_path / "calc.py"
    file.write_text(SOURCE)
    done = llada("rewrite", f"{file}:6:1-7:1", "--write")
    assert done.returncode == 0, done.stderr
    # What the embedded model does with line 6 (deterministic on the CPU): it changes the operator.
    assert done.stdout == f"--- {file}\n+++ {file}\n{DIFF}"
    assert f"llada-lsp rewrite: wrote {file}" in done.stderr
    assert file.read_text() == SOURCE.replace("a - b", "a + b")


def test_rewrite_diff_shows_the_change_and_leaves_the_file(tmp_path: Path):
    file = tmp_path / "calc.py"
    file.write_text(SOURCE)
    done = llada("rewrite", f"{file}:6:1-7:1", "--diff")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"--- {file}\n+++ {file}\n{DIFF}" and "wrote" not in done.stderr
    assert file.read_text() == SOURCE


def test_a_rewrite_of_the_last_line_may_end_at_the_end_of_the_file(tmp_path: Path):
    """The file has 8 lines as an editor shows them; 9:1, the end of the file, ends a span."""
    file = tmp_path / "calc.py"
    file.write_text(SOURCE)
    done = llada("rewrite", f"{file}:8:1-9:1")
    assert done.returncode in (0, 1) and "past the end" not in done.stderr, done.stderr


def test_a_rewrite_that_would_break_the_file_is_not_written(tmp_path: Path):
    file = tmp_path / "calc.py"
    file.write_text(SOURCE)
    done = llada("rewrite", f"{file}:6:1-9:1", "--write")
    assert done.returncode == 1 and done.stdout == ""
    assert "not applied: the rewrite would leave the file unparsable" in done.stderr
    assert file.read_text() == SOURCE


def test_a_missing_model_fails_with_the_reason():
    """A bad option, refused before a server starts (it started one, waited for its load to fail, and
    exited 1): code 2 and one line (it was three near-identical ones), with one `llada` prefix."""
    done = llada("complete", "examples/hello.py:12:15", "--model", "/nonexistent/model")
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr == "llada-lsp complete: --model: /nonexistent/model: no such model folder\n"


def test_a_model_that_does_not_load_fails_with_the_reason_and_exits_1(tmp_path: Path):
    """A folder that looks like a model passes the command's checks; the server's load says why it fails."""
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    done = llada("complete", "examples/hello.py:12:15", "--model", str(tmp_path))
    assert done.returncode == 1 and str(tmp_path) in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("llada-lsp complete: "), done.stderr
    assert "llada:" not in done.stderr


def test_no_completion_is_said_and_exits_1(tmp_path: Path):
    """An empty line on stdout with code 0 read as a whitespace answer. The embedded model answers
    nothing after `return a + ` (tests/server/test_server_e2e.py: MID_LINE)."""
    file = tmp_path / "unfinished.py"
    file.write_text("def add(a, b):\n    return a + \n\n\ndef sub(a, b):\n    \n\nprint(add(1, 2))\n")
    done = llada("complete", f"{file}:2:16")
    assert done.returncode == 1 and done.stdout == "", (done.stdout, done.stderr)
    assert done.stderr == "llada-lsp complete: no completion\n"


def test_what_a_script_reads_does_not_depend_on_how_fast_the_model_loads(tmp_path: Path):
    """A load that outlasted 3 s (a slow machine's) added a waiting notice to stderr, and the exact
    stderr above differed by the machine's speed. The notice is said at a terminal only: here a load
    takes 5 s longer (the test hook) and stderr is what a quick load gives."""
    file = tmp_path / "unfinished.py"
    file.write_text("def add(a, b):\n    return a + \n\n\ndef sub(a, b):\n    \n\nprint(add(1, 2))\n")
    env = {**os.environ, "LLADA_LSP_TEST_LOAD_DELAY_MS": "5000"}
    command = [sys.executable, "-m", "llada_lsp", "complete", f"{file}:2:16"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, env=env, cwd=ROOT)
    assert done.returncode == 1 and done.stdout == "", (done.stdout, done.stderr)
    assert done.stderr == "llada-lsp complete: no completion\n"


@pytest.mark.parametrize("shown", ["--diff", "--write"])
def test_a_rewrite_that_changes_nothing_has_no_diff_and_exits_1(tmp_path: Path, shown: str):
    """The embedded model keeps `return a + b` as it is. --diff printed nothing and exited 0, though
    the README says 1 when there is no answer; now one line says so, and the file is left alone."""
    file = tmp_path / "calc.py"
    file.write_text(SOURCE)
    done = llada("rewrite", f"{file}:2:1-3:1", shown)
    assert done.returncode == 1 and done.stdout == "", (done.stdout, done.stderr)
    assert (
        done.stderr == f"llada-lsp rewrite: the model proposed no change: no diff to print, {file} is left as it is\n"
    )
    assert file.read_text() == SOURCE


def test_an_instruction_the_embedded_model_cannot_read_is_refused_before_it_loads(tmp_path: Path):
    """It loaded the model (12-27 s on a busy machine) before refusing. Here a load takes a minute
    (the test hook): the refusal comes long before."""
    file = tmp_path / "calc.py"
    file.write_text(SOURCE)
    env = {**os.environ, "LLADA_LSP_TEST_LOAD_DELAY_MS": "60000"}
    command = [sys.executable, "-m", "llada_lsp", "rewrite", f"{file}:6:1-7:1", "--instruction", "use subtraction"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=50, env=env)
    assert done.returncode == 1 and "cannot follow an instruction" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and file.read_text() == SOURCE


def test_the_diff_of_a_file_without_a_final_line_end_applies(tmp_path: Path):
    """Its last line was glued to the next line of the diff: `patch` could not read it."""
    file = tmp_path / "calc.py"
    file.write_text(SOURCE.rstrip("\n"))
    done = llada("rewrite", f"{file}:6:1-7:1", "--diff")
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith(" print(add(1, 2))\n\\ No newline at end of file\n"), done.stdout
