"""`llada-lab eval-next-edit`: next-edit suggestions on held-out commits, scored per configuration.

The cases (data/next_edit/cases.jsonl.gz, cut by training/edit_pairs.py from repositories training
never saw) are replayed against the real server over stdio exactly as an editor would: one server per
configuration, reused across cases; per case didOpen of the file before the history, one incremental
didChange per history edit, `llada/nextEdit` at the cursor, the answer's edits applied, didClose.
Configurations: the shipped model, a fine-tuned one (--model), "rewrite the window without history"
(the shipped model with `nextEditHistory: false`), the fine-tuned one without history (what the
history adds to it) and "always silent" (no server). Scores (exact match
of the changed region, delta-chrF, silent-when-right precision/recall, reversal rate, parse kept,
p50/p95 time to the answer) are training/eval_next_edit.py; the sign test compares configurations
case by case on exact match.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..training.edit_pairs import EVAL_SET, apply, read_jsonl_gz
from ..training.eval_next_edit import (
    case_scores,
    changed_region,
    paired_exact,
    summarize,
)

SILENT = "always silent"


# --- positions (the protocol's lines and code units <-> str offsets) ---------------------------------


def _units(s: str, encoding: str) -> int:
    if encoding == "utf-32":
        return len(s)
    if encoding == "utf-8":
        return len(s.encode("utf-8", errors="surrogatepass"))
    return len(s.encode("utf-16-le", errors="surrogatepass")) // 2


def to_position(text: str, offset: int, encoding: str = "utf-16") -> dict:
    """str offset -> LSP Position (lines split at \\n: the cases hold no \\r)."""
    line = text.count("\n", 0, offset)
    start = text.rfind("\n", 0, offset) + 1
    return {"line": line, "character": _units(text[start:offset], encoding)}


def to_offset(text: str, position: dict, encoding: str = "utf-16") -> int:
    """LSP Position -> str offset; past the end of a line clamps to its end, past the last line to the text's."""
    start = 0
    for _ in range(position["line"]):
        nl = text.find("\n", start)
        if nl < 0:
            return len(text)
        start = nl + 1
    end = text.find("\n", start)
    line = text[start:] if end < 0 else text[start:end]
    want, i, units = position["character"], 0, 0
    while i < len(line) and units < want:
        units += _units(line[i], encoding)
        if units > want:
            break
        i += 1
    return start + i


def apply_answer(text: str, result: Any, version: int, encoding: str = "utf-16") -> str | None:
    """The text after a `llada/nextEdit` result's edits (all of them: together they are the suggestion),
    or None when the result suggests nothing (no edits, an edit that changes nothing, another version)."""
    if not isinstance(result, dict) or not result.get("edits"):
        return None
    if result.get("version") is not None and result["version"] != version:
        return None
    spans = sorted(
        (
            (to_offset(text, e["range"]["start"], encoding), to_offset(text, e["range"]["end"], encoding), e["newText"])
            for e in result["edits"]
        ),
        reverse=True,
    )
    for start, end, new in spans:
        text = text[:start] + new + text[end:]
    return text


# --- a minimal LSP client over a child's stdio -------------------------------------------------------


class LspError(RuntimeError):
    pass


class StdioClient:
    """JSON-RPC over a child process's stdin/stdout, as an editor speaks it: requests with ids (answered
    in any order), notifications, and requests from the server answered with a null result."""

    def __init__(self, command: list[str], env: dict | None = None):
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        self._next = 0
        self._lock = threading.Lock()
        self._waiting: dict[int, queue.Queue] = {}
        self.logs: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._drain_stderr, daemon=True).start()

    def _drain_stderr(self) -> None:
        for line in self.proc.stderr:
            self.logs.append(line.decode("utf-8", "replace").rstrip())
            del self.logs[:-200]

    def _send(self, message: dict) -> None:
        body = json.dumps(message).encode("utf-8")
        with self._lock:
            self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
            self.proc.stdin.flush()

    def _read(self) -> None:
        out = self.proc.stdout
        while True:
            length = None
            while True:
                line = out.readline()
                if not line:
                    for q in list(self._waiting.values()):
                        q.put({"error": {"code": -32099, "message": "the server closed its output"}})
                    return
                line = line.strip()
                if not line:
                    break
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if length is None:
                continue
            message = json.loads(out.read(length))
            if "method" in message and "id" in message:  # a request from the server
                self._send({"jsonrpc": "2.0", "id": message["id"], "result": None})
            elif "method" in message:
                if message["method"] == "window/logMessage":
                    self.logs.append(str(message.get("params", {}).get("message", "")))
                    del self.logs[:-200]
            elif message.get("id") in self._waiting:
                self._waiting.pop(message["id"]).put(message)

    def request(self, method: str, params: Any, timeout: float = 120.0) -> Any:
        with self._lock:
            self._next += 1
            rid = self._next
        q: queue.Queue = queue.Queue()
        self._waiting[rid] = q
        self._send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        try:
            message = q.get(timeout=timeout)
        except queue.Empty:
            self._waiting.pop(rid, None)
            self.notify("$/cancelRequest", {"id": rid})
            raise TimeoutError(f"{method}: no answer in {timeout:.0f} s") from None
        if "error" in message:
            raise LspError(f"{method}: {message['error'].get('message')} ({message['error'].get('code')})")
        return message.get("result")

    def notify(self, method: str, params: Any) -> None:
        self._send({"jsonrpc": "2.0", "method": method, "params": params})

    def close(self, timeout: float = 10.0) -> None:
        try:
            self.request("shutdown", None, timeout=timeout)
            self.notify("exit", None)
        except (LspError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Session:
    """One configuration's server: initialized once, then each case opened, edited, asked and closed."""

    def __init__(self, command: list[str], options: dict, timeout: float):
        self.client = StdioClient(command, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.timeout = timeout
        capabilities = {
            "general": {"positionEncodings": ["utf-16"]},
            "textDocument": {"synchronization": {"dynamicRegistration": False}},
        }
        result = self.client.request(
            "initialize",
            {"processId": os.getpid(), "rootUri": None, "capabilities": capabilities, "initializationOptions": options},
            timeout=timeout,
        )
        self.encoding = (result or {}).get("capabilities", {}).get("positionEncoding") or "utf-16"
        self.client.notify("initialized", {})
        self._n = 0

    def ask(self, case: dict) -> tuple[str | None, float, str | None]:
        """(the text after the suggestion or None, seconds to the answer, an error or None)."""
        self._n += 1
        uri = f"file:///eval/{self._n}/{Path(case['path']).name}"
        text, version = case["before"], 1
        self.client.notify(
            "textDocument/didOpen",
            {"textDocument": {"uri": uri, "languageId": "python", "version": version, "text": text}},
        )
        for e in case["history"]:
            version += 1
            change = {
                "range": {
                    "start": to_position(text, e["start"], self.encoding),
                    "end": to_position(text, e["end"], self.encoding),
                },
                "text": e["text"],
            }
            self.client.notify(
                "textDocument/didChange", {"textDocument": {"uri": uri, "version": version}, "contentChanges": [change]}
            )
            text = apply(text, [e])
        started = time.perf_counter()
        error = None
        try:
            result = self.client.request(
                "llada/nextEdit",
                {
                    "textDocument": {"uri": uri, "version": version},
                    "position": to_position(text, case["cursor"], self.encoding),
                },
                timeout=self.timeout,
            )
            predicted = apply_answer(text, result, version, self.encoding)
        except (LspError, TimeoutError) as err:
            predicted, error = None, str(err)
        seconds = time.perf_counter() - started
        self.client.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
        return predicted, seconds, error

    def close(self) -> None:
        self.client.close()


WARM_UP = {
    "path": "warm.py",
    "before": "def f(a):\n    return a\n\n\nx = f(1)\n",
    "history": [{"start": 6, "end": 7, "text": "b"}],
    "cursor": 7,
    "expected": None,
}


def run_configuration(
    command: list[str], options: dict, cases: list[dict], timeout: float, progress=None
) -> tuple[list[str | None], list[float], list[str]]:
    """Every case through one server: the suggested texts, the seconds each took, the errors met.
    A warm-up request first (its model load is not timed)."""
    session = Session(command, options, timeout)
    predicted, seconds, errors = [], [], []
    try:
        session.ask(WARM_UP)
        for i, case in enumerate(cases):
            text, s, error = session.ask(case)
            predicted.append(text)
            seconds.append(s)
            if error:
                errors.append(f"{case['repo']} {case['commit'][:10]} {case['path']}: {error}")
            if progress:
                progress(i + 1, len(cases))
    finally:
        session.close()
    return predicted, seconds, errors


# --- the command -------------------------------------------------------------------------------------


def _fmt(x: float, pct: bool = True) -> str:
    if isinstance(x, float) and math.isnan(x):
        return "-"
    return f"{x:.1%}" if pct else f"{x:.0f}"


def table(rows: dict[str, dict]) -> list[str]:
    lines = [
        (
            "| configuration | EM (all) | EM (edit cases) | delta-chrF | silent precision | silent recall | "
            "suggestions | reversal rate | parse kept | p50 ms | p95 ms |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {_fmt(r['exact_all'])} | {_fmt(r['exact_edit'])} | {_fmt(r['delta_chrf'], False)} | "
            f"{_fmt(r['silent_precision'])} | {_fmt(r['silent_recall'])} | {r['suggested']} | "
            f"{_fmt(r['reversal_rate'])} | {_fmt(r['parse_kept'])} | {_fmt(r['p50_ms'], False)} | "
            f"{_fmt(r['p95_ms'], False)} |"
        )
    return lines


def eval_next_edit_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="llada-lab eval-next-edit", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=str(EVAL_SET), help="cases (.jsonl.gz; default: the repository's held-out set)")
    ap.add_argument("--limit", type=int, default=None, help="only the first N cases (default: all)")
    ap.add_argument(
        "--sample",
        type=int,
        default=None,
        help="N cases spread evenly over the set (every repository, in proportion; default: all)",
    )
    ap.add_argument("--model", default=None, help="a fine-tuned model folder: scored beside the shipped model")
    ap.add_argument(
        "--server",
        default=f"{shlex.quote(sys.executable)} -m llada_lsp --engine local",
        help="the server command line (default: %(default)s)",
    )
    ap.add_argument(
        "--configs",
        default="shipped,fine-tuned,no-history,fine-tuned-no-history," + SILENT.replace(" ", "-"),
        help="which configurations, comma-separated (default: %(default)s; fine-tuned ones need --model)",
    )
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds one request may take (default: %(default)s)")
    ap.add_argument("--json", action="store_true", help="also print the rows as one JSON line")
    ap.add_argument("--save", default=None, help="write every configuration's per-case scores here (JSON)")
    ap.add_argument(
        "--load",
        action="append",
        default=[],
        metavar="FILE",
        help="configurations scored by an earlier run on the same cases (--save's file): shown and "
        "sign-tested beside this run's, not run again (repeatable)",
    )
    args = ap.parse_args(argv)
    if not Path(args.cases).is_file():  # the held-out set is in the repository, not in the wheel
        ap.error(f"no case file at {args.cases} (run from a checkout of the repository, or pass --cases)")
    cases = list(read_jsonl_gz(args.cases))[: args.limit]
    if args.sample and args.sample < len(cases):
        cases = [cases[i * len(cases) // args.sample] for i in range(args.sample)]
    if not cases:
        ap.error(f"no cases in {args.cases}")
    server = shlex.split(args.server)
    on = {"nextEdit": True, "nextEditHistory": True}
    plans = {
        "shipped": (server, on),
        "fine-tuned": (server + ["--model", args.model] if args.model else None, on),
        "no-history": (server, {**on, "nextEditHistory": False}),
        "fine-tuned-no-history": (
            server + ["--model", args.model] if args.model else None,
            {**on, "nextEditHistory": False},
        ),
        "always-silent": (None, None),
    }
    names = {
        "shipped": "shipped model",
        "fine-tuned": f"fine-tuned ({args.model})",
        "no-history": "rewrite the window without history",
        "fine-tuned-no-history": "fine-tuned, the window without history",
        "always-silent": SILENT,
    }
    wanted = [c for c in args.configs.split(",") if c]
    unknown = [c for c in wanted if c not in plans]
    if unknown:
        ap.error(f"--configs: unknown {', '.join(unknown)}; choose from {', '.join(plans)}")
    if not args.model:
        wanted = [c for c in wanted if not c.startswith("fine-tuned")]
    scores: dict[str, list[dict]] = {}
    rows: dict[str, dict] = {}
    ids = [f"{c['repo']} {c['commit']} {c['path']}" for c in cases]
    for path in args.load:
        earlier = json.loads(Path(path).read_text())
        if earlier["cases"] != ids:
            ap.error(f"--load {path}: scored on other cases")
        for key, name in earlier["names"].items():
            if key not in wanted:
                scores[key], rows[name], names[key] = earlier["scores"][key], earlier["rows"][name], name
    for key in wanted:
        command, options = plans[key]
        started = time.time()
        if command is None:
            predicted, seconds, errors = [None] * len(cases), [], []
        else:

            def progress(i, n, key=key, started=started):
                if i % 25 == 0 or i == n:
                    print(f"[{key}: {i}/{n}, {time.time() - started:.0f}s]", file=sys.stderr, flush=True)

            predicted, seconds, errors = run_configuration(command, options, cases, args.timeout, progress)
        for error in errors[:5]:
            print(f"[{key}] {error}", file=sys.stderr)
        if len(errors) > 5:
            print(f"[{key}] ... {len(errors)} errors in all", file=sys.stderr)
        scores[key] = [case_scores(c, p) for c, p in zip(cases, predicted, strict=True)]
        if args.save:  # what was suggested, as the smallest change of the text asked about (to read failures)
            for s, c, p in zip(scores[key], cases, predicted):
                if p is not None:
                    s["change"] = changed_region(apply(c["before"], c["history"]), p)
        rows[names[key]] = {**summarize(scores[key], seconds), "errors": len(errors)}
    kinds: dict[str, int] = {}
    for c in cases:
        kinds[c["kind"]] = kinds.get(c["kind"], 0) + 1
    print(
        f"next edit on {len(cases)} held-out cases ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))}) "
        f"from {', '.join(sorted({c['repo'] for c in cases}))}"
    )
    print("\n".join(table(rows)))
    keys = list(scores)
    for i, a in enumerate(keys):
        for b in keys[i + 1 :]:
            only_a, only_b, p = paired_exact(scores[a], scores[b])
            print(
                f"{names[a]} vs {names[b]}: exact only in the first {only_a}, only in the second {only_b} "
                f"(sign test p = {p:.3g})"
            )
    if args.json:
        print(json.dumps(rows))
    if args.save:
        Path(args.save).write_text(
            json.dumps({"cases": ids, "names": {k: names[k] for k in scores}, "rows": rows, "scores": scores})
        )
    return 0
