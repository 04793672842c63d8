"""CPU kernels (numba) with plain-PyTorch references: the small ops around a CPU step's GEMMs fused
into one compiled loop each. At the embedded model's shapes (32 rows of 256) a torch op costs more to
dispatch than to compute, so a step is mostly overhead; each kernel here replaces several such ops.

`enabled(x)` is the one switch: float32 CPU tensors under no_grad / inference_mode (the engine's),
numba installed, not under torch.compile, unless LLADA_LSP_KERNELS=0. Everywhere else the model's
torch path runs. Bulk passes (the step rule's exponentials, SiLU) stay in torch: its vectorised math
library beats a numba loop.
Knows nothing of modules, checkpoints or decoding policy.
"""

from __future__ import annotations

import logging
import os
import time

import numpy as np
import torch

log = logging.getLogger(__name__)

numba = None  # LLADA_LSP_KERNELS=0 does not even import it: numba and its kernels take ~120 MiB
if os.environ.get("LLADA_LSP_KERNELS", "1") != "0":
    try:
        import numba
    except ImportError:  # pragma: no cover - numba is a dependency; a platform without its wheels runs torch
        pass

# Read once: the switch is asked on every step, and reading the environment there costs a step ~1%.
ON = numba is not None


def enabled(x: torch.Tensor) -> bool:
    """Whether the CPU kernels run for activations x: float32 on the CPU, no autograd recording, numba
    installed and LLADA_LSP_KERNELS not 0 when the process started (tests flip `ON`)."""
    return (
        ON
        and x.dtype is torch.float32
        and x.device.type == "cpu"
        and not (torch.is_grad_enabled() or torch.compiler.is_compiling())
    )


def array(t: torch.Tensor):
    """A tensor's numpy view (no copy) for a kernel's argument."""
    return t.detach().numpy()


tensor = torch.from_numpy  # a kernel's result (allocated in the kernel: one call less per output)


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
    return tensor(_rms_norm(array(x).reshape(-1, x.shape[-1]), array(weight), eps)).view(x.shape)


# --- attention: q/k norm and RoPE, the paged cache's write and gather -------------------------------


@jit(reduce=True)
def _qk_norm_rope(qkv, w, eps, cos, sin, heads):  # qkv [N, >= heads, D]; w [heads, D]; cos/sin [P, R]
    N, _, D = qkv.shape
    P, R = cos.shape
    half = R // 2
    t = np.empty(D, np.float32)
    for n in range(N):
        c, s_ = cos[n % P], sin[n % P]
        for h in range(heads):
            v = qkv[n, h]
            ss = np.float32(0.0)
            for d in range(D):
                ss += v[d] * v[d]
            r = np.float32(1.0) / np.sqrt(ss / np.float32(D) + np.float32(eps))
            for d in range(D):
                t[d] = v[d] * r * w[h, d]
            for d in range(half):  # x1 * cos + x2 * sin, sin's first half holding the minus
                v[d] = t[d] * c[d] + t[d + half] * s_[d]
                v[d + half] = t[d + half] * c[d + half] + t[d] * s_[d + half]
            for d in range(R, D):
                v[d] = t[d]


def qk_norm_rope_(qkv: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """In place on qkv [B, T, heads + K, D] (contiguous): the first `heads` = weight.shape[0] heads (the
    queries', then the keys') RMS-normed over D by their row of weight [heads, D] and rotated by
    cos / sin ([T, R], or [B, 1, T, R]: rope_cos_sin's tables); the values untouched. The reference:
    llada2.rms_norm then llada2.apply_rope."""
    B, T, _, D = qkv.shape
    R = cos.shape[-1]
    _qk_norm_rope(array(qkv).reshape(B * T, -1, D), array(weight), eps, array(cos).reshape(-1, R),
                  array(sin).reshape(-1, R), weight.shape[0])  # fmt: skip


@jit
def _attention_in(qkv, w, eps, cos, sin, K, pool_k, pool_v, writes, reads):
    N, heads, D = qkv.shape
    _qk_norm_rope(qkv, w, eps, cos, sin, w.shape[0])
    # rows of K * D floats: the pools [slots, K * D], this forward's rows [N, heads * D]
    KD, at = K * D, (heads - 2 * K) * D
    rows, pk, pv = qkv.reshape(N, heads * D), pool_k.reshape(-1, KD), pool_v.reshape(-1, KD)
    for n in range(N):  # this forward's keys and values into their slots
        slot = writes[n]
        for j in range(KD):
            pk[slot, j] = rows[n, at + j]
            pv[slot, j] = rows[n, at + KD + j]
    keys = np.empty((reads.shape[0], KD), np.float32)
    values = np.empty((reads.shape[0], KD), np.float32)
    for i in range(reads.shape[0]):  # then every visible key and value, gathered
        slot = reads[i]
        for j in range(KD):
            keys[i, j] = pk[slot, j]
            values[i, j] = pv[slot, j]
    return keys, values


def attention_in(qkv: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor,
                 pool_k: torch.Tensor, pool_v: torch.Tensor, writes: torch.Tensor,
                 reads: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """qk_norm_rope_ on qkv [B, T, H + 2K, D], then its keys and values written to their slots
    `writes` [B * T] of the pools [slots, K, D] and those at `reads` [B, S] gathered: returns (keys,
    values) [B, K, S, D] (views of [B, S, K, D]). The reference for the pools: engine/cache.py's
    PagedView.update (index_copy_, index_select)."""
    B, T, _, D = qkv.shape
    S, K, R = reads.shape[1], pool_k.shape[1], cos.shape[-1]
    keys, values = _attention_in(array(qkv).reshape(B * T, -1, D), array(weight), eps, array(cos).reshape(-1, R),
                                 array(sin).reshape(-1, R), K, array(pool_k), array(pool_v), array(writes),
                                 array(reads).reshape(-1))  # fmt: skip
    return tensor(keys).view(B, S, K, D).transpose(1, 2), tensor(values).view(B, S, K, D).transpose(1, 2)


# --- MoE: routing with the grouping by expert, the weighted sum -------------------------------------


@jit
def _route(logits, bias, n_group, topk_group, top_k, scale, normalise, x, shared):
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


def route(logits: torch.Tensor, bias: torch.Tensor, n_group: int, topk_group: int, top_k: int, scale: float,
          normalise: bool, x: torch.Tensor, shared: bool = False):  # fmt: skip
    """LLaDA2.1's group-limited top-k on the router's logits [N, E] (float32; their sigmoid scores it),
    then the tokens x [N, C] grouped by expert for grouped GEMMs. Returns (expert ids [N, top_k] int64,
    best first; xs [N * A, C] in expert order, each expert's rows in token order; token_of [N * A];
    each row's routing weight [N * A]; ends [E] int32, where each expert's rows end). With `shared`,
    xs ends with x itself, the shared expert's group (ends [E + 1]). The references: llada2.Router (the
    sigmoid, the group limit, topk, the normalisation, the scale: the same choice wherever no two
    scores tie within a rounding, the same weights within one) and Experts.sparse's stable argsort."""
    out = _route(array(logits), array(bias), n_group, topk_group, top_k, scale, normalise, array(x), shared)
    return tuple(tensor(a) for a in out)


@jit
def _combine(y, token_of, w_sorted, shared, residual, norm, eps):
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
    if norm.shape[0] == 0:
        return out, out[:0]
    return out, _rms_norm(out, norm, eps)


def combine(y: torch.Tensor, token_of: torch.Tensor, w_sorted: torch.Tensor, shared: torch.Tensor,
            residual: torch.Tensor, norm: torch.Tensor | None = None,
            eps: float = 0.0) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """residual + (routed + shared), each [N, C]: the routed sum is each expert row of y [N * A, C]
    times its weight, added to its token's row in the rows' order (Experts.sparse's multiply and
    index_add: the same sums in the same order), then SparseMoE's shared add and the layer's residual.
    With `norm` [C], also that sum RMS-normed by it (rms_norm: the next layer's input norm, or the
    final one), else None."""
    weight = array(norm) if norm is not None else np.empty(0, np.float32)
    out, normed = _combine(array(y), array(token_of), array(w_sorted), array(shared), array(residual), weight, eps)
    return tensor(out), (tensor(normed) if norm is not None else None)


def warm_up() -> None:
    """Runs every kernel once on tiny inputs of the types a step passes: the first process on a machine
    compiles them (seconds; numba caches the result on disk), later ones load them. cpu_layout calls
    it, so the cost falls in the model's load (a server is still "loading" then), not in a first answer.
    Kernels that do not compile on this machine turn the switch off (`give_up`): the torch path runs."""
    started = time.perf_counter()
    try:
        with torch.inference_mode():
            x, w = torch.ones(2, 4), torch.ones(4)
            rms_norm(x, w, 1e-6)
            qkv, weight, table = torch.ones(1, 2, 4, 4), torch.ones(2, 4), torch.ones(2, 2)
            qk_norm_rope_(qkv, weight, 1e-6, table, table)
            pool = torch.zeros(4, 1, 4)
            attention_in(qkv, weight, 1e-6, table, table, pool, pool.clone(), torch.arange(2), torch.arange(3)[None])
            for shared in (False, True):
                ids, xs, token_of, w_sorted, ends = route(
                    torch.ones(2, 4), torch.zeros(4), 2, 1, 2, 2.5, True, x, shared
                )
            combine(xs[: len(token_of)], token_of, w_sorted, x, x)
            combine(xs[: len(token_of)], token_of, w_sorted, x, x, w, 1e-6)
    except Exception as err:  # numba's compiler failed here (a toolchain or cache problem): not the model's
        give_up(err)
        return
    seconds = time.perf_counter() - started
    if seconds > 1.0:
        log.info("compiled the CPU kernels in %.1f s (once on this machine: numba keeps them on disk)", seconds)


def give_up(err: BaseException) -> None:
    """The CPU kernels off for the rest of the process (a warm-up failed: `err`), said once in the log."""
    global ON
    ON = False
    log.warning("the CPU kernels do not run here (%s: %s); the plain torch path runs instead", type(err).__name__,
                str(err).splitlines()[0] if str(err) else "")  # fmt: skip
