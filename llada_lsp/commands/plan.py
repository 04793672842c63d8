"""`llada-lsp plan`: the memory a checkpoint needs (weights by part, KV cache) per device, and whether
it fits, from config.json and the safetensors headers alone (no weight is read).

Exit status: 0 it fits, 1 it does not (the table, then one line saying where), 2 bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..completion.generation import add_edit_ids_argument


def plan_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="llada-lsp plan", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None,
                    help="model folder, Hugging Face id in the local cache, or a config.json "
                         "(default: embedded)")  # fmt: skip
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--device", help="cpu, cuda, cuda:N (default: cuda:0 if present, else cpu)")
    where.add_argument("--devices",
                       help="several devices, e.g. cuda:0,cuda:1: contiguous layer ranges balanced by bytes")  # fmt: skip
    ap.add_argument("--quantize", choices=["fp8"], help="routed experts in FP8 with 128x128 block scales")
    ap.add_argument("--context", type=int, help="tokens of KV cache per sequence (default: max_position_embeddings)")
    ap.add_argument("--batch", type=int, default=1, help="sequences decoded together (default: 1)")
    ap.add_argument("--dtype", default=None,
                    help="weights and KV cache: bfloat16, float16, float32 (default: what the model is loaded in "
                         "there: bfloat16 on GPUs, float32 on the CPU)")  # fmt: skip
    ap.add_argument("--memory", help="bytes per device, e.g. 141GB,141GB or 80GiB (default: the devices' free memory)")
    add_edit_ids_argument(ap)
    ap.add_argument("--sglang", action="store_true",
                    help="also print the SGLang servers' algorithm files and launch commands for this checkpoint, "
                    "one per mode, with SGLang 0.5.23's flags (docs/sglang.md)")  # fmt: skip
    args = ap.parse_args(argv)

    # Imported after parsing so that --help and usage errors load nothing heavy.
    from ..errors import CheckpointError
    from ..model.plan import DTYPE_BYTES, make_plan, parse_bytes, render

    if args.dtype is not None and args.dtype not in DTYPE_BYTES:
        ap.error(f"--dtype {args.dtype!r}: choose one of {', '.join(sorted(DTYPE_BYTES))}")
    if (args.context is not None and args.context < 0) or args.batch < 1:
        ap.error("--context must be >= 0 and --batch >= 1")
    devices = [d.strip() for d in args.devices.split(",")] if args.devices else [args.device or default_device()]
    dtype = args.dtype or default_dtype(devices)
    try:
        memory = [parse_bytes(m) for m in args.memory.split(",")] if args.memory else None
    except ValueError as err:
        ap.error(f"--memory: {err}")
    if memory is not None and len(memory) not in (1, len(devices)):
        ap.error(f"--memory gives {len(memory)} sizes for {len(devices)} devices")
    try:
        plan = make_plan(args.model, devices, memory, dtype, args.quantize, args.context, args.batch,
                         args.edit_ids)  # fmt: skip
    except (CheckpointError, ValueError) as err:
        print(f"llada-lsp plan: {err}", file=sys.stderr)
        return 2
    print(render(plan))
    from ..kernel_backend import current  # (no torch, no numba: it looks their files up)

    print(f"kernels here: {current().line()}")
    if args.sglang:
        from ..backends.sglang_config import sglang_instructions

        print("\n" + sglang_instructions(args.model or "MODEL", plan.family))
    unknown = [d.device for d in plan.devices if d.memory is None]
    if unknown:
        print(f"llada-lsp plan: {unknown[0]} is not on this machine; give its size with --memory", file=sys.stderr)
        return 2
    if not plan.fits:
        print(f"llada-lsp plan: does not fit: {plan.reason()}", file=sys.stderr)
        return 1
    return 0


def default_dtype(devices: list[str]) -> str:
    """The dtype the loader picks when none is given (model/loader.py, resolve_dtype): bfloat16 where it
    is fast, float32 on the CPU, which runs the embedded model in float32."""
    return "float32" if all(d.split(":")[0] == "cpu" for d in devices) else "bfloat16"


def default_device() -> str:
    """cuda:0 when torch sees a GPU; without a GPU driver on the machine, cpu without importing torch."""
    if not any(Path(p).exists() for p in ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/kfd")):
        return "cpu"
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"
