"""A soak run: several editors hammer one engine service through their own language servers for a
while, with random edits, completions, cancels, rewrites and malformed messages, and every request
must be answered.

One `llada-lsp engine` (embedded model unless `--model`), and per client one `llada-lsp serve --engine
unix:...` front over stdio, driven through the project's LSP client (llada_lsp/lsp_client.py, which
also sends what no library would: a body that is not JSON, a batch array, an object as an id, an
unknown method). Each client opens a document and loops until the time is up: an incremental edit (insert
or delete at a random spot, now and then a lone surrogate), an inline completion (a fifth of them
cancelled soon after), a rewrite of a random line now and then, and a malformed message now and
then. Requests the server sends (work-done progress, applyEdit) are answered. At the end each client
waits for its outstanding answers (up to `--drain` seconds), then shuts its server down.

Printed: requests sent and answered per client, results and errors by kind (JSON-RPC code),
unanswered requests (must be 0: the exit status is 1 otherwise), and the RSS of the service and of
each front at the start and at the end.

Abuse (issue 25; `--no-abuse` leaves it out): the editors type alone for the first half of the run,
then with abusive clients on the engine's socket for the second: a huge Python rewrite (`--abuse-mb`
of valid Python each side of the selection), a peer that holds a large hello (announces a 15 MiB
frame, sends part of it, never finishes), a burst of 2,000 requests on one connection (past the
queue), a status flooder that never reads, and a frame of a million unknown fields. Printed per class
(editors alone, editors under abuse, each abuser): requests, unanswered (0), p50/p95 of the answers,
and the service's RSS at the start, its peak and at the end (after the abusers left). Targets: the
editors' p95 under abuse at most 2x their p95 alone, the RSS at the end within 100 MB of the start.

    python benchmarks/soak.py [--minutes 5] [--clients 3] [--seed 0] [--model PATH] [--threads 2] [--abuse-mb 4]
                              [--markdown FILE]

A stress run, not a benchmark: the mix is random but seeded; rates depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_lsp import EngineService, rss_mib  # noqa: E402  (the benchmarks folder)

from llada_lsp import wire  # noqa: E402
from llada_lsp.lsp_client import LspClient, LspError, Request, position  # noqa: E402
from llada_lsp.report import Report, Table, add_markdown_argument  # noqa: E402

SOURCE = (Path(__file__).resolve().parent / "data" / "inventory.py").read_text()
MALFORMED = {  # what is sent -> the error code a server should answer it with (None: no id to answer)
    "not json": (b"{this is not json", -32700),
    "batch array": (b'[{"jsonrpc": "2.0", "id": 1, "method": "shutdown"}]', -32600),
    "object id": (b'{"jsonrpc": "2.0", "id": {"x": 1}, "method": "llada/nothing"}', -32600),
    "unknown method": (None, -32601),
}


class Service(EngineService):
    """The engine service every front talks to (`--model`, `--threads`)."""

    def failure(self, what: str) -> SystemExit:
        return SystemExit(f"soak: {what}:\n{self.log.read_text()}")


class Client:
    """One editor: a front process on pipes (lsp_client.py), its document, and what it asked and got."""

    def __init__(self, name: str, address: str, rng: random.Random):
        self.name, self.address, self.rng = name, address, rng
        self.uri = f"file:///soak/{name}.py"
        self.lsp: LspClient | None = None
        self.sent = Counter()  # method -> count
        self.outcomes = Counter()  # "result" or the error code (and its kind) -> count
        self.malformed = Counter()  # the answers to malformed messages: "result" or the error code -> count
        self.rss_start = self.rss_end = float("nan")
        self.phase = "alone"  # the soak's phase: completion times are kept per phase
        self.latencies: dict[str, list[float]] = {"alone": [], "abused": []}

    @property
    def proc(self) -> asyncio.subprocess.Process | None:
        return self.lsp.process if self.lsp is not None else None

    async def start(self) -> None:
        command = [sys.executable, "-m", "llada_lsp", "serve", "--engine", self.address]
        self.lsp = lsp = await LspClient.start(command, stderr="discard")
        lsp.on_stray = lambda message: self.malformed.update([_outcome(message)])  # ids we never numbered
        lsp.answer("workspace/applyEdit", lambda params: {"applied": False})  # the document is ours
        await lsp.initialize({"window": {"workDoneProgress": True}, "workspace": {"applyEdit": True}}, timeout=300)
        self.sent["initialize"] += 1  # counted as every other request
        self.outcomes["result"] += 1
        self.doc = lsp.did_open(self.uri, SOURCE)
        self.rss_start = rss_mib(self.proc.pid)

    def ask(self, method: str, params) -> Request:
        request = self.lsp.send(method, params)
        self.sent[method] += 1
        request.answer.add_done_callback(
            lambda answer: answer.exception() is None and self.outcomes.update([_outcome(answer.result())])
        )
        return request

    async def request(self, method: str, params, timeout: float = 300) -> dict:
        return await asyncio.wait_for(asyncio.shield(self.ask(method, params).answer), timeout)

    # --- what an editor does ------------------------------------------------------------------------
    def position(self, offset: int) -> dict:
        return position(self.doc, offset, self.lsp.encoding)

    def edit(self) -> None:
        rng, text = self.rng, self.doc.text
        at = rng.randrange(len(text) + 1)
        if rng.random() < 0.5 and len(text) > 200:
            end = min(len(text), at + rng.randrange(1, 12))
            new = ""
        else:
            end = at
            new = rng.choice(["x", " ", "\n", "def f(a):\n    return a", "(", ")", "self.", "\ud800", "# note\n"])
        self.lsp.did_change(self.doc, at, end, new)

    async def complete(self) -> None:
        at = self.rng.randrange(len(self.doc.text) + 1)
        request = self.ask("textDocument/inlineCompletion", {
            "textDocument": {"uri": self.uri}, "position": self.position(at),
            "context": {"triggerKind": 2}})  # fmt: skip
        start, phase = time.monotonic(), self.phase
        if self.rng.random() < 0.2:
            await asyncio.sleep(self.rng.random() * 0.1)
            self.lsp.cancel(request)
            await request.answer
            return
        await request.answer
        self.latencies[phase].append(time.monotonic() - start)

    async def rewrite(self) -> None:
        doc = self.doc
        line = self.rng.randrange(doc.text.count("\n") + 1)
        start = doc.line_starts[line]
        arg = {
            "textDocument": {"uri": self.uri, "version": doc.version},
            "range": {"start": self.position(start), "end": self.position(start + len(doc.line(line)))},
        }
        await self.ask("workspace/executeCommand", {"command": "llada.rewriteSelection", "arguments": [arg]}).answer

    def misbehave(self) -> None:
        kind = self.rng.choice(sorted(MALFORMED))
        body, _code = MALFORMED[kind]
        self.sent[f"malformed: {kind}"] += 1
        if body is None:  # a well-formed request for a method nobody serves: numbered negative
            self.lsp.send_message({"id": -self.sent[f"malformed: {kind}"], "method": "llada/noSuchMethod",
                                   "params": {}})  # fmt: skip
        else:
            self.lsp.write(body)

    async def run(self, until: float) -> None:
        while time.monotonic() < until:
            roll = self.rng.random()
            if roll < 0.45:
                self.edit()
                await asyncio.sleep(0.01)
            elif roll < 0.85:
                await self.complete()
            elif roll < 0.93:
                await self.rewrite()
            else:
                self.misbehave()
                await asyncio.sleep(0.01)

    async def finish(self, drain: float) -> list[tuple[int, str]]:
        """Waits up to `drain` seconds for outstanding answers; what is still unanswered then."""
        deadline = time.monotonic() + drain
        while self.lsp.pending and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        missing = [(rid, request.method) for rid, request in self.lsp.pending.items()]
        self.rss_end = rss_mib(self.proc.pid)
        try:
            await self.request("shutdown", None, timeout=30)
            self.lsp.notify("exit")
        except (TimeoutError, ConnectionError, LspError):
            self.proc.kill()
        await self.lsp.wait(30)
        return missing


def _outcome(message: dict) -> str:
    """How a request was answered: "result", or "error" and the JSON-RPC code."""
    error = message.get("error")
    return "result" if error is None else f"error {error.get('code')}"


class Abuser:
    """One abusive client class on the engine's own socket (the wire protocol, no front): what it
    sent, how many were answered, and how long the answers took."""

    def __init__(self, name: str, address: str, run):
        self.name, self.path, self._run = name, address.removeprefix("unix:"), run
        self.requests = self.answered = 0
        self.latencies: list[float] = []
        self.errors = Counter()

    async def connect(self, hello: bool = True):
        reader, writer = await asyncio.open_unix_connection(self.path, limit=2**20)
        if hello:
            wire.write(writer, wire.Hello(wire.VERSION, f"soak-{self.name}"))
            await asyncio.wait_for(wire.read(reader), 30)
        return reader, writer

    async def loop(self, until: float) -> None:
        while time.monotonic() < until:
            try:
                await self._run(self, until)
            except (OSError, asyncio.IncompleteReadError, TimeoutError, wire.WireError) as err:
                self.errors[type(err).__name__] += 1
                await asyncio.sleep(0.2)

    async def answers(self, reader, ids: set[int], until: float) -> None:
        """Reads until every id in `ids` is answered (done or failed), or the time is up."""
        start = time.monotonic()
        while ids and time.monotonic() < until + 60:
            message = await asyncio.wait_for(wire.read(reader), until + 60 - time.monotonic())
            if message is None:
                break
            if isinstance(message, (wire.Done, wire.Failed)) and message.id in ids:
                ids.discard(message.id)
                self.answered += 1
                self.latencies.append(time.monotonic() - start)


ABUSERS = ("huge-rewrite", "held-hello", "burst", "status-flood", "unknown-fields")


def abusers(address: str, megabytes: float, only: list[str] | None = None) -> list[Abuser]:
    """The abusive classes. Their frames are built here, once: built in their loops, they would stall
    this process's event loop, which also times the editors."""
    one = "def f{0}(a, b):\n    if a > {0}:\n        return a - b\n    return [a, b, {0}]\n\n\n"
    filler = "".join(one.format(i) for i in range(int(megabytes * 2**20) // len(one.format(0))))
    rewrite = wire.encode(wire.Rewrite(filler + "def add(a, b):\n    ", "return   a+b", "\n\n\n" + filler,
                                       "quality", 1024, python=True, id=1, key="rw"))  # fmt: skip
    burst_ids = range(1, 2001)
    burst_frames = b"".join(wire.encode(wire.Infill(i, f"k{i}", "def add(a, b):\n    return a +", "\n", "speed", 64,
                                                    1024)) for i in burst_ids)  # fmt: skip
    flood = wire.encode(wire.Status()) * 400_000
    many = msgpack.packb({"type": "infill", **{f"f{i:07d}": 1 for i in range(1_000_000)}})
    many = len(many).to_bytes(4, "big") + many

    async def huge_rewrite(self: Abuser, until: float) -> None:
        reader, writer = await self.connect()
        writer.write(rewrite)
        self.requests += 1
        await self.answers(reader, {1}, until)
        writer.close()

    async def held_hello(self: Abuser, until: float) -> None:
        peers, round_start = [], time.monotonic()
        for _ in range(30):  # each announces a 15 MiB hello and sends 64 KiB of it
            reader, writer = await self.connect(hello=False)
            writer.write((15 * 2**20).to_bytes(4, "big") + b"\0" * 2**16)
            peers.append((reader, writer, time.monotonic()))
            self.requests += 1
        for reader, writer, start in peers:  # the service refuses (or, before issue 25, waits for the rest)
            try:
                if await asyncio.wait_for(wire.read(reader), 12) is not None:
                    self.answered += 1
                    self.latencies.append(time.monotonic() - start)
            except (TimeoutError, asyncio.IncompleteReadError, OSError):
                pass
            writer.close()
        # 30 peers a second, as holders that come back: refused at once, they would otherwise be a
        # connect flood, which costs both ends the CPU the editors share with them here.
        await asyncio.sleep(max(0.0, round_start + 1 - time.monotonic()))

    async def burst(self: Abuser, until: float) -> None:
        reader, writer = await self.connect()
        ids = set(burst_ids)
        writer.write(burst_frames)
        self.requests += len(ids)
        await self.answers(reader, ids, until)
        writer.close()

    async def status_flood(self: Abuser, until: float) -> None:
        _reader, writer = await self.connect()
        writer.write(flood)  # 400,000 status asks, and never reads
        self.requests += 1
        await asyncio.sleep(min(10, max(0, until - time.monotonic())))
        writer.transport.abort()

    async def unknown_fields(self: Abuser, until: float) -> None:
        reader, writer = await self.connect()
        writer.write(many)
        self.requests += 1
        start = time.monotonic()
        while (message := await asyncio.wait_for(wire.read(reader), 60)) is not None:
            if isinstance(message, wire.Failed):
                self.answered += 1
                self.latencies.append(time.monotonic() - start)
        writer.close()
        await asyncio.sleep(1)

    runs = dict(zip(ABUSERS, (huge_rewrite, held_hello, burst, status_flood, unknown_fields)))
    return [Abuser(name.replace("-", " "), address, runs[name]) for name in only or ABUSERS]


def percentiles(values: list[float]) -> tuple[str, str]:
    """p50 and p95 in seconds, as cells."""
    if not values:
        return "-", "-"
    cuts = statistics.quantiles(values, n=20, method="inclusive") if len(values) > 1 else [values[0]] * 19
    return f"{statistics.median(values):.2f}", f"{cuts[18]:.2f}"


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used (/proc/PID/stat); NaN where there is none."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_now(service: Service, clients: list[Client]) -> tuple[float, dict[str, float]]:
    """(monotonic time, CPU seconds so far of the service, the fronts together, and this process, which
    plays the editors and the abusers): on a machine of few cores, what one spends the others lack."""
    fronts = sum(cpu_seconds(c.proc.pid) for c in clients)
    return time.monotonic(), {"service": cpu_seconds(service.process.pid), "fronts": fronts,
                              "soak driver": cpu_seconds(os.getpid())}  # fmt: skip


async def watch_rss(pid: int, peak: list[float]) -> None:
    while True:
        peak[0] = max(peak[0], rss_mib(pid))
        await asyncio.sleep(0.25)


async def soak(args) -> int:
    caption = (f"{args.clients} clients for {args.minutes:g} minutes against one engine service"
               + ("" if args.no_abuse else ", abused in the second half"))  # fmt: skip
    service = Service(args)
    clients: list[Client] = []
    bad: list[Abuser] = []
    try:
        await service.listening(timeout=math.inf)
        rng = random.Random(args.seed)
        clients = [Client(f"client{i}", service.address, random.Random(rng.random())) for i in range(args.clients)]
        await asyncio.gather(*(c.start() for c in clients))
        first = clients[0]  # once this is answered the service has loaded its model: RSS like for like from here
        await first.request("textDocument/inlineCompletion", {"textDocument": {"uri": first.uri},
                            "position": first.position(len(first.doc.text)), "context": {"triggerKind": 2}})  # fmt: skip
        rss_service_start = rss_mib(service.process.pid)
        peak = [rss_service_start]
        watcher = asyncio.ensure_future(watch_rss(service.process.pid, peak))
        bad = [] if args.no_abuse else abusers(service.address, args.abuse_mb, args.abusers)
        end = time.monotonic() + args.minutes * 60
        print(f"{caption} ...", flush=True)
        editing = asyncio.gather(*(c.run(end) for c in clients))
        cpu = [cpu_now(service, clients)]
        if not args.no_abuse:
            await asyncio.sleep(args.minutes * 30)
            for c in clients:
                c.phase = "abused"
            cpu.append(cpu_now(service, clients))
            await asyncio.gather(*(a.loop(end) for a in bad))
        await editing
        cpu.append(cpu_now(service, clients))
        await asyncio.sleep(5)  # the abusers are gone: what the service gives back
        rss_service_end = rss_mib(service.process.pid)
        watcher.cancel()
        missing = {c.name: await c.finish(args.drain) for c in clients}
    finally:
        for c in clients:
            if c.proc is not None and c.proc.returncode is None:
                c.proc.kill()
        service.stop()  # SIGTERM (the service removes its socket and stops), a kill after 30 s

    total_missing = sum(len(m) for m in missing.values())
    editors = Table(["client", "sent", "answered", "unanswered", "RSS start", "RSS end", "outcomes"])
    for c in clients:
        sent = sum(n for m, n in c.sent.items() if not m.startswith("malformed"))
        outcomes = ", ".join(f"{k}: {n}" for k, n in sorted(c.outcomes.items()))
        editors.add(c.name, sent, sum(c.outcomes.values()), len(missing[c.name]), f"{c.rss_start:.0f}",
                    f"{c.rss_end:.0f}", outcomes)  # fmt: skip
    editors.add("service", "", "", "", f"{rss_service_start:.0f}", f"{rss_service_end:.0f}", "")
    tables = [(editors, f"{caption}. Requests per editor (its own front), RSS in MiB.")]
    sent = Counter()
    malformed = Counter()
    for c in clients:
        sent.update(c.sent)
        malformed.update(c.malformed)
    notes = ["sent by method: " + ", ".join(f"{m} {n}" for m, n in sorted(sent.items())),
             "answers to malformed messages: " + (", ".join(f"{k}: {n}" for k, n in sorted(malformed.items()))
                                                  or "none")]  # fmt: skip
    notes += [f"UNANSWERED: {name} request {rid} ({method})" for name, m in missing.items() for rid, method in m]
    notes.append(f"unanswered requests: {total_missing}")
    failed = bool(total_missing)
    if not args.no_abuse:
        classes = Table(["class", "requests", "unanswered", "p50 s", "p95 s", "notes"])
        for phase in ("alone", "abused"):
            times = [t for c in clients for t in c.latencies[phase]]
            classes.add(f"editors {phase}", len(times), "", *percentiles(times), "inline completions answered")
        for a in bad:
            unanswered = "-" if a.name == "status flood" else str(a.requests - a.answered)
            note = "never reads: nothing to answer" if a.name == "status flood" else ", ".join(
                f"{k}: {n}" for k, n in a.errors.items())  # fmt: skip
            classes.add(a.name, a.requests, unanswered, *percentiles(a.latencies), note)
        tables.append((classes, "The editors alone and under abuse, and each abusive class on the engine's socket."))
        notes.append(f"service RSS, MiB: start {rss_service_start:.0f}, peak {peak[0]:.0f}, end {rss_service_end:.0f}")
        (t0, c0), (t1, c1), (t2, c2) = cpu
        notes.append(f"CPU cores busy (CPU s / wall s) alone -> abused, of {os.cpu_count()}: " + ", ".join(
            f"{k} {(c1[k] - c0[k]) / (t1 - t0):.2f} -> {(c2[k] - c1[k]) / (t2 - t1):.2f}" for k in c0))  # fmt: skip
        alone = [t for c in clients for t in c.latencies["alone"]]
        abused = [t for c in clients for t in c.latencies["abused"]]
        if len(alone) > 1 and len(abused) > 1:
            ratio = statistics.quantiles(abused, n=20)[18] / statistics.quantiles(alone, n=20)[18]
            notes.append(f"editors' p95 under abuse / alone: {ratio:.2f} (target <= 2)")
            failed |= ratio > 2
        notes.append(f"RSS end - start: {rss_service_end - rss_service_start:+.0f} MiB (target <= 100)")
        failed |= rss_service_end - rss_service_start > 100
        failed |= any(a.requests != a.answered for a in bad if a.name != "status flood")
    for table, _ in tables:
        print(f"\n{table.text()}")
    print("", *notes, sep="\n")
    if args.markdown:
        report = Report("Hostile input")
        for table, text in tables:
            report.table(table, text)
        report.note("\n".join(f"- {line}" for line in notes))
        report.write(args.markdown)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=5.0, help="how long the clients keep going (default 5)")
    ap.add_argument("--clients", type=int, default=3, help="editors, each with its own front (default 3)")
    ap.add_argument("--seed", type=int, default=0, help="the random mix (default 0)")
    ap.add_argument("--drain", type=float, default=120.0,
                    help="seconds to wait for outstanding answers at the end (default 120)")  # fmt: skip
    ap.add_argument("--model", metavar="PATH|HF-ID", help="the engine's model (default: the embedded one)")
    ap.add_argument("--threads", type=int, default=2, help="the engine's torch threads (default 2)")
    ap.add_argument("--no-abuse", action="store_true", help="no abusive clients (issue 25) in the second half")
    ap.add_argument(
        "--abuse-mb",
        type=float,
        default=4.0,
        help="MB of Python each side of the huge rewrite's selection (default 4; the issue's was 15)",
    )
    ap.add_argument("--abusers", type=lambda v: [a.strip() for a in v.split(",") if a.strip()], default=None,
                    metavar="NAME,...", help=f"only these abusive classes (default: all: {', '.join(ABUSERS)})")  # fmt: skip
    add_markdown_argument(ap)
    args = ap.parse_args(argv)
    unknown = [a for a in args.abusers or () if a not in ABUSERS]
    if unknown:
        ap.error(f"unknown abusive class {unknown[0]!r}; choose from {', '.join(ABUSERS)}")
    if args.clients < 1 or args.minutes <= 0:
        ap.error("--clients and --minutes must be positive")
    return asyncio.run(soak(args))


if __name__ == "__main__":
    raise SystemExit(main())
