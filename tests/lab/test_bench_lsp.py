"""benchmarks/bench_lsp.py run small: three recorded keystrokes (an Enter, then two characters) through
an in-process server and a front of an engine service, as lsp_client.py speaks to them, its tables
printed and published with the command and commit (`--markdown`)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_small_replay_through_both_fronts_prints_and_publishes_its_tables(tmp_path):
    published = tmp_path / "bench_lsp.md"
    done = subprocess.run([sys.executable, "benchmarks/bench_lsp.py", "--engine", "both", "--limit", "3", "--threads",
                           "1", "--markdown", str(published)], cwd=ROOT, capture_output=True, text=True,
                          timeout=280)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert out.startswith("3 keystrokes over inventory_edits.json, mode speed, 1 thread(s)")
    # Both fronts answered every keystroke, with numbers: the Enter is a block, the characters single-line.
    assert re.search(r"^didChange -> inline response \(single-line\)( +\d+\.\d){4} +2$", out, re.M), out
    assert re.search(r"^didChange -> inline response \(block\)( +\d+\.\d){4} +1$", out, re.M), out
    assert re.search(r"^added: inline response \(target p50 < 3 ms\) +-?\d+\.\d +-?\d+\.\d +3$", out, re.M), out
    assert re.search(r"^in-process: completions shown: \d/3; identical to the direct run: \d/3$", out, re.M)
    markdown = published.read_text()
    assert markdown.startswith("## Latency as an editor sees it") and "Commit: `" in markdown
    assert "| milliseconds | in-process p50 | in-process p95 | service p50 | service p95 | n |" in markdown
    assert "| service - in-process, per keystroke, ms | p50 | p95 | n |" in markdown
    assert "- RSS at the end of the run: in-process front " in markdown
    assert "Command: `python benchmarks/bench_lsp.py --engine both --limit 3" in markdown
