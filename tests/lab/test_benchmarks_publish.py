"""The small benchmarks publish what they print: bench_load and bench_fp8 with --markdown."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def benchmark(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows(markdown: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in markdown.splitlines()
            if line.startswith("| ") and not line.startswith("|---")][1:]  # fmt: skip


@pytest.mark.slow
def test_bench_load_publishes_each_step_of_a_cold_start(tmp_path):
    benchmark("bench_load").main(["--runs", "1", "--markdown", str(tmp_path / "load.md")])
    published = (tmp_path / "load.md").read_text()
    steps = {row[0]: float(row[1]) for row in rows(published)}
    assert set(steps) == {"import torch", "import llada_lsp + transformers", "load weights + tokenizer", "total"}
    assert 0 < steps["import torch"] < steps["total"] and "Command: `" in published


@pytest.mark.slow
def test_bench_fp8_publishes_its_bar(tmp_path, restore_threads):
    bench = benchmark("bench_fp8")
    assert bench.main(["--vocab", "512", "--tokens", "16", "--threads", "1", "--markdown", str(tmp_path / "f.md")]) == 0
    table = rows((tmp_path / "f.md").read_text())
    assert [row[0].split(",")[0] for row in table] == [
        "the golden tiny checkpoint (64 wide",
        "one random MoE layer at LLaDA2.1-mini shapes (vocab 512)",
    ]
    assert all(row[-1] in ("met", "missed") for row in table)


@pytest.mark.slow
def test_bench_first_minute_publishes_calls_timeline_and_load_phases(tmp_path):
    """One warm round: the whole `complete` call (wall and CPU), when its parts happen, and the load's phases."""
    benchmark("bench_first_minute").main(["--runs", "1", "--first-runs", "0", "--markdown", str(tmp_path / "f.md")])
    published = (tmp_path / "f.md").read_text()
    table = {row[0]: row[1:] for row in rows(published)}
    wall, cpu = float(table["warm caches"][0]), float(table["warm caches"][2])
    assert cpu > 0 and wall > 0
    marks = [float(table[mark][0]) for mark in ("server initialized", "model ready", "completion computed", "exited")]
    assert marks == sorted(marks) and marks[0] > 0, marks
    assert float(table["import torch"][1]) > 0 and "weights (and CPU kernels)" in table
    assert "CPU kernels off" in published and "Command: `" in published
