"""benchmarks/bench_serve.py on a short run: a real engine service, one editor, its row printed and
published with the command that produced it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_short_serving_run_prints_and_publishes_its_row(tmp_path):
    out_file = tmp_path / "serve.md"
    command = [sys.executable, "benchmarks/bench_serve.py", "--editors", "1", "--rows", "batched", "--limit", "3",
               "--threads", "1", "--markdown", str(out_file)]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    row = next(line.split() for line in done.stdout.splitlines() if line.split()[:2] == ["1", "on"])
    assert int(row[3]) == 3 and int(row[4]) == 0  # three keystrokes answered, none failed
    published = out_file.read_text()
    assert "| editors | batching | prefix cache | answered |" in published and "| 1 | on | on | 3 | 0 |" in published
    assert "Command: `python benchmarks/bench_serve.py --editors 1" in published
