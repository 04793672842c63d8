"""Fused MoE for a block of tokens: the routed experts' SwiGLU as two grouped GEMMs over the touched
experts only, each expert's weights read once per call for all the (token, expert) pairs routed to it.

Knows nothing of the model's modules, checkpoints or decoding: tensors in, tensors out. Routing stays
in torch (see README.md). Shape legend: N tokens, C hidden, E experts, A experts per token, I expert
width, P = N*A (token, expert) pairs, S pair slots sorted by expert and padded to whole tiles of
BLOCK_M, G tiles; weights are [out, in] as nn.Linear stores them: gate/up [E, I, C], down [E, C, I].
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .launch import Launch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the launcher says so; the reference needs no triton
    triton = None

# FP8 block scales (DeepSeek-V3 layout, `weight_scale_inv`): weight ~= stored * scale per 128x128 tile.
SCALE_BLOCK = 128
# Triton's interpreter (TRITON_INTERPRET=1, read when the kernels below are decorated) computes a bf16
# tl.dot wrongly: there the operands go up to float32 first. Compiled kernels keep bf16 tensor cores.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Tiles:
    """BLOCK_M pairs of one expert by BLOCK_N output columns, stepping BLOCK_K along the inner dim."""

    block_m: int = 16
    block_n: int = 64
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3


def default_tiles(pairs: int, n_experts: int, dtype: torch.dtype = torch.bfloat16) -> Tiles:
    """One tile of pairs per expert when pairs are few (one block: ~1 pair per touched expert), so each
    expert's weights stream through once; taller tiles for prefills, where experts get many pairs.
    float32 operands multiply in full float32 (dot_precision: FMA, not tensor cores), whose tiles live
    in registers: smaller ones, or ptxas spills (kernels/aot.py checks every variant for sm_80/90)."""
    per_expert = pairs / n_experts
    block_m = 16 if per_expert <= 16 else 32 if per_expert <= 64 else 64
    if dtype == torch.float32:
        block_m = min(block_m, 32)
        return Tiles(block_m=block_m, block_n=32, block_k=32, num_warps=4 if block_m == 16 else 8)
    return Tiles(block_m=block_m)


def expert_tiles(expert_ids: torch.Tensor, n_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The pairs grouped by expert, each group padded to whole tiles, with no host sync (so a CUDA
    graph can hold it). expert_ids [N, A] -> slot_pair [S] int32 (P: an empty slot), tile_expert [G]
    int32 (E: a tile past the last expert's, whose program returns at once). G is a static bound:
    sum over touched experts of ceil(n_e / BLOCK_M) <= ceil(P / BLOCK_M) + min(P, E)."""
    flat = expert_ids.flatten()  # [P]
    P, device = flat.numel(), flat.device
    counts = torch.zeros(n_experts, dtype=torch.int64, device=device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m  # [E]
    ends = padded.cumsum(0)
    order = flat.argsort(stable=True)  # [P] pair ids, grouped by expert
    expert_of = flat[order]
    rank = torch.arange(P, device=device) - (counts.cumsum(0) - counts)[expert_of]  # place within its expert
    G = -(-P // block_m) + min(P, n_experts)
    slot_pair = torch.full((G * block_m,), P, dtype=torch.int32, device=device)
    slot_pair[(ends - padded)[expert_of] + rank] = order.to(torch.int32)
    tile_start = torch.arange(G, device=device) * block_m
    tile_expert = torch.searchsorted(ends, tile_start, right=True).to(torch.int32)  # [G]
    return slot_pair, tile_expert


if triton is not None:

    @triton.jit
    def _as_operand(v, dtype: tl.constexpr, PRECISION: tl.constexpr):
        """v (float32) as a compiled tl.dot reads an operand of `dtype` at `PRECISION`: TF32 keeps 10 of
        float32's 23 mantissa bits (rounded to nearest), so the interpreter, which multiplies in full
        float32, computes the numbers a GPU would. Only the interpreter's UPCAST path calls it."""
        if dtype == tl.float32 and PRECISION == "tf32":
            bits = v.to(tl.uint32, bitcast=True)
            v = ((bits + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)
        return v

    @triton.jit
    def _fused_moe_gate_up_kernel(
        x_ptr, wg_ptr, wu_ptr, sg_ptr, su_ptr, h_ptr, slot_pair_ptr, tile_expert_ptr,
        P, C, I, A, E,
        stride_xn, stride_we, stride_wi, stride_se, stride_si, stride_hp,
        HAS_SCALE: tl.constexpr, SCALE: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        """h[pair, i] = silu(x[token] . w_gate[e, i]) * (x[token] . w_up[e, i]) for one tile of pairs
        of expert e and BLOCK_N columns i; x [N, C], w [E, I, C] (last dim contiguous), h [P, I]."""
        tile, pid_n = tl.program_id(0), tl.program_id(1)
        e = tl.load(tile_expert_ptr + tile)
        if e >= E:
            return
        pairs = tl.load(slot_pair_ptr + tile * BLOCK_M + tl.arange(0, BLOCK_M))  # [BM]
        live = pairs < P
        tokens = pairs // A
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN] along I
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, C, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)  # [BK] along C
            xa = tl.load(x_ptr + tokens[:, None] * stride_xn + ks[None, :],
                         mask=live[:, None] & (ks[None, :] < C), other=0.0)  # [BM, BK]  # fmt: skip
            w_at = e.to(tl.int64) * stride_we + cols[None, :] * stride_wi + ks[:, None]  # [BK, BN]: w^T
            w_ok = (cols[None, :] < I) & (ks[:, None] < C)
            g = tl.load(wg_ptr + w_at, mask=w_ok, other=0.0)
            u = tl.load(wu_ptr + w_at, mask=w_ok, other=0.0)
            if HAS_SCALE:  # one scale per tile: BLOCK_N and BLOCK_K divide SCALE (the launcher checks)
                s_at = e * stride_se + (pid_n * BLOCK_N // SCALE) * stride_si + k0 // SCALE
                g = (g.to(tl.float32) * tl.load(sg_ptr + s_at)).to(xa.dtype)
                u = (u.to(tl.float32) * tl.load(su_ptr + s_at)).to(xa.dtype)
            if UPCAST:
                xf = _as_operand(xa.to(tl.float32), xa.dtype, PRECISION)
                acc_g += tl.dot(xf, _as_operand(g.to(xa.dtype).to(tl.float32), xa.dtype, PRECISION))
                acc_u += tl.dot(xf, _as_operand(u.to(xa.dtype).to(tl.float32), xa.dtype, PRECISION))
            else:
                acc_g = tl.dot(xa, g.to(xa.dtype), acc_g, input_precision=PRECISION)
                acc_u = tl.dot(xa, u.to(xa.dtype), acc_u, input_precision=PRECISION)
        h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u  # silu(g) * u, in float32
        tl.store(h_ptr + pairs[:, None].to(tl.int64) * stride_hp + cols[None, :],
                 h.to(h_ptr.dtype.element_ty), mask=live[:, None] & (cols[None, :] < I))  # fmt: skip

    @triton.jit
    def _fused_moe_down_kernel(
        h_ptr, wd_ptr, sd_ptr, route_ptr, out_ptr, slot_pair_ptr, tile_expert_ptr,
        P, C, I, E,
        stride_hp, stride_we, stride_wc, stride_se, stride_sc, stride_op,
        HAS_SCALE: tl.constexpr, SCALE: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        """out[pair, c] = route[pair] * (h[pair] . w_down[e, c]) in float32, for one tile of pairs of
        expert e and BLOCK_N columns c; h [P, I], w_down [E, C, I], route [P], out [P, C]."""
        tile, pid_n = tl.program_id(0), tl.program_id(1)
        e = tl.load(tile_expert_ptr + tile)
        if e >= E:
            return
        pairs = tl.load(slot_pair_ptr + tile * BLOCK_M + tl.arange(0, BLOCK_M))
        live = pairs < P
        rows = pairs.to(tl.int64)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN] along C
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, I, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)  # [BK] along I
            ha = tl.load(h_ptr + rows[:, None] * stride_hp + ks[None, :],
                         mask=live[:, None] & (ks[None, :] < I), other=0.0)  # [BM, BK]  # fmt: skip
            w_at = e.to(tl.int64) * stride_we + cols[None, :] * stride_wc + ks[:, None]  # [BK, BN]
            w = tl.load(wd_ptr + w_at, mask=(cols[None, :] < C) & (ks[:, None] < I), other=0.0)
            if HAS_SCALE:
                s_at = e * stride_se + (pid_n * BLOCK_N // SCALE) * stride_sc + k0 // SCALE
                w = (w.to(tl.float32) * tl.load(sd_ptr + s_at)).to(ha.dtype)
            if UPCAST:
                acc += tl.dot(_as_operand(ha.to(tl.float32), ha.dtype, PRECISION),
                              _as_operand(w.to(ha.dtype).to(tl.float32), ha.dtype, PRECISION))  # fmt: skip
            else:
                acc = tl.dot(ha, w.to(ha.dtype), acc, input_precision=PRECISION)
        route = tl.load(route_ptr + rows, mask=live, other=0.0).to(tl.float32)
        tl.store(out_ptr + rows[:, None] * stride_op + cols[None, :], acc * route[:, None],
                 mask=live[:, None] & (cols[None, :] < C))  # fmt: skip


def check_scales(w: torch.Tensor, scale: torch.Tensor | None, name: str) -> None:
    if scale is None:
        return
    E, rows, cols = w.shape
    want = (E, -(-rows // SCALE_BLOCK), -(-cols // SCALE_BLOCK))
    if tuple(scale.shape) != want or scale.dtype != torch.float32:
        raise ValueError(f"{name}: block scales must be float32 {want}, got {scale.dtype} {tuple(scale.shape)}")


def dot_precision(dtype: torch.dtype) -> str:
    """What a compiled tl.dot multiplies operands of `dtype` in: float32 is meant as float32 ("ieee":
    Triton's default on CUDA is TF32, which keeps 10 mantissa bits and would part the kernel from its
    reference by ~1e-2); half types go to the tensor cores as they are (the name is then unread)."""
    return "ieee" if dtype == torch.float32 else "tf32"


def operand_eps(dtype: torch.dtype, precision: str | None = None) -> float:
    """The relative rounding of one GEMM operand of `dtype` at `precision` (tests derive tolerances
    from it): TF32 rounds float32 operands to fp16's 10 mantissa bits."""
    precision = precision or dot_precision(dtype)
    if dtype == torch.float32 and precision == "tf32":
        return torch.finfo(torch.float16).eps
    return torch.finfo(dtype).eps


def gate_up_launch(x, w_gate, w_up, sg, su, h, slot_pair, tile_expert, A: int, has_scale: bool, tiles: Tiles,
                   precision: str) -> Launch:  # fmt: skip
    """Kernel 1's grid and arguments, as fused_moe passes them (kernels/aot.py compiles the same)."""
    E, I, C = w_gate.shape
    return Launch(_fused_moe_gate_up_kernel, (tile_expert.shape[0], triton.cdiv(I, tiles.block_n)),
                  (x, w_gate, w_up, sg, su, h, slot_pair, tile_expert, h.shape[0], C, I, A, E,
                   x.stride(0), w_gate.stride(0), w_gate.stride(1), sg.stride(0), sg.stride(1), h.stride(0)),
                  _meta(has_scale, tiles, precision))  # fmt: skip


def down_launch(h, w_down, sd, route, out_pairs, slot_pair, tile_expert, has_scale: bool, tiles: Tiles,
                precision: str) -> Launch:  # fmt: skip
    E, C, I = w_down.shape
    return Launch(_fused_moe_down_kernel, (tile_expert.shape[0], triton.cdiv(C, tiles.block_n)),
                  (h, w_down, sd, route, out_pairs, slot_pair, tile_expert, h.shape[0], C, I, E,
                   h.stride(0), w_down.stride(0), w_down.stride(1), sd.stride(0), sd.stride(1), out_pairs.stride(0)),
                  _meta(has_scale, tiles, precision))  # fmt: skip


def _meta(has_scale: bool, tiles: Tiles, precision: str) -> dict:
    return {"HAS_SCALE": has_scale, "SCALE": SCALE_BLOCK, "UPCAST": INTERPRETED, "PRECISION": precision,
            "BLOCK_M": tiles.block_m, "BLOCK_N": tiles.block_n, "BLOCK_K": tiles.block_k,
            "num_warps": tiles.num_warps, "num_stages": tiles.num_stages}  # fmt: skip


def fused_moe(
    x: torch.Tensor,  # [N, C] float32, float16 or bfloat16
    expert_ids: torch.Tensor,  # [N, A] int
    weights: torch.Tensor,  # [N, A] routing weights
    w_gate: torch.Tensor,  # [E, I, C]
    w_up: torch.Tensor,  # [E, I, C]
    w_down: torch.Tensor,  # [E, C, I]
    scales: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,  # gate/up/down block scales
    tiles: Tiles | None = None,
    activations: Callable[[torch.Tensor], torch.Tensor] | None = None,
    precision: str | None = None,  # tl.dot's input_precision; None: dot_precision(x.dtype)
) -> torch.Tensor:
    """sum over a of weights[n, a] * SwiGLU_{expert_ids[n, a]}(x[n]) -> [N, C] in x's dtype. Weights
    are x's dtype, or (with `scales`, float32 [E, ceil(out/128), ceil(in/128)] each) FP8 or any float
    stored per 128x128 tile as weight / scale. `activations`: what each GEMM's input goes through first
    (the model's FP8 rule rounds x and h per token as an FP8 matmul would), None: nothing. Two launches
    and no host sync."""
    if triton is None:
        raise RuntimeError("fused_moe needs triton (pip install triton); fused_moe_reference needs none")
    N, C = x.shape
    E, I, _ = w_gate.shape
    A = expert_ids.shape[1]
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"x: {x.dtype} is not float32, float16 or bfloat16")
    if expert_ids.shape != (N, A) or weights.shape != (N, A):
        raise ValueError(f"expert_ids {tuple(expert_ids.shape)} and weights {tuple(weights.shape)} must be [{N}, A]")
    if w_gate.shape != (E, I, C) or w_up.shape != (E, I, C) or w_down.shape != (E, C, I):
        raise ValueError(f"weights: gate {tuple(w_gate.shape)}, up {tuple(w_up.shape)}, down {tuple(w_down.shape)} "
                         f"do not make [E, I, {C}] / [E, {C}, I]")  # fmt: skip
    if scales is None and not w_gate.dtype == w_up.dtype == w_down.dtype == x.dtype:
        raise ValueError(f"weights ({w_gate.dtype}) must be x's dtype ({x.dtype}) unless block scales are given")
    tiles = tiles or default_tiles(N * A, E, x.dtype)
    if scales is not None:
        for w, s, name in zip((w_gate, w_up, w_down), scales, ("gate", "up", "down")):
            check_scales(w, s, name)
        if SCALE_BLOCK % tiles.block_n or SCALE_BLOCK % tiles.block_k:
            raise ValueError(f"tiles {tiles}: BLOCK_N and BLOCK_K must divide the {SCALE_BLOCK}-wide scale blocks")
    precision = precision or dot_precision(x.dtype)
    if activations is not None:
        x = activations(x)
    x, w_gate, w_up, w_down = (t.contiguous() for t in (x, w_gate, w_up, w_down))
    P = N * A
    slot_pair, tile_expert = expert_tiles(expert_ids, E, tiles.block_m)
    sg, su, sd = (s.contiguous() for s in scales) if scales is not None else (w_gate,) * 3  # unread when no scales
    has_scale = scales is not None
    h = torch.empty(P, I, dtype=x.dtype, device=x.device)  # [P, I]
    gate_up_launch(x, w_gate, w_up, sg, su, h, slot_pair, tile_expert, A, has_scale, tiles, precision).run()
    if activations is not None:
        h = activations(h)
    out_pairs = torch.zeros(P, C, dtype=torch.float32, device=x.device)  # [P, C]; zeros: padded pairs stay 0
    route = weights.contiguous().view(P)
    down_launch(h, w_down, sd, route, out_pairs, slot_pair, tile_expert, has_scale, tiles, precision).run()
    return out_pairs.view(N, A, C).sum(1).to(x.dtype)


def dequantize(w: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """w [E, R, K] stored per 128x128 tile, scale [E, ceil(R/128), ceil(K/128)] -> w * scale in `dtype`."""
    E, R, K = w.shape
    full = scale.repeat_interleave(SCALE_BLOCK, 1).repeat_interleave(SCALE_BLOCK, 2)[:, :R, :K]
    return (w.to(torch.float32) * full).to(dtype)


def fused_moe_reference(x, expert_ids, weights, w_gate, w_up, w_down, scales=None, activations=None) -> torch.Tensor:
    """The plain-PyTorch definition: each pair's SwiGLU in float32, weighted, summed per token."""
    keep = activations or (lambda t: t)
    x = keep(x)
    if scales is not None:
        w_gate, w_up, w_down = (dequantize(w, s, x.dtype) for w, s in zip((w_gate, w_up, w_down), scales))
    N, A = expert_ids.shape
    xf = x.float()
    out = torch.zeros(N, x.shape[1], dtype=torch.float32, device=x.device)  # [N, C]
    for a in range(A):
        e = expert_ids[:, a]
        g = torch.einsum("nc,nic->ni", xf, w_gate[e].float())
        u = torch.einsum("nc,nic->ni", xf, w_up[e].float())
        h = keep((F.silu(g) * u).to(x.dtype)).float()  # the kernel keeps h in x's dtype between its two GEMMs
        out += torch.einsum("ni,nci->nc", h, w_down[e].float()) * weights[:, a, None].float()
    return out.to(x.dtype)
