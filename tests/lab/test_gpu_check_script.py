"""benchmarks/gpu_check.sh, the one device command of a GPU run, checked on the CPU: its time boxes (kill
grace included) add up to at most 540 s, so it always ends inside a device command's 600 s with its
summary written; it runs `python3` unless PYTHON says otherwise; and without CUDA it still writes
summary.json under $OUT and exits 2."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.sh"
BUDGET = 540


def time_boxes(text: str) -> list[tuple[str, int]]:
    """(what, seconds) of every time box: `run NAME SECONDS ...` steps and direct `timeout` calls,
    each with its `-k` grace."""
    boxes = []
    run_kill = int(re.search(r'timeout -k (\d+) "\$limit"', text).group(1))
    for name, limit in re.findall(r"^run (\S+) (\d+) ", text, flags=re.M):
        boxes.append((name, int(limit) + run_kill))
    for kill, limit in re.findall(r"timeout -k (\d+) (\d+) ", text):
        boxes.append(("timeout", int(limit) + int(kill)))
    return boxes


def test_the_time_boxes_fit_540_seconds():
    text = SCRIPT.read_text()
    boxes = time_boxes(text)
    assert len([b for b in boxes if b[0] != "timeout"]) >= 9, boxes  # every step of the run is boxed
    bare = [line for line in text.splitlines() if re.search(r"(^|\s)timeout (?!-k)", line)]
    assert not bare, f"a timeout without its -k grace is not counted: {bare}"
    assert sum(s for _, s in boxes) <= BUDGET, boxes


def test_it_runs_python3_unless_told_otherwise():
    text = SCRIPT.read_text()
    assert "PY=${PYTHON:-python3}" in text
    assert not re.search(r"(^|[\s(])python(\s|$)", text, flags=re.M), "a bare `python`: the device has python3"


@pytest.mark.skipif(shutil.which("timeout") is None or shutil.which("bash") is None, reason="needs bash and timeout")
def test_without_cuda_it_writes_its_summary_under_out(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the script would run the whole device check")
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    run = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 2, run.stdout + run.stderr
    summary = json.loads((tmp_path / "gpu_check" / "summary.json").read_text())
    assert summary["steps"]["probe"]["status"] == "no CUDA"
    assert "kernel_parity_cuda" in summary["unmeasured"] and summary["mini_ms_per_step_1k"]["1_graph"] is None
    assert run.stdout.rstrip().splitlines()[-1].startswith("total "), "the summary is printed last"
