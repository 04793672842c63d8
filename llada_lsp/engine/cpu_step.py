"""CPU kernels (numba) for the engine's work around a denoising step's forward: the step's slot tables
and mask, the step rule's argmax from its chunk maxima, and the joint-threshold decisions packed as the
scheduler reads them. At a step's sizes each replaces a dozen torch ops that cost more to dispatch
than to compute.

Their references are the engine's torch paths (cache.device_tables; policy.first_max and the mask
search of _cpu_guesses; policy.packed_decisions), which stay the path on every other device;
tests/engine/test_cpu_step.py holds these to them. The tables run where `host_enabled(rows)` says so, the
rule where `cpu.enabled(logits)` does (both read llada_lsp/kernel_backend.py's one decision). Bulk passes over
the logits stay in torch (see kernels/cpu.py). The layouts are step_layout.py's. Knows nothing of
sequences, the cache's pages or the model.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import kernel_backend as backend
from ..kernels import cpu
from ..kernels.cpu import jit
from .step_layout import (
    CONFIDENCE,
    CONFIDENCE_SCALE,
    EDITED,
    FILLED,
    FINITE,
    FROZEN,
    MASK,
    OUTSIDE,
    TOKENS,
    Decisions,
    Ints,
)


def host_enabled(t: torch.Tensor) -> bool:
    """Whether the host kernels (integer work, no activations) run for t: a CPU tensor, numba present,
    not under torch.compile, where the backend runs the CPU kernels (the decision cpu.enabled reads)."""
    return backend.current().cpu and t.device.type == "cpu" and not torch.compiler.is_compiling()


# --- the step's slot tables ---------------------------------------------------------------------------


@jit
def _tables_kernel(rows, width, bs, scratch, positions, writes, reads, real, allow):  # allow [0, ...]: visible
    B, S = reads.shape
    for b in range(B):
        start, end = rows[b, 0], rows[b, 1]
        for k in range(S):
            reads[b, k] = rows[b, 2 + k // bs] * bs + k % bs
        for t in range(width):
            p = end - width + t  # right-aligned queries; left padding sits at 0 and writes to scratch
            pad = p < start
            if pad:
                p = 0
            positions[b, t] = p
            writes[b * width + t] = scratch * bs if pad else reads[b, p]
            real[b, t] = not pad
            if allow.shape[0]:  # keys up to the end of the query's block, and before the row's end
                seen = min(end, (p // bs + 1) * bs)
                allow[b, 0, t, :seen] = True
                allow[b, 0, t, seen:] = False


def paged_tables(rows: np.ndarray, width: int, S: int, bs: int, visible: bool, scratch: int):
    """cache.paged_tables from the rows on the host (numpy int64, row_descriptor's layout; `scratch` the
    scratch page): the same tensors as cache.device_tables', made in one kernel call."""
    B = rows.shape[0]
    positions, writes = np.empty((B, width), dtype=np.int64), np.empty(B * width, dtype=np.int64)
    reads, real = np.empty((B, S), dtype=np.int64), np.empty((B, width), dtype=np.bool_)
    allow = np.empty((0 if visible else B, 1, width, S), dtype=np.bool_)
    _tables_kernel(rows, width, bs, scratch, positions, writes, reads, real, allow)
    return (torch.from_numpy(positions), torch.from_numpy(writes), torch.from_numpy(reads),
            None if visible else torch.from_numpy(allow), torch.from_numpy(real))  # fmt: skip


# --- the step rule's argmax -------------------------------------------------------------------------


@jit
def _row_first_max(x, lo, hi, skip):  # -> (value, index): x[lo:hi]'s max, NaN first, ties to the first
    best, at = x[lo], lo
    if lo == skip:
        best = -np.inf
    if best != best:
        return best, at
    for i in range(lo + 1, hi):
        v = -np.inf if i == skip else x[i]
        if v != v:  # NaN: the largest, and the first one wins
            return v, i
        if v > best:
            best, at = v, i
    return best, at


@jit
def _first_max_kernel(logits, chunk_max, chunk, masks, per, top, token, shift):
    """logits [R, V]; chunk_max [R, V / chunk] their chunks' amax; masks[r // per]: row r's mask id ->
    top, token [R]: the row's first maximum, the mask excluded (searched again where it was the first
    maximum), top +inf where the row's max is +inf (its confidence is NaN, as the reference's);
    shift [R]: the logsumexp's shift (the row's max where finite, 0 where infinite, NaN)."""
    R, V = logits.shape
    for r in range(R):
        row = logits[r]
        best, c = _row_first_max(chunk_max[r], 0, chunk_max.shape[1], -1)
        at = _row_first_max(row, c * chunk, (c + 1) * chunk, -1)[1]  # NaN: the chunk's first NaN, the row's
        value = best
        shift[r] = best if best != np.inf and best != -np.inf else 0.0  # NaN stays NaN
        mask = masks[r // per]
        if at == mask:  # the mask is the row's first maximum: its best other id over the whole row
            other, at = _row_first_max(row, 0, V, mask)
            if best != np.inf:
                value = other
        top[r], token[r] = value, at


def guesses(logits: torch.Tensor, mask_id: int | torch.Tensor | np.ndarray,
            overwrite: bool = False) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """logits [..., V] float32 contiguous -> (confidence, token) [...] as numpy arrays: policy.step_guesses
    (the mask id, one or one per row of a [B, N, V] batch, kept out of the argmax; the confidence over
    the whole row, bit for bit). Torch makes the passes over the logits (the chunks' amax, then the
    logsumexp as torch's own: shift, exp, sum, log, add) and the confidence's exp; one kernel call finds
    each row's first maximum from its chunks' amax. `overwrite`: the logits are the caller's to lose
    (left as their exponentials): the shift and exp run in place, one [..., V] buffer less to write."""
    V = logits.shape[-1]
    lead = logits.shape[:-1]
    rows = logits.numpy().reshape(-1, V)
    R = rows.shape[0]
    chunk = next((c for c in (128, 64, 32) if V % c == 0 and c < V), V)  # policy.first_max's chunks
    chunk_max = np.empty((R, V // chunk), dtype=rows.dtype)
    torch.amax(logits.view(R, V // chunk, chunk), -1, out=torch.from_numpy(chunk_max))
    masks = np.asarray(mask_id.numpy() if isinstance(mask_id, torch.Tensor) else mask_id, dtype=np.int64).reshape(-1)
    top, shift = np.empty((*lead, 1), dtype=rows.dtype), np.empty((*lead, 1), dtype=rows.dtype)
    token = np.empty(lead, dtype=np.int64)
    _first_max_kernel(rows, chunk_max, chunk, masks, max(1, R // masks.shape[0]), top.reshape(R), token.reshape(R),
                      shift.reshape(R))  # fmt: skip
    shift_t = torch.from_numpy(shift)
    shifted = logits.sub_(shift_t) if overwrite else torch.sub(logits, shift_t)
    total = shifted.exp_().sum(-1, keepdim=True).log_().add_(shift_t)  # [..., 1]
    torch.from_numpy(top).sub_(total).exp_()  # top becomes the confidence, in place
    return top.reshape(lead), token


# --- the joint-threshold decisions ------------------------------------------------------------------


@jit
def _decisions_kernel(ids, head, conf, argmax, limits, vocab, scale, out, masked):
    """ids [B, D]: each row's last D query ids; head [B, HEAD]: Ints' head (FROZEN, MASK, OUTSIDE read); conf [B, D] float32 and argmax [B, D]: the rule's guesses; limits [B, 2] float32 (threshold,
    editing); scale float32 -> out [B, 4D + 1] (tokens, filled, edited, confidence * scale, all finite),
    masked [B, D]. Returns, per row, whether its fallback fill needs torch.topk's tie order (no mask
    above the threshold, and its best masks tied or one NaN): such a row's fallback is the caller's."""
    B, D = ids.shape
    pending = np.zeros(B, dtype=np.bool_)
    for b in range(B):
        frozen_n, mask, outside = head[b, FROZEN], head[b, MASK], head[b, OUTSIDE]
        fill_above, edit_above = limits[b, 0], limits[b, 1]
        finite, any_filled, has_nan = 1, False, False
        best, best_at, tied = np.float32(-1.0), -1, False
        for d in range(D):
            slot = d - outside
            token = ids[b, d]
            if slot < 0 and token == mask:  # not the row's own: never a mask, so no rule reaches it
                token = (mask + 1) % vocab
            c = conf[b, d]
            is_mask = token == mask
            masked[b, d] = is_mask
            filled = is_mask and c > fill_above
            edited = not is_mask and slot >= 0 and slot >= frozen_n and argmax[b, d] != token and c > edit_above
            any_filled = any_filled or filled
            if is_mask:
                if c != c:
                    has_nan = True
                elif c == best:
                    tied = True
                elif c > best:
                    best, best_at, tied = c, d, False
            out[b, TOKENS * D + d] = argmax[b, d] if filled or edited else token
            out[b, FILLED * D + d] = filled
            out[b, EDITED * D + d] = edited
            if not np.isfinite(c) and slot >= 0:
                finite = 0
            # nan_to_num(0), clamp(0, 1), times the scale: float32 all through, as torch rounds it
            if c != c or c < np.float32(0.0):
                c = np.float32(0.0)
            elif c > np.float32(1.0):
                c = np.float32(1.0)
            out[b, CONFIDENCE * D + d] = np.int64(c * scale)
        out[b, FINITE * D] = finite
        if any_filled:
            continue
        if tied or has_nan:  # torch.topk's order decides among them
            pending[b] = True
        elif best_at >= 0:  # the single most confident mask
            out[b, TOKENS * D + best_at] = argmax[b, best_at]
            out[b, FILLED * D + best_at] = 1
    return pending


def packed_decisions(ints: torch.Tensor, layout: Ints, D: int, logits: torch.Tensor, limits: torch.Tensor,
                     vocab: int) -> torch.Tensor:  # fmt: skip
    """policy.packed_decisions on the CPU: the same Decisions rows [B, 4D + 1] int64 (`ints` and `limits`
    in step_layout's layouts, logits [B, D, V] float32 contiguous, overwritten: the step reads them no more),
    from `guesses` and one kernel call. A row whose fallback fill is a tie (or NaN) takes torch.topk's
    choice, as the generic rule does."""
    host = ints.numpy()
    ids, head = layout.decided_ids(host, D), layout.head(host)
    conf, argmax = guesses(logits, head[:, MASK], overwrite=True)  # [B, D] each
    out = np.empty((ids.shape[0], Decisions.width(D)), dtype=np.int64)
    masked = np.empty(ids.shape, dtype=np.bool_)
    pending = _decisions_kernel(ids, head, conf, argmax, limits.numpy(), vocab, np.float32(CONFIDENCE_SCALE), out,
                                masked)  # fmt: skip
    if pending.any():  # rare: exact ties (or NaN) among a row's best masks
        keyed = torch.from_numpy(conf).masked_fill(~torch.from_numpy(masked), -1.0)
        best = keyed.topk(1, dim=-1).indices[:, 0].numpy()
        for b in np.flatnonzero(pending):
            out[b, TOKENS * D + best[b]] = argmax[b, best[b]]
            out[b, FILLED * D + best[b]] = 1
    return torch.from_numpy(out)


def warm_up() -> None:
    """Runs every kernel here once on tiny inputs of the types and layouts a step passes (one row and
    several), through cpu.warm_up: compiled or loaded when the scheduler starts on the CPU, not in a first
    answer; a failure turns every CPU kernel off."""
    if backend.current().cpu:
        cpu.warm_up(_tiny_steps)


def _tiny_steps() -> None:
    width, D, V = 4, 2, 64
    for B in (1, 2):  # one row's slices are contiguous, several rows' strided: a compile each
        layout = Ints(width)
        ints = torch.tensor([Ints.row([], width, 0, 0, -1, 0, [0, width, 0])] * B)
        for visible in (True, False):
            paged_tables(layout.descriptors(ints.numpy()), width, width, 4, visible, 0)
        logits = torch.zeros(B, D, V)
        packed_decisions(ints, layout, D, logits, torch.ones(B, 2), V)
        guesses(logits, torch.zeros(B, dtype=torch.int64))
    guesses(logits, 0)
