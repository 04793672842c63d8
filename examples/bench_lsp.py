"""Replays recorded typing through the real server over stdio and reports latency as an editor sees it.

Every keystroke (a character, or Enter with the new line's indentation) is one `textDocument/didChange`
followed by `textDocument/inlineCompletion`, the way VS Code and Neovim ask; the next keystroke waits
for the answer (a patient typist: no request is superseded, so each latency is a whole completion).
After each keystroke the same inputs also go through `run_infill` in this process (prompt, engine,
post-processing; no LSP). Printed: p50/p95 from didChange to the inline response and to the first
`llada/draft`, for single-line (cursor after code) and block (cursor on an empty line) completions, the
direct call's times, and the LSP's overhead per keystroke (against the direct call, and against the
server's own time for the job).

    python examples/bench_lsp.py [--limit N] [--mode speed|quality] [--model PATH] [--no-drafts]

A benchmark, not a test: numbers depend on the machine and on how well the model is trained.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from lsprotocol import types as t
from pygls.lsp.client import LanguageClient

from llada_lsp.server.documents import Document
from llada_lsp.server.jobs import Infill, ModelSpec, cursor_context, load, run_infill
from llada_lsp.server.positions import UTF16

HERE = Path(__file__).resolve().parent
RECORDING = HERE / "data" / "inventory_edits.json"


@dataclass(frozen=True)
class Keystroke:
    version: int
    at: tuple[int, int]  # where `typed` is inserted (line, UTF-16 character; the recording is ASCII)
    typed: str  # one character, or Enter: a line end plus the new line's indentation
    cursor_at: tuple[int, int]  # the cursor once it is typed: where the completion is asked
    text_after: str  # the document once it is typed
    cursor: int  # str offset of the cursor
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
        doc.edit(at, at, typed, UTF16)
        doc.version += 1
        offset = doc.offset(*cursor_at, UTF16)
        block = cursor_context(doc.text, offset).on_empty_line
        keys.append(Keystroke(doc.version, at, typed, cursor_at, doc.text, offset, block))

    for s in sessions:
        line, indent = s["line"], s["character"]
        type_((line - 1, len(doc.line(line - 1))), "\n" + " " * indent, (line, indent))
        for k, char in enumerate(s["text"]):
            type_((line, indent + k), char, (line, indent + k + 1))
    return start, keys[:limit]


class Never:
    def is_set(self) -> bool:
        return False


async def run(start: str, keys: list[Keystroke], args) -> tuple[Timing, Timing]:
    """Each keystroke goes through the server, then the same inputs through `run_infill` in this
    process (its own engine, fed the same sequence): paired samples under the same machine load."""
    model = load(ModelSpec(args.model), lambda *_: None)
    client = LanguageClient("bench", "1")
    drafts: dict[int, float] = {}
    job_ms: dict[int, float] = {}
    client.feature("llada/draft")(lambda p: drafts.setdefault(int(p.requestId), time.perf_counter()))

    def on_log(params):
        m = re.match(r"llada: inline (\d+): \d+ steps in ([\d.]+) ms", params.message)
        if m:
            job_ms[int(m[1])] = float(m[2]) / 1000

    client.feature(t.WINDOW_LOG_MESSAGE)(on_log)
    server = [sys.executable, "-m", "llada_lsp", "serve", "--threads", str(args.threads)]
    await client.start_io(*server, *(["--model", args.model] if args.model else []))
    capabilities = t.ClientCapabilities(experimental={"lladaDrafts": not args.no_drafts})
    options = {"inlineMode": args.mode, "maxCompletionTokens": args.max_tokens}
    await client.initialize_async(t.InitializeParams(capabilities=capabilities, initialization_options=options))
    client.initialized(t.InitializedParams())
    uri = (HERE / "data" / "inventory.py").as_uri()
    client.text_document_did_open(t.DidOpenTextDocumentParams(t.TextDocumentItem(uri, "python", 1, start)))

    def ask(line: int, character: int, msg_id: int):
        params = t.InlineCompletionParams(
            text_document=t.TextDocumentIdentifier(uri), position=t.Position(line, character),
            context=t.InlineCompletionContext(t.InlineCompletionTriggerKind.Automatic),
        )  # fmt: skip
        return client.protocol.send_request_async(t.TEXT_DOCUMENT_INLINE_COMPLETION, params, msg_id=msg_id)

    await ask(0, 0, 0)  # waits for the model to load; not measured
    lsp, ref = Timing(), Timing()
    for i, key in enumerate(keys, start=1):
        at = t.Position(*key.at)
        change = t.TextDocumentContentChangePartial(range=t.Range(at, at), text=key.typed)
        sent = time.perf_counter()
        client.text_document_did_change(
            t.DidChangeTextDocumentParams(t.VersionedTextDocumentIdentifier(version=key.version, uri=uri), [change])
        )  # fmt: skip
        result = await ask(*key.cursor_at, i)
        lsp.response.append(time.perf_counter() - sent)
        lsp.first_draft.append(drafts.get(i, float("nan")) - sent)
        lsp.texts.append(result.items[0].insert_text if result.items else "")

        first: list[float] = []
        started = time.perf_counter()
        job = Infill(key.text_after, key.cursor, args.mode, args.max_tokens, 1024)
        outcome = run_infill(model, job, Never(), lambda step, text: first or first.append(time.perf_counter()))
        ref.response.append(time.perf_counter() - started)
        ref.first_draft.append(first[0] - started)
        ref.texts.append(outcome.text)
        print(f"\r  {i}/{len(keys)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()
    lsp.job = [job_ms.get(i, float("nan")) for i in range(1, len(keys) + 1)]
    return lsp, ref


def pct(values: list[float], q: float) -> str:
    values = sorted(v for v in values if v == v)
    if not values:
        return "     -"
    return f"{values[min(len(values) - 1, int(q * len(values)))] * 1000:6.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, help="replay only the first N keystrokes")
    ap.add_argument("--mode", default="speed", choices=("speed", "quality"))
    ap.add_argument("--max-tokens", type=int, default=64, help="maxCompletionTokens (default 64, the server's)")
    ap.add_argument("--model", help="model folder (default: the embedded model)")
    ap.add_argument("--no-drafts", action="store_true", help="do not ask for llada/draft notifications (what they cost)")
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2), help="torch threads, both sides")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    start, keys = replay(RECORDING, args.limit)
    print(f"{len(keys)} keystrokes over {RECORDING.name}, mode {args.mode}, {args.threads} thread(s), "
          f"torch {torch.__version__}, {os.cpu_count()} CPUs")  # fmt: skip
    lsp, ref = asyncio.run(run(start, keys, args))

    kinds = (("single-line", False), ("block", True))
    groups = {name: [i for i, k in enumerate(keys) if k.block == block] for name, block in kinds}
    print(f"\n{'milliseconds':44} {'p50':>6} {'p95':>6}   n")
    for name, idx in groups.items():
        if not idx:
            continue
        rows = {
            f"didChange -> inline response ({name})": [lsp.response[i] for i in idx],
            f"didChange -> first llada/draft ({name})": [lsp.first_draft[i] for i in idx],
            f"direct run_infill ({name})": [ref.response[i] for i in idx],
            f"direct, first draft ({name})": [ref.first_draft[i] for i in idx],
        }
        for label, values in rows.items():
            print(f"{label:44} {pct(values, 0.5)} {pct(values, 0.95)} {len(values):3}")
    overhead = [a - b for a, b in zip(lsp.response, ref.response)]
    in_server = [a - b for a, b in zip(lsp.response, lsp.job)]
    job_vs_direct = [a - b for a, b in zip(lsp.job, ref.response)]
    for label, values in (("server job time - direct (same keys)", job_vs_direct),
                          ("LSP overhead: response - direct (same keys)", overhead),
                          ("LSP overhead: response - server job time", in_server)):  # fmt: skip
        print(f"{label:44} {pct(values, 0.5)} {pct(values, 0.95)} {len(values):3}")
    same = sum(a == b for a, b in zip(lsp.texts, ref.texts))
    shown = sum(bool(a) for a in lsp.texts)
    print(f"\ncompletions shown: {shown}/{len(keys)}; identical to the direct run: {same}/{len(keys)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
