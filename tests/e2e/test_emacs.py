"""End-to-end test of the `textDocument/completion` fallback in Emacs: a real batch Emacs, its eglot
(built in from Emacs 29, the elpa-eglot package before), and the llada-lsp server.

eglot_complete.el opens SOURCE, puts the cursor after the partial word `val`, runs `completion-at-point`
with eglot's completion function, shuts the server down with `eglot-shutdown`, and prints what happened
as JSON. The server is `python -m llada_lsp` (LLADA_TEST_SERVER_CMD overrides it), LLADA_TEST_EMACS
names another Emacs.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EMACS = os.environ.get("LLADA_TEST_EMACS") or shutil.which("emacs")
SCRIPT = Path(__file__).with_name("eglot_complete.el")
# Each wait inside Emacs (connecting, the completion request that waits for the model to load).
WAIT_S = float(os.environ.get("LLADA_TEST_TIMEOUT", "60"))

pytestmark = [pytest.mark.slow, pytest.mark.skipif(EMACS is None, reason="emacs not found (LLADA_TEST_EMACS, PATH)")]

# Mid-word: at `    for v in val|` the embedded model completes the word (`ues:`). The item must replace
# the typed `val` with the word completed, so that eglot offers it for the prefix `val` and inserts it whole.
SOURCE = "def total(values):\n    for v in val\n"
LINE = 2
TYPED = "    for v in val"
EXPECTED_START = "    for v in values"
MARKER = "@@LLADA-RESULT@@ "


def server_command() -> list[str]:
    override = os.environ.get("LLADA_TEST_SERVER_CMD")
    return shlex.split(override) if override else [sys.executable, "-m", "llada_lsp"]


def run_emacs(path: Path) -> dict:
    env = {
        **os.environ,
        "LLADA_EMACS_SERVER": json.dumps(server_command()),
        "LLADA_EMACS_FILE": str(path),
        "LLADA_EMACS_LINE": str(LINE),
        "LLADA_EMACS_TIMEOUT": str(int(WAIT_S)),
    }
    proc = subprocess.run(
        [EMACS, "--batch", "-Q", "-l", str(SCRIPT)], cwd=path.parent, env=env, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=2 * WAIT_S + 30,
    )  # fmt: skip
    lines = [line[line.index(MARKER) :] for line in proc.stdout.splitlines() if MARKER in line]
    assert proc.returncode == 0 and lines, (
        f"emacs exited with {proc.returncode} and no result"
        " (eglot must be loadable: Emacs 29+, or the elpa-eglot package on Emacs 28)\n"
        f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )
    result = json.loads(lines[-1][len(MARKER) :])
    result["stderr"] = proc.stderr
    return result


def test_eglot_completes_the_word_typed(tmp_path: Path):
    path = tmp_path / "sample.py"
    path.write_text(SOURCE)
    result = run_emacs(path)
    print(f"Emacs {result['emacs']}, eglot {result['eglot']}: {result.get('before')!r} -> {result.get('after')!r}")
    assert "error" not in result, f"{result['error']}\n{result['stderr']}"
    capabilities = result["capabilities"]
    assert capabilities["triggerCharacters"] == ["."] and capabilities["resolveProvider"] is False, capabilities
    assert result["before"] == TYPED
    assert result["probe"] == "val", "eglot's completion bounds are the word typed"
    # eglot lists the item for the typed prefix (eglot 1.9 filters out items not starting with it).
    assert result["candidates"] and all(c.startswith("val") for c in result["candidates"]), (
        f"eglot offered {result['candidates']!r} for the typed `val`: the item must begin with the word typed"
    )

    after = result["after"]
    assert "valval" not in after and after.startswith(EXPECTED_START), (
        f"eglot made {after!r} of {TYPED!r}: the typed word must be completed, nothing deleted or duplicated"
    )
    # The rest of the buffer is untouched and the cursor is at the end of the insertion.
    assert result["buffer"] == SOURCE.replace(TYPED, after, 1)
    assert result["point-column"] == len(after)

    # eglot-shutdown: the server exited by itself after `exit`, with no SIGKILL (status 9) needed.
    assert "shutdown-error" not in result, result["shutdown-error"]
    assert (result["process-status"], result["exit-status"]) == ("exit", 0), result
