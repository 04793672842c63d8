"""The native engine and SGLang side by side: the same checkpoint, the same prompts, on this machine.

The checkpoint is the embedded model made SGLang-ready (tests/e2e/sglang/sglang_harness.py: the vocabulary
padded to SGLang's fixed mask id, the MoE scale folded into the experts), in a temporary folder. Two
engine services are started on it, one after the other: `llada-lsp engine --model CKPT` (native) and
`llada-lsp engine --model CKPT --backend sglang+URL` in front of one SGLang 0.5.23 server (speed
thresholds, FDFO on, `--max-running-requests 4`), installed by tests/e2e/sglang/install.sh.

Per engine:
- per-step time: one denoising forward of one request. Native: the service's `done.seconds / done.step`
  (its steps are forwards). SGLang: the median gap between the objects of a streamed /generate with
  first-done-first-out on, which sends one object per denoising step (its `step` counts blocks).
- completion latency p50/p95: request sent -> `done` received, over the prompts, 1 editor at a time;
- throughput with 1 and 4 editors: each editor asks its completions one after another (every editor the
  same prompt list, from its own offset), completions/s and generated tokens/s over the wall time.
Prompts: the window before each line end of benchmarks/data/inventory.py, in speed mode, 64 tokens.

On a CPU this compares the engines' overhead around the same small network (the service, HTTP, SGLang's
scheduler), not what SGLang does on GPUs. Needs the SGLang install (exits 2 without it).

    python benchmarks/bench_sglang.py [--prompts 24] [--markdown docs/results/bench_sglang.md]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e" / "sglang"))

from sglang_harness import make_checkpoint, sglang_python, start_server  # noqa: E402

from llada_lsp import wire  # noqa: E402
from llada_lsp.report import Report, Table, add_markdown_argument  # noqa: E402
from llada_lsp.service.client import EngineClient  # noqa: E402

SOURCE = ROOT / "benchmarks" / "data" / "inventory.py"
MAX_TOKENS = 64
EDITORS = (1, 4)


def prompts(count: int) -> list[tuple[str, str]]:
    """(before, after) at the end of `count` lines spread over the file."""
    text = SOURCE.read_text()
    ends = [i for i, ch in enumerate(text) if ch == "\n" and i > 0 and text[i - 1] != "\n"]
    picked = [ends[k * len(ends) // count] for k in range(count)]
    return [(text[:i][-1500:], text[i:][:500]) for i in picked]


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


async def connect(address: str, process: subprocess.Popen, log: Path) -> EngineClient:
    deadline = time.monotonic() + 300
    while True:
        try:
            client = await EngineClient.connect(address, "bench-sglang")
            status = await client.status()
            if status.state == "ready":
                return client
            await client.close()
        except Exception:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the engine service did not get ready:\n{log.read_text()[-2000:]}")
        await asyncio.sleep(0.5)


async def editor(address: str, work: list[tuple[str, str]], out: list[tuple[float, wire.Done]]) -> None:
    async with await EngineClient.connect(address, "bench-sglang") as client:
        for n, (before, after) in enumerate(work):
            request = wire.Infill(client.next_id(), f"e{id(work)}-{n}", before, after, "speed", MAX_TOKENS, 1024)
            started = time.perf_counter()
            done = await client.request(request)
            out.append((time.perf_counter() - started, done))


async def measure(address: str, process: subprocess.Popen, log: Path, work: list[tuple[str, str]]) -> dict:
    client = await connect(address, process, log)
    await client.close()
    warm: list = []
    await editor(address, work[:2], warm)  # first requests pay one-off costs (compiles, caches)
    rows = {}
    for n in EDITORS:
        out: list[tuple[float, wire.Done]] = []
        shares = [work[k * len(work) // n :] + work[: k * len(work) // n] for k in range(n)]
        started = time.perf_counter()
        await asyncio.gather(*(editor(address, share, out) for share in shares))
        wall = time.perf_counter() - started
        latencies = [s for s, _ in out]
        rows[n] = dict(p50=percentile(latencies, 0.5) * 1000, p95=percentile(latencies, 0.95) * 1000,
                       per_s=len(out) / wall, tokens_s=sum(d.tokens for _, d in out) / wall,
                       step_ms=statistics.median(d.seconds / d.step * 1000 for _, d in out if d.step),
                       steps=statistics.mean(d.step for _, d in out), answered=len(out))  # fmt: skip
    return rows


def sglang_step_ms(url: str, checkpoint: Path, work: list[tuple[str, str]]) -> float:
    """The median gap between a FDFO stream's objects (one per denoising step), over a few prompts."""
    from llada_lsp.model.loader import load_tokenizer

    tokenizer = load_tokenizer(checkpoint)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    gaps: list[float] = []
    for before, _ in work[:3]:
        body = {"input_ids": tokenizer(before)["input_ids"][-400:], "stream": True,
                "sampling_params": {"max_new_tokens": MAX_TOKENS, "temperature": 0.0}}  # fmt: skip
        request = urllib.request.Request(f"{url}/generate", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})  # fmt: skip
        with opener.open(request, timeout=300) as answer:
            times = [time.perf_counter() for line in answer if line.startswith(b"data:")]
        gaps += [b - a for a, b in zip(times[1:], times[2:], strict=False)]  # the first object waits for prefill
    return statistics.median(gaps) * 1000


def service(folder: Path, name: str, checkpoint: Path, backend: str | None) -> tuple[subprocess.Popen, str, Path]:
    address = f"unix:{folder / (name + '.sock')}"
    log = folder / f"{name}.log"
    argv = [sys.executable, "-m", "llada_lsp", "engine", "--listen", address, "--model", str(checkpoint),
            "--log-level", "warning"] + (["--backend", backend, "--backend-timeout", "600"] if backend else [])  # fmt: skip
    with log.open("ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT), address, log


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=24, help="completions per editor (24)")
    add_markdown_argument(ap)
    args = ap.parse_args(argv)
    python, why = sglang_python()
    if python is None:
        print(why, file=sys.stderr)
        return 2
    work = prompts(args.prompts)
    folder = Path(tempfile.mkdtemp(prefix="llbs", dir="/tmp"))
    checkpoint = make_checkpoint(folder / "model")
    results: dict[str, dict] = {}
    began, loads = time.perf_counter(), [os.getloadavg()[0]]
    process, address, log = service(folder, "native", checkpoint, None)
    try:
        results["native"] = asyncio.run(measure(address, process, log, work))
    finally:
        stop(process)
    server = start_server(python, checkpoint, folder, threshold=0.5, edit_threshold=0.0, fdfo=True, max_running=4)
    try:
        server.wait_ready(300)
        process, address, log = service(folder, "sglang", checkpoint, f"sglang+{server.url}")
        try:
            results["SGLang 0.5.23"] = asyncio.run(measure(address, process, log, work))
        finally:
            stop(process)
        sglang_step = sglang_step_ms(server.url, checkpoint, work)
    finally:
        server.stop()
    loads.append(os.getloadavg()[0])
    table = Table(["engine", "editors", "answered", "per-step ms", "p50 ms", "p95 ms", "completions/s", "tokens/s",
                   "steps per answer"])  # fmt: skip
    for engine, rows in results.items():
        for n, row in rows.items():
            step = row["step_ms"] if engine == "native" else sglang_step
            table.add(engine, n, row["answered"], f"{step:.1f}" if n == 1 else "-", f"{row['p50']:.0f}",
                      f"{row['p95']:.0f}", f"{row['per_s']:.2f}", f"{row['tokens_s']:.1f}", f"{row['steps']:.1f}")  # fmt: skip
    print(table.text())
    caption = (f"{args.prompts} completions per editor (speed mode, {MAX_TOKENS} tokens, windows of "
               f"{SOURCE.relative_to(ROOT)}), both engines on the same checkpoint (the embedded model made "
               f"SGLang-ready), one after the other ({time.perf_counter() - began:.0f} s in all). On this CPU "
               "the network is tiny: the table compares the engines' overhead (service, HTTP, SGLang's "
               "scheduler on a CPU), not GPU speed. Per-step: native, the service's seconds per denoising "
               "forward; SGLang, the median gap between the objects of a first-done-first-out stream (one per "
               "step). Steps per answer: native counts forwards, SGLang blocks. Load average (1 min) at the start and "
               f"the end: {loads[0]:.1f}, {loads[1]:.1f} on {os.cpu_count()} cores.")  # fmt: skip
    if args.markdown:
        report = Report("The native engine and SGLang 0.5.23 side by side (CPU)")
        report.table(table, caption)
        report.write(args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
