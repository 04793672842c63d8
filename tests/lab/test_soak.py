"""benchmarks/soak.py run small: two editors, each through its own front over stdio (lsp_client.py),
edit, complete, cancel, rewrite and misbehave against one engine service for a few seconds; every
request is answered, and the tables are printed and published with the command and commit."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_short_soak_answers_every_request_and_publishes_its_tables(tmp_path):
    published = tmp_path / "soak.md"
    done = subprocess.run([sys.executable, "benchmarks/soak.py", "--minutes", "0.1", "--clients", "2", "--no-abuse",
                           "--threads", "1", "--drain", "60", "--markdown", str(published)], cwd=ROOT,
                          capture_output=True, text=True, timeout=280)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    for client in ("client0", "client1"):
        row = re.search(rf"^{client} +(\d+) +(\d+) +0 +\d+ +\d+ +(.*)$", out, re.M)
        assert row, out
        assert int(row[1]) == int(row[2]) >= 3 and "result: " in row[3]  # initialize, a completion, shutdown at least
    assert "unanswered requests: 0" in out and "sent by method: " in out
    markdown = published.read_text()
    assert markdown.startswith("## Hostile input") and "Commit: `" in markdown
    assert "| client | sent | answered | unanswered | RSS start | RSS end | outcomes |" in markdown
    assert re.search(r"^\| client0 \| \d+ \| \d+ \| 0 \|", markdown, re.M)
    assert "- unanswered requests: 0" in markdown and "- answers to malformed messages: " in markdown
