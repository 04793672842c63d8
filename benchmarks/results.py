"""Assembles docs/results.md from the per-command files in docs/results/ (each written by a benchmark or
evaluation with `--markdown FILE`, or recorded from a run that predates that option, with its command
and commit all the same).

    python benchmarks/results.py          # rewrite docs/results.md
    python benchmarks/results.py --check  # exit 1 if docs/results.md is not what the files give
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = ROOT / "docs" / "results"
OUT = ROOT / "docs" / "results.md"

# The order a reader meets them in: what an editor user feels first, then serving, quality, the GPU.
ORDER = ["bench_lsp", "bench_lsp_cold", "eval_typing", "bench_serve", "soak", "eval_infill", "eval_cross_file",
         "eval_rewrite", "eval_next_edit", "edit_tokens", "bench_cpu_floor", "bench_cpu_floor_side_by_side", "bench_cpu", "bench_load", "bench_first_minute",
         "editing_fuzz", "bench_sglang", "fp8", "gpu",
         "training"]  # fmt: skip

INTRO = """# Results

Every figure the project quotes, each table under the command that produced it, the commit it ran on,
the date and the machine. This file is generated: `python benchmarks/results.py` assembles it from
`docs/results/*.md`, which the commands write with `--markdown FILE` (a table marked "recorded" was
copied from the output of a run made before the command had that option, at the commit it names).
Re-run a command to refresh its part, then the script.
"""


def parts() -> list[Path]:
    files = {path.stem: path for path in PARTS.glob("*.md")}
    ordered = [files.pop(name) for name in ORDER if name in files]
    return ordered + [files[name] for name in sorted(files)]


def assemble() -> str:
    contents = [path.read_text(encoding="utf-8").strip() for path in parts()]
    return "\n\n".join([INTRO.strip(), *contents]) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only check that docs/results.md is up to date")
    args = ap.parse_args(argv)
    text = assemble()
    if args.check:
        if not OUT.is_file() or OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT.relative_to(ROOT)} is out of date: run python benchmarks/results.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)} from {len(parts())} files")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
