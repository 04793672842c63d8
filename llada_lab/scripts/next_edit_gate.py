"""Measures the next-edit confidence gate (completion/next_edit.MIN_EDIT_CONFIDENCE) on training cases.

Every case (by default the mined training split, never the held-out set) is asked in process with the
gate off; each suggestion the other gates let through is kept with its changed tokens' mean confidence
and whether it is the exact expected edit. For each threshold it prints what exact match over all the
cases would be with suggestions below it silenced, and the best threshold.

    python llada_lab/scripts/next_edit_gate.py --model runs/next_edit_tune/model --sample 300
"""

from __future__ import annotations

import argparse
import threading
import time

import torch

from llada_lab.training.edit_pairs import read_jsonl_gz
from llada_lab.training.edit_tune import served_job
from llada_lab.training.eval_next_edit import exact_match
from llada_lsp.backends import native
from llada_lsp.completion import next_edit
from llada_lsp.completion.generation import ModelSpec
from llada_lsp.completion.jobs import CONTEXT_TOKENS


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="runs/edit_pairs/train.jsonl.gz", help="default: %(default)s")
    ap.add_argument("--model", default=None, help="model folder (default: the embedded model)")
    ap.add_argument("--sample", type=int, default=300, help="cases spread evenly over the file (default: 300)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cases = list(read_jsonl_gz(args.cases))
    cases = cases[:: max(1, len(cases) // args.sample)][: args.sample]
    model = native.load(ModelSpec(args.model, threads=args.threads), lambda *_: None)
    next_edit.MIN_EDIT_CONFIDENCE = 0.0  # the gate off: every suggestion is seen with its confidence
    shown: list[tuple[float, bool, bool]] = []  # (confidence, exact, no edit needed) of what the other gates keep
    silent_right = 0  # silences (no suggestion at all) on no-edit cases: right whatever the threshold
    started = time.perf_counter()
    for i, case in enumerate(cases):
        job, start, text = served_job(case, CONTEXT_TOKENS)
        plan = next_edit.NextEditPlan(model, job, threading.Event())
        out = plan.run(model, lambda *_: None)
        if out.stopped == "done" and plan.confidence is not None:
            predicted = next_edit.apply_changes(text, start, next_edit.changes(job.window, out.text))
            exact = exact_match(text, case["expected"], predicted)
            shown.append((plan.confidence, exact, exact_match(text, case["expected"], None)))
        elif exact_match(text, case["expected"], None):
            silent_right += 1
        if (i + 1) % 50 == 0:
            print(f"{i + 1}/{len(cases)} cases, {time.perf_counter() - started:.0f} s", flush=True)
    print(f"{len(cases)} cases, {len(shown)} suggestions past the other gates, {sum(e for _, e, _ in shown)} exact")
    print("| threshold | suggestions kept | exact kept | exact match (all cases) |")
    print("|---|---|---|---|")
    best = (-1, 0.0)
    for k in range(0, 20):
        t = k / 20
        kept = sum(1 for c, _, _ in shown if c >= t)
        exact_kept = sum(e for c, e, _ in shown if c >= t)
        silenced_right = sum(n for c, _, n in shown if c < t)  # silence is right where no edit is needed
        score = silent_right + exact_kept + silenced_right
        print(f"| {t:.2f} | {kept} | {exact_kept} | {score / len(cases):.1%} |")
        best = max(best, (score, -t))
    print(f"best threshold: {-best[1]:.2f} ({best[0] / len(cases):.1%} exact match)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
