"""Rewrite selections cut from held-out standard-library files, and what an editor would get for each:
a proposal that parses, applied, refused (and why), unchanged or too long.

Selections are of three kinds, as users make them: whole statements (linewise, one to a few lines),
whole functions (linewise, up to a size the model can rewrite) and partial lines (characterwise: an
expression inside a line). Each is answered by the server's own rewrite job (prompt, decoding in the
chosen mode, the syntax guard), so the counts are those of `llada.rewriteSelection`. The command that
counts them is `llada-lab eval-rewrite` (commands/eval_rewrite.py).
"""

from __future__ import annotations

import ast
import random
import threading
from dataclasses import dataclass

from tqdm import tqdm

from llada_lsp.completion.jobs import Rewrite
from llada_lsp.completion.pipeline import run_rewrite
from llada_lsp.completion.syntax import python_error

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
            if node.end_lineno - node.lineno < 4 and not (
                isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            ):
                out["statement"].append((starts[node.lineno - 1], starts[node.end_lineno]))
        elif isinstance(node, (ast.Call, ast.BinOp, ast.Compare, ast.Subscript)) and node.lineno == node.end_lineno:
            line = lines[node.lineno - 1]
            raw = line.encode()  # ast columns count UTF-8 bytes
            a = len(raw[: node.col_offset].decode(errors="ignore"))
            b = len(raw[: node.end_col_offset].decode(errors="ignore"))
            if b - a >= 6 and line[a:b].strip() != line.strip():  # inside the line, not all of it
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


def rewrite_all(model, selections: list[Selection], mode: str) -> list[dict]:
    """Each selection rewritten by the server's rewrite job in `mode` -> one row per selection: kind,
    how it stopped ("done" applied, "refused", "unchanged", "too long"), the reason, whether the file
    with the proposal parses; with the selection, the proposal and the file's path where it decoded."""
    rows: list[dict] = []
    for sel in tqdm(selections, desc="rewrites", mininterval=2):
        job = Rewrite.at(sel.text, sel.start, sel.end, mode, python=True)
        try:
            out = run_rewrite(model, job, threading.Event(), lambda *_: None)
        except ValueError as err:  # too long for the model: refused before decoding
            rows.append({"kind": sel.kind, "stopped": "too long", "reason": str(err), "parses": None, "steps": 0})
            continue
        new_file = sel.text[: sel.start] + out.text + sel.text[sel.end :]
        rows.append({"kind": sel.kind, "stopped": out.stopped, "reason": out.reason, "parses": python_error(new_file) is None,
                     "steps": out.steps, "selection": sel.text[sel.start : sel.end], "proposal": out.text,
                     "path": sel.path})  # fmt: skip
    return rows
