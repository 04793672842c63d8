"""Replays recorded typing through the real server over stdio and reports latency as an editor sees it.

Every keystroke (a character, or Enter with the new line's indentation) is one `textDocument/didChange`
followed by `textDocument/inlineCompletion`, the way VS Code and Neovim ask; the next keystroke waits
for the answer (a patient typist: no request is superseded, so each latency is a whole completion).
The keystrokes go to an in-process server (`--engine local`: the model in the front) and to a front
of an engine service (`llada-lsp engine`, started here on a socket of its own with the same model and
threads, stopped with SIGTERM at the end), taking turns per keystroke; `--engine local|service` runs
one of them. After each keystroke the same inputs also go through `run_infill` in this process
(prompt, engine, post-processing; no LSP). Printed, per front side by side: p50/p95 from didChange to
the inline response and to the first `llada/draft`, for single-line (cursor after code) and block
(cursor on an empty line) completions, the direct call's times, and the LSP's overhead per keystroke
(against the direct call, and against the time of the job in the server or the service); with both,
what the service adds per keystroke (service minus in-process, same keys); and each front's RSS.

    python benchmarks/bench_lsp.py [--engine both|local|service] [--limit N] [--mode speed|quality]
                                 [--model PATH] [--no-drafts] [--threads N] [--markdown FILE]

A benchmark, not a test: numbers depend on the machine and on how well the model is trained.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from llada_lsp.backends.native import load
from llada_lsp.completion.generation import ModelSpec
from llada_lsp.completion.jobs import Infill, window
from llada_lsp.completion.pipeline import cursor_context, run_infill
from llada_lsp.lsp_client import LspClient, Request, position
from llada_lsp.report import Report, Table, add_markdown_argument
from llada_lsp.server.documents import Document
from llada_lsp.server.positions import UTF16
from llada_lsp.service.client import EngineClient

HERE = Path(__file__).resolve().parent
RECORDING = HERE / "data" / "inventory_edits.json"


@dataclass(frozen=True)
class Keystroke:
    version: int
    at: int  # str offset where `typed` is inserted
    typed: str  # one character, or Enter: a line end plus the new line's indentation
    text_after: str  # the document once it is typed
    cursor: int  # str offset of the cursor once it is typed: where the completion is asked
    block: bool  # the cursor is on an empty line: a block completion, else a single-line one


@dataclass
class Timing:
    response: list[float] = field(default_factory=list)
    first_draft: list[float] = field(default_factory=list)
    job: list[float] = field(default_factory=list)  # the server's own time for the job (its log line)
    texts: list[str] = field(default_factory=list)


def replay(recording: Path, limit: int | None) -> tuple[str, list[Keystroke]]:
    """The starting text (the recorded file without the sessions' lines) and the keystrokes that turn
    it into the recorded file: per session, Enter at the end of the line above (the editor indents the
    new line), then the line's text one character at a time."""
    spec = json.loads(recording.read_text())
    lines = (recording.parent / spec["file"]).read_text().split("\n")
    sessions = sorted(spec["sessions"], key=lambda s: s["line"])
    for s in reversed(sessions):
        assert lines[s["line"]] == " " * s["character"] + s["text"], f"the recording does not match {spec['file']}: {s}"
        del lines[s["line"]]
    doc = Document("file:///bench", 1, "\n".join(lines))
    start, keys = doc.text, []

    def type_(at: tuple[int, int], typed: str, cursor_at: tuple[int, int]) -> None:
        offset_at = doc.offset(*at, UTF16)
        doc.edit(at, at, typed, UTF16)
        doc.version += 1
        offset = doc.offset(*cursor_at, UTF16)
        block = cursor_context(*window(doc.text, offset, offset, 2**14)).on_empty_line
        keys.append(Keystroke(doc.version, offset_at, typed, doc.text, offset, block))

    for s in sessions:
        line, indent = s["line"], s["character"]
        type_((line - 1, len(doc.line(line - 1))), "\n" + " " * indent, (line, indent))
        for k, char in enumerate(s["text"]):
            type_((line, indent + k), char, (line, indent + k + 1))
    return start, keys[:limit]


class Never:
    def is_set(self) -> bool:
        return False


def model_args(args) -> list[str]:
    return ["--model", args.model] if args.model else []


def rss_mib(pid: int) -> float:
    """The process's resident memory (VmRSS), in MiB; NaN where there is no /proc."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return float("nan")
    m = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
    return int(m[1]) / 1024 if m else float("nan")


def terminate(process: subprocess.Popen) -> float:
    """SIGTERM (a kill if it does not stop in 30 s); the process's RSS just before, in MiB (NaN if it
    had already ended)."""
    if process.poll() is not None:
        return float("nan")
    rss = rss_mib(process.pid)
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    return rss


class EngineService:
    """`llada-lsp engine` on a socket of its own (`--threads`, and `--model`, `--device`, `--dtype` where
    `args` has them, then `flags`), its stderr (and stdout: `stdout_to_log`) in a log beside the socket.
    Shared by the benchmarks that start a service (bench_serve.py, soak.py)."""

    late = "the engine service did not start"  # what not listening within the timeout is called

    def __init__(self, args, flags: list[str] | tuple[str, ...] = (), stdout_to_log: bool = True):
        self.folder = Path(tempfile.mkdtemp(prefix="ll", dir="/tmp"))  # a Unix socket path is ~100 bytes at most
        self.socket = self.folder / "engine.sock"
        self.address = f"unix:{self.socket}"
        self.log = self.folder / "engine.log"
        command = [
            sys.executable,
            "-m",
            "llada_lsp",
            "engine",
            "--listen",
            self.address,
            "--threads",
            str(args.threads),
        ]
        for name in ("model", "device", "dtype"):
            if getattr(args, name, None):
                command += [f"--{name}", getattr(args, name)]
        self.command = [*command, *flags]
        with self.log.open("w") as log:
            stdout = log if stdout_to_log else None
            self.process = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=stdout, stderr=log)

    def failure(self, what: str) -> Exception:
        """The error raised when the service would not start: `what`, and the tail of its log."""
        return RuntimeError(f"{what}:\n{self.log.read_text()[-2000:]}")

    async def listening(self, timeout: float = 120.0) -> None:
        """Returns once the socket is there (the model may still be loading: requests wait for it)."""
        deadline = time.monotonic() + timeout
        while not self.socket.exists():
            if self.process.poll() is not None:
                raise self.failure("the engine service did not start")
            if time.monotonic() > deadline:
                raise self.failure(self.late.format(timeout=timeout))
            await asyncio.sleep(0.05)

    def stop(self) -> float:
        """SIGTERM (a kill if it does not stop in 30 s), and its folder removed; its RSS just before, in
        MiB (NaN if it had already ended)."""
        rss = terminate(self.process)
        shutil.rmtree(self.folder, ignore_errors=True)
        return rss


class Service(EngineService):
    """The engine service beside the in-process server, with its model and threads; its log (one line
    per job) is kept for the job times."""

    def __init__(self, args):
        super().__init__(args, stdout_to_log=False)
        self.rss = float("nan")
        self.hit_rate: float | None = None  # the prefix cache's, at the end of the run

    def stop(self) -> list[float]:
        """SIGTERM; the seconds of each infill job it ran, in order."""
        rss = terminate(self.process)
        if rss == rss:  # it was still running
            self.rss = rss
        jobs = re.findall(r" infill \S+: \d+ steps in ([\d.]+) ms", self.log.read_text())
        shutil.rmtree(self.folder, ignore_errors=True)
        return [float(ms) / 1000 for ms in jobs]


class Front:
    """A language server the keystrokes go through over stdio (lsp_client.py): the model in its process
    (`engine` "local") or a front of the service (`engine` its address); what it answered, and when."""

    def __init__(self, label: str, engine: str):
        self.label, self.engine = label, engine
        self.timing = Timing()
        self.drafts: dict[int, float] = {}  # request id -> when its first llada/draft was read
        self.job_ms: dict[int, float] = {}  # from the server's log: only a front running the model has one
        self.request_ids: list[int] = []  # per keystroke
        self.rss = float("nan")
        self.uri = (HERE / "data" / "inventory.py").as_uri()

    def _on_log(self, params: dict) -> None:
        m = re.match(r"llada: inline (\d+): \d+ steps in ([\d.]+) ms", params["message"])
        if m:
            self.job_ms[int(m[1])] = float(m[2]) / 1000

    async def start(self, text: str, args) -> None:
        server = [sys.executable, "-m", "llada_lsp", "serve", "--engine", self.engine]
        if self.engine == "local":
            server += ["--threads", str(args.threads), *model_args(args)]
        self.client = client = await LspClient.start(server)
        client.on("llada/draft", lambda p: self.drafts.setdefault(int(p["requestId"]), time.perf_counter()))
        client.on("window/logMessage", self._on_log)
        options = {"inlineMode": args.mode, "maxCompletionTokens": args.max_tokens, "revise": not args.no_revise,
                   "contextFiles": not args.no_context_files}  # fmt: skip
        await client.initialize({"experimental": {"lladaDrafts": not args.no_drafts}}, options)
        for other in args.open:  # the editor's other tabs: snippets of them start the prompts (contextFiles)
            client.did_open(Path(other).resolve().as_uri(), Path(other).read_text())
        self.doc = client.did_open(self.uri, text)

    async def ready(self, timeout: float = 300.0) -> None:
        """Until the model is loaded: while it loads, the server answers completions at once with nothing."""
        deadline = time.monotonic() + timeout
        while True:
            status = await self.client.request("workspace/executeCommand", {"command": "llada.status"})
            if status["state"] == "ready":
                return
            if status["state"] in ("error", "unavailable", "not responding") or time.monotonic() > deadline:
                raise RuntimeError(f"the {self.label} server is not ready: {status}")
            await asyncio.sleep(0.1)

    def ask(self, offset: int) -> Request:
        at = position(self.doc, offset, self.client.encoding)
        params = {"textDocument": {"uri": self.uri}, "position": at, "context": {"triggerKind": 2}}  # 2: Automatic
        return self.client.send("textDocument/inlineCompletion", params)

    async def type(self, key: Keystroke) -> None:
        sent = time.perf_counter()
        self.client.did_change(self.doc, key.at, key.at, key.typed)
        request = self.ask(key.cursor)
        result = await self.client.result(request)
        self.timing.response.append(request.arrived - sent)
        self.timing.first_draft.append(self.drafts.get(request.id, float("nan")) - sent)
        items = (result.get("items") if isinstance(result, dict) else result) or []
        self.timing.texts.append(items[0]["insertText"] if items else "")
        self.request_ids.append(request.id)

    async def stop(self) -> None:
        self.rss = rss_mib(self.client.process.pid)
        await self.client.shutdown()
        self.timing.job = [self.job_ms.get(i, float("nan")) for i in self.request_ids]


async def run(start: str, keys: list[Keystroke], args) -> tuple[list[Front], Timing, Service | None]:
    """Each keystroke goes through each front (they take turns at going first), then the same inputs
    through `run_infill` in this process (its own engine, fed the same sequence): paired samples under
    the same machine load."""
    model = load(ModelSpec(args.model), lambda *_: None)
    service = Service(args) if args.engine in ("both", "service") else None
    fronts: list[Front] = []
    try:
        if args.engine in ("both", "local"):
            fronts.append(Front("in-process", "local"))
            await fronts[-1].start(start, args)
        if service is not None:
            await service.listening()
            fronts.append(Front("service", service.address))
            await fronts[-1].start(start, args)
        for front in fronts:
            await front.ready()
            await front.client.result(front.ask(0))  # a warm-up, not measured

        ref = Timing()
        for i, key in enumerate(keys, start=1):
            for front in fronts if i % 2 else fronts[::-1]:
                await front.type(key)
            first: list[float] = []
            started = time.perf_counter()
            job = Infill.at(key.text_after, key.cursor, args.mode, args.max_tokens, 1024)
            outcome = run_infill(model, job, Never(), lambda step, text: first or first.append(time.perf_counter()))
            ref.response.append(time.perf_counter() - started)
            ref.first_draft.append(first[0] - started)
            ref.texts.append(outcome.text)
            print(f"\r  {i}/{len(keys)}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        if service is not None:  # whole prompt blocks found cached, every request together (the snippets' too)
            async with await EngineClient.connect(service.address, "bench_lsp", totals=True) as engine:
                service.hit_rate = (await engine.status()).cache_hit_rate
        for front in fronts:
            await front.stop()
    finally:
        jobs = service.stop() if service is not None else []
    if service is not None and len(jobs) >= len(keys):  # one job per request, one request at a time, the warm-up first
        fronts[-1].timing.job = jobs[-len(keys) :]
    return fronts, ref, service


def quantile(values: list[float], q: float) -> float | None:
    """The q-quantile (nearest rank) of the values that are not NaN; None if there are none."""
    values = sorted(v for v in values if v == v)
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


def pct(values: list[float], q: float) -> str:
    value = quantile(values, q)
    return "-" if value is None else f"{value * 1000:.1f}"


def mib(value: float) -> str:
    return f"{value:.0f} MiB" if value == value else "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--engine",
        default="both",
        choices=("both", "local", "service"),
        help="the in-process server, a front of an engine service started here, or both (the default)",
    )
    ap.add_argument("--limit", type=int, help="replay only the first N keystrokes")
    ap.add_argument("--mode", default="speed", choices=("speed", "quality"))
    ap.add_argument("--max-tokens", type=int, default=64, help="maxCompletionTokens (default 64, the server's)")
    ap.add_argument("--model", help="model folder (default: the embedded model)")
    ap.add_argument(
        "--no-drafts", action="store_true", help="do not ask for llada/draft notifications (what they cost)"
    )
    ap.add_argument("--no-revise", action="store_true",
                    help="cold starts only (setting revise: false), as the direct call makes them")  # fmt: skip
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                    help="torch threads: the server, the service and the direct call")  # fmt: skip
    ap.add_argument("--open", action="append", default=[], metavar="FILE",
                    help="open FILE beside the replayed document, as another tab (repeatable)")  # fmt: skip
    ap.add_argument("--no-context-files", action="store_true",
                    help="setting contextFiles: false (the window of the document alone in the prompt)")  # fmt: skip
    add_markdown_argument(ap)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    start, keys = replay(RECORDING, args.limit)
    caption = (f"{len(keys)} keystrokes over {RECORDING.name}, mode {args.mode}, {args.threads} thread(s), "
               f"torch {torch.__version__}, {os.cpu_count()} CPUs, engine {args.engine}")  # fmt: skip
    print(caption)
    fronts, ref, service = asyncio.run(run(start, keys, args))

    kinds = (("single-line", False), ("block", True))
    groups = {name: [i for i, k in enumerate(keys) if k.block == block] for name, block in kinds}
    latency = Table(["milliseconds", *(f"{f.label} {q}" for f in fronts for q in ("p50", "p95")), "n"])

    def row(label: str, per_front: list[list[float]]) -> None:
        latency.add(label, *(pct(values, q) for values in per_front for q in (0.5, 0.95)), len(per_front[0]))

    for name, idx in groups.items():
        if not idx:
            continue
        row(f"didChange -> inline response ({name})", [[f.timing.response[i] for i in idx] for f in fronts])
        row(f"didChange -> first llada/draft ({name})", [[f.timing.first_draft[i] for i in idx] for f in fronts])
        row(f"direct run_infill ({name})", [[ref.response[i] for i in idx]] * len(fronts))
        row(f"direct, first draft ({name})", [[ref.first_draft[i] for i in idx]] * len(fronts))
    for label, of in (("server job time - direct (same keys)", lambda s: zip(s.job, ref.response)),
                      ("LSP overhead: response - direct (same keys)", lambda s: zip(s.response, ref.response)),
                      ("LSP overhead: response - server job time", lambda s: zip(s.response, s.job))):  # fmt: skip
        row(label, [[a - b for a, b in of(f.timing)] for f in fronts])
    tables = [latency]

    if len(fronts) == 2:
        local, remote = (f.timing for f in fronts)
        added = Table(["service - in-process, per keystroke, ms", "p50", "p95", "n"])
        for label, a, b in (("added: inline response (target p50 < 3 ms)", remote.response, local.response),
                            ("added: first llada/draft", remote.first_draft, local.first_draft),
                            ("added: job time (two processes, same steps)", remote.job, local.job),
                            ("added: response - job time", [r - j for r, j in zip(remote.response, remote.job)],
                             [r - j for r, j in zip(local.response, local.job)])):  # fmt: skip
            values = [x - y for x, y in zip(a, b)]
            added.add(label, pct(values, 0.5), pct(values, 0.95), len(values))
        tables.append(added)

    rss = ", ".join(f"{f.label} front {mib(f.rss)}" for f in fronts)
    rss += f"; the service {mib(service.rss)} (target for its front: < 150 MiB)" if service else ""
    notes = [f"RSS at the end of the run: {rss}"]
    if service is not None and service.hit_rate is not None:
        notes.append(f"the service's prefix cache: {service.hit_rate:.0%} of whole prompt blocks found cached")
    for f in fronts:
        same = sum(a == b for a, b in zip(f.timing.texts, ref.texts))
        shown = sum(bool(a) for a in f.timing.texts)
        notes.append(
            f"{f.label}: completions shown: {shown}/{len(keys)}; identical to the direct run: {same}/{len(keys)}"
        )
    if len(fronts) == 2:
        same = sum(a == b for a, b in zip(fronts[0].timing.texts, fronts[1].timing.texts))
        notes.append(f"service identical to in-process: {same}/{len(keys)}")
    for table in tables:
        print(f"\n{table.text()}")
    print("", *notes, sep="\n")
    if args.markdown:
        report = Report("Latency as an editor sees it" + (", cold starts only (--no-revise)" if args.no_revise else ""))
        report.table(latency, f"{caption}. Milliseconds from the keystroke's didChange, p50 and p95 per front.")
        if len(tables) == 2:
            report.table(tables[1], "What the engine service adds per keystroke (service minus in-process, same keys).")
        report.note("\n".join(f"- {line}" for line in notes))
        report.write(args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
