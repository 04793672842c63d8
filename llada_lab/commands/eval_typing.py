"""`llada-lab eval-typing`: replays typing of held-out files through the real server over stdio, as an
editor sends it, with revisions on and off side by side, and prints what the user gains.

Each keystroke is a didChange and an inlineCompletion (the previous request cancelled if it still
runs); a simulated user (training/eval_typing.py) takes a suggestion that matches the file's next
characters with Tab with probability 1/2 (the accepted text inserted as one edit), else types on. The
replay waits for every answer, but charges its time: keystrokes are paced at `--interval-ms` (120),
and an answer that arrives after the next keystroke would have been typed counts as not shown. Both
configurations' servers run side by side, and each span is typed through one, then the other.
Forwards per request come from the server's log line for the request; times from the client side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from llada_lsp.server.transport import FrameReader

from ..training.corpus import DEFAULT_CACHE, SPLIT_FILES, iter_files, load
from ..training.eval_typing import Replay, User, make_spans, paired_saved, scores, table

_STEPS = re.compile(r"^llada: (?:inline|completion) (\d+): (\d+) steps in")


class StdioClient:
    """A minimal LSP client of one server process: requests with futures, the drafts and step counts
    the server sends per request id, and an answer to whatever it asks of the client."""

    def __init__(self, process: asyncio.subprocess.Process):
        self.process = process
        self.ids = 0
        self.pending: dict[int, asyncio.Future] = {}
        self.first_shown: dict[int, float] = {}  # request id -> perf_counter of its first non-empty draft
        self.steps: dict[int, int] = {}
        self.step_waiters: dict[int, asyncio.Future] = {}
        self.reader = asyncio.ensure_future(self._read())

    @classmethod
    async def start(cls, command: list[str]) -> StdioClient:
        process = await asyncio.create_subprocess_exec(*command, stdin=asyncio.subprocess.PIPE,
                                                       stdout=asyncio.subprocess.PIPE,
                                                       stderr=asyncio.subprocess.DEVNULL)  # fmt: skip
        return cls(process)

    def _send(self, message: dict) -> None:
        body = json.dumps({"jsonrpc": "2.0", **message}).encode()
        self.process.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)

    def notify(self, method: str, params: Any) -> None:
        self._send({"method": method, "params": params})

    def request(self, method: str, params: Any) -> tuple[int, asyncio.Future]:
        self.ids += 1
        future = asyncio.get_running_loop().create_future()
        self.pending[self.ids] = future
        self._send({"id": self.ids, "method": method, "params": params})
        return self.ids, future

    async def steps_of(self, request_id: int, timeout: float = 5.0) -> int | None:
        """The forwards the server logged for a request (its log line follows the answer)."""
        if request_id not in self.steps:
            future = self.step_waiters.setdefault(request_id, asyncio.get_running_loop().create_future())
            try:
                await asyncio.wait_for(asyncio.shield(future), timeout)
            except TimeoutError:
                return None
        return self.steps.get(request_id)

    async def _read(self) -> None:
        frames = FrameReader(self.process.stdout)
        while (frame := await frames.next()) is not None:
            if frame.body is None:  # a server's frames are well formed; a broken one is no answer
                continue
            message = json.loads(frame.body)
            now = time.perf_counter()
            method = message.get("method")
            if method is None:
                future = self.pending.pop(message.get("id"), None)
                if future is not None and not future.done():
                    future.set_result((now, message))
            elif "id" in message:  # the server asks (progress tokens): yes
                self._send({"id": message["id"], "result": None})
            elif method == "llada/draft":
                params = message["params"]
                if params["text"] and isinstance(params["requestId"], int):
                    self.first_shown.setdefault(params["requestId"], now)
            elif method == "window/logMessage" and (match := _STEPS.match(message["params"]["message"])):
                request_id, steps = int(match[1]), int(match[2])
                self.steps[request_id] = steps
                waiter = self.step_waiters.pop(request_id, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(steps)

    async def close(self) -> None:
        _, answer = self.request("shutdown", None)
        await asyncio.wait_for(answer, 30)
        self.notify("exit", None)
        await self.process.stdin.drain()
        await asyncio.wait_for(self.process.wait(), 30)
        self.reader.cancel()


def position(text: str, offset: int) -> dict[str, int]:
    """An LSP position in UTF-32 (code points: str indices), which the client negotiates."""
    line = text.count("\n", 0, offset)
    return {"line": line, "character": offset - (text.rfind("\n", 0, offset) + 1)}


async def replay(commands: dict[str, list[str]], spans, seed: int, interval: float, label: str) -> dict[str, Replay]:
    """Every span typed through each configuration's server, span by span in turn (the first of them
    alternating), so a machine that speeds up or slows down during the run weighs on all alike; the
    servers stay up for the whole split, each with its own caches."""
    clients = {name: await _open(command) for name, command in commands.items()}
    results = {name: Replay() for name in commands}
    started = time.perf_counter()
    for index, span in enumerate(spans):
        names = list(commands) if index % 2 == 0 else list(commands)[::-1]
        for name in names:
            await _type(clients[name], index, span, seed, interval, results[name])
        if (index + 1) % 20 == 0:
            counts = ", ".join(f"{name} {len(r.keystrokes)}" for name, r in results.items())
            print(f"[{label}: {index + 1}/{len(spans)} spans, keystrokes {counts}, "
                  f"{time.perf_counter() - started:.0f}s]", file=sys.stderr, flush=True)  # fmt: skip
    for client in clients.values():
        await client.close()
    return results


async def _open(command: list[str]) -> StdioClient:
    client = await StdioClient.start(command)
    capabilities = {"general": {"positionEncodings": ["utf-32"]}, "experimental": {"lladaDrafts": True}}
    _, init = client.request("initialize", {"processId": os.getpid(), "rootUri": None, "capabilities": capabilities})
    await asyncio.wait_for(init, 120)
    client.notify("initialized", {})
    await _warm_up(client)
    return client


async def _type(client: StdioClient, index: int, span, seed: int, interval: float, result: Replay) -> None:
    """One span typed by the simulated user, keystroke by keystroke, into `result`."""
    uri, version = f"file:///eval-typing/{index}/{Path(span.path).name}", 1
    text, cursor = span.before + span.after, len(span.before)
    client.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                            "text": text}})  # fmt: skip
    user = User(result, seed, index, span)
    last: asyncio.Future | None = None
    last_id = 0
    while not user.done:
        inserted, keystroke = user.act()
        at = position(text, cursor)
        version += 1
        client.notify("textDocument/didChange", {
            "textDocument": {"uri": uri, "version": version},
            "contentChanges": [{"range": {"start": at, "end": at}, "text": inserted}]})  # fmt: skip
        text, cursor = text[:cursor] + inserted + text[cursor:], cursor + len(inserted)
        if last is not None and not last.done():  # as an editor: the previous request is superseded
            client.notify("$/cancelRequest", {"id": last_id})
        sent = time.perf_counter()
        last_id, last = client.request("textDocument/inlineCompletion", {
            "textDocument": {"uri": uri}, "position": position(text, cursor),
            "context": {"triggerKind": 2}})  # fmt: skip
        arrived, message = await asyncio.wait_for(last, 120)
        items = (message.get("result") or {}).get("items") or []
        keystroke.answer = items[0]["insertText"] if items else ""
        keystroke.final = arrived - sent
        if keystroke.answer and last_id in client.first_shown:
            keystroke.first_shown = min(client.first_shown.pop(last_id), arrived) - sent
        elif keystroke.answer:
            keystroke.first_shown = keystroke.final
        keystroke.steps = await client.steps_of(last_id)
        user.see(keystroke, interval)
    client.notify("textDocument/didClose", {"textDocument": {"uri": uri}})


async def _warm_up(client: StdioClient) -> None:
    """One request, answered once the model has loaded (the load is not a keystroke's cost)."""
    uri = "file:///eval-typing/warm-up.py"
    client.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                            "text": "def f(x):\n    return \n"}})  # fmt: skip
    _, answer = client.request("textDocument/inlineCompletion", {
        "textDocument": {"uri": uri}, "position": {"line": 1, "character": 11}, "context": {"triggerKind": 2}})  # fmt: skip
    await asyncio.wait_for(answer, 300)
    client.notify("textDocument/didClose", {"textDocument": {"uri": uri}})


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
    print(
        f"eval-typing: model {args.model or 'embedded'}, {args.mode} mode, seed {args.seed}, "
        f"{args.interval_ms:.0f} ms per keystroke, {args.chars} characters per split, server threads {args.threads}"
    )
    print(table(results))
    return 0
