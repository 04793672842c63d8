"""`llada-lab compile-kernels`: compile every Triton kernel variant for real GPU targets ahead of time,
on a machine without a GPU, and report registers and spills; exit 1 when a variant the kernels declare
supported fails to compile or spills. The compiling is aot.py.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict


def compile_kernels_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llada-lab compile-kernels", description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, nargs="+", default=[90, 80], help="compute capabilities (90: sm_90a)")
    parser.add_argument("--json", help="write every variant's result here")
    args = parser.parse_args(argv)
    from ..aot import REGISTER_CAP, compile_all  # torch and Triton: paid by a run, not by --help

    variants = compile_all(tuple(args.arch))
    for v in variants:
        state = ("ok" if v.ok else "FAIL") if v.supported else ("compiles" if v.ok else "unsupported, torch path")
        usage = f"{v.registers} regs, {v.spill_bytes} B spilled" if v.ok else v.error
        print(f"sm_{v.target} {v.kernel:28s} {state:24s} {usage:40s} {v.case}")
    bad = [v for v in variants if v.failed]
    print(
        f"aot: {len(variants)} variants, {sum(v.ok for v in variants)} compiled, {len(bad)} supported ones "
        f"failed or spilled; most registers {max((v.registers or 0) for v in variants)} of {REGISTER_CAP}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(v) for v in variants], f, indent=1)
    return 1 if bad else 0
