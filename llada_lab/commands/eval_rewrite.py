"""`llada-lab eval-rewrite`: rewrite selections cut from held-out standard-library files, and count
what an editor would get: proposals that parse, rewrites applied, refused (and why), unchanged.

Selections are of three kinds, as users make them: whole statements (linewise, one to a few lines),
whole functions (linewise, up to a size the model can rewrite) and partial lines (characterwise: an
expression inside a line). Each is answered by the server's own rewrite job (prompt, decoding in the
chosen mode, the syntax guard), so the counts are those of `llada.rewriteSelection`. The check that
matters: no applied rewrite leaves a file that parsed unparsable. The selections and the rewriting
loop are training/eval_rewrite.py.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter

from llada_lsp.report import Report, Table, add_markdown_argument


def eval_rewrite_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="llada-lab eval-rewrite", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--model", default=None, help="model folder or cached Hugging Face id (default: the embedded model)"
    )
    ap.add_argument("--n", type=int, default=20, help="selections per kind (default: 20, so 60 in all)")
    ap.add_argument("--mode", default="quality", help="decoding preset (default: quality, the rewrite default)")
    ap.add_argument("--seed", type=int, default=1234, help="which selections are cut (default: 1234)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--show", type=int, default=0, metavar="K", help="print K refused and K applied proposals")
    ap.add_argument("--json", action="store_true", help="also print the counts as one JSON line")
    add_markdown_argument(ap)
    args = ap.parse_args(argv)
    # Imported after parsing so that --help and usage errors load no torch.
    from llada_lsp.backends.native import load
    from llada_lsp.completion.generation import ModelSpec
    from llada_lsp.engine import PRESETS

    from ..training.eval_rewrite import KINDS, make_selections, rewrite_all

    if args.mode not in PRESETS:
        ap.error(f"--mode {args.mode!r}: choose from {', '.join(PRESETS)}")
    model = load(ModelSpec(args.model, device="cpu", dtype="float32", threads=args.threads), lambda *_: None)
    selections = make_selections(args.n, args.seed)
    started = time.time()
    rows = rewrite_all(model, selections, args.mode)
    seconds = time.time() - started

    caption = (f"Rewrites of held-out selections, mode {args.mode}, model {args.model or 'embedded'}, {len(rows)} "
               f"selections ({seconds:.0f} s).")  # fmt: skip
    table = Table(["selection", "n", "proposal parses", "applied", "refused", "unchanged", "too long",
                   "applied and unparsable"])  # fmt: skip
    for kind in (*KINDS, "all"):
        rs = [r for r in rows if kind in ("all", r["kind"])]
        count = Counter(r["stopped"] for r in rs)
        broken = sum(r["stopped"] == "done" and not r["parses"] for r in rs)
        table.add(kind, len(rs), sum(bool(r["parses"]) for r in rs), count["done"], count["refused"],
                  count["unchanged"], count["too long"], broken)  # fmt: skip
    reasons = Counter(r["reason"].split(" (")[0] for r in rows if r["stopped"] == "refused")
    n = max(len(rows), 1)
    notes = [f"refused, {k}: {reason}" for reason, k in reasons.most_common()]
    notes.append(f"exact-unchanged rate: {sum(r['stopped'] == 'unchanged' for r in rows) / n:.1%}")
    print(caption, table.text(), *notes, sep="\n")
    if args.markdown:
        report = Report("Rewrites that keep code valid")
        report.table(table, caption)
        report.note("\n".join(f"- {line}" for line in notes))
        report.write(args.markdown)
    for stopped in ("refused", "done") if args.show else ():
        for r in [r for r in rows if r["stopped"] == stopped][: args.show]:
            print(f"--- {stopped} ({r['kind']}, {r['path']}): {r['reason']}\n{r['selection']!r}\n->\n{r['proposal']!r}")
    if args.json:
        print(json.dumps({"rows": [{k: r[k] for k in ("kind", "stopped", "reason", "parses")} for r in rows]}))
    return 1 if any(r["stopped"] == "done" and not r["parses"] for r in rows) else 0
