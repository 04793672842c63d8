"""How long a cold process takes to get the embedded model ready on the CPU, in a fresh interpreter
each time: importing torch, importing llada_lsp (and transformers), then reading the weights and the
tokenizer. Prints the median of --runs runs.

Usage: python benchmarks/bench_load.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from llada_lsp.report import Report, Table, add_markdown_argument

CHILD = """
import json, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
from llada_lsp.model import load_model, load_tokenizer
t2 = time.perf_counter()
model, tokenizer = load_model(None), load_tokenizer(None)
t3 = time.perf_counter()
print(json.dumps({"import torch": t1 - t0, "import llada_lsp + transformers": t2 - t1,
                  "load weights + tokenizer": t3 - t2, "total": t3 - t0}))
"""


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    add_markdown_argument(ap)
    args = ap.parse_args(argv)
    runs = [
        json.loads(subprocess.run([sys.executable, "-c", CHILD], check=True, capture_output=True, text=True).stdout)
        for _ in range(args.runs)
    ]
    caption = f"The embedded model in a cold process, median of {args.runs} runs."
    table = Table(["step", "seconds"])
    for key in runs[0]:
        table.add(key, f"{statistics.median(r[key] for r in runs):.2f}")
    print(caption, table.text(), sep="\n")
    if args.markdown:
        report = Report("Loading the embedded model")
        report.table(table, caption)
        report.write(args.markdown)


if __name__ == "__main__":
    main()
