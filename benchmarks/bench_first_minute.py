"""The first minute of `llada-lsp complete` with no engine running: how long whole calls take (the
median of --runs, warm caches, and a first start with an empty numba cache), when each part of one
call happens, and where a load's time goes.

Three measurements, each in fresh processes:
- calls: `python -m llada_lsp complete SPOT --engine local`, wall time and CPU time (user + sys of the
  client and its server); CPU time moves far less than wall time when other work shares the machine.
- timeline: the same call with `--log-level debug`, each server log line stamped as it arrives: the
  server has answered `initialize` (its imports), the model is ready, the completion is computed, the
  command has exited.
- load phases: what the server's model thread does (its CPU kernels as `complete` runs them: off unless
  LLADA_LSP_KERNELS or --kernels says otherwise), step by step in one process (imports of torch,
  tokenizers, numba and the CPU kernels, the model code; the weights; the CPU kernels' warm-up, which
  loads them from numba's cache or compiles them; the tokenizer; the engine; one completion).

A first start compiles the CPU kernels (numba caches them on disk): it runs with NUMBA_CACHE_DIR set to
an empty folder. Timings on a shared machine are noisy: compare CPU times, and re-run on a quiet one.

Usage: python benchmarks/bench_first_minute.py [--runs 5] [--first-runs 1] [--spot FILE:LINE:COL]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from llada_lsp.report import Report, Table, add_markdown_argument

ROOT = Path(__file__).resolve().parents[1]
SPOT = f"{ROOT / 'examples' / 'hello.py'}:12:15"  # the README's example: `return sum` completes here

# server log lines (--log-level debug) -> the moment they mark
MARKS = {
    "server initialized": re.compile(r"Language server initialized"),
    "model ready": re.compile(r"load \S+: done in"),
    "completion computed": re.compile(r"inline \d+: \d+ steps in"),
}

PROBE = """
import json, sys, time
wall, cpu = time.perf_counter, time.process_time
phases, last = {}, [wall(), cpu()]

def mark(name):
    now = [wall(), cpu()]
    phases[name] = [now[0] - last[0], now[1] - last[1]]
    last[:] = now

import torch
threads = int(sys.argv[1])
torch.set_num_threads(threads)
mark("import torch")
import tokenizers
mark("import tokenizers (the load imports no transformers)")
try:
    from llada_lsp.kernels import cpu as kernels
except ImportError:
    kernels = None
mark("import numba and the CPU kernels")
from llada_lsp.backends.base import load_codec
from llada_lsp.engine import Engine
from llada_lsp.model import load_model
mark("import the model and engine code")
warm = [0.0, 0.0]  # the CPU kernels' warm-ups (cached kernels loaded, or compiled), inside the load
if kernels is not None and hasattr(kernels, "warm_up"):
    _warm_up = kernels.warm_up
    def timed_warm_up(run):
        start = [wall(), cpu()]
        try:
            return _warm_up(run)
        finally:
            warm[0] += wall() - start[0]
            warm[1] += cpu() - start[1]
    kernels.warm_up = timed_warm_up
model = load_model(None)
mark("weights (and CPU kernels)")
codec = load_codec(None, "embedded")
mark("tokenizer")
engine = Engine(model)
mark("engine (and CPU kernels)")
prompt = codec.encode_markup("<|fim_prefix|>def mean(values):\\n    total = 0\\n    return<|fim_suffix|>\\n<|fim_middle|>")
result = engine.generation(prompt, 64, "speed", mask_id=codec.special.mask, eos_early_stop=True).run()
mark(f"one completion in the engine, no server ({result.steps} steps, {len(result.tokens)} tokens)")
phases["of which the CPU kernels' warm-ups (in the weights and the engine)"] = warm
print(json.dumps(phases))
"""


def complete_command(spot: str, threads: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "llada_lsp", "complete", spot, "--engine", "local", "--threads", str(threads), *extra]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def call(spot: str, threads: int, env: dict[str, str]) -> dict[str, float]:
    """One plain call -> wall and CPU seconds (the client and its server: the client reaps the server)."""
    cpu, start = children_cpu(), time.perf_counter()
    done = subprocess.run(complete_command(spot, threads), capture_output=True, text=True, env=env, timeout=600)
    wall = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"complete failed ({done.returncode}): {done.stderr}")
    return {"wall": wall, "cpu": children_cpu() - cpu, "answered": done.returncode == 0}


def timeline(spot: str, threads: int, env: dict[str, str]) -> dict[str, float]:
    """One call with the server's log: seconds from the start to each of MARKS, and to the exit."""
    start = time.perf_counter()
    p = subprocess.Popen(complete_command(spot, threads, "--log-level", "debug"), stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    seen: dict[str, float] = {}

    def read() -> None:
        for line in p.stderr:
            for name, pattern in MARKS.items():
                if name not in seen and pattern.search(line):
                    seen[name] = time.perf_counter() - start

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    p.wait(timeout=600)
    seen["exited"] = time.perf_counter() - start
    reader.join(timeout=10)
    return seen


def probe(threads: int, env: dict[str, str]) -> dict[str, list[float]]:
    done = subprocess.run([sys.executable, "-c", PROBE, str(threads)], capture_output=True, text=True, env=env,
                          timeout=600, cwd=ROOT)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"the load probe failed: {done.stderr}")
    return json.loads(done.stdout.splitlines()[-1])


def median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}" if values else "-"


def spread(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}" if values else "-"


def measure(args, env: dict[str, str], runs: int, label: str, fresh_cache: bool) -> dict:
    """`runs` rounds of (a call, a timeline, a probe), each round of a first start in its own empty
    numba cache."""
    out = {"calls": [], "timelines": [], "probes": []}
    runs_of = {"calls": lambda e: call(args.spot, args.threads, e), "timelines": lambda e: timeline(args.spot,
               args.threads, e), "probes": lambda e: probe(args.threads, e)}  # fmt: skip
    for i in range(runs):
        for kind, run in runs_of.items():
            with tempfile.TemporaryDirectory(prefix="llada-numba-") as cache:
                out[kind].append(run({**env, "NUMBA_CACHE_DIR": cache} if fresh_cache else env))
        last = out["calls"][-1]
        print(f"{label} {i + 1}/{runs}: {last['wall']:.2f} s wall, {last['cpu']:.2f} s CPU", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])  # fmt: skip
    ap.add_argument("--runs", type=int, default=5, help="rounds with warm caches (default: 5)")
    ap.add_argument("--first-runs", type=int, default=1,
                    help="rounds of a first start, each in an empty numba cache (default: 1; 0 skips them)")  # fmt: skip
    ap.add_argument("--spot", default=SPOT, help="FILE:LINE:COL to complete (default: examples/hello.py:12:15)")
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                    help="the model's CPU threads (default: the server's, half the cores)")  # fmt: skip
    ap.add_argument("--kernels", choices=["off", "on"], default=None,
                    help="the CPU kernels in the server (LLADA_LSP_KERNELS); default: as `complete` starts it, off "
                    "unless LLADA_LSP_KERNELS is set")  # fmt: skip
    add_markdown_argument(ap)
    args = ap.parse_args(argv)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    if args.kernels:
        env["LLADA_LSP_KERNELS"] = "1" if args.kernels == "on" else "0"
    kernels = "on" if env.setdefault("LLADA_LSP_KERNELS", "0") != "0" else "off"  # the probe as the server runs
    # the caches warm (numba's kernels, Python's bytecode, the files in the page cache) before timing
    subprocess.run(complete_command(args.spot, args.threads), capture_output=True, env=env, timeout=600)
    kinds = [("warm caches", measure(args, env, args.runs, "warm", False))]
    if args.first_runs:
        kinds.append(("first start (empty numba cache)", measure(args, env, args.first_runs, "first", True)))

    calls = Table(["`llada-lsp complete`, no engine", "wall s (median)", "wall s (range)", "CPU s (median)",
                   "CPU s (range)", "runs"])  # fmt: skip
    for label, data in kinds:
        walls, cpus = [c["wall"] for c in data["calls"]], [c["cpu"] for c in data["calls"]]
        calls.add(label, median(walls), spread(walls), median(cpus), spread(cpus), len(walls))
    times = Table(["seconds from the start (median)", *(label for label, _ in kinds)])
    for mark in [*MARKS, "exited"]:
        times.add(mark, *(median([t[mark] for t in data["timelines"] if mark in t]) for _, data in kinds))
    phases = Table(["load phase, one process", *(f"{label}: {what}" for label, _ in kinds for what in ("wall s",
                    "CPU s"))])  # fmt: skip
    names = list(kinds[0][1]["probes"][0])
    for name in names:
        cells = []
        for _, data in kinds:
            for i in (0, 1):
                cells.append(median([p[name][i] for p in data["probes"] if name in p]))
        phases.add(name, *cells)
    load = os.getloadavg()
    caption = (f"`--spot {Path(args.spot).name}...`, CPU kernels {kernels}, {args.threads} model thread(s), "
               f"{os.cpu_count()} CPUs, load "
               f"average {load[0]:.1f} at the end (wall times grow with it; CPU times much less).")  # fmt: skip
    print(caption, calls.text(), "", times.text(), "", phases.text(), sep="\n")
    if args.markdown:
        report = Report("The first minute: `llada-lsp complete` with no engine running")
        report.table(calls, caption + " CPU time: user + sys of the client and its server.")
        report.table(times, "When each part of one call happens (the call with `--log-level debug`).")
        report.table(phases, "Where a load's time goes: the model thread's steps in one process.")
        report.write(args.markdown)


if __name__ == "__main__":
    main()
