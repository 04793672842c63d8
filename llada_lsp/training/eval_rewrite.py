"""`llada-lsp eval-rewrite`: rewrite selections cut from held-out standard-library files, and count
what an editor would get: proposals that parse, rewrites applied, refused (and why), unchanged.

Selections are of three kinds, as users make them: whole statements (linewise, one to a few lines),
whole functions (linewise, up to a size the model can rewrite) and partial lines (characterwise: an
expression inside a line). Each is answered by the server's own rewrite job (prompt, decoding in the
chosen mode, the syntax guard), so the counts are those of `llada.rewriteSelection`. The check that
matters: no applied rewrite leaves a file that parsed unparsable.
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass

from tqdm import tqdm

from ..completion.syntax import python_error
from .corpus import iter_files

KINDS = ("statement", "function", "partial_line")
MAX_SELECTION_CHARS = 1200  # whole functions beyond this are more than the embedded model can rewrite


@dataclass(frozen=True)
class Selection:
    kind: str
    path: str
    text: str  # the whole file
    start: int
    end: int


def _line_starts(text: str) -> list[int]:
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts


def _candidates(text: str, tree: ast.AST) -> dict[str, list[tuple[int, int]]]:
    """str spans of each kind in one parsed file."""
    starts, lines = _line_starts(text), text.splitlines(keepends=True)
    out: dict[str, list[tuple[int, int]]] = {kind: [] for kind in KINDS}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.decorator_list:
            span = (starts[node.lineno - 1], starts[node.end_lineno])
            if span[1] - span[0] <= MAX_SELECTION_CHARS:
                out["function"].append(span)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Return, ast.Expr, ast.Raise, ast.If, ast.For)):
            if node.end_lineno - node.lineno < 4 and not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
                out["statement"].append((starts[node.lineno - 1], starts[node.end_lineno]))
        elif isinstance(node, (ast.Call, ast.BinOp, ast.Compare, ast.Subscript)) and node.lineno == node.end_lineno:
            line = lines[node.lineno - 1]
            raw = line.encode()  # ast columns count UTF-8 bytes
            a = len(raw[: node.col_offset].decode(errors="ignore"))
            b = len(raw[: node.end_col_offset].decode(errors="ignore"))
            if 6 <= b - a and line[a:b].strip() != line.strip():  # inside the line, not all of it
                out["partial_line"].append((starts[node.lineno - 1] + a, starts[node.lineno - 1] + b))
    return out


def make_selections(n_per_kind: int, seed: int = 1234) -> list[Selection]:
    """Deterministic selections from held-out files that parse."""
    rng = random.Random(seed)
    pools: dict[str, list[Selection]] = {kind: [] for kind in KINDS}
    for f in iter_files("heldout"):
        try:
            tree = ast.parse(f.text)
        except (SyntaxError, ValueError):
            continue
        for kind, spans in _candidates(f.text, tree).items():
            pools[kind] += [Selection(kind, f.path, f.text, a, b) for a, b in spans]
    out = []
    for kind in KINDS:
        out += rng.sample(pools[kind], min(n_per_kind, len(pools[kind])))
    return out


def eval_rewrite_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="llada-lsp eval-rewrite", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model folder or cached Hugging Face id (default: the embedded model)")
    ap.add_argument("--n", type=int, default=20, help="selections per kind (default: 20, so 60 in all)")
    ap.add_argument("--mode", default="quality", help="decoding preset (default: quality, the rewrite default)")
    ap.add_argument("--seed", type=int, default=1234, help="which selections are cut (default: 1234)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--show", type=int, default=0, metavar="K", help="print K refused and K applied proposals")
    ap.add_argument("--json", action="store_true", help="also print the counts as one JSON line")
    args = ap.parse_args(argv)
    from ..engine import PRESETS
    from ..backends.native import load
    from ..completion.generation import ModelSpec
    from ..completion.jobs import Rewrite
    from ..completion.pipeline import run_rewrite

    if args.mode not in PRESETS:
        ap.error(f"--mode {args.mode!r}: choose from {', '.join(PRESETS)}")
    model = load(ModelSpec(args.model, device="cpu", dtype="float32", threads=args.threads), lambda *_: None)
    selections = make_selections(args.n, args.seed)
    rows: list[dict] = []
    started = time.time()
    for sel in tqdm(selections, desc="rewrites", mininterval=2):
        job = Rewrite.at(sel.text, sel.start, sel.end, args.mode, python=True)
        try:
            out = run_rewrite(model, job, threading.Event(), lambda *_: None)
        except ValueError as err:  # too long for the model: refused before decoding
            rows.append({"kind": sel.kind, "stopped": "too long", "reason": str(err), "parses": None, "steps": 0})
            continue
        new_file = sel.text[: sel.start] + out.text + sel.text[sel.end :]
        rows.append({"kind": sel.kind, "stopped": out.stopped, "reason": out.reason, "parses": python_error(new_file) is None,
                     "steps": out.steps, "selection": sel.text[sel.start : sel.end], "proposal": out.text,
                     "path": sel.path})  # fmt: skip
    seconds = time.time() - started

    print(f"rewrites of held-out selections, mode {args.mode}, model {args.model or 'embedded'}, {len(rows)} "
          f"selections ({seconds:.0f} s)")  # fmt: skip
    print("| selection | n | proposal parses | applied | refused | unchanged | too long | applied and unparsable |")
    print("|---|---|---|---|---|---|---|---|")
    for kind in (*KINDS, "all"):
        rs = [r for r in rows if kind in ("all", r["kind"])]
        count = Counter(r["stopped"] for r in rs)
        broken = sum(r["stopped"] == "done" and not r["parses"] for r in rs)
        print(f"| {kind} | {len(rs)} | {sum(bool(r['parses']) for r in rs)} | {count['done']} | {count['refused']} | "
              f"{count['unchanged']} | {count['too long']} | {broken} |")  # fmt: skip
    reasons = Counter(r["reason"].split(" (")[0] for r in rows if r["stopped"] == "refused")
    for reason, k in reasons.most_common():
        print(f"refused, {k}: {reason}")
    n = max(len(rows), 1)
    print(f"exact-unchanged rate: {sum(r['stopped'] == 'unchanged' for r in rows) / n:.1%}")
    for stopped in ("refused", "done") if args.show else ():
        for r in [r for r in rows if r["stopped"] == stopped][: args.show]:
            print(f"--- {stopped} ({r['kind']}, {r['path']}): {r['reason']}\n{r['selection']!r}\n->\n{r['proposal']!r}")
    if args.json:
        print(json.dumps({"rows": [{k: r[k] for k in ("kind", "stopped", "reason", "parses")} for r in rows]}))
    return 1 if any(r["stopped"] == "done" and not r["parses"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(eval_rewrite_main())
