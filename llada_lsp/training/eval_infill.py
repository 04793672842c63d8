"""`llada-lsp eval-infill`: infill tasks cut from held-out standard-library files, scored per mode.

Tasks: the rest of the line with the cursor mid-line, a whole line, a multi-line block body (the same
hole kinds as training, from files training never saw). Scores: first-line exact match, full exact
match, syntax-valid rate (the file with the completion inserted parses), tokens per forward and
tokens/s, for `speed`, `quality`, the strict `no-edit` baseline, and a trivial baseline (repeat the
previous line).
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import sys
import time
from dataclasses import dataclass

import torch

from ..engine import PRESETS, Engine
from ..model import load_model, load_tokenizer
from ..prompting import SpecialIds, fim_ids
from .corpus import iter_files
from .objective import cut_hole

TASK_KINDS = {"rest_of_line": 32, "whole_line": 32, "block_body": 64}  # kind -> gen_length


@dataclass(frozen=True)
class Task:
    kind: str
    path: str
    prefix: str
    middle: str
    suffix: str


def make_tasks(n_per_kind: int, seed: int = 1234) -> list[Task]:
    """Deterministic tasks from held-out files that parse (so syntax validity is meaningful)."""
    rng = random.Random(seed)
    files = []
    for f in iter_files("heldout"):
        try:
            ast.parse(f.text)
        except (SyntaxError, ValueError):
            continue
        files.append(f)
    tasks = []
    for kind in TASK_KINDS:
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


def build_prompt(tokenizer, special: SpecialIds, task: Task, budget: int) -> list[int]:
    """Prefix first: the prefix keeps up to 3/4 of the budget, the suffix what is left."""
    enc = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"] if s else []  # noqa: E731
    prefix, suffix = enc(task.prefix), enc(task.suffix)
    budget -= 3
    keep_prefix = min(len(prefix), max(budget - len(suffix), budget * 3 // 4))
    keep_suffix = min(len(suffix), budget - keep_prefix)
    return fim_ids(prefix[len(prefix) - keep_prefix :], suffix[:keep_suffix], [], special)


def score(tasks, completions, tpfs=None, tps=None) -> dict:
    n = len(tasks)
    out = {
        "n": n,
        "first_line_em": sum(first_line(c) == first_line(t.middle) for t, c in zip(tasks, completions)) / n,
        "full_em": sum(c.rstrip() == t.middle.rstrip() for t, c in zip(tasks, completions)) / n,
        "syntax_ok": sum(syntax_ok(t, c) for t, c in zip(tasks, completions)) / n,
    }
    if tpfs is not None:
        out["tpf"] = sum(tpfs) / n
        out["tokens_per_s"] = sum(tps) / n
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="llada-lsp eval-infill", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model folder (default: the embedded model)")
    ap.add_argument("--n", type=int, default=100, help="tasks per kind")
    ap.add_argument("--modes", default="speed,quality,no-edit")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", action="store_true", help="also print the scores as one JSON line")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(args.model, device="cpu", dtype="float32")
    tokenizer = load_tokenizer(args.model)
    special = SpecialIds.from_tokenizer(tokenizer)
    if not special.has_fim:
        print("llada-lsp eval-infill: the model's tokenizer has no FIM tokens", file=sys.stderr)
        return 2
    tasks = make_tasks(args.n, args.seed)
    engine = Engine(model)
    results: dict[str, dict[str, dict]] = {}
    for kind in TASK_KINDS:
        ts = [t for t in tasks if t.kind == kind]
        results.setdefault("previous-line", {})[kind] = score(ts, [previous_line_baseline(t) for t in ts])
    for mode in args.modes.split(","):
        started = time.time()
        for kind, gen_length in TASK_KINDS.items():
            ts = [t for t in tasks if t.kind == kind]
            completions, tpfs, tps = [], [], []
            for t in ts:
                prompt = build_prompt(tokenizer, special, t, model.config.max_position_embeddings - gen_length)
                r = engine.generation(prompt, gen_length, PRESETS[mode], eos_early_stop=True).run()
                text = tokenizer.decode(r.tokens, skip_special_tokens=True)
                completions.append(cut_to_unit(kind, text))
                tpfs.append(r.tokens_per_forward)
                tps.append(r.tokens_per_second)
            results.setdefault(mode, {})[kind] = score(ts, completions, tpfs, tps)
        print(f"[{mode}: {time.time() - started:.0f}s]", file=sys.stderr, flush=True)

    print(f"held-out infill, {args.n} tasks per kind, model {args.model or 'embedded'}")
    print("| mode | task | first-line EM | full EM | syntax-valid | TPF | tokens/s |")
    print("|---|---|---|---|---|---|---|")
    for mode, per_kind in results.items():
        for kind, s in per_kind.items():
            tpf = f"{s['tpf']:.2f}" if "tpf" in s else "-"
            tok_s = f"{s['tokens_per_s']:.0f}" if "tokens_per_s" in s else "-"
            print(f"| {mode} | {kind} | {s['first_line_em']:.1%} | {s['full_em']:.1%} | {s['syntax_ok']:.1%} | {tpf} | {tok_s} |")
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
