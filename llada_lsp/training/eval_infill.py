"""`llada-lsp eval-infill`: infill tasks cut from held-out standard-library files, scored per mode.

Tasks: the rest of the line with the cursor mid-line, a whole line, a multi-line block body (the same
hole kinds as training, from files training never saw). Scores: first-line exact match, full exact
match, syntax-valid rate (the file with the completion inserted parses), tokens per forward and
tokens/s, for `speed`, `quality`, the strict `no-edit` baseline, and a trivial baseline (repeat the
previous line). Each task is answered exactly as the server answers an editor at that cursor (its
prompt, decoding and post-processing, server defaults); TPF counts the completion's tokens per forward.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import random
import sys
import threading
import time
from dataclasses import dataclass

import torch
from tqdm import tqdm

from ..engine import PRESETS
from ..backends.native import load as load_native
from ..completion import jobs
from ..completion.generation import ModelSpec
from ..completion.pipeline import run_infill
from .corpus import SourceFile, iter_files, load
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
        job = jobs.Infill.at(t.prefix + t.suffix, len(t.prefix), mode)
        out = run_infill(model, job, threading.Event(), lambda *_: None)
        completions.append(cut_to_unit(t.kind, out.text))
        tokens += len(model.codec.encode(out.text))
        steps, seconds = steps + out.steps, seconds + out.seconds
    return completions, score(tasks, completions, tokens / max(steps, 1), tokens / max(seconds, 1e-9))


def eval_infill_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="llada-lsp eval-infill", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model folder (default: the embedded model)")
    ap.add_argument("--n", type=int, default=100, help="tasks per kind (default: 100)")
    ap.add_argument("--modes", default="speed,quality,no-edit", help="decoding presets to score, comma-separated (default: %(default)s)")
    ap.add_argument("--kinds", default=",".join(TASK_KINDS), help="task kinds to score, comma-separated (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=1234, help="which tasks are cut (default: 1234)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--tasks-from", default=None, help="cut the tasks from this held-out corpus file (.jsonl.gz "
                    "from `python -m llada_lsp.training.corpus`; default: this interpreter's held-out stdlib)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default: %(default)s)")
    ap.add_argument("--dtype", default="float32", help="default: %(default)s")
    ap.add_argument("--json", action="store_true", help="also print the scores as one JSON line")
    args = ap.parse_args(argv)
    kinds, modes = [k for k in args.kinds.split(",") if k], [m for m in args.modes.split(",") if m]
    if not kinds or not set(kinds) <= set(TASK_KINDS):
        ap.error(f"--kinds {args.kinds!r}: choose from {', '.join(TASK_KINDS)}")
    if not modes or not set(modes) <= set(PRESETS):
        ap.error(f"--modes {args.modes!r}: choose from {', '.join(PRESETS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_native(ModelSpec(args.model, device=args.device, dtype=args.dtype), lambda *_: None)
    if not model.codec.special.has_fim:
        print("llada-lsp eval-infill: the model's tokenizer has no FIM tokens", file=sys.stderr)
        return 2
    tasks = make_tasks(args.n, args.seed, load(args.tasks_from) if args.tasks_from else None)
    by_kind = {kind: [t for t in tasks if t.kind == kind] for kind in kinds}
    results: dict[str, dict[str, dict]] = {}
    answers: dict[str, dict[str, list[str]]] = {}
    for kind, ts in by_kind.items():
        results.setdefault("previous-line", {})[kind] = score(ts, [previous_line_baseline(t) for t in ts])
    for mode in modes:
        started = time.time()
        for kind, ts in by_kind.items():
            answers.setdefault(mode, {})[kind], results.setdefault(mode, {})[kind] = answer(model, ts, mode)
        print(f"[{mode}: {time.time() - started:.0f}s]", file=sys.stderr, flush=True)

    print(f"held-out infill, {args.n} tasks per kind, model {args.model or 'embedded'}"
          + (f", tasks from {args.tasks_from}" if args.tasks_from else ""))
    print("| mode | task | first-line EM | full EM | syntax-valid | TPF | tokens/s |")
    print("|---|---|---|---|---|---|---|")
    for mode, per_kind in results.items():
        for kind, s in per_kind.items():
            tpf = f"{s['tpf']:.2f}" if "tpf" in s else "-"
            tok_s = f"{s['tokens_per_s']:.0f}" if "tokens_per_s" in s else "-"
            print(f"| {mode} | {kind} | {s['first_line_em']:.1%} | {s['full_em']:.1%} | {s['syntax_ok']:.1%} | {tpf} | {tok_s} |")
    if "no-edit" in answers:  # does editing pay, or is the gap noise? Same tasks, so compare them in pairs.
        for mode in (m for m in answers if m != "no-edit"):
            for kind, ts in by_kind.items():
                a, b, p = paired(ts, answers[mode][kind], answers["no-edit"][kind])
                print(f"{mode} vs no-edit, {kind}: first line right only in {mode} {a}, only in no-edit {b}"
                      f" (sign test p = {p:.2f})")
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(eval_infill_main())
