"""`llada-lab eval-infill`: infill tasks cut from held-out standard-library files, scored per mode.

Tasks: the rest of the line with the cursor mid-line, a whole line, a multi-line block body (the same
hole kinds as training, from files training never saw). Scores: first-line exact match, full exact
match, syntax-valid rate (the file with the completion inserted parses), tokens per forward and
tokens/s, for `speed`, `quality`, the strict `no-edit` baseline, and a trivial baseline (repeat the
previous line). Each task is answered exactly as the server answers an editor at that cursor (its
prompt, decoding and post-processing, server defaults); TPF counts the completion's tokens per forward.
The tasks and scores are training/eval_infill.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from llada_lsp.backends.native import load as load_model
from llada_lsp.completion.generation import ModelSpec
from llada_lsp.engine import PRESETS
from llada_lsp.report import Report, Table, add_markdown_argument

from ..training.corpus import load
from ..training.eval_infill import TASK_KINDS, answer, make_tasks, paired, previous_line_baseline, score


def eval_infill_main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--cross-file" in argv:  # its own evaluation, through the real server: commands/eval_cross_file.py
        from .eval_cross_file import eval_cross_file_main

        return eval_cross_file_main(argv)
    ap = argparse.ArgumentParser(prog="llada-lab eval-infill", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model folder (default: the embedded model)")
    ap.add_argument("--n", type=int, default=100, help="tasks per kind (default: 100)")
    ap.add_argument(
        "--modes",
        default="speed,quality,no-edit",
        help="decoding presets to score, comma-separated (default: %(default)s)",
    )
    ap.add_argument(
        "--kinds", default=",".join(TASK_KINDS), help="task kinds to score, comma-separated (default: %(default)s)"
    )
    ap.add_argument("--seed", type=int, default=1234, help="which tasks are cut (default: 1234)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument(
        "--tasks-from",
        default=None,
        help="cut the tasks from this held-out corpus file (.jsonl.gz "
        "from `llada-lab corpus`; default: this interpreter's held-out stdlib)",
    )
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default: %(default)s)")
    ap.add_argument("--dtype", default="float32", help="default: %(default)s")
    ap.add_argument("--json", action="store_true", help="also print the scores as one JSON line")
    ap.add_argument("--cross-file", action="store_true",
                    help="instead: cross-file tasks through the real server, contextFiles on vs off "
                         "(`eval-infill --cross-file --help`)")  # fmt: skip
    add_markdown_argument(ap)
    args = ap.parse_args(argv)
    kinds, modes = [k for k in args.kinds.split(",") if k], [m for m in args.modes.split(",") if m]
    if not kinds or not set(kinds) <= set(TASK_KINDS):
        ap.error(f"--kinds {args.kinds!r}: choose from {', '.join(TASK_KINDS)}")
    if not modes or not set(modes) <= set(PRESETS):
        ap.error(f"--modes {args.modes!r}: choose from {', '.join(PRESETS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(ModelSpec(args.model, device=args.device, dtype=args.dtype), lambda *_: None)
    if not model.codec.special.has_fim:
        print("llada-lab eval-infill: the model's tokenizer has no FIM tokens", file=sys.stderr)
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

    caption = (f"Held-out infill, {args.n} tasks per kind (seed {args.seed}), model {args.model or 'embedded'}"
               + (f", tasks from {args.tasks_from}" if args.tasks_from else "") + ".")  # fmt: skip
    table = Table(["mode", "task", "first-line EM", "full EM", "syntax-valid", "TPF", "tokens/s"])
    for mode, per_kind in results.items():
        for kind, s in per_kind.items():
            tpf = f"{s['tpf']:.2f}" if "tpf" in s else "-"
            tok_s = f"{s['tokens_per_s']:.0f}" if "tokens_per_s" in s else "-"
            table.add(
                mode, kind, f"{s['first_line_em']:.1%}", f"{s['full_em']:.1%}", f"{s['syntax_ok']:.1%}", tpf, tok_s
            )
    pairs = []
    if "no-edit" in answers:  # does editing pay, or is the gap noise? Same tasks, so compare them in pairs.
        for mode in (m for m in answers if m != "no-edit"):
            for kind, ts in by_kind.items():
                a, b, p = paired(ts, answers[mode][kind], answers["no-edit"][kind])
                pairs.append(f"{mode} vs no-edit, {kind}: first line right only in {mode} {a}, only in no-edit {b}"
                             f" (sign test p = {p:.2f})")  # fmt: skip
    print(caption, table.text(), *pairs, sep="\n")
    if args.markdown:
        report = Report("Infill on held-out code")
        report.table(table, caption + " TPF: the completion's tokens per forward; tokens/s on this machine's threads.")
        report.note("\n".join(f"- {line}" for line in pairs))
        report.write(args.markdown)
    if args.json:
        print(json.dumps(results))
    return 0
