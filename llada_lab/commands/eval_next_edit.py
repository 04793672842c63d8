"""`llada-lab eval-next-edit`: next-edit suggestions on held-out commits, scored per configuration.

The cases (data/next_edit/cases.jsonl.gz, cut by training/edit_pairs.py from repositories training
never saw) are replayed against the real server over stdio exactly as an editor would (through
llada_lsp/lsp_client.py): one server per configuration, reused across cases; per case didOpen of the
file before the history, one incremental didChange per history edit, `llada/nextEdit` at the cursor,
the answer's edits applied, didClose. Configurations: the shipped model, a fine-tuned one (--model),
"rewrite the window without history" (the shipped model with `nextEditHistory: false`), the fine-tuned
one without history (what the history adds to it) and "always silent" (no server). Scores (exact match
of the changed region, delta-chrF, silent-when-right precision/recall, reversal rate, parse kept,
p50/p95 time to the answer) are training/eval_next_edit.py; the sign test compares configurations
case by case on exact match.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from llada_lsp.lsp_client import LspClient, LspError, edited, position
from llada_lsp.report import Report, Table, add_markdown_argument
from llada_lsp.server.documents import Document

from ..training.edit_pairs import EVAL_SET, apply, read_jsonl_gz
from ..training.eval_next_edit import (
    case_scores,
    changed_region,
    paired_exact,
    summarize,
)

SILENT = "always silent"


def apply_answer(doc: Document, result: Any, encoding: str) -> str | None:
    """The text after a `llada/nextEdit` result's edits (all of them: together they are the suggestion),
    or None when the result suggests nothing (no edits, or an answer for another version)."""
    if not isinstance(result, dict) or not result.get("edits"):
        return None
    if result.get("version") is not None and result["version"] != doc.version:
        return None
    return edited(doc, result["edits"], encoding)


class CaseRunner:
    """One configuration's server (lsp_client.py): initialized once, then each case opened, edited,
    asked and closed."""

    def __init__(self, client: LspClient, timeout: float):
        self.client, self.timeout = client, timeout
        self._n = 0

    @classmethod
    async def start(cls, command: list[str], options: dict, timeout: float) -> CaseRunner:
        client = await LspClient.start(command, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        capabilities = {"textDocument": {"synchronization": {"dynamicRegistration": False}}}
        await client.initialize(capabilities, options, timeout=timeout)
        return cls(client, timeout)

    async def ask(self, case: dict) -> tuple[str | None, float, str | None]:
        """(the text after the suggestion or None, seconds to the answer, an error or None)."""
        self._n += 1
        client = self.client
        doc = client.did_open(f"file:///eval/{self._n}/{Path(case['path']).name}", case["before"])
        for e in case["history"]:
            client.did_change(doc, e["start"], e["end"], e["text"])
        params = {"textDocument": {"uri": doc.uri, "version": doc.version},
                  "position": position(doc, case["cursor"], client.encoding)}  # fmt: skip
        started = time.perf_counter()
        error = None
        try:
            result = await client.request("llada/nextEdit", params, self.timeout)
            predicted = apply_answer(doc, result, client.encoding)
        except (LspError, TimeoutError) as err:
            predicted, error = None, str(err)
        seconds = time.perf_counter() - started
        client.did_close(doc)
        return predicted, seconds, error


WARM_UP = {
    "path": "warm.py",
    "before": "def f(a):\n    return a\n\n\nx = f(1)\n",
    "history": [{"start": 6, "end": 7, "text": "b"}],
    "cursor": 7,
    "expected": None,
}


async def run_configuration(
    command: list[str], options: dict, cases: list[dict], timeout: float, progress=None
) -> tuple[list[str | None], list[float], list[str]]:
    """Every case through one server: the suggested texts, the seconds each took, the errors met.
    A warm-up request first (its model load is not timed)."""
    session = await CaseRunner.start(command, options, timeout)
    predicted, seconds, errors = [], [], []
    try:
        await session.ask(WARM_UP)
        for i, case in enumerate(cases):
            text, s, error = await session.ask(case)
            predicted.append(text)
            seconds.append(s)
            if error:
                errors.append(f"{case['repo']} {case['commit'][:10]} {case['path']}: {error}")
            if progress:
                progress(i + 1, len(cases))
    finally:
        await session.client.shutdown(10)
    return predicted, seconds, errors


# --- the command -------------------------------------------------------------------------------------


def _fmt(x: float, pct: bool = True) -> str:
    if isinstance(x, float) and math.isnan(x):
        return "-"
    return f"{x:.1%}" if pct else f"{x:.0f}"


def table(rows: dict[str, dict]) -> Table:
    out = Table(["configuration", "EM (all)", "EM (edit cases)", "delta-chrF", "silent precision", "silent recall",
                 "suggestions", "reversal rate", "parse kept", "p50 ms", "p95 ms"])  # fmt: skip
    for name, r in rows.items():
        out.add(name, _fmt(r["exact_all"]), _fmt(r["exact_edit"]), _fmt(r["delta_chrf"], False),
                _fmt(r["silent_precision"]), _fmt(r["silent_recall"]), r["suggested"], _fmt(r["reversal_rate"]),
                _fmt(r["parse_kept"]), _fmt(r["p50_ms"], False), _fmt(r["p95_ms"], False))  # fmt: skip
    return out


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
    add_markdown_argument(ap)
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

            predicted, seconds, errors = asyncio.run(run_configuration(command, options, cases, args.timeout, progress))
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
    caption = (f"Next edit on {len(cases)} held-out cases ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))}) "
               f"from {', '.join(sorted({c['repo'] for c in cases}))}.")  # fmt: skip
    scored = table(rows)
    keys = list(scores)
    pairs = []
    for i, a in enumerate(keys):
        for b in keys[i + 1 :]:
            only_a, only_b, p = paired_exact(scores[a], scores[b])
            pairs.append(f"{names[a]} vs {names[b]}: exact only in the first {only_a}, only in the second {only_b} "
                         f"(sign test p = {p:.3g})")  # fmt: skip
    print(caption, scored.text(), *pairs, sep="\n")
    if args.markdown:
        report = Report("Next-edit suggestions")
        report.table(scored, caption + " EM: exact match of the changed region; times from the request to the "
                     "answer, on this machine.")  # fmt: skip
        if pairs:
            report.note("\n".join(f"- {line}" for line in pairs))
        report.write(args.markdown)
    if args.json:
        print(json.dumps(rows))
    if args.save:
        Path(args.save).write_text(
            json.dumps({"cases": ids, "names": {k: names[k] for k in scores}, "rows": rows, "scores": scores})
        )
    return 0
