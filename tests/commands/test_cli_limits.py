"""The command line refuses what the server could not take before it starts one: a file over the
LSP message limit is one line and exit code 2, at once (it was 34 s of jargon and exit code 0)."""

from __future__ import annotations

import subprocess
import sys
import time


def test_a_file_over_the_message_limit_is_refused_before_a_server_starts(tmp_path):
    huge = tmp_path / "huge.py"
    line = "x = 1  # " + "filler " * 10 + "\n"
    with huge.open("w") as f:
        f.write(line * (65 * 2**20 // len(line) + 1))  # just over 64 MiB of plain text
    started = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "llada_lsp", "complete", f"{huge}:1000:3"], capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert p.returncode == 2 and p.stdout == "", (p.stdout, p.stderr)
    assert p.stderr == f"llada-lsp complete: {huge} is 65 MiB; the limit is 64 MiB\n"
    assert time.monotonic() - started < 30, "no server was started, no 64 MiB sent"


def test_a_file_whose_message_would_be_over_the_limit_is_refused(tmp_path):
    """Under the limit on disk, over it as JSON: every non-ASCII character is sent as a \\u escape."""
    wide = tmp_path / "wide.py"
    wide.write_text("s = '" + "é" * (12 * 2**20) + "'\n")  # 24 MiB on disk, 72 MiB escaped
    p = subprocess.run([sys.executable, "-m", "llada_lsp", "complete", f"{wide}:1:3"], capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "the limit is 64 MiB (as one LSP message, escaped)" in p.stderr
