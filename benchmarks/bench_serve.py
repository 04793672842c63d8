"""Replays recorded typing from 1, 2, 4 and 8 simulated editors against one engine service and reports
what serving many editors costs: throughput, time to answer, batching and the prefix cache.

Per row, a fresh `llada-lsp engine` is started on a socket of its own (the model, `--threads` and the
row's engine flags; stopped with SIGTERM at the end of the row) and, once it is ready, N editors
replay the keystrokes of `benchmarks/data/inventory_edits.json` (the five sessions of inventory.py, as
`bench_lsp.py` derives them) at once, each over its own connection (an EngineClient) and at its own
spot of the file: editor i starts at keystroke i * len(keys) // N and wraps around, so the editors
type in different places but share the file's leading text (what the prefix cache can reuse). Each
keystroke is one `infill` of the window around the cursor, cut as the server's front cuts it (no
drafts); the editor waits for the answer before its next keystroke (a patient typist: nothing is
superseded). A row ends when the first editor has typed `--limit` keystrokes (the others' requests
in flight are cancelled and not counted), so every editor is busy for the whole measured time: with
a fixed count each, editors whose completions are short would finish early and leave the last ones
to run alone, which measures the tail rather than the load. Rows: each editor count with batching on (`--max-batch 8`) and off (`--max-batch 1`);
then the prefix cache, paired: two services at once, one with `--no-prefix-cache`, and one editor
whose keystrokes go to both, taking turns (which goes first alternates), so both see the same
keystrokes on the same machine at the same time (the rows above differ by more than the cache's
saving from run to run on a shared machine). After each batched row of N > 1 editors, "alone": a
fresh service and ONE editor typing exactly the keystrokes that row answered (editor after editor,
each in its own order), so the row's tokens/s and p50 are also compared with one editor doing the
same work (the 1-editor row types only the first `--limit` keystrokes: other prompts, other
completion lengths, a different p50).

Printed per row: completions answered (and failed), aggregate completions/s and generated tokens/s
(the sum of `done.tokens` over the row's wall time), p50/p95 time to answer (request sent -> done
received, in this process), mean and largest batch per denoising step and the prefix-cache hit rate
(from the service's final status; "-" where the service does not report them), and the service's
RSS at the end. Then the ratios: tokens/s and p50 at 4 and 8 editors against the 1-editor row and
against the same keystrokes typed alone, and the 1-editor p50 with the prefix cache on against off.

    python benchmarks/bench_serve.py [--editors 1,2,4,8] [--rows batched,unbatched,alone,paired-cache] [--limit K]
                                   [--max-batch 8] [--engine-arg=ARG ...] [--threads 2] [--mode speed|quality]
                                   [--max-tokens 64] [--context-tokens N] [--model PATH] [--json PATH]

`--limit` is keystrokes per editor (default 30: all nine rows ran in 536 s on a 2-core machine that
other work shared). `--engine-arg` goes to every row's service as is (repeatable; split like a shell
line: `--engine-arg="--cache-mb 256"`). A warm-up request of a few tokens, on text of its own, runs
before each row's clock starts; the batch mean is counted from there. The rows replay different
keystrokes (the offsets depend on N), so compare their p50s as "about". A benchmark, not a test:
numbers depend on the machine and on how well the model is trained.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_lsp import RECORDING, EngineService, Keystroke, quantile, replay  # noqa: E402  (the benchmarks folder)

from llada_lsp import wire  # noqa: E402
from llada_lsp.completion.jobs import CHARS_PER_TOKEN, CONTEXT_TOKENS, MAX_TOKENS, window  # noqa: E402
from llada_lsp.report import Report, Table, add_markdown_argument  # noqa: E402
from llada_lsp.service.client import EngineClient, EngineFailure  # noqa: E402

READY_TIMEOUT = 300.0  # seconds for a service to load its model
ANSWER_TIMEOUT = 300.0  # seconds one request may take before the service is taken for hung
ROW_KINDS = ("batched", "unbatched", "alone", "paired-cache")


class ServiceFailed(RuntimeError):
    """The service died, hung or would not start: the row cannot go on."""


@dataclass(frozen=True)
class RowSpec:
    editors: int
    batching: str  # "on" | "off" | "default" (no flag given: the service's own)
    prefix_cache: str  # "on" | "off" | "default"
    flags: tuple[str, ...]  # the row's engine flags, before --engine-arg's


@dataclass
class Row:
    editors: int
    batching: str
    prefix_cache: str
    flags: list[str]
    answered: int = 0
    failed: dict[str, int] = field(default_factory=dict)  # failure kind -> count
    seconds: float = 0.0  # wall time of the replay
    tokens: int = 0  # sum of done.tokens
    latencies: list[float] = field(default_factory=list)  # seconds, request sent -> done received
    batch_mean: float | None = None
    batch_max: int | None = None
    cache_hit_rate: float | None = None
    rss_mib: float = float("nan")
    paired: bool = False  # one of the two rows of the paired prefix-cache comparison
    typed: list[list[int]] = field(default_factory=list)  # per editor, the keystrokes answered (indices), in order
    alone_of: int | None = None  # a replay by one editor of the keystrokes of the row of this many editors

    @property
    def completions_per_s(self) -> float:
        return self.answered / self.seconds if self.seconds else float("nan")

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.seconds if self.tokens and self.seconds else None  # 0: a service without tokens

    def p(self, q: float) -> float | None:
        return quantile(self.latencies, q)

    def record(self, sent: float, done: wire.Done) -> None:
        """One answer: its time from `sent` (perf_counter) to now, and its tokens."""
        self.latencies.append(time.perf_counter() - sent)
        self.answered += 1
        self.tokens += getattr(done, "tokens", 0)  # an older wire module has no tokens


class Service(EngineService):
    """`llada-lsp engine` on a socket of its own, with the row's flags; its stdout and stderr go to a log."""

    late = "the engine service did not listen within {timeout:.0f} s"

    def failure(self, what: str) -> ServiceFailed:
        """An error that says what went wrong, with the service's exit status and the tail of its log."""
        code = self.process.poll()
        state = "still running" if code is None else f"exited with status {code}"
        tail = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
        return ServiceFailed(f"{what} (the service {state}; {shlex.join(self.command)})\n--- its log ---\n{tail}")

    async def ready(self) -> EngineClient:
        """A connection to the service once its model is loaded (state "ready")."""
        deadline = time.monotonic() + READY_TIMEOUT
        await self.listening(READY_TIMEOUT)
        try:
            client = await EngineClient.connect(self.address, "bench_serve status", timeout=30, totals=True)
            while True:
                status = await asyncio.wait_for(client.status(), 30)
                if status.state == "ready":
                    return client
                if status.state == "error" or self.process.poll() is not None:
                    raise self.failure(f"the engine service could not load the model: {status.error}")
                if time.monotonic() > deadline:
                    raise self.failure(f"the model was not loaded within {READY_TIMEOUT:.0f} s")
                await asyncio.sleep(0.1)
        except (EngineFailure, TimeoutError) as err:
            raise self.failure(f"the engine service did not answer: {err}") from None


def request(client: EngineClient, text: str, cursor: int, args, max_tokens: int | None = None) -> wire.Infill:
    """The infill a front sends for a cursor in a document: the window around it, cut as the front cuts it."""
    before, after = window(text, cursor, cursor, args.context_tokens * CHARS_PER_TOKEN)
    tokens = max_tokens or args.max_tokens
    return wire.Infill(client.next_id(), "bench", before, after, args.mode, tokens, args.context_tokens)


async def warm_up(client: EngineClient, args) -> None:
    """A request of a few tokens, on text of its own, before the clock starts (under one cache block:
    no prefix-cache lookups counted)."""
    await asyncio.wait_for(client.request(request(client, "x = ", 4, args, max_tokens=8)), ANSWER_TIMEOUT)


async def editor(
    service: Service, client: EngineClient, keys: list[Keystroke], order: list[int], args, row: Row
) -> None:
    """One editor on its own connection: the keystrokes `order` names, one answer at a time."""
    name = f"the editor that started at keystroke {order[0]}"
    typed: list[int] = []
    row.typed.append(typed)
    for index in order:
        key = keys[index]
        message = request(client, key.text_after, key.cursor, args)
        sent = time.perf_counter()
        try:
            done = await asyncio.wait_for(client.request(message), ANSWER_TIMEOUT)
        except TimeoutError:
            raise service.failure(f"{name}: no answer within {ANSWER_TIMEOUT:.0f} s") from None
        except EngineFailure as err:
            if err.kind in ("engine_gone", "unreachable"):
                raise service.failure(f"{name} lost the engine service: {err}") from None
            row.failed[err.kind] = row.failed.get(err.kind, 0) + 1
            continue
        row.record(sent, done)
        typed.append(index)
        print(f"\r  {row.answered + sum(row.failed.values())} answered", end="", file=sys.stderr, flush=True)


async def run_row(spec: RowSpec, keys: list[Keystroke], args, alone: Row | None = None) -> Row:
    """N editors at once; or (`alone`: a row already run) one editor typing that row's answered
    keystrokes, editor after editor, each in its own order: the same work, one request at a time."""
    flags = [*spec.flags, *args.extra]
    row = Row(spec.editors, spec.batching, spec.prefix_cache, flags, alone_of=alone and alone.editors)
    service = Service(args, flags)
    try:
        monitor = await service.ready()
        try:
            try:
                await warm_up(monitor, args)
                before = await asyncio.wait_for(monitor.status(), 30)
            except (EngineFailure, TimeoutError) as err:
                raise service.failure(f"the warm-up request failed: {err!r}") from None
            clients: list[EngineClient] = []
            try:
                for i in range(spec.editors):  # all connected before the clock starts
                    clients.append(await EngineClient.connect(service.address, f"bench_serve editor {i}", timeout=30))
                n = spec.editors
                if alone is None:  # editor i starts at keystroke i * len(keys) // n and wraps around
                    orders = [[(i * len(keys) // n + j) % len(keys) for j in range(args.limit)] for i in range(n)]
                else:
                    orders = [[k for typed in alone.typed for k in typed]]
                started = time.perf_counter()
                tasks = [asyncio.ensure_future(editor(service, client, keys, order, args, row))
                         for client, order in zip(clients, orders)]  # fmt: skip
                try:  # the row ends when the first editor has typed its keystrokes: every editor was busy until then
                    finished, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                    row.seconds = time.perf_counter() - started
                    for task in finished:
                        task.result()  # a failed service
                finally:
                    for task in tasks:
                        task.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
            except EngineFailure as err:
                raise service.failure(f"an editor could not connect: {err}") from None
            finally:
                for client in clients:
                    await client.close()
            print(file=sys.stderr)
            try:
                after = await asyncio.wait_for(monitor.status(), 30)
            except (EngineFailure, TimeoutError) as err:
                raise service.failure(f"no final status: {err!r}") from None
            row.batch_mean = batch_mean(before, after)
            row.batch_max = getattr(after, "batch_max", None)  # None: an older service
            row.cache_hit_rate = getattr(after, "cache_hit_rate", None)
        finally:
            await monitor.close()
    finally:
        row.rss_mib = service.stop()
    return row


async def run_paired_cache(keys: list[Keystroke], args) -> list[Row]:
    """One editor, two services (prefix cache on, off), each keystroke sent to both in turn."""
    on = ("--max-batch", str(args.max_batch))
    rows = [
        Row(1, "on", cache, [*on, *flag, *args.extra]) for cache, flag in (("on", ()), ("off", ("--no-prefix-cache",)))
    ]
    services = [Service(args, row.flags) for row in rows]
    clients: list[EngineClient] = []
    try:
        for service in services:
            clients.append(await service.ready())
            await warm_up(clients[-1], args)
        started = time.perf_counter()
        for j in range(args.paired_limit):
            key = keys[j % len(keys)]
            for i in (0, 1) if j % 2 == 0 else (1, 0):
                sent = time.perf_counter()
                try:
                    done = await asyncio.wait_for(clients[i].request(request(clients[i], key.text_after, key.cursor, args)),
                                                  ANSWER_TIMEOUT)  # fmt: skip
                except (EngineFailure, TimeoutError) as err:
                    raise services[i].failure(f"keystroke {j}: {err!r}") from None
                rows[i].record(sent, done)
            print(f"\r  {j + 1}/{args.paired_limit}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        for row, client in zip(rows, clients):
            row.seconds = time.perf_counter() - started  # both shared the wall time: compare p50s, not rates
            status = await asyncio.wait_for(client.status(), 30)
            row.batch_mean, row.batch_max = status.batch_mean, status.batch_max
            row.cache_hit_rate = status.cache_hit_rate
    finally:
        for client in clients:
            await client.close()
        for row, service in zip(rows, services):
            row.rss_mib = service.stop()
    return rows


def batch_mean(before: wire.Status, after: wire.Status) -> float | None:
    """The mean rows per step between two statuses (the steps of the warm-up left out)."""
    mean, steps = getattr(after, "batch_mean", None), getattr(after, "steps", None)  # None: an older service
    mean0, steps0 = getattr(before, "batch_mean", None), getattr(before, "steps", None)
    if mean is None or steps is None:
        return None
    if mean0 is None or steps0 is None or steps <= steps0:
        return mean
    return (mean * steps - mean0 * steps0) / (steps - steps0)


def row_specs(args) -> list[RowSpec]:
    if args.plain:  # no batching or cache flag: for a service that has none
        return [RowSpec(n, "default", "default", ()) for n in args.editors]
    on, off = ("--max-batch", str(args.max_batch)), ("--max-batch", "1")
    specs = []
    for n in args.editors:
        if "batched" in args.rows:
            specs.append(RowSpec(n, "on", "on", on))
        if "unbatched" in args.rows:
            specs.append(RowSpec(n, "off", "on", off))
    return specs


def cell(value, fmt: str) -> str:
    if value is None or value != value:
        return "-"
    return f"{value:{fmt}}"


def percent(rate: float | None) -> str:
    return "-" if rate is None else f"{rate * 100:.1f}%"


def serve_table(rows: list[Row]) -> tuple[Table, list[str]]:
    """The rows as a table, and the footnotes it needs."""
    table = Table(["editors", "batching", "prefix cache", "answered", "failed", "completions/s", "tokens/s", "p50 ms",
                   "p95 ms", "rows per forward", "max", "prefix-cache hits", "service RSS MiB"])  # fmt: skip
    for r in rows:
        p50, p95 = r.p(0.5), r.p(0.95)
        editors = f"1<-{r.alone_of}" if r.alone_of else str(r.editors)
        table.add(editors, r.batching, r.prefix_cache + "*" * r.paired, r.answered, sum(r.failed.values()),
                  cell(r.completions_per_s, ".2f"), cell(r.tokens_per_s, ".1f"), cell(p50 and p50 * 1000, ".1f"),
                  cell(p95 and p95 * 1000, ".1f"), cell(r.batch_mean, ".2f"), cell(r.batch_max, "d"),
                  percent(r.cache_hit_rate), cell(r.rss_mib, ".0f"))  # fmt: skip
    notes = []
    if any(r.alone_of for r in rows):
        notes.append("1<-N: one editor alone typing the keystrokes the row of N editors answered (the same work)")
    if any(r.paired for r in rows):
        notes.append("*: the paired rows (keystrokes sent to both services in turn; their rates share one wall clock)")
    if any(r.failed for r in rows):  # by kind ("busy": over the engine's --max-queue)
        notes.append("failed: " + "; ".join(f"{r.editors} editors, batch {r.batching}, prefix cache {r.prefix_cache}: "
                                            f"{r.failed}" for r in rows if r.failed))  # fmt: skip
    return table, notes


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b and a == a and b == b else "-"


def ratios(rows: list[Row]) -> list[str]:
    lines = []
    for batching in ("on", "off", "default"):
        same = {r.editors: r for r in rows if r.batching == batching and not r.paired and not r.alone_of}
        alone = {r.alone_of: r for r in rows if r.batching == batching and r.alone_of}
        one = same.get(1)
        if one is not None and any(n in same for n in (4, 8)):
            tok = ", ".join(f"{n} editors {ratio(same[n].tokens_per_s, one.tokens_per_s)}" for n in (4, 8) if n in same)
            p50 = ", ".join(f"{n} editors {ratio(same[n].p(0.5), one.p(0.5))}" for n in (4, 8) if n in same)
            lines.append(f"batching {batching}: aggregate tokens/s against the 1-editor row: {tok}")
            lines.append(f"batching {batching}: p50 time to answer against the 1-editor row: {p50}")
        if any(n in alone for n in (4, 8)):
            ns = [n for n in (2, 4, 8) if n in alone and n in same]
            tok = ", ".join(f"{n} editors {ratio(same[n].tokens_per_s, alone[n].tokens_per_s)}" for n in ns)
            p50 = ", ".join(f"{n} editors {ratio(same[n].p(0.5), alone[n].p(0.5))}" for n in ns)
            lines.append(
                f"batching {batching}: aggregate tokens/s against 1 editor typing the same keystrokes alone: {tok}"
            )
            lines.append(
                f"batching {batching}: p50 time to answer against 1 editor typing the same keystrokes alone: {p50}"
            )
    pair = [r for r in rows if r.paired]
    if len(pair) == 2:
        on, off = pair
        ms = [x * 1000 if x is not None else None for x in (on.p(0.5), off.p(0.5))]
        lines.append(
            f"1 editor, the same {on.answered} keystrokes to two services in turn: p50 with the prefix cache "
            f"{cell(ms[0], '.1f')} ms, without {cell(ms[1], '.1f')} ms: on/off {ratio(on.p(0.5), off.p(0.5))}"
        )
    return lines


def editor_counts(text: str) -> list[int]:
    try:
        counts = [int(n) for n in text.split(",") if n.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want a list like 1,2,4,8") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: want positive editor counts")
    return counts


def row_kinds(text: str) -> list[str]:
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in ROW_KINDS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"{text!r}: want a list of {', '.join(ROW_KINDS)}")
    return kinds


async def run_all(specs: list[RowSpec], keys: list[Keystroke], args) -> list[Row]:
    rows = []
    for spec in specs:
        print(f"{spec.editors} editor(s), batching {spec.batching}, prefix cache {spec.prefix_cache}: "
              f"{shlex.join([*spec.flags, *args.extra]) or 'no engine flags'}", file=sys.stderr)  # fmt: skip
        rows.append(await run_row(spec, keys, args))
        if "alone" in args.rows and spec.editors > 1 and spec.batching != "off":
            print(f"  the same {rows[-1].answered} keystrokes typed by 1 editor alone", file=sys.stderr)
            rows.append(await run_row(replace(spec, editors=1), keys, args, alone=rows[-1]))
    if "paired-cache" in args.rows and not args.plain:
        print(
            f"the prefix cache, paired: 1 editor, {args.paired_limit} keystrokes to two services in turn",
            file=sys.stderr,
        )
        rows += [replace(row, paired=True) for row in await run_paired_cache(keys, args)]
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--editors", type=editor_counts, default=[1, 2, 4, 8], metavar="N,N,...",
                    help="how many editors type at once, one row (or two) each (default 1,2,4,8)")  # fmt: skip
    ap.add_argument("--rows", type=row_kinds, default=list(ROW_KINDS), metavar="KIND,...",
                    help="which rows: batched (--max-batch N), unbatched (--max-batch 1) per editor count; alone "
                    "(after each batched row of 2+ editors, one editor typing the keystrokes that row answered); "
                    "paired-cache (1 editor, prefix cache on and off, paired); default: all four")  # fmt: skip
    ap.add_argument("--limit", type=int, default=30,
                    help="keystrokes per editor (default 30: all rows in about 10 minutes on 2 cores)")  # fmt: skip
    ap.add_argument("--paired-limit", type=int, default=100,
                    help="keystrokes of the paired prefix-cache comparison (default 100)")  # fmt: skip
    ap.add_argument("--max-batch", type=int, default=8, help="the engine's --max-batch in a batched row (default 8)")
    ap.add_argument("--engine-arg", dest="extra", action="append", default=[], metavar="ARG",
                    help="passed to every row's engine as is (repeatable; split like a shell line: "
                    "--engine-arg='--cache-mb 256')")  # fmt: skip
    ap.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)  # no engine flags of its own
    ap.add_argument("--mode", default="speed", choices=("speed", "quality"))
    ap.add_argument("--max-tokens", type=int, default=MAX_TOKENS,
                    help=f"per completion (default {MAX_TOKENS}, the server's)")  # fmt: skip
    ap.add_argument("--context-tokens", type=int, default=CONTEXT_TOKENS,
                    help=f"the prompt's budget (default {CONTEXT_TOKENS}, the server's)")  # fmt: skip
    ap.add_argument("--model", metavar="PATH|HF-ID",
                    help="model folder or Hugging Face id (default: the embedded model)")  # fmt: skip
    ap.add_argument("--device", help="the engine's device (default: its own choice)")
    ap.add_argument("--dtype", help="the engine's dtype (default: its own choice)")
    ap.add_argument("--threads", type=int, default=2, help="the engine's torch threads (default 2)")
    ap.add_argument("--json", metavar="PATH", help="also write the rows (and the run's settings) as JSON")
    add_markdown_argument(ap)
    args = ap.parse_args(argv)
    if args.limit < 1:
        ap.error("--limit must be positive")
    args.extra = [part for arg in args.extra for part in shlex.split(arg)]

    _, keys = replay(RECORDING, None)
    specs = row_specs(args)
    setup = (f"{len(specs)} rows, {args.limit} keystrokes per editor over {RECORDING.name} ({len(keys)} recorded), "
             f"mode {args.mode}, max_tokens {args.max_tokens}, context_tokens {args.context_tokens}, "
             f"{args.threads} engine thread(s), {os.cpu_count()} CPUs")  # fmt: skip
    print(setup)
    started = time.perf_counter()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # the `finally`s stop the service
    try:
        rows = asyncio.run(run_all(specs, keys, args))
    except ServiceFailed as err:
        print(f"\nbench_serve: {err}", file=sys.stderr)
        return 1
    table, notes = serve_table(rows)
    lines = ratios(rows)
    seconds = time.perf_counter() - started
    print("", table.text(), *notes, "", *lines, f"\n{seconds:.0f} s in all", sep="\n")
    if args.markdown:
        report = Report("Serving many editors at once")
        report.table(table, f"{setup} ({seconds:.0f} s). Batching on is --max-batch {args.max_batch}, off is "
                     "--max-batch 1; a row ends when the first editor has typed its keystrokes.")  # fmt: skip
        report.note("\n".join(f"- {line}" for line in [*notes, *lines]))
        report.write(args.markdown)
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k not in ("json", "markdown")}
        out = [asdict(r) | {"completions_per_s": r.completions_per_s, "tokens_per_s": r.tokens_per_s,
                            "p50_s": r.p(0.5), "p95_s": r.p(0.95)} for r in rows]  # fmt: skip
        Path(args.json).write_text(json.dumps({"settings": settings, "rows": out}, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
