"""CPU kernels (numba) with plain-PyTorch references: a decoder layer's inference forward on the CPU as
two compiled calls around torch's attention. At the embedded model's shapes (32 rows of 256) a torch op
costs more to dispatch than to compute, so a step was mostly overhead around its GEMMs. Here the kernels
call the GEMM themselves (the backend's: the BLAS routine torch's own CPU matmul calls, so the products
are torch's bit for bit, or a portable one within rounding where torch's cannot be found; kernel_backend.py) and do the small ops between the GEMMs in loops: `attend` (QKV projection, q/k
norm, RoPE, the paged cache's write and gather) and `mlp` / `mlp_attend` (output projection, norm,
routing, the experts' grouped GEMMs with SwiGLU, the weighted sum, the next layer's norm and, with
`mlp_attend`, its `attend`).

`enabled(x)` is the one switch: float32 CPU tensors under no_grad / inference_mode (the engine's),
not under torch.compile, where the backend (kernel_backend.py, decided once) runs the CPU kernels. Everywhere
else the model's torch path runs. The step rule's exponentials stay in torch (its confidence must be the reference's to
the bit); SiLU's runs here as torch's own (SLEEF's expf_u10 by fused multiply-adds), bit for bit.
Knows nothing of modules, checkpoints or decoding policy.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import torch

from .. import kernel_backend as backend

log = logging.getLogger(__name__)

numba = backend.numba()  # None where LLADA_LSP_KERNELS=0 (not even imported) or not installed
if numba is None and backend.current().cpu:  # pragma: no cover - found but broken: the torch paths run
    backend.give_up(ImportError("numba is installed but does not import"))


def enabled(x: torch.Tensor) -> bool:
    """Whether the CPU kernels run for activations x: float32 on the CPU, no autograd recording, and the
    backend's CPU kernels on (llada_lsp/kernel_backend.py: decided once per process)."""
    return (
        backend.current().cpu
        and x.dtype is torch.float32
        and x.device.type == "cpu"
        and not (torch.is_grad_enabled() or torch.compiler.is_compiling())
    )


def _sgemm():
    """The GEMM argument every kernel takes: torch's sgemm as a ctypes function, or None (the portable
    GEMM, chosen when the kernel compiles: a kernel is compiled once for each)."""
    return backend.current().sgemm


def array(t: torch.Tensor):
    """A tensor's numpy view (no copy) for a kernel's argument."""
    return t.detach().numpy()


def jit(fn=None, **options):
    """numba.njit with the on-disk cache (one compile per machine, a load per process after; this
    module's kernels and cpu_step's); `reduce`
    allows reassociating sums (vectorised reductions), never contracting a multiply-add, so products
    round as torch's do."""
    if numba is None:  # pragma: no cover
        return fn if fn is not None else (lambda f: f)
    if options.pop("reduce", False):
        options["fastmath"] = {"reassoc", "nsz"}
    jit = numba.njit(cache=True, nogil=True, **options)
    return jit(fn) if fn is not None else jit


# --- GEMM -------------------------------------------------------------------------------------------


@jit
def _gemm(fn, a, b, c, beta):
    """c [M, N] = a [M, K] @ b [K, N] (+ c where beta is 1), float32, by `fn`: torch's sgemm (a ctypes
    function, backend.find_torch_sgemm), or None for the portable GEMM (`_loops_gemm`; numba prunes the
    branch it does not take when it compiles). `fn` is an argument, never a global, and must stay one:
    numba cannot cache a function that holds a ctypes pointer as a global (the pointer is one process's),
    and without the cache every process would compile the kernels again (seconds). Each operand has one
    unit stride (a row-major matrix, a slice of its rows, or a transposed one), as torch passes them. A
    row-major product is the column-major C^T = B^T A^T."""
    M, K = a.shape
    N = b.shape[1]
    if M == 0 or N == 0:
        return
    if fn is None:
        _loops_gemm(a, b, c, beta)
        return
    if (a.strides[1] != 4 and a.strides[0] != 4) or (b.strides[1] != 4 and b.strides[0] != 4) or c.strides[1] != 4:
        raise ValueError("gemm: an operand without a unit stride")
    trans = np.empty(2, np.uint8)
    ints = np.empty(6, np.int32)
    scalars = np.empty(2, np.float32)
    if b.strides[1] == 4:  # "N", else "T" (b stored as its transpose)
        trans[0], ints[3] = 78, max(N, b.strides[0] // 4)
    else:
        trans[0], ints[3] = 84, max(K, b.strides[1] // 4)
    if a.strides[1] == 4:
        trans[1], ints[4] = 78, max(K, a.strides[0] // 4)
    else:
        trans[1], ints[4] = 84, max(M, a.strides[1] // 4)
    ints[0], ints[1], ints[2], ints[5] = N, M, K, max(N, c.strides[0] // 4)
    scalars[0], scalars[1] = 1.0, beta
    fn(trans[0:].ctypes, trans[1:].ctypes, ints[0:].ctypes, ints[1:].ctypes, ints[2:].ctypes, scalars[0:].ctypes,
       b.ctypes, ints[3:].ctypes, a.ctypes, ints[4:].ctypes, scalars[1:].ctypes, c.ctypes, ints[5:].ctypes)  # fmt: skip


@jit(reduce=True)
def _loops_gemm(a, b, c, beta):
    """The portable GEMM (backend rung 2): c = a @ b (+ c where beta is 1) in loops LLVM vectorises, the
    sums reassociated: within float32 rounding of a BLAS's, slower (docs/model.md), on any machine."""
    M, K = a.shape
    N = b.shape[1]
    row = np.empty(N, np.float32)
    by_rows = b.strides[1] == 4  # b row-major: rows of a times rows of b; else b's columns are contiguous
    bt = b.T
    for i in range(M):
        if by_rows:
            row[:] = 0.0
            for k in range(K):
                aik = a[i, k]
                for j in range(N):
                    row[j] += aik * b[k, j]
        else:
            for j in range(N):
                s = np.float32(0.0)
                for k in range(K):
                    s += a[i, k] * bt[j, k]
                row[j] = s
        for j in range(N):
            c[i, j] = row[j] if beta == 0.0 else c[i, j] + row[j]


@jit
def _grouped_gemm(fn, xs, weights, ends):  # xs [n, C]; weights [G, C, O]; ends [G] -> [n, O]
    out = np.empty((xs.shape[0], weights.shape[2]), np.float32)
    start = 0
    for g in range(ends.shape[0]):
        _gemm(fn, xs[start : ends[g]], weights[g], out[start : ends[g]], 0.0)
        start = ends[g]
    return out


def gemm(a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
    """a @ b (+ c, in place, where given) by GEMM: float32 numpy matrices with a unit stride each."""
    out = np.empty((a.shape[0], b.shape[1]), np.float32) if c is None else c
    _gemm(_sgemm(), a, b, out, 0.0 if c is None else 1.0)
    return out


# --- RMSNorm ---------------------------------------------------------------------------------------


@jit(reduce=True)
def _rms_norm(x, w, eps):  # x [N, C]; w [C] -> [N, C]
    N, C = x.shape
    out = np.empty_like(x)
    for i in range(N):
        s = np.float32(0.0)
        for j in range(C):
            s += x[i, j] * x[i, j]
        r = np.float32(1.0) / np.sqrt(s / np.float32(C) + np.float32(eps))
        for j in range(C):
            out[i, j] = x[i, j] * r * w[j]
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., C] (contiguous) normalised over C times weight [C]: llada2.rms_norm's float32 numbers
    within rounding (the sum of squares is vectorised in another order)."""
    return torch.from_numpy(_rms_norm(array(x).reshape(-1, x.shape[-1]), array(weight), eps)).view(x.shape)


# --- attention's input: the QKV GEMM, q/k norm and RoPE, the paged cache's write and gather ----------


@jit(reduce=True)
def _qk_norm_rope(qkv, wq, wk, eps, cos, sin, H, K):  # qkv [N, >= H + K, D]; wq, wk [D]; cos/sin [P, R]
    N, _, D = qkv.shape
    P, R = cos.shape
    half = R // 2
    t = np.empty(D, np.float32)
    for n in range(N):
        c, s_ = cos[n % P], sin[n % P]
        for h in range(H + K):
            v, w = qkv[n, h], wq if h < H else wk
            ss = np.float32(0.0)
            for d in range(D):
                ss += v[d] * v[d]
            r = np.float32(1.0) / np.sqrt(ss / np.float32(D) + np.float32(eps))
            for d in range(D):
                t[d] = v[d] * r * w[d]
            for d in range(half):  # x1 * cos + x2 * sin, sin's first half holding the minus
                v[d] = t[d] * c[d] + t[d + half] * s_[d]
                v[d + half] = t[d + half] * c[d + half] + t[d] * s_[d + half]
            for d in range(R, D):
                v[d] = t[d]


@jit
def _attend(fn, normed, w_qkv, wq, wk, eps, cos, sin, H, K, B, pool_k, pool_v, writes, reads):
    N = normed.shape[0]
    T, D = N // B, wq.shape[0]
    qkv = np.empty((N, (H + 2 * K) * D), np.float32)
    _gemm(fn, normed, w_qkv, qkv, 0.0)
    heads = qkv.reshape(N, H + 2 * K, D)
    _qk_norm_rope(heads, wq, wk, eps, cos, sin, H, K)
    q = np.empty((B * H * T, D), np.float32)  # [B, H, T, D] as rows
    for n in range(N):
        for h in range(H):
            q[(n // T * H + h) * T + n % T] = heads[n, h]
    KD, at = K * D, H * D  # rows of K * D floats: the pools [slots, K * D], this forward's [N, (H + 2K) * D]
    if pool_k.shape[0] == 0:  # no paged cache: this forward's own keys and values, [B, K, T, D] as rows
        keys, values = np.empty((B * K * T, D), np.float32), np.empty((B * K * T, D), np.float32)
        for n in range(N):
            for g in range(K):
                row = (n // T * K + g) * T + n % T
                keys[row], values[row] = heads[n, H + g], heads[n, H + K + g]
        return q, keys, values
    pk, pv = pool_k.reshape(-1, KD), pool_v.reshape(-1, KD)
    for n in range(N):  # this forward's keys and values into their slots
        slot = writes[n]
        for j in range(KD):
            pk[slot, j] = qkv[n, at + j]
            pv[slot, j] = qkv[n, at + KD + j]
    S = reads.shape[1]
    keys, values = np.empty((B * K * S, D), np.float32), np.empty((B * K * S, D), np.float32)
    for b in range(B):  # then every visible key and value, gathered [B, K, S, D] as rows
        for i in range(S):
            slot = reads[b, i]
            for g in range(K):
                row = (b * K + g) * S + i
                for d in range(D):
                    keys[row, d] = pk[slot, g * D + d]
                    values[row, d] = pv[slot, g * D + d]
    return q, keys, values


def attend(normed, w_qkv, wq, wk, eps: float, cos, sin, H: int, K: int, B: int, pool_k=None, pool_v=None,
           writes=None, reads=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """An attention's input from its normed input rows normed [B * T, C] (numpy float32, as every argument):
    q, k, v = normed @ w_qkv ([C, (H + 2K) * D]), each query head RMS-normed by wq [D] and each key head by
    wk [D] and rotated by cos / sin [B * T or T, R] (rope_cos_sin's rows); with the paged cache's pools
    [slots, K, D], k and v written to their slots `writes` [B * T] and the keys and values at `reads` [B,
    S] gathered. Returns q [B, H, T, D] and the keys and values [B, K, S, D] (S = T without pools), each
    contiguous. The references: Attention's linear, rms_norm, apply_rope, and PagedView.update."""
    pools = _no_pools(K, wq.shape[0]) if pool_k is None else (pool_k, pool_v, writes, reads)
    return _shaped(*_attend(_sgemm(), normed, w_qkv, wq, wk, eps, cos, sin, H, K, B, *pools), B, H, K, wq.shape[0])


def _no_pools(K: int, D: int) -> tuple[np.ndarray, ...]:
    empty = np.empty((0, K, D), np.float32)
    return empty, empty, np.empty(0, np.int64), np.empty((0, 0), np.int64)


def _shaped(q, keys, values, B: int, H: int, K: int, D: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return q.reshape(B, H, -1, D), keys.reshape(B, K, -1, D), values.reshape(B, K, -1, D)


# --- MoE: routing with the grouping by expert, the weighted sum -------------------------------------


@jit
def _route(logits, bias, n_group, topk_group, top_k, scale, normalise, x, shared):
    """LLaDA2.1's group-limited top-k on the router's logits [N, E] (their sigmoid scores it), then the
    rows x [N, C] grouped by expert for grouped GEMMs. Returns (expert ids [N, top_k], best first; xs [N *
    A, C] in expert order, each expert's rows in token order; token_of [N * A]; each row's routing weight
    [N * A]; ends [E] int32, where each expert's rows end). With `shared`, xs ends with x itself, the
    shared expert's group (ends [E + 1]). The references: llada2.Router (the same choice wherever no two
    scores tie within a rounding, the same weights within one) and Experts.sparse's stable argsort."""
    N, E = logits.shape
    scores = np.empty_like(logits)
    for n in range(N):
        for e in range(E):
            scores[n, e] = np.float32(1.0) / (np.float32(1.0) + np.exp(-logits[n, e]))
    per = E // n_group
    ids = np.empty((N, top_k), np.int64)
    weights = np.empty((N, top_k), np.float32)
    biased = np.empty(E, np.float32)
    group = np.empty(n_group, np.float32)
    for n in range(N):
        for e in range(E):
            biased[e] = scores[n, e] + bias[e]
        for g in range(n_group):  # a group's score: the sum of its best two (its best, if one expert)
            a = -np.inf
            b = -np.inf
            for e in range(g * per, (g + 1) * per):
                if biased[e] > a:
                    a, b = biased[e], a
                elif biased[e] > b:
                    b = biased[e]
            group[g] = a + b if per > 1 else a
        for _ in range(n_group - topk_group):  # drop the worst groups (the last of equals first)
            worst = 0
            for g in range(1, n_group):
                if group[g] <= group[worst]:
                    worst = g
            group[worst] = np.inf
            for e in range(worst * per, (worst + 1) * per):
                biased[e] = -np.inf
        total = np.float32(0.0)
        for k in range(top_k):
            best = 0
            for e in range(1, E):
                if biased[e] > biased[best]:
                    best = e
            ids[n, k] = best
            biased[best] = -np.inf
            weights[n, k] = scores[n, best]
            total += scores[n, best]
        for k in range(top_k):
            w = weights[n, k] / (total + np.float32(1e-20)) if normalise else weights[n, k]
            weights[n, k] = w * np.float32(scale)
    # the tokens grouped by expert, each expert's in token order (a stable sort)
    start = np.zeros(E + 1, np.int64)
    for n in range(N):
        for k in range(top_k):
            start[ids[n, k] + 1] += 1
    ends = np.empty(E + shared, np.int32)
    for e in range(E):
        start[e + 1] += start[e]
        ends[e] = start[e + 1]
    xs = np.empty((N * top_k + N * shared, x.shape[1]), x.dtype)
    if shared:  # every token once more, after the routed rows: the shared expert's group
        ends[E] = N * top_k + N
        xs[N * top_k :] = x
    token_of = np.empty(N * top_k, np.int64)
    w_sorted = np.empty(N * top_k, np.float32)
    for n in range(N):
        for k in range(top_k):
            row = start[ids[n, k]]
            start[ids[n, k]] += 1
            token_of[row] = n
            w_sorted[row] = weights[n, k]
            xs[row] = x[n]
    return ids, xs, token_of, w_sorted, ends


@jit
def _combine(y, token_of, w_sorted, shared, residual):
    N, C = residual.shape
    acc = np.zeros((N, C), np.float32)
    for r in range(y.shape[0]):
        t = token_of[r]
        w = w_sorted[r]
        for c in range(C):
            acc[t, c] += y[r, c] * w
    out = np.empty_like(residual)
    for n in range(N):
        for c in range(C):
            out[n, c] = residual[n, c] + (acc[n, c] + shared[n, c])
    return out


def _intrinsics():
    """Three float32 LLVM operations numba kernels call as functions: `fma(a, b, c)` (a * b + c rounded
    once: vfmadd), `rint(x)` (to nearest, ties to even) and `as_float(bits)` (an int32's bits as a
    float32); each one instruction where the CPU has it, vectorised with the loop around it."""
    if numba is None:  # pragma: no cover
        return None, None, None
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    f32 = types.float32

    def _declared(builder, name: str, n: int):
        return cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.FloatType(), [ir.FloatType()] * n), name
        )

    @intrinsic
    def fma(typingctx, a, b, c):
        def codegen(context, builder, sig, args):
            return builder.call(_declared(builder, "llvm.fma.f32", 3), args)

        return f32(f32, f32, f32), codegen

    @intrinsic
    def rint(typingctx, x):
        def codegen(context, builder, sig, args):
            return builder.call(_declared(builder, "llvm.rint.f32", 1), args)

        return f32(f32), codegen

    @intrinsic
    def as_float(typingctx, bits):
        def codegen(context, builder, sig, args):
            return builder.bitcast(args[0], ir.FloatType())

        return f32(types.int32), codegen

    return fma, rint, as_float


_fma, _rint, _as_float = _intrinsics()


@jit
def _silu_mul(gate_up):
    """F.silu(gate) * up for gate_up [n, 2I] (gate, then up), float32, bit for bit torch's: torch's CPU SiLU
    is x / (1 + exp(-x)) with SLEEF's expf_u10 (ATen's Vectorized<float>::exp, with FMA on AVX2 and
    AVX-512), which this follows step for step (round, two-part ln 2 reduction, the degree-5 polynomial
    by fused multiply-adds, the two-factor ldexp, the range cut-offs). Where torch runs another exp (a
    build without FMA, the scalar tail of a row shorter than a vector, aarch64), the two may differ in
    the last bit of a few values (tests/kernels/test_cpu_kernels.py measures it here)."""
    n, I = gate_up.shape[0], gate_up.shape[1] // 2
    out = np.empty((n, I), np.float32)
    ex = np.empty(I, np.float32)  # exp(-gate) of one row: the loops apart, so that each vectorises
    for r in range(n):
        row = gate_up[r]
        for i in range(I):
            d = -row[i]
            q = _rint(min(max(d, np.float32(-105.0)), np.float32(101.0)) * np.float32(1.442695040888963407359924681))
            s = _fma(q, np.float32(-0.693145751953125), d)
            s = _fma(q, np.float32(-1.428606765330187045e-06), s)
            u = np.float32(0.000198527617612853646278381)
            u = _fma(u, s, np.float32(0.00139304355252534151077271))
            u = _fma(u, s, np.float32(0.00833336077630519866943359))
            u = _fma(u, s, np.float32(0.0416664853692054748535156))
            u = _fma(u, s, np.float32(0.166666671633720397949219))
            u = _fma(u, s, np.float32(0.5))
            u = np.float32(1.0) + _fma(s * s, u, s)
            k = np.int32(q)
            h = k >> 1
            u = u * _as_float((h + np.int32(127)) << 23) * _as_float((k - h + np.int32(127)) << 23)
            u = np.float32(0.0) if d < np.float32(-104.0) else u
            ex[i] = np.float32(np.inf) if d > np.float32(100.0) else u
        for i in range(I):
            out[r, i] = row[i] / (np.float32(1.0) + ex[i]) * row[I + i]
    return out


@jit
def _mlp(fn, x, attn, w_dense, w_post, eps, w_router, bias, n_group, topk_group, top_k, scale, normalise, shared,
         gate_up, down, norm):  # fmt: skip
    x = x.copy()
    _gemm(fn, attn, w_dense, x, 1.0)  # the output projection, the residual its accumulator (torch.addmm's)
    h = _rms_norm(x, w_post, eps)
    N = x.shape[0]
    if top_k == 0:  # a dense MLP: its down projection with the residual as accumulator
        ids = np.empty((N, 0), np.int64)
        out = x.copy()
        _gemm(fn, _silu_mul(_grouped_gemm(fn, h, gate_up, np.full(1, N, np.int32))), down[0], out, 1.0)
    else:
        logits = np.empty((N, w_router.shape[1]), np.float32)
        _gemm(fn, h, w_router, logits, 0.0)
        ids, xs, token_of, w_sorted, ends = _route(logits, bias, n_group, topk_group, top_k, scale, normalise, h,
                                                   shared)  # fmt: skip
        y = _grouped_gemm(fn, _silu_mul(_grouped_gemm(fn, xs, gate_up, ends)), down, ends)
        routed = token_of.shape[0]
        out = _combine(y[:routed], token_of, w_sorted, y[routed:] if shared else np.zeros_like(x), x)
    if norm.shape[0] == 0:
        return out, out[:0], ids
    return out, _rms_norm(out, norm, eps), ids


def mlp(x, attn, w_dense, w_post, eps: float, gate_up, down, router: tuple, norm=None):
    """The rest of a layer after its attention, numpy float32 throughout: x [N, C] (the residual stream)
    plus attn [N, H * D] @ w_dense [H * D, C] (torch.addmm's); that RMS-normed by w_post [C]; then the MLP,
    SwiGLU's by groups of rows, each group by its gate_up [G, C, 2I] and down [G, I, C]. `router` (its
    weight [C, E], expert bias [E], n_group, topk_group, top_k, scale, normalise, shared: whether the last
    group is a shared expert) makes a sparse MoE: the routing and the grouping by expert (_route), each
    routed row's output times its weight summed per token (Experts.sparse's multiply and index_add: the
    same sums in the same order), then the shared expert's (SparseMoE's add) and the residual;
    `dense_router(C)` a dense MLP, one group, the residual its down GEMM's accumulator (torch.addmm's). Returns (the layer's
    output [N, C], that output RMS-normed by `norm` [C] (the next layer's input norm or the final one;
    None without one), the expert ids [N, A])."""
    weight = np.empty(0, np.float32) if norm is None else norm
    out, normed, ids = _mlp(_sgemm(), x, attn, w_dense, w_post, eps, *router, gate_up, down, weight)
    return out, (None if norm is None else normed), ids


@jit
def _mlp_attend(fn, x, attn, w_dense, w_post, eps, w_router, bias, n_group, topk_group, top_k, scale, normalise,
                shared, gate_up, down, norm, w_qkv, wq, wk, eps_next, cos, sin, H, K, B, pool_k, pool_v, writes,
                reads):  # fmt: skip
    out, normed, ids = _mlp(fn, x, attn, w_dense, w_post, eps, w_router, bias, n_group, topk_group, top_k, scale,
                            normalise, shared, gate_up, down, norm)  # fmt: skip
    q, keys, values = _attend(fn, normed, w_qkv, wq, wk, eps_next, cos, sin, H, K, B, pool_k, pool_v, writes, reads)
    return out, ids, q, keys, values


def mlp_attend(x, attn, w_dense, w_post, eps: float, gate_up, down, router: tuple, norm, w_qkv, wq, wk, eps_next: float, cos,
               sin, H: int, K: int, B: int, pool_k=None, pool_v=None, writes=None, reads=None):  # fmt: skip
    """`mlp` (its output normed by the next layer's input norm `norm`), then the next layer's `attend` on
    those rows, in one kernel call: returns (the layer's output [N, C], the expert ids [N, A], the next
    layer's (q, keys, values)). Between two attentions a step thus calls one kernel."""
    pools = _no_pools(K, wq.shape[0]) if pool_k is None else (pool_k, pool_v, writes, reads)
    out, ids, q, keys, values = _mlp_attend(_sgemm(), x, attn, w_dense, w_post, eps, *router, gate_up, down, norm, w_qkv,
                                            wq, wk, eps_next, cos, sin, H, K, B, *pools)  # fmt: skip
    return out, ids, _shaped(q, keys, values, B, H, K, wq.shape[0])


def dense_router(C: int) -> tuple:
    """mlp's router arguments for a dense MLP of width C: top_k 0, and a weight laid out as a router's
    (the transpose of a contiguous [E, C]), so both kinds of layer share one compiled kernel."""
    return np.zeros((2, C), np.float32).T, np.zeros(2, np.float32), 1, 1, 0, 1.0, False, False


NOTICE_AFTER = 1.0  # seconds of warm-up before it is said to be compiling (loading cached kernels is quicker)
COMPILING = "compiling the CPU kernels: once on this machine, seconds (numba keeps them on disk)"


def warm_up(run) -> None:
    """Calls `run` under inference_mode: work that calls kernels with the types a step passes (cpu_runner.prepare's
    one-token forward of the model; cpu_step.warm_up's tiny step). The first process on a machine compiles
    them (seconds; numba caches the result on disk), later ones load them, so the cost falls in a load (a
    server is still "loading" then), not in a first answer. A load that compiles says so while it waits
    (a first `llada-lsp complete` would sit silent otherwise). Kernels that do not compile on this machine
    turn the CPU kernels off (backend.give_up): the torch paths run."""
    started = time.perf_counter()
    notice = threading.Timer(NOTICE_AFTER, log.warning, (COMPILING,))
    notice.daemon = True
    notice.start()
    try:
        with torch.inference_mode():
            run()
    except Exception as err:  # numba's compiler failed here (a toolchain or cache problem): not the model's
        backend.give_up(err)
        return
    finally:
        notice.cancel()
    seconds = time.perf_counter() - started
    if seconds > 1.0:
        log.info("compiled the CPU kernels in %.1f s (once on this machine: numba keeps them on disk)", seconds)
