"""The gate of the embedded model's edit-token fine-tune (issue 43): held-out infill, task by task
beside the shipped model, and next edits from `llada-lab eval-next-edit --save` (both through the
server's own code), each with its sign test, and the verdict of the issue's rule.

Infill: the same held-out tasks (training/eval_infill.py) answered by both models in each mode;
the candidate must not lose: in no mode does the shipped model get the first line right, or the
file to parse, on significantly more tasks (two-sided sign test, p < 0.05, pooled over the task kinds). Next edits:
the candidate must make more exact edits than the shipped model, significantly (same test).

    llada-lab eval-next-edit --model runs/edit_tokens/model --configs shipped,fine-tuned --save runs/edit_tokens/next_edit.json
    python llada_lab/scripts/eval_edit_tokens.py --model runs/edit_tokens/model --next-edit runs/edit_tokens/next_edit.json \\
        --note runs/edit_tokens/note.md --markdown docs/results/edit_tokens.md
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from llada_lab.commands.eval_next_edit import table as next_edit_table
from llada_lab.training.eval_infill import TASK_KINDS, answer, make_tasks, paired, sign_test, syntax_ok
from llada_lab.training.eval_next_edit import paired_exact
from llada_lsp.backends.native import load as load_model
from llada_lsp.completion.generation import ModelSpec
from llada_lsp.report import Report, Table, add_markdown_argument

SIGNIFICANT = 0.05


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)  # fmt: skip
    ap.add_argument("--model", required=True, help="the candidate's model folder")
    ap.add_argument("--next-edit", required=True, type=Path,
                    help="`eval-next-edit --save` file with the configurations shipped and fine-tuned")  # fmt: skip
    ap.add_argument("--n", type=int, default=100, help="infill tasks per kind")
    ap.add_argument("--modes", default="speed,quality", help="infill decoding presets, comma-separated")
    ap.add_argument("--seed", type=int, default=1234, help="which infill tasks are cut")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--note", type=Path, default=None,
                    help="a file whose text is written above the tables (what the fine-tune did)")  # fmt: skip
    add_markdown_argument(ap)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    saved = json.loads(args.next_edit.read_text())
    missing = {"shipped", "fine-tuned"} - set(saved["scores"])
    if missing:
        ap.error(f"--next-edit {args.next_edit}: no {', '.join(sorted(missing))} configuration in it")

    tasks = make_tasks(args.n, args.seed)
    modes = [m for m in args.modes.split(",") if m]
    models = {"shipped": None, "candidate": args.model}
    answers: dict[tuple[str, str], list[str]] = {}
    infill = Table(["model", "mode", "task", "first-line EM", "full EM", "syntax-valid", "TPF"])
    for name, folder in models.items():
        model = load_model(ModelSpec(folder, threads=args.threads), lambda *_: None)
        for mode in modes:
            started = time.time()
            for kind in TASK_KINDS:
                ts = [t for t in tasks if t.kind == kind]
                answers[name, mode, kind], s = answer(model, ts, mode)
                infill.add(name, mode, kind, f"{s['first_line_em']:.1%}", f"{s['full_em']:.1%}",
                           f"{s['syntax_ok']:.1%}", f"{s['tpf']:.2f}")  # fmt: skip
            print(f"[{name} {mode}: {time.time() - started:.0f}s]", file=sys.stderr, flush=True)
    infill_lines, infill_ok = [], True
    for mode in modes:
        wins = losses = parse_wins = parse_losses = 0
        for kind in TASK_KINDS:
            ts = [t for t in tasks if t.kind == kind]
            ours, theirs = answers["candidate", mode, kind], answers["shipped", mode, kind]
            a, b, p = paired(ts, ours, theirs)
            wins, losses = wins + a, losses + b
            parse_wins += sum(syntax_ok(t, x) and not syntax_ok(t, y) for t, x, y in zip(ts, ours, theirs))
            parse_losses += sum(syntax_ok(t, y) and not syntax_ok(t, x) for t, x, y in zip(ts, ours, theirs))
            infill_lines.append(f"{mode}, {kind}: first line right only with the candidate {a}, only with the "
                                f"shipped model {b} (sign test p = {p:.3g})")  # fmt: skip
        # Either score significantly worse is a loss: a first line as often right in code that no longer
        # parses is no gain an editor would feel.
        for what, a, b in (("first line right", wins, losses), ("syntax-valid", parse_wins, parse_losses)):
            p = sign_test(a, b)
            lost = b > a and p < SIGNIFICANT
            infill_ok &= not lost
            infill_lines.append(f"{mode}, all kinds, {what}: only the candidate {a}, only the shipped model {b} "
                                f"(sign test p = {p:.3g}): {'loses' if lost else 'does not lose'}")  # fmt: skip

    rows, names = saved["rows"], saved["names"]
    next_edit = next_edit_table(
        {"shipped": rows[names["shipped"]], f"candidate ({args.model})": rows[names["fine-tuned"]]}
    )
    only_c, only_s, p = paired_exact(saved["scores"]["fine-tuned"], saved["scores"]["shipped"])
    more_exact = only_c > only_s and p < SIGNIFICANT
    edit_line = (f"exact only with the candidate {only_c}, only with the shipped model {only_s} "
                 f"(sign test p = {p:.3g}): {'more exact edits' if more_exact else 'not more exact edits'}")  # fmt: skip
    ship = infill_ok and more_exact
    verdict = (f"Verdict: {'ship' if ship else 'keep the shipped model'} (infill: "
               f"{'no loss' if infill_ok else 'loses'}; next edits: {'more exact' if more_exact else 'not more exact'}).")  # fmt: skip
    caption = f"Held-out infill, {args.n} tasks per kind (seed {args.seed}), the shipped model and {args.model}."
    print(caption, infill.text(), *infill_lines, "", next_edit.text(), edit_line, verdict, sep="\n")
    if args.markdown:
        report = Report("The embedded model's edit tokens (issue 43)")
        if args.note:
            report.note(args.note.read_text().strip())
        report.table(infill, caption + " TPF: the completion's tokens per forward.")
        report.note("\n".join(f"- {line}" for line in infill_lines))
        report.table(next_edit, f"Next edits on the {len(saved['cases'])} held-out cases through the real server, "
                     f"read from `llada-lab eval-next-edit --model {args.model} --configs shipped,fine-tuned --save "
                     f"{args.next_edit}` (run just before, same checkout and machine). EM: exact match of the "
                     "changed region.")  # fmt: skip
        report.note(f"- {edit_line}\n\n{verdict}")
        report.write(args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
