"""The LLaDA2 (`llada2_moe`) network in plain PyTorch: block-causal attention over an optional block
KV cache, a sigmoid-routed MoE (LLaDA2.1: group-limited per token; LLaDA2.2: per block of tokens),
unshifted logits.

Knows nothing of decoding policy, tokenizers or documents. Shape legend: B batch, T query tokens,
S key tokens, H query heads, K kv heads, D head dim, C hidden, E experts, A experts per token,
I expert width, V vocab.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from .. import kernels
from ..kernels import cpu
from . import fp8
from .config import LLaDA2Config

# Grouped GEMMs (torch >= 2.8): every expert's tokens by its own weights in one call; the sparse MoE's
# inference path on the CPU in float32.
GROUPED_MM = getattr(F, "grouped_mm", None)

try:  # optional CUDA fast path, chosen at run time
    from flash_attn import flash_attn_func, flash_attn_varlen_func
except ImportError:  # pragma: no cover - depends on the machine
    flash_attn_func = flash_attn_varlen_func = None


def flash_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether flash-attn runs for activations on `device` in `dtype`: installed, CUDA, a half type."""
    half = dtype in (torch.float16, torch.bfloat16)
    return flash_attn_func is not None and torch.device(device).type == "cuda" and half


def flash_ok(x: torch.Tensor) -> bool:
    return flash_available(x.device, x.dtype)


_COMPUTE = {torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.float32: torch.float32,
            torch.float64: torch.float64}  # fmt: skip


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Norms, the router and RoPE run in at least float32 (bf16 in, fp32 math; fp64 stays fp64)."""
    return _COMPUTE.get(dtype) or torch.promote_types(dtype, torch.float32)


def as_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x in `dtype`, with no dispatched op when it is already (a step runs hundreds of small ops)."""
    return x if x.dtype == dtype else x.to(dtype)


def additive_mask(allow: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool mask as the additive one (0 where allowed, -inf elsewhere) that scaled_dot_product_attention
    makes of it internally, on every call; the same attention, bit for bit (tests/model/test_cpu_layout.py)."""
    return torch.zeros(allow.shape, dtype=dtype, device=allow.device).masked_fill_(~allow, float("-inf"))


def block_causal_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, block_size: int) -> torch.Tensor:
    """allow[i, j] = key j is in the same or an earlier block than query i.  # [T, S] bool"""
    return (k_pos[None, :] // block_size) <= (q_pos[:, None] // block_size)


class PackedRows(Protocol):
    """A batched step's rows laid end to end for flash-attn's varlen kernel (engine/cache.py's Packed)."""

    query_rows: torch.Tensor
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int


class KVView(Protocol):
    """What the model reads of a cache for one forward: the engine's PagedView (engine/cache.py) or a
    ContiguousView here. `positions` / `allow` None: the model makes them from `start` (block-causal)."""

    positions: torch.Tensor | None  # [B, T]: each query's absolute position
    allow: torch.Tensor | None  # [B, 1, T, S] bool, or None where every query sees every key
    real: torch.Tensor | None  # [B, T] bool: not left padding (LLaDA2.2's block routing); None: no padding
    packed: PackedRows | None  # set where no row needs a mask and flash-attn's varlen path may run

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Stores this forward's K/V [B, K, T, D]; returns every key and value the queries see [B, K, S, D]."""
        ...

    def update_packed(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`update` in `packed`'s layout [sum of ends, K, D] (only where `packed` is set)."""
        ...

    def host_pools(self) -> tuple | None:
        """The pools and slots as numpy views for the CPU runner's own write and gather; None: use `update`."""
        ...


class BlockKVCache:
    """Preallocated keys/values of every layer for one contiguous sequence (a fixed-shape benchmark or
    test); the engine's own memory is the block pool of engine/cache.py. Both are written through the
    same verb, `update(layer, k, v)`, on a view that knows where the queries sit."""

    def __init__(self, config: LLaDA2Config, max_len: int, device, dtype, batch: int = 1):
        shape = (config.num_hidden_layers, batch, config.num_key_value_heads, max_len, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)  # [L, B, K, S, D]
        self.v = torch.zeros(shape, device=device, dtype=dtype)

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    def at(self, start: int, length: int) -> ContiguousView:
        return ContiguousView(self, start, length)


class ContiguousView:
    """Queries at positions [start, start + length) of a BlockKVCache: they attend to [0, start + length)."""

    positions = allow = real = packed = None  # the model makes positions and mask from `start` (block-causal)

    def __init__(self, cache: BlockKVCache, start: int, length: int):
        self.cache, self.start, self.end = cache, start, start + length

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Writes the queries' K/V [B, K, T, D]; returns every visible key and value [B, K, S, D]."""
        # Hazard: the K/V written here are those of the tokens *as run now*; a block whose tokens
        # change afterwards must be run again before a later block may attend to it.
        self.cache.k[layer, :, :, self.start : self.end] = k
        self.cache.v[layer, :, :, self.start : self.end] = v
        return self.cache.k[layer, :, :, : self.end], self.cache.v[layer, :, :, : self.end]

    def update_packed(self, layer: int, k: torch.Tensor, v: torch.Tensor):  # pragma: no cover - `packed` is None
        raise NotImplementedError("a contiguous cache has no packed rows")

    def host_pools(self) -> None:
        return None  # the CPU runner writes through `update`


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., D] normalised over D, times `weight` ([D], or one row per x's second-to-last dim [n, D]).
    A float32 / float64 x takes torch's own kernel, one op instead of seven, with the same numbers
    (tests/engine/test_policy_cpu.py holds them equal), or on the CPU in float32 without autograd the
    numba kernel (kernels/cpu.py, within rounding); a half x is widened for the sum, as before."""
    if x.dtype == compute_dtype(x.dtype):
        if weight.dim() == 1 and cpu.enabled(x) and x.is_contiguous():
            return cpu.rms_norm(x, weight, eps)  # one compiled loop instead of torch's five ops
        if weight.dim() == 1:
            return F.rms_norm(x, x.shape[-1:], weight, eps)
        return F.rms_norm(x, x.shape[-1:], None, eps) * weight
    h = x.to(compute_dtype(x.dtype))
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, rotary_dim: int, theta: float, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables for half-split rotation of the first `rotary_dim` dims.  # [..., T, rotary_dim]
    The sin table carries the rotation's sign: its first half is -sin (see apply_rope)."""
    ct = compute_dtype(dtype)
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, device=positions.device, dtype=ct) / rotary_dim))
    angles = as_dtype(positions, ct)[..., None] * inv_freq
    sin = angles.sin()
    return as_dtype(torch.cat([angles, angles], dim=-1).cos(), dtype), as_dtype(torch.cat([-sin, sin], dim=-1), dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates x [B, H, T, D] in place and returns it: dims [0, r) in half-split pairs (k, k + r/2),
    x1 * cos - x2 * sin and x2 * cos + x1 * sin (rope_cos_sin's sin holds the minus); the rest pass
    through untouched. x must be a tensor of the caller's own (the normed q and k are)."""
    r = cos.shape[-1]
    x_rot = x[..., :r]
    x1, x2 = x_rot.chunk(2, dim=-1)
    swapped = torch.cat([x2, x1], dim=-1)  # a copy, taken before x_rot changes
    x_rot.mul_(cos).add_(swapped.mul_(sin))
    return x


class Attention(nn.Module):
    def __init__(self, config: LLaDA2Config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head, self.n_kv, self.head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.query_key_value = nn.Linear(config.hidden_size, (self.n_head + 2 * self.n_kv) * self.head_dim, bias=False)
        self.query_layernorm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.key_layernorm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.dense = nn.Linear(self.n_head * self.head_dim, config.hidden_size, bias=False)

    def qk_norm_weight(self) -> torch.Tensor:
        """[H + K, D]: the query norm's weight for each query head, then the key norm's for each key head."""
        wq, wk = self.query_layernorm.weight, self.key_layernorm.weight
        return torch.cat([wq.expand(self.n_head, -1), wk.expand(self.n_kv, -1)])

    def forward(self, x, cos, sin, allow, kv: KVView | None):
        """kv: None, or the cache's view for this forward (KVView)."""
        B, T, _ = x.shape
        qkv = self.query_key_value(x).view(B, T, self.n_head + 2 * self.n_kv, self.head_dim)
        # q and k normed (each head by its own norm's weight) and rotated together: half the small ops
        qk = rms_norm(qkv[:, :, : self.n_head + self.n_kv], self.qk_norm_weight(), self.query_layernorm.eps)
        q, k = apply_rope(qk.transpose(1, 2), cos, sin).split([self.n_head, self.n_kv], dim=1)  # [B, H|K, T, D]
        v = qkv[:, :, self.n_head + self.n_kv :].transpose(1, 2)
        packed = kv.packed if kv is not None else None
        if packed is not None and flash_ok(x):  # a batched step whose rows need no mask: varlen, no padding keys
            kp, vp = kv.update_packed(self.layer_idx, k, v)  # [sum of ends, K, D]
            qp = q.transpose(1, 2).reshape(B * T, self.n_head, self.head_dim)[packed.query_rows]
            got = flash_attn_varlen_func(qp, kp, vp, packed.cu_q, packed.cu_k, packed.max_q, packed.max_k, causal=False)
            out = got.new_zeros(B * T, self.n_head, self.head_dim).index_copy_(0, packed.query_rows, got)
            return self.dense(out.view(B, T, -1))
        if kv is not None:
            k, v = kv.update(self.layer_idx, k, v)
        if allow is None and flash_ok(x):
            out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=False)
            out = out.reshape(B, T, -1)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=allow, enable_gqa=self.n_kv != self.n_head)
            out = out.transpose(1, 2).reshape(B, T, -1)
        return self.dense(out)


class MLP(nn.Module):
    """SwiGLU: the dense layer 0 and the shared experts."""

    def __init__(self, hidden: int, inner: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x, blocks: RoutingBlocks | None = None):  # `blocks`: routing, which a dense layer has none of
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    """Sigmoid scores; `expert_bias` only chooses (LLaDA2.1: group-limited top-k; LLaDA2.2: top-k among
    the experts its block admitted), the unbiased scores weigh."""

    def __init__(self, config: LLaDA2Config):
        super().__init__()
        self.top_k, self.n_group, self.topk_group = config.num_experts_per_tok, config.n_group, config.topk_group
        self.scale, self.normalise = config.routed_scaling_factor, config.norm_topk_prob
        self.capacity = config.expert_capacity  # LLaDA2.2: experts admitted per routing block; None: LLaDA2.1
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size))
        self.expert_bias = nn.Parameter(torch.zeros(config.num_experts), requires_grad=False)

    def forward(self, x: torch.Tensor, blocks: RoutingBlocks | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, C] -> expert ids [N, A], weights [N, A] (x's dtype). `blocks`: LLaDA2.2's block routing,
        each token's block among the forward's (a checkpoint with `expert_capacity` always passes it)."""
        ct = compute_dtype(x.dtype)
        scores = torch.sigmoid(F.linear(as_dtype(x, ct), as_dtype(self.weight, ct)))  # [N, E]
        biased = (scores.detach() if scores.requires_grad else scores) + as_dtype(self.expert_bias, ct)
        if self.capacity is not None:
            biased = self.admitted_only(biased, blocks)
        else:
            biased = self.best_groups_only(biased)
        expert_ids = biased.topk(self.top_k, dim=-1).indices  # [N, A]
        weights = scores.gather(1, expert_ids)
        if self.normalise:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return expert_ids, as_dtype(weights * self.scale, x.dtype)

    def best_groups_only(self, biased: torch.Tensor) -> torch.Tensor:
        """LLaDA2.1: the biased scores [N, E] outside each token's best `topk_group` groups set to -inf."""
        N, E = biased.shape
        grouped = biased.view(N, self.n_group, E // self.n_group)
        group_score = grouped.topk(min(2, E // self.n_group), dim=-1).values.sum(-1)  # [N, G]
        kept = group_score.topk(self.topk_group, dim=-1).indices
        dropped = torch.ones_like(group_score, dtype=torch.bool).scatter_(1, kept, False)  # [N, G]
        return grouped.masked_fill(dropped[..., None], float("-inf")).view(N, E)

    def admitted_only(self, biased: torch.Tensor, blocks: RoutingBlocks) -> torch.Tensor:
        """LLaDA2.2 (report, eq. 1): an expert's block score is the max of its biased score over the
        block's real tokens; the `capacity` best of each block are admitted, the others' scores set to
        -inf for every token of the block. No group limit (n_group / topk_group unused, as the ports
        read the reference). Static shapes and no host read: a CUDA graph holds it."""
        if blocks is None:
            raise ValueError("this checkpoint routes per block (expert_capacity): the forward needs its blocks")
        N, E = biased.shape
        index = blocks.index.to(biased.device)
        real = blocks.real.to(biased.device)
        per_block = biased.new_full((blocks.count, E), float("-inf"))
        per_block.scatter_reduce_(0, index[:, None].expand(N, E), biased.masked_fill(~real[:, None], float("-inf")),
                                  "amax")  # fmt: skip
        admitted = per_block.topk(self.capacity, dim=-1).indices  # [blocks, capacity]
        ok = torch.zeros_like(per_block, dtype=torch.bool).scatter_(1, admitted, True)
        return biased.masked_fill(~ok[index], float("-inf"))


@dataclass(frozen=True)
class RoutingBlocks:
    """Which routing block each of a forward's N = B * T tokens belongs to (LLaDA2.2): blocks of
    `block_size` absolute positions from 0, per row, numbered within the forward; padding tokens are
    not `real` and take no part in any block's score (they are routed, their outputs are dropped)."""

    index: torch.Tensor  # [N] long: the token's block, in [0, count)
    real: torch.Tensor  # [N] bool
    count: int  # blocks in the forward (static for static shapes: B * (T // block_size + 2))

    @classmethod
    def of(cls, positions: torch.Tensor, real: torch.Tensor | None, batch: int, block_size: int) -> RoutingBlocks:
        """positions [T] or [B, T] (absolute), real [B, T] bool or None (no padding)."""
        B, T = batch, positions.shape[-1]
        positions = positions.expand(B, T)
        real = torch.ones_like(positions, dtype=torch.bool) if real is None else real.to(positions.device)
        block = positions // block_size
        first = block.masked_fill(~real, torch.iinfo(block.dtype).max).amin(1, keepdim=True)  # [B, 1]
        span = T // block_size + 2  # T consecutive positions touch at most this many blocks
        local = (block - first).clamp(0, span - 1)  # padding (position 0) lands on the row's first block
        rows = torch.arange(B, device=positions.device)[:, None] * span
        return cls((rows + local).flatten(), real.flatten(), B * span)


class Experts(nn.Module):
    """All routed experts' SwiGLU weights stacked, so a small block can run them densely."""

    def __init__(self, n_experts: int, hidden: int, inner: int):
        super().__init__()
        self.w_gate = nn.Parameter(torch.empty(n_experts, inner, hidden))  # [E, I, C]
        self.w_up = nn.Parameter(torch.empty(n_experts, inner, hidden))  # [E, I, C]
        self.w_down = nn.Parameter(torch.empty(n_experts, hidden, inner))  # [E, C, I]

    # Experts per dense chunk; None: all at once (plain weights are read in place, nothing is copied).
    dense_chunk: int | None = None

    def dense(self, x, expert_ids, weights):
        """Every expert on every token, weighted by a mostly-zero [N, E] table: static shapes and no
        host sync, cheapest when N is one block (most experts are touched anyway). Each weight is read
        in place as a matmul operand (no permuted copy of w_down: 512 MiB per MoE layer at mini shapes)."""
        N, C = x.shape
        E, ct = self.w_gate.shape[0], compute_dtype(x.dtype)
        table = torch.zeros(N, E, dtype=ct, device=x.device).scatter_(1, expert_ids, weights.to(ct))  # [N, E]
        out = torch.zeros(N, C, dtype=ct, device=x.device)
        step = self.dense_chunk or E
        for e0 in range(0, E, step):
            w_gate, w_up, w_down = self.dense_weights(e0, min(E, e0 + step), x.dtype)
            n, inner = w_gate.shape[:2]
            xa = self.activations(x)
            g = (xa @ w_gate.reshape(n * inner, C).T).view(N, n, inner)  # [N, e, I]
            u = (xa @ w_up.reshape(n * inner, C).T).view(N, n, inner)
            h = self.activations((F.silu(g) * u).reshape(N * n, inner)).view(N, n, inner)
            down = torch.bmm(h.transpose(0, 1), w_down.transpose(1, 2))  # [e, N, C]: w_down^T as a view
            out += (down.to(ct) * table[:, e0 : e0 + n].T[:, :, None]).sum(0)  # routing weights after, as sparse
        return out.to(x.dtype)

    def dense_weights(self, e0: int, e1: int, dtype: torch.dtype):
        """Experts [e0, e1)'s (gate, up, down) as the dense path multiplies them."""
        return self.w_gate[e0:e1], self.w_up[e0:e1], self.w_down[e0:e1]

    def activations(self, x: torch.Tensor) -> torch.Tensor:
        """What a GEMM's input goes through first (FP8Experts rounds it per token)."""
        return x

    def sparse(self, x, expert_ids, weights):
        """Tokens grouped by expert, gathered once; each expert's SwiGLU on its tokens; then weighted
        and added back in one op each (the same sums in the same order as adding expert by expert:
        index_add runs its rows in order). Where `groups(x)` (the CPU's inference in float32): three
        grouped GEMMs over all experts at once and no host read; else one matmul chain per expert that has
        tokens (differentiable: training takes it). Both give the same numbers (tests/model/test_cpu_layout.py)."""
        N, A = expert_ids.shape
        flat = expert_ids.flatten()
        order = flat.argsort(stable=True)
        token_of = order // A
        xs = x.index_select(0, token_of)  # each expert's tokens [n, C], in expert order
        counts = torch.bincount(flat, minlength=self.w_gate.shape[0])
        if self.groups(x):
            y = self.grouped(xs, counts.cumsum(0, dtype=torch.int32))
        else:
            ys = []
            for e, xe in enumerate(xs.split(counts.tolist())):
                if len(xe):
                    ys.append(
                        self.linear(F.silu(self.linear(xe, "w_gate", e)) * self.linear(xe, "w_up", e), "w_down", e)
                    )
            y = torch.cat(ys)
        y = y * weights.reshape(N * A, 1).index_select(0, order)  # [N * A, C]
        return torch.zeros_like(x).index_add_(0, token_of, as_dtype(y, x.dtype))

    def groups(self, x: torch.Tensor) -> bool:
        """Whether `sparse` runs the grouped GEMMs for x [N, C]: torch has them, float32 activations and
        weights on the CPU (they take no float64; a GPU's want bfloat16), no gradient to keep."""
        return (
            GROUPED_MM is not None
            and x.dtype == torch.float32
            and self.w_gate.dtype == torch.float32
            and x.device.type == "cpu"
            and not (torch.is_grad_enabled() and self.w_gate.requires_grad)
        )

    def grouped(self, xs: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        """Every expert's SwiGLU on its rows of xs [n, C] (expert order; `ends` [E] int32): a grouped GEMM
        over all experts each for gate, up and down."""
        gate = GROUPED_MM(xs, self.w_gate.transpose(1, 2), offs=ends)
        up = GROUPED_MM(xs, self.w_up.transpose(1, 2), offs=ends)
        return GROUPED_MM(F.silu(gate) * up, self.w_down.transpose(1, 2), offs=ends)

    def fused(self, x, expert_ids, weights):
        """llada_lsp/kernels' fused MoE: grouped GEMMs over the touched experts only (Triton, CUDA)."""
        return kernels.moe(x, expert_ids, weights, self.w_gate, self.w_up, self.w_down)

    def linear(self, x: torch.Tensor, name: str, e: int) -> torch.Tensor:
        """x [n, in] through expert e's `name` matrix -> [n, out] (F.linear: the same matmul in one op)."""
        return F.linear(x, getattr(self, name)[e])


class FP8Experts(Experts):
    """The routed experts in FP8: float8_e4m3fn weights, each with float32 scales per 128x128 tile
    (`<name>_scale_inv` [E, tiles(out), tiles(in)]); see fp8.py for the numbers."""

    def __init__(self, n_experts: int, hidden: int, inner: int):
        nn.Module.__init__(self)
        for name, (rows, cols) in (("w_gate", (inner, hidden)), ("w_up", (inner, hidden)), ("w_down", (hidden, inner))):
            weight = torch.empty(n_experts, rows, cols, dtype=fp8.FP8)
            scale = torch.empty(n_experts, fp8.tiles(rows), fp8.tiles(cols), dtype=torch.float32)
            setattr(self, name, nn.Parameter(weight, requires_grad=False))
            setattr(self, f"{name}_scale_inv", nn.Parameter(scale, requires_grad=False))

    # Dequantized a chunk at a time: 16 experts of mini's gate/up/down in bf16 are 96 MiB, all 256 1.5 GiB.
    dense_chunk = 16

    def dense_weights(self, e0: int, e1: int, dtype: torch.dtype):
        """Experts [e0, e1) dequantized to `dtype` (static shapes, no host sync: a CUDA graph holds it)."""
        return tuple(fp8.dequantize(getattr(self, name)[e0:e1], getattr(self, f"{name}_scale_inv")[e0:e1], dtype)
                     for name in ("w_gate", "w_up", "w_down"))  # fmt: skip

    def activations(self, x: torch.Tensor) -> torch.Tensor:
        return fp8.quantized_activations(x)

    def fused(self, x, expert_ids, weights):
        """The fused kernel reads the FP8 tiles with their scales; its activations are rounded per token
        as fp8.linear rounds them, so both paths compute the same numbers."""
        scales = (self.w_gate_scale_inv, self.w_up_scale_inv, self.w_down_scale_inv)
        return kernels.moe(x, expert_ids, weights, self.w_gate, self.w_up, self.w_down, scales,
                           fp8.quantized_activations)  # fmt: skip

    def linear(self, x: torch.Tensor, name: str, e: int) -> torch.Tensor:
        return fp8.linear(x, getattr(self, name)[e], getattr(self, f"{name}_scale_inv")[e])


class SparseMoE(nn.Module):
    # Blocks of at most this many tokens run all experts densely when on a GPU; see Experts.dense.
    dense_max_tokens = 64

    def __init__(self, config: LLaDA2Config):
        super().__init__()
        self.gate = Router(config)
        experts = FP8Experts if fp8.is_fp8(config) else Experts
        self.experts = experts(config.num_experts, config.hidden_size, config.moe_intermediate_size)
        self.shared_experts = (
            MLP(config.hidden_size, config.moe_intermediate_size * config.num_shared_experts)
            if config.num_shared_experts
            else None
        )
        self.force: str | None = None  # "dense" / "sparse" / "fused" for tests and benchmarks; None = auto

    def mode(self, x: torch.Tensor) -> str:
        """Which Experts path runs for x [B, T, C]: `force`, else the kernel where the switch allows it
        (for these weights on this GPU), else the torch path."""
        if self.force:
            return self.force
        if kernels.enabled(x, self.experts.w_gate.dtype):
            return "fused"
        return self.torch_mode(x)

    def torch_mode(self, x: torch.Tensor) -> str:
        """Dense for one small block on a GPU, else sparse; dense whatever the size while a CUDA graph
        is being captured (the sparse path reads the expert counts back to the host)."""
        if x.is_cuda and (x.shape[0] * x.shape[1] <= self.dense_max_tokens or torch.cuda.is_current_stream_capturing()):
            return "dense"
        return "sparse"

    def forward(self, x, blocks: RoutingBlocks | None = None):
        B, T, C = x.shape
        flat = x.reshape(B * T, C)
        expert_ids, weights = self.gate(flat, blocks)  # every Experts path below takes this one routing
        if self.training:  # per-expert load, read by the training loop's bias balancing
            self.load = torch.bincount(expert_ids.flatten(), minlength=self.experts.w_gate.shape[0])
        mode = self.mode(x)
        out = getattr(self.experts, mode)(flat, expert_ids, weights)
        if out is None:  # the fused kernel does not compile on this machine (kernels logged it once)
            out = getattr(self.experts, self.torch_mode(x))(flat, expert_ids, weights)
        if self.shared_experts is not None:
            out = out + self.shared_experts(flat)
        return out.view(B, T, C)


class DecoderLayer(nn.Module):
    def __init__(self, config: LLaDA2Config, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attention = Attention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        dense = layer_idx < config.first_k_dense_replace
        self.mlp = MLP(config.hidden_size, config.intermediate_size) if dense else SparseMoE(config)

    def forward(self, x, cos, sin, allow, kv, blocks: RoutingBlocks | None = None):
        x = x + self.attention(self.input_layernorm(x), cos, sin, allow, kv)
        return x + self.mlp(self.post_attention_layernorm(x), blocks)


class LLaDA2Backbone(nn.Module):
    def __init__(self, config: LLaDA2Config):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LLaDA2(nn.Module):
    """`model(ids)` gives unshifted logits: row i predicts the token at position i."""

    def __init__(self, config: LLaDA2Config):
        super().__init__()
        config.validate_llada()
        self.config = config
        self.model = LLaDA2Backbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        # A model split over devices (loader's `devices`): the device that takes over at each boundary,
        # keyed by the first layer it holds (num_hidden_layers: the final norm and head). {}: one device.
        self.hops: dict[int, torch.device] = {}

    # The CPU runner (model/cpu_runner.py), attached by cpu_runner.prepare: where it runs a forward
    # (`runs`), LLaDA2.forward hands it the embeddings; None: the modules run every forward.
    runner = None

    def _apply(self, fn, *args, **kwargs):
        """nn.Module's `.to()`, `.float()`, `.cuda()`...: an attached runner is told the parameters may
        have new storage (it rebuilds itself from them, or detaches)."""
        out = super()._apply(fn, *args, **kwargs)
        if self.runner is not None:
            self.runner.parameters_changed()
        return out

    @property
    def device(self) -> torch.device:
        """Where the logits come out (the last device of a split model)."""
        return self.lm_head.weight.device

    @property
    def layer_devices(self) -> list[torch.device] | None:
        """The device of each layer (and of its K/V) in a split model; None on one device."""
        if not self.hops:
            return None
        return [layer.input_layernorm.weight.device for layer in self.model.layers]

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    _rope: tuple[tuple, tuple[torch.Tensor, torch.Tensor]] | None = None

    def rope_tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """rope_cos_sin of every position [0, max_position_embeddings) [P, r], made once per device and
        dtype (the CPU step indexes them instead of making its rows again)."""
        key = (device, self.dtype)
        if self._rope is None or self._rope[0] != key:
            c = self.config
            positions = torch.arange(c.max_position_embeddings, device=device)
            self._rope = key, rope_cos_sin(positions, c.rotary_dim, c.rope_theta, self.dtype)
        return self._rope[1]

    def forward(
        self,
        input_ids: torch.Tensor,  # [B, T]
        positions: torch.Tensor | None = None,  # [T] or [B, T]; default start..start+T-1
        allow: torch.Tensor | None = None,  # [T, S] or [B, 1, T, S] bool; default block-causal
        cache: BlockKVCache | None = None,
        start: int = 0,
        block_size: int = 32,
        last_n: int | None = None,  # logits only for the last n rows (0: none, for a prefill)
        kv: KVView | None = None,  # the cache's view for this forward (engine/cache.py), instead of cache/start
    ) -> torch.Tensor | None:
        B, T = input_ids.shape
        input_ids = input_ids.to(self.model.word_embeddings.weight.device)
        if cache is not None:
            kv = cache.at(start, T)
        if kv is not None and kv.positions is not None:  # a batch's view: each row's positions and its mask
            positions, allow = kv.positions, kv.allow
        else:
            if positions is None:
                positions = torch.arange(start, start + T, device=input_ids.device)
            if allow is None and (kv is None or start // block_size != (start + T - 1) // block_size):
                keys = torch.arange(start + T, device=input_ids.device) if kv is not None else positions
                allow = block_causal_mask(positions, keys, block_size)
        # allow is None when every query sees every key it is given (one block, no padding): the fast path.
        if allow is not None and allow.device.type == "cpu" and not self.hops:
            allow = additive_mask(allow, self.dtype)  # once, not once per layer inside attention
        blocks = None
        if self.config.block_routing:  # LLaDA2.2: its routing blocks, from absolute positions, padding out
            real = kv.real if kv is not None else None
            blocks = RoutingBlocks.of(positions, real, B, self.config.block_size)
        x = self.model.word_embeddings(input_ids)
        if self.runner is not None and self.runner.runs(x):  # the CPU runner's flat layers (float32, no autograd)
            return self.runner.forward(x, positions, allow, kv, last_n)
        cos, sin = rope_cos_sin(positions, self.config.rotary_dim, self.config.rope_theta, self.dtype)
        if positions.dim() == 2:  # per-row positions: [B, T, r] -> [B, 1, T, r], broadcast over heads
            cos, sin = cos[:, None], sin[:, None]
        for i, layer in enumerate(self.model.layers):
            if i in self.hops:
                x, cos, sin, allow = hand_off(self.hops[i], x, cos, sin, allow)
            x = layer(x, cos, sin, allow, kv, blocks)
        if last_n == 0:
            return None
        if len(self.model.layers) in self.hops:
            x = hand_off(self.hops[len(self.model.layers)], x)[0]
        if last_n is not None:
            x = x[:, -last_n:]
        return self.lm_head(self.model.norm(x))


def hand_off(device: torch.device, *tensors: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """The activations (and the RoPE tables and mask every layer reads) onto the next device of a
    split model: the one copy per boundary."""
    return tuple(t if t is None else t.to(device) for t in tensors)
