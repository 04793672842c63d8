"""Ahead-of-time compilation of every Triton kernel variant for real GPU targets, on a machine without
a GPU: the launchers' own Launch objects are built on the meta device at LLaDA2.1-mini and -flash
shapes (decode and prefill tiles, every dtype), bound by Triton's own binder for the target, compiled
with `triton.compile`, and their PTX run through the bundled `ptxas -v` for registers and spills.

A developer's check of the product's kernels (llada_lsp/kernels/), which never import it. Knows nothing
of models or decoding: shapes come in as numbers. Its command is `llada-lab compile-kernels`
(commands/compile_kernels.py); tests/kernels/test_gpu_compile.py runs it in a fresh process (Triton's
interpreter, chosen when the kernels are decorated, must be off).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

import torch

from llada_lsp.kernels import supports
from llada_lsp.kernels.fused_moe import (
    SCALE_BLOCK,
    default_tiles,
    dot_precision,
    down_launch,
    expert_tiles,
    gate_up_launch,
)
from llada_lsp.kernels.joint_threshold import decisions_launch, row_confidence_launch
from llada_lsp.kernels.launch import Launch

# (hidden C, expert width I, experts E, experts per token A, vocabulary V) of the released models.
MODELS = {"llada2.1-mini": (2048, 512, 256, 8, 157184), "llada2.1-flash": (4096, 1024, 256, 8, 157184)}
# Tokens per MoE call: one block (decode), 8 blocks (a batched step), a prefill chunk, a long prefill.
TOKENS = {"decode": 32, "batch8": 256, "prefill1k": 1024, "prefill4k": 4096}
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FP8 = torch.float8_e4m3fn
REGISTER_CAP = 255


@dataclass
class Variant:
    kernel: str
    target: int  # compute capability, e.g. 90
    case: str  # what it was bound for: model, tiles, dtypes
    supported: bool  # what kernels.supports declares for this target
    ok: bool = False
    registers: int | None = None
    spill_bytes: int | None = None
    error: str | None = None

    @property
    def failed(self) -> bool:
        """A supported variant that does not compile, or spills: a bug to fix before the GPU sees it."""
        return self.supported and (not self.ok or bool(self.spill_bytes))


def meta(*shape, dtype=torch.float32) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


def moe_launches(C: int, I: int, E: int, A: int, N: int, x_dtype: torch.dtype, w_dtype: torch.dtype) -> list[Launch]:
    """Both fused-MoE launches as fused_moe builds them for N tokens (contiguous weights, block scales
    when the weights are not x's dtype)."""
    tiles = default_tiles(N * A, E, x_dtype)
    expert_ids = meta(N, A, dtype=torch.int64)
    slot_pair, tile_expert = expert_tiles(expert_ids, E, tiles.block_m)
    x, h = meta(N, C, dtype=x_dtype), meta(N * A, I, dtype=x_dtype)
    wg, wu, wd = meta(E, I, C, dtype=w_dtype), meta(E, I, C, dtype=w_dtype), meta(E, C, I, dtype=w_dtype)
    scaled = w_dtype != x_dtype
    t = -(-I // SCALE_BLOCK), -(-C // SCALE_BLOCK)
    sg, su, sd = (meta(E, *t), meta(E, *t), meta(E, t[1], t[0])) if scaled else (wg,) * 3
    precision = dot_precision(x_dtype)
    return [
        gate_up_launch(x, wg, wu, sg, su, h, slot_pair, tile_expert, A, scaled, tiles, precision),
        down_launch(h, wd, sd, meta(N * A), meta(N * A, C), slot_pair, tile_expert, scaled, tiles, precision),
    ]


def step_launches(B: int, N: int, V: int, dtype: torch.dtype) -> list[Launch]:
    """Both step-rule launches as joint_threshold_step builds them for B blocks of N positions."""
    conf, guess, tokens = meta(B, N), meta(B, N, dtype=torch.int64), meta(B, N, dtype=torch.int64)
    flags = [meta(B, N, dtype=torch.int8) for _ in range(3)]
    return [row_confidence_launch(meta(B * N, V, dtype=dtype), meta(B, dtype=torch.int64), conf, guess, N),
            decisions_launch(conf, guess, tokens, flags[0], meta(B, dtype=torch.int64), meta(B), meta(B),
                             meta(B, N, dtype=torch.int64), flags[1], flags[2])]  # fmt: skip


def cases():
    """(case name, weight dtype or None, launches) for every variant the engine can launch."""
    for model, (C, I, E, A, V) in MODELS.items():
        for phase, N in TOKENS.items():
            for x_dtype in DTYPES:
                for w_dtype in (x_dtype, FP8):
                    w = "fp8" if w_dtype == FP8 else "same"
                    yield (f"{model} {phase} x={_name(x_dtype)} w={w}", w_dtype,
                           moe_launches(C, I, E, A, N, x_dtype, w_dtype))  # fmt: skip
        for B in (1, 8):
            for dtype in DTYPES:
                yield f"{model} step B={B} logits={_name(dtype)}", None, step_launches(B, 32, V, dtype)


def compile_launch(launch: Launch, capability: int):
    """triton.compile for `capability` with the arguments bound as the JIT binds them at run time
    (dtypes, 16-byte alignment and divisibility of ints) -> the compiled kernel (PTX in .asm)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    kernel = launch.kernel
    if not isinstance(kernel, triton.runtime.jit.JITFunction):
        raise TypeError("the kernels were decorated by Triton's interpreter (TRITON_INTERPRET=1): run aot without it")
    target = GPUTarget("cuda", capability, 32)
    backend = make_backend(target)
    options = {k: v for k, v in launch.meta.items() if k in ("num_warps", "num_stages")}
    constexprs = {k: v for k, v in launch.meta.items() if k not in options}
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, _ = binder(*launch.args, **constexprs, **options)
    opts, signature, consts, attrs = kernel._pack_args(backend, options, bound, specialization, options)
    return triton.compile(ASTSource(kernel, signature, consts, attrs), target=target, options=opts.__dict__)


def ptxas_usage(ptx: str, capability: int) -> tuple[int, int]:
    """(registers, spilled bytes stored + loaded) per ptxas -v, Triton's bundled ptxas."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        command = [get_ptxas(capability).path, "-v", f"--gpu-name={sm_arch_from_capability(capability)}", src,
                   "-o", os.path.join(tmp, "k.cubin")]  # fmt: skip
        run = subprocess.run(command, check=False, capture_output=True, text=True)
    if run.returncode:
        raise RuntimeError(f"ptxas: {run.stderr.strip()}")
    registers = [int(r) for r in re.findall(r"Used (\d+) registers", run.stderr)]
    spills = [int(a) + int(b) for a, b in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", run.stderr)]
    return max(registers, default=0), sum(spills)


def compile_all(capabilities=(90, 80)) -> list[Variant]:
    """Every variant for every target; the same binding compiled twice (mini and flash often agree
    on every specialization) is compiled once and reported under its first case. Of the variants the
    kernels declare unsupported on a target, only the first per kernel is compiled: it shows why."""
    seen: set[tuple] = set()
    out: list[Variant] = []
    for case, w_dtype, launches in cases():
        for launch in launches:
            for cap in capabilities:
                name = launch.kernel.__name__
                supported = supports((cap // 10, cap % 10), w_dtype)
                key = (name, cap, _binding_key(launch) if supported else "unsupported")
                if key in seen:
                    continue
                seen.add(key)
                v = Variant(name, cap, case, supported)
                try:
                    compiled = compile_launch(launch, cap)
                    v.registers, v.spill_bytes = ptxas_usage(compiled.asm["ptx"], cap)
                    v.ok = True
                except Exception as e:  # noqa: BLE001 - every compile error is a finding to report
                    v.error = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
                out.append(v)
    return out


def _binding_key(launch: Launch) -> tuple:
    """What the compiled code depends on: dtypes, which ints are 1 or multiples of 16, the constexprs."""

    def kind(a):
        if isinstance(a, torch.Tensor):
            return str(a.dtype)
        if isinstance(a, int):
            return "1" if a == 1 else "16n" if a % 16 == 0 else "i"
        return repr(a)

    return tuple(kind(a) for a in launch.args) + tuple(sorted(launch.meta.items()))


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
