"""End-to-end test of Vim with ALE (Debian's vim-ale) against the llada-lsp server: a real Vim in a
pseudo-terminal, ALE connected to `llada-lsp` on stdio as a user's linter definition connects it.

vim_ale_session.vim opens SOURCE, asks ALE for a completion after `total = s` (as <Plug>(ale_complete)
does, again until the model has loaded), accepts the first item of the menu with CTRL-Y, then runs the
code action "Rewrite selection (LLaDA)" on line 6 (selected with V) through :'<,'>ALECodeAction and
its numbered menu, and
writes what happened as JSON: the menu's items, the completed line, the buffer and Vim's screen.

ALE keeps an item's text only up to its first `(` (server/ale.py): `sorted(values)` was shown and
inserted as `sorted`. ALE also declares that it cannot apply workspace edits, and showed nothing of the
rewrite. The server is `python -m llada_lsp` (LLADA_TEST_SERVER_CMD overrides it); LLADA_TEST_VIM names
another Vim. A missing Vim or ALE skips, with the reason.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import shlex
import shutil
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

VIM = os.environ.get("LLADA_TEST_VIM") or shutil.which("vim")
HERE = Path(__file__).parent
# The whole session: the model's load (a first start compiles the CPU kernels), a completion, a rewrite.
WAIT_S = float(os.environ.get("LLADA_TEST_TIMEOUT", "60")) * 3

pytestmark = [pytest.mark.slow, pytest.mark.skipif(VIM is None, reason="vim not found (LLADA_TEST_VIM, PATH)")]

# The embedded model completes `    total = s` with `orted(values)`, and proposes a change to line 6.
SOURCE = "def mean(values):\n    total = s\n\n\ndef sub(a, b):\n    return a - b\n"
COMPLETE_LINE, TYPED = 2, "    total = s"
REWRITE_LINES = (6, 6)


def server_command() -> str:
    override = os.environ.get("LLADA_TEST_SERVER_CMD")
    command = shlex.split(override) if override else [sys.executable, "-m", "llada_lsp"]
    return shlex.join([*command, "--threads", "1", "--engine", "local"])


def require_ale() -> None:
    """Skips unless this Vim finds ALE with `packadd` (Debian's vim-ale puts it in vimfiles/pack)."""
    proc = subprocess.run(
        [VIM, "-Nu", "NONE", "-i", "NONE", "-es", "-c", "packadd ale", "-c", "if !exists(':ALEComplete') | cquit | endif",
         "-c", "qall!"], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        pytest.skip(f"{VIM} has no ALE (`packadd ale` failed; Debian: apt-get install vim-ale): {proc.stderr.strip()}")


def run_vim(path: Path, out: Path) -> dict:
    """Runs vim_ale_session.vim on {path} in a pseudo-terminal of 40x160 and returns its JSON result."""
    env = {**os.environ, "TERM": "xterm", "LLADA_VIM_SERVER": server_command(), "LLADA_VIM_OUT": str(out),
           "LLADA_VIM_COMPLETE": f"{COMPLETE_LINE}:{len(TYPED)}", "LLADA_VIM_REWRITE": "%d:%d" % REWRITE_LINES,
           "LLADA_VIM_WAIT": str(WAIT_S)}  # fmt: skip
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    command = [VIM, "-Nu", str(HERE / "vim_ale_session.vim"), "-i", "NONE", "-n", str(path)]
    proc = subprocess.Popen(command, stdin=terminal, stdout=terminal, stderr=terminal, env=env,
                            cwd=path.parent, start_new_session=True)  # fmt: skip
    os.close(terminal)
    deadline = time.monotonic() + WAIT_S + 60
    try:
        while proc.poll() is None and time.monotonic() < deadline:  # Vim blocks if its output is not read
            if select.select([controller], [], [], 0.5)[0]:
                try:
                    os.read(controller, 65536)
                except OSError:  # the terminal closed: Vim has exited
                    break
        proc.wait(timeout=max(1, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(controller)
    assert out.exists(), f"Vim ended (status {proc.returncode}) without writing its result"
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> dict:
    require_ale()
    folder = tmp_path_factory.mktemp("vim-ale")
    path = folder / "sample.py"
    path.write_text(SOURCE)
    result = run_vim(path, folder / "result.json")
    print("\n".join(result["events"]))
    assert result["finish"] == "done", "\n".join(result["events"] + [result["messages"]] + result["screen"])
    return result


def test_ale_shows_and_inserts_the_whole_completion(session):
    (item,) = session["items"]
    line = session["completed_line"]
    assert line.startswith(TYPED) and len(line) > len(TYPED), line
    completion = line[len(TYPED) - 1 :]  # from the typed `s`
    assert "(" in completion, f"the case needs a completion with a `(`: {completion!r}"
    assert line == "    total = sorted(values)", line  # the embedded model's completion, whole
    # The menu shows the word ALE inserts and, beside it, the whole completion.
    assert completion.startswith(item["word"]) and item["menu"] == completion, item


def test_ale_shows_the_rewrites_outcome(session):
    """ALE cannot apply workspace edits (it says so): the rewrite it cannot apply is told with
    window/showMessage, which ALE shows, with the text to take."""
    screen = session["screen"]
    assert session["buffer"] == session["before_rewrite"]  # nothing was applied behind the user's back
    (said,) = [i for i, row in enumerate(screen) if "the rewrite was not applied" in row]
    assert screen[said].startswith("Error:") and screen[said].endswith("The rewrite:"), screen
    # The proposal for line 6 (V selects it to the end of the line; the model's text for that selection).
    assert screen[said + 1].startswith("    return a") and screen[said + 1] != "    return a - b", screen
