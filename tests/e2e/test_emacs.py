"""End-to-end tests of Emacs against the llada-lsp server, with the LSP clients Emacs users have: eglot
(built in from Emacs 29, the elpa-eglot package before) and lsp-mode (elpa-lsp-mode), with and without
company (elpa-company).

eglot_complete.el opens SOURCE, puts the cursor after the partial word `val`, runs `completion-at-point`
with eglot's completion function, shuts the server down with `eglot-shutdown`, and prints what happened
as JSON. lsp_mode_session.el completes inside a word with completion-at-point and with company, and
rewrites lines through the code action. The server is `python -m llada_lsp` (LLADA_TEST_SERVER_CMD
overrides it), LLADA_TEST_EMACS names another Emacs. A missing Emacs or package skips, with the reason.
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
HERE = Path(__file__).parent
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


def require_packages(*features: str) -> None:
    """Skips the test, with Emacs's own reason, unless batch Emacs loads each of {features} the way the
    scripts do (emacs_packages.el first)."""
    load = " ".join(f"(require '{feature})" for feature in features)
    proc = subprocess.run(
        [EMACS, "--batch", "-Q", "-l", str(HERE / "emacs_packages.el"), "--eval", f"(progn {load})"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        reason = next((line for line in proc.stderr.splitlines() if "error" in line.lower()), proc.stderr.strip())
        pytest.skip(f"{EMACS} cannot load {', '.join(features)} (Emacs 29+ has eglot; Debian packages"
                    f" elpa-eglot, elpa-lsp-mode, elpa-company): {reason}")  # fmt: skip


def run_emacs(script: str, path: Path, **inputs: str) -> dict:
    """Runs {script} in batch Emacs on {path} with {inputs} as LLADA_EMACS_* variables; its JSON result."""
    env = {
        **os.environ,
        "LLADA_EMACS_SERVER": json.dumps(server_command()),
        "LLADA_EMACS_FILE": str(path),
        "LLADA_EMACS_TIMEOUT": str(int(WAIT_S)),
        **{f"LLADA_EMACS_{name.upper()}": value for name, value in inputs.items()},
    }
    proc = subprocess.run(
        [EMACS, "--batch", "-Q", "-l", str(HERE / script)], cwd=path.parent, env=env, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=4 * WAIT_S + 30, check=False,
    )  # fmt: skip
    lines = [line[line.index(MARKER) :] for line in proc.stdout.splitlines() if MARKER in line]
    assert proc.returncode == 0 and lines, (
        f"emacs exited with {proc.returncode} and no result\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )
    result = json.loads(lines[-1][len(MARKER) :])
    result["stderr"] = proc.stderr
    return result


def test_eglot_completes_the_word_typed(tmp_path: Path):
    require_packages("eglot")
    path = tmp_path / "sample.py"
    path.write_text(SOURCE)
    result = run_emacs("eglot_complete.el", path, line=str(LINE))
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


# lsp-mode: the cursor inside the word `return` (after `re`), and a class whose first two lines the
# embedded model rewrites.
# The embedded model rewrites line 6 (`a - b` -> `a + b`) in this file, so the rewrite has a change to apply.
LSP_MODE_SOURCE = (
    "def add(a, b):\n"
    "    return a + b\n"
    "\n"
    "\n"
    "def sub(a, b):\n"
    "    return a - b\n"
    "\n"
    "print(add(1, 2))\n"
    "\n"
    "\n"
    "class T:\n"
    "    return su\n"
)
MID_WORD_LINE, MID_WORD_COLUMN = 12, len("    re")
REWRITE_LINES = (6, 6)


@pytest.fixture(scope="module")
def lsp_mode_session(tmp_path_factory) -> dict:
    """One lsp-mode session for the module: both completions, then the code action (model loads once)."""
    require_packages("lsp-mode", "lsp-completion", "company")
    path = tmp_path_factory.mktemp("lsp-mode") / "sample.py"
    path.write_text(LSP_MODE_SOURCE)
    result = run_emacs("lsp_mode_session.el", path, point=f"{MID_WORD_LINE}:{MID_WORD_COLUMN}",
                       region="%d:%d" % REWRITE_LINES)  # fmt: skip
    print(f"Emacs {result['emacs']}, {result['lsp-mode']}, {result['company']}")
    assert "error" not in result, f"{result['error']}\n{result['stderr']}"
    assert result["before"] == "    return su"
    return result


def assert_no_duplication(result: dict, how: str) -> None:
    """Inside `re|turn`, a completion replaces the whole word `return` (what replaces it may keep the
    word, as `return x`), or nothing is offered; the text around the word stays as it was."""
    after, lines = result[f"{how}-after"], LSP_MODE_SOURCE.split("\n")
    assert f"{how}-error" not in result, result[f"{how}-error"]
    head, tail = "    ", " su"
    word = after[len(head) : -len(tail)] if after.startswith(head) and after.endswith(tail) else None
    assert word is not None and (word == "return" or not word.endswith("turn")), (
        f"{how} made {after!r} of {'    re|turn su'!r}: the word's rest must be replaced, not left after the insertion"
    )
    lines[MID_WORD_LINE - 1] = after
    assert result[f"{how}-buffer"] == "\n".join(lines), "only the completed line changes"


def test_lsp_mode_completion_at_point_inside_a_word(lsp_mode_session):
    assert lsp_mode_session["capabilities"]["completion"], "lsp-mode sees no completion provider"
    assert_no_duplication(lsp_mode_session, "capf")


def test_lsp_mode_company_inside_a_word(lsp_mode_session):
    assert_no_duplication(lsp_mode_session, "company")


def test_lsp_mode_rewrites_through_the_code_action(lsp_mode_session):
    result = lsp_mode_session
    assert "rewrite-error" not in result, result["rewrite-error"]
    actions = result["code-actions"]
    assert {"title": "Rewrite selection (LLaDA)", "kind": "refactor.rewrite"} in actions, actions
    after, before = result["rewrite-buffer"].split("\n"), LSP_MODE_SOURCE.split("\n")
    first, last = REWRITE_LINES
    assert after != before, "the model proposed no change for the lines; the rewrite cannot be checked"
    # Only the selected lines were replaced: the text before and after them is as it was.
    assert after[: first - 1] == before[: first - 1], after
    assert after[len(after) - (len(before) - last) :] == before[last:], after
