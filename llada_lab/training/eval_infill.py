"""Infill tasks cut from held-out files, answered as the server answers an editor, and scored.

Tasks: the rest of the line with the cursor mid-line, a whole line, a multi-line block body (the same
hole kinds as training, from files training never saw). Scores: first-line exact match, full exact
match, syntax-valid rate (the file with the completion inserted parses), tokens per forward and
tokens/s; a trivial baseline (repeat the previous line); and the paired sign test of two answer sets.
The command that prints them per mode is `llada-lab eval-infill` (commands/eval_infill.py).
"""

from __future__ import annotations

import ast
import math
import random
import threading
from dataclasses import dataclass

from tqdm import tqdm

from llada_lsp.completion.jobs import Infill
from llada_lsp.completion.pipeline import run_infill

from .corpus import SourceFile, iter_files
from .objective import cut_hole

TASK_KINDS = ("rest_of_line", "whole_line", "block_body")


@dataclass(frozen=True)
class Task:
    kind: str
    path: str
    prefix: str
    middle: str
    suffix: str


def make_tasks(n_per_kind: int, seed: int = 1234, source: list[SourceFile] | None = None,
               kinds: tuple[str, ...] = TASK_KINDS) -> list[Task]:  # fmt: skip
    """Deterministic tasks from held-out files that parse (so syntax validity is meaningful): this
    interpreter's held-out standard library, or `source` (a held-out corpus file's contents)."""
    rng = random.Random(seed)
    files = []
    for f in iter_files("heldout") if source is None else source:
        try:
            ast.parse(f.text)
        except (SyntaxError, ValueError):
            continue
        files.append(f)
    tasks = []
    if not files:
        raise ValueError("no held-out file parses: no task to cut")
    for kind in kinds:
        attempts = 0
        while sum(t.kind == kind for t in tasks) < n_per_kind and attempts < 50 * n_per_kind:
            attempts += 1
            f = rng.choice(files)
            hole = cut_hole(f.text, kind, rng)
            if hole is None or not hole[1].strip():
                continue
            tasks.append(Task(kind, f.path, *hole))
    return tasks


def first_line(s: str) -> str:
    return s.split("\n", 1)[0].rstrip()


def cut_to_unit(kind: str, text: str) -> str:
    """What an editor would insert: single-line tasks stop at the end of the line."""
    return first_line(text) if kind != "block_body" else text.rstrip()


def previous_line_baseline(task: Task) -> str:
    lines = task.prefix.split("\n")
    col = len(lines[-1])
    prev = lines[-2] if len(lines) > 1 else ""
    if task.kind == "rest_of_line":
        return prev[col:].rstrip()
    return prev.strip()


def syntax_ok(task: Task, completion: str) -> bool:
    try:
        ast.parse(task.prefix + completion + task.suffix)
        return True
    except (SyntaxError, ValueError):
        return False


def score(tasks, completions, tpf: float | None = None, tokens_per_s: float | None = None) -> dict:
    n = len(tasks)
    out = {
        "n": n,
        "first_line_em": sum(first_line(c) == first_line(t.middle) for t, c in zip(tasks, completions)) / n,
        "full_em": sum(c.rstrip() == t.middle.rstrip() for t, c in zip(tasks, completions)) / n,
        "syntax_ok": sum(syntax_ok(t, c) for t, c in zip(tasks, completions)) / n,
    }
    if tpf is not None:
        out["tpf"], out["tokens_per_s"] = tpf, tokens_per_s
    return out


def paired(tasks, a: list[str], b: list[str]) -> tuple[int, int, float]:
    """Tasks whose first line only `a` gets right, only `b` does, and the two-sided sign-test p-value of
    that split (how likely so uneven a split is if neither is better)."""
    right_a = [first_line(c) == first_line(t.middle) for t, c in zip(tasks, a)]
    right_b = [first_line(c) == first_line(t.middle) for t, c in zip(tasks, b)]
    only_a = sum(x and not y for x, y in zip(right_a, right_b))
    only_b = sum(y and not x for x, y in zip(right_a, right_b))
    return only_a, only_b, sign_test(only_a, only_b)


def sign_test(only_a: int, only_b: int) -> float:
    """Two-sided sign-test p-value of a split of the discordant tasks (ties are left out)."""
    n = only_a + only_b
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(min(only_a, only_b) + 1)) / 2**n)


def answer(model, tasks: list[Task], mode: str) -> tuple[list[str], dict]:
    """Every task answered exactly as the server answers an editor at that cursor (its prompt, decoding
    and post-processing) in `mode`, cut to the task's unit; and the scores, tokens per forward included."""
    completions, tokens, steps, seconds = [], 0, 0, 0.0
    for t in tqdm(tasks, desc=f"{mode} {tasks[0].kind if tasks else ''}", leave=False, mininterval=2):
        job = Infill.at(t.prefix + t.suffix, len(t.prefix), mode)
        out = run_infill(model, job, threading.Event(), lambda *_: None)
        completions.append(cut_to_unit(t.kind, out.text))
        tokens += len(model.codec.encode(out.text))
        steps, seconds = steps + out.steps, seconds + out.seconds
    return completions, score(tasks, completions, tokens / max(steps, 1), tokens / max(seconds, 1e-9))
