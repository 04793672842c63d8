"""`llada-lab eval-typing`: replays typing of held-out files through the real server over stdio, as an
editor sends it, with revisions on and off side by side, and prints what the user gains.

Each keystroke is a didChange and an inlineCompletion (the previous request cancelled if it still
runs); a simulated user (training/eval_typing.py) takes a suggestion that matches the file's next
characters with Tab with probability 1/2 (the accepted text inserted as one edit), else types on. The
replay waits for every answer, but charges its time: keystrokes are paced at `--interval-ms` (120),
and an answer that arrives after the next keystroke would have been typed counts as not shown. Both
configurations' servers run side by side (spoken to through llada_lsp/lsp_client.py), and each span
is typed through one, then the other. Forwards per request come from the server's log line for the
request; times from the client side, from sending the request to reading its answer or first draft.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from pathlib import Path

from llada_lsp.lsp_client import LspClient, Request, position
from llada_lsp.report import Report, add_markdown_argument
from llada_lsp.server.positions import UTF32

from ..training.corpus import DEFAULT_CACHE, SPLIT_FILES, iter_files, load
from ..training.eval_typing import Replay, User, make_spans, paired_saved, scores, table

_STEPS = re.compile(r"^llada: (?:inline|completion) (\d+): (\d+) steps in")


class TypingServer:
    """One configuration's server (lsp_client.py) and what it says per request besides the answer: when
    its first non-empty draft arrived, and the forwards its log line counts."""

    def __init__(self, client: LspClient):
        self.client = client
        self.first_shown: dict[int, float] = {}  # request id -> perf_counter of its first non-empty draft
        self.steps: dict[int, int] = {}
        self.step_waiters: dict[int, asyncio.Future] = {}
        client.on("llada/draft", self._on_draft)
        client.on("window/logMessage", self._on_log)

    def _on_draft(self, params: dict) -> None:
        if params["text"] and isinstance(params["requestId"], int):
            self.first_shown.setdefault(params["requestId"], time.perf_counter())

    def _on_log(self, params: dict) -> None:
        if match := _STEPS.match(params["message"]):
            request_id, steps = int(match[1]), int(match[2])
            self.steps[request_id] = steps
            waiter = self.step_waiters.pop(request_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(steps)

    async def steps_of(self, request_id: int, timeout: float = 5.0) -> int | None:
        """The forwards the server logged for a request (its log line follows the answer)."""
        if request_id not in self.steps:
            future = self.step_waiters.setdefault(request_id, asyncio.get_running_loop().create_future())
            try:
                await asyncio.wait_for(asyncio.shield(future), timeout)
            except TimeoutError:
                return None
        return self.steps.get(request_id)


async def replay(commands: dict[str, list[str]], spans, seed: int, interval: float, label: str) -> dict[str, Replay]:
    """Every span typed through each configuration's server, span by span in turn (the first of them
    alternating), so a machine that speeds up or slows down during the run weighs on all alike; the
    servers stay up for the whole split, each with its own caches."""
    servers = {name: await _open(command) for name, command in commands.items()}
    results = {name: Replay() for name in commands}
    started = time.perf_counter()
    for index, span in enumerate(spans):
        names = list(commands) if index % 2 == 0 else list(commands)[::-1]
        for name in names:
            await _type(servers[name], index, span, seed, interval, results[name])
        if (index + 1) % 20 == 0:
            counts = ", ".join(f"{name} {len(r.keystrokes)}" for name, r in results.items())
            print(f"[{label}: {index + 1}/{len(spans)} spans, keystrokes {counts}, "
                  f"{time.perf_counter() - started:.0f}s]", file=sys.stderr, flush=True)  # fmt: skip
    for server in servers.values():
        await server.client.shutdown(30)
    return results


async def _open(command: list[str]) -> TypingServer:
    client = await LspClient.start(command, stderr="discard")
    # UTF-32: positions are str indices, with no conversion in the timed loop.
    await client.initialize({"experimental": {"lladaDrafts": True}}, encodings=[UTF32], timeout=120)
    server = TypingServer(client)
    await _warm_up(client)
    return server


async def _type(server: TypingServer, index: int, span, seed: int, interval: float, result: Replay) -> None:
    """One span typed by the simulated user, keystroke by keystroke, into `result`."""
    client = server.client
    doc = client.did_open(f"file:///eval-typing/{index}/{Path(span.path).name}", span.before + span.after)
    cursor = len(span.before)
    user = User(result, seed, index, span)
    last: Request | None = None
    while not user.done:
        inserted, keystroke = user.act()
        client.did_change(doc, cursor, cursor, inserted)
        cursor += len(inserted)
        if last is not None:  # as an editor: the previous request is superseded
            client.cancel(last)
        last = client.send("textDocument/inlineCompletion", {
            "textDocument": {"uri": doc.uri}, "position": position(doc, cursor, client.encoding),
            "context": {"triggerKind": 2}})  # fmt: skip
        message = await asyncio.wait_for(asyncio.shield(last.answer), 120)
        items = (message.get("result") or {}).get("items") or []
        keystroke.answer = items[0]["insertText"] if items else ""
        keystroke.final = last.arrived - last.sent
        if keystroke.answer and last.id in server.first_shown:
            keystroke.first_shown = min(server.first_shown.pop(last.id), last.arrived) - last.sent
        elif keystroke.answer:
            keystroke.first_shown = keystroke.final
        keystroke.steps = await server.steps_of(last.id)
        user.see(keystroke, interval)
    client.did_close(doc)


async def _warm_up(client: LspClient) -> None:
    """One request, answered once the model has loaded (the load is not a keystroke's cost)."""
    doc = client.did_open("file:///eval-typing/warm-up.py", "def f(x):\n    return \n")
    params = {"textDocument": {"uri": doc.uri}, "position": {"line": 1, "character": 11}, "context": {"triggerKind": 2}}
    await asyncio.wait_for(asyncio.shield(client.send("textDocument/inlineCompletion", params).answer), 300)
    client.did_close(doc)


def eval_typing_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="llada-lab eval-typing", description=__doc__.split("\n\n")[0])
    ap.add_argument("--chars", type=int, default=3000, help="characters to type per split (default: %(default)s; "
                    "Tab saves some, so keystrokes are fewer)")  # fmt: skip
    ap.add_argument("--seed", type=int, default=26, help="which spans are typed and the user's draws (default: 26)")
    ap.add_argument("--interval-ms", type=float, default=120, help="keystroke pacing (default: %(default)s)")
    ap.add_argument("--mode", default="speed", choices=["speed", "quality"], help="inline mode (default: speed)")
    ap.add_argument("--threads", type=int, default=1, help="the server's model threads (default: 1)")
    ap.add_argument("--model", default=None, help="model folder (default: the embedded model)")
    ap.add_argument(
        "--corpus",
        type=Path,
        default=DEFAULT_CACHE,
        help="the corpus folder whose held-out third-party split is typed too (default: .corpus)",
    )
    add_markdown_argument(ap)
    args = ap.parse_args(argv)
    splits = {"stdlib": iter_files("heldout")}
    third = args.corpus / SPLIT_FILES["heldout-thirdparty"]
    if third.is_file():
        splits["third-party"] = load(third)
    else:
        print(f"llada-lab eval-typing: no held-out third-party split at {third} (build it with "
              "`llada-lab corpus`); the standard library only", file=sys.stderr)  # fmt: skip
    base = [sys.executable, "-m", "llada_lsp", "--engine", "local", "--threads", str(args.threads),
            "--inline-mode", args.mode] + (["--model", args.model] if args.model else [])  # fmt: skip
    interval = args.interval_ms / 1000
    results = {}
    for name, files in splits.items():
        spans = make_spans(files, args.chars, args.seed)
        runs = asyncio.run(replay({"on": base, "off": base + ["--no-revise"]}, spans, args.seed, interval, name))
        results[name] = (scores(runs["on"]), scores(runs["off"]), paired_saved(runs["on"], runs["off"]))
    caption = (f"eval-typing: model {args.model or 'embedded'}, {args.mode} mode, seed {args.seed}, "
               f"{args.interval_ms:.0f} ms per keystroke, {args.chars} characters per split, server threads "
               f"{args.threads}")  # fmt: skip
    scored, notes = table(results)
    print(caption, scored.text(), "", *notes, sep="\n")
    if args.markdown:
        report = Report("Suggestions revised while you type")
        report.table(scored, caption + ". Times from the keystroke's request, on this machine.")
        report.note("\n".join(f"- {line}" for line in notes))
        report.write(args.markdown)
    return 0
