"""The fused step rule: each row's softmax confidence and argmax in one pass over the vocabulary
(online max and sum of exponentials, no float32 [T, V] softmax), then the joint-threshold decisions.

Knows nothing of sequences, caches or presets: the engine's policy passes tensors and thresholds in and
wraps what comes out. Shape legend: B blocks, N positions per block, V vocabulary, R = B*N rows.
"""

from __future__ import annotations

import torch

from .launch import Launch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the launcher says so; the reference needs no triton
    triton = None


if triton is not None:

    @triton.jit
    def _row_confidence_kernel(logits_ptr, mask_id_ptr, conf_ptr, guess_ptr, V, N, stride_row,
                               BLOCK_V: tl.constexpr):  # fmt: skip
        """Row r of logits [R, V]: guess[r] = the greedy token, the row's mask id excluded (the first
        on a tie), conf[r] = its softmax probability over the whole row, the mask included (the
        reference's confidence). Each lane keeps its running max, sum of exp(l - max), best non-mask
        value and its first index; the lanes are merged once at the end."""
        row = tl.program_id(0)
        mask_id = tl.load(mask_id_ptr + row // N)
        base = logits_ptr + row.to(tl.int64) * stride_row
        lanes = tl.arange(0, BLOCK_V)
        m = tl.full((BLOCK_V,), float("-inf"), tl.float32)
        s = tl.zeros((BLOCK_V,), tl.float32)
        best = tl.full((BLOCK_V,), float("-inf"), tl.float32)
        first = tl.zeros((BLOCK_V,), tl.int32)
        for v0 in range(0, V, BLOCK_V):
            vs = v0 + lanes
            x = tl.load(base + vs, mask=vs < V, other=float("-inf")).to(tl.float32)
            bigger = x > m
            gap = x - tl.where(x == float("-inf"), 0.0, m)  # never (-inf) - (-inf): NaN, and a warning
            t = tl.exp(-tl.abs(gap))  # exp(m - x) when x is the new max, exp(x - m) otherwise: one exp
            s = tl.where(x == float("-inf"), s, tl.where(bigger, s * t + 1.0, s + t))
            m = tl.maximum(m, x)
            guess = tl.where(vs == mask_id, float("-inf"), x)
            first = tl.where(guess > best, vs, first)
            best = tl.maximum(best, guess)
        top = tl.max(m, axis=0)
        total = tl.sum(tl.where(m == float("-inf"), 0.0, s * tl.exp(m - top)), axis=0)
        winner = tl.max(best, axis=0)
        tl.store(conf_ptr + row, tl.exp(winner - top) / total)
        tl.store(guess_ptr + row, tl.min(tl.where(best == winner, first, V), axis=0).to(tl.int64))

    @triton.jit
    def _joint_threshold_kernel(
        conf_ptr, guess_ptr, tokens_ptr, frozen_ptr, mask_id_ptr, fill_ptr, edit_ptr,
        out_ptr, filled_ptr, edited_ptr, N, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        """Block b's decisions over its N positions (all [B, N] contiguous): fill the masks above the
        threshold, or else the single most confident mask; edit unfrozen tokens whose guess differs and
        beats the editing threshold."""
        b = tl.program_id(0)
        n = tl.arange(0, BLOCK_N)
        ok = n < N
        at = b * N + n
        conf = tl.load(conf_ptr + at, mask=ok, other=-1.0)
        guess = tl.load(guess_ptr + at, mask=ok, other=0)
        tokens = tl.load(tokens_ptr + at, mask=ok, other=0)
        frozen = tl.load(frozen_ptr + at, mask=ok, other=1) != 0
        masked = (tokens == tl.load(mask_id_ptr + b)) & ok
        filled = masked & (conf > tl.load(fill_ptr + b))
        best = tl.argmax(tl.where(masked, conf, -1.0), axis=0, tie_break_left=True)
        fallback = masked & (n == best)
        filled = tl.where(tl.max(filled.to(tl.int32), axis=0) > 0, filled, fallback)
        edited = ok & ~masked & ~frozen & (guess != tokens) & (conf > tl.load(edit_ptr + b))
        tl.store(out_ptr + at, tl.where(filled | edited, guess, tokens), mask=ok)
        tl.store(filled_ptr + at, filled.to(tl.int8), mask=ok)
        tl.store(edited_ptr + at, edited.to(tl.int8), mask=ok)


def row_confidence(logits: torch.Tensor, mask_ids: torch.Tensor, block_v: int | None = None):
    """logits [B, N, V] (float32/16, bfloat16), mask_ids [B] -> (conf [B, N] float32, guess [B, N]
    int64): the greedy token of each position, the mask excluded, and its softmax probability."""
    if triton is None:
        raise RuntimeError("row_confidence needs triton (pip install triton); row_confidence_reference needs none")
    B, N, V = logits.shape
    if logits.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"logits: {logits.dtype} is not float32, float16 or bfloat16")
    if mask_ids.shape != (B,):
        raise ValueError(f"mask_ids {tuple(mask_ids.shape)} must be [{B}]")
    rows = logits.reshape(B * N, V)
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    conf = torch.empty(B, N, dtype=torch.float32, device=logits.device)
    guess = torch.empty(B, N, dtype=torch.int64, device=logits.device)
    row_confidence_launch(rows, mask_ids.contiguous(), conf, guess, N, block_v).run()
    return conf, guess


def row_confidence_launch(rows, mask_ids, conf, guess, N: int, block_v: int | None = None) -> Launch:
    """The row kernel's grid and arguments, as row_confidence passes them (llada_lab/aot.py compiles the
    same): rows [R, V] with unit last stride, mask_ids [B], conf / guess [R]."""
    V = rows.shape[1]
    block_v = block_v or min(2048, triton.next_power_of_2(V))
    return Launch(_row_confidence_kernel, (rows.shape[0],), (rows, mask_ids, conf, guess, V, N, rows.stride(0)),
                  {"BLOCK_V": block_v, "num_warps": 8 if block_v >= 2048 else 4})  # fmt: skip


def decisions_launch(conf, guess, tokens, frozen, mask_ids, fill_above, edit_above, out, filled, edited) -> Launch:
    """The decisions kernel's grid and arguments: every [B, N] tensor contiguous, frozen int8,
    mask_ids int64 [B], the thresholds float32 [B]."""
    B, N = tokens.shape
    return Launch(_joint_threshold_kernel, (B,),
                  (conf, guess, tokens, frozen, mask_ids, fill_above, edit_above, out, filled, edited, N),
                  {"BLOCK_N": triton.next_power_of_2(max(N, 16))})  # fmt: skip


def joint_threshold_step(
    tokens: torch.Tensor,  # [B, N] int64
    logits: torch.Tensor,  # [B, N, V]
    frozen: torch.Tensor,  # [B, N] bool: prompt positions
    mask_ids: torch.Tensor,  # [B]
    thresholds: list[float] | torch.Tensor,  # one per block; a float32 tensor on the device for a CUDA graph
    editing: list[float] | torch.Tensor,  # one per block (inf: never edit)
    block_v: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step of the joint-threshold rule for every block -> (tokens, filled, edited, confidence)
    [B, N], the fields of the engine's StepUpdate; confidence is NaN in a row with a NaN or +inf logit.
    Two launches and no host sync."""
    B, N, _ = logits.shape
    if tokens.shape != (B, N) or frozen.shape != (B, N):
        raise ValueError(f"tokens {tuple(tokens.shape)} and frozen {tuple(frozen.shape)} must be [{B}, {N}]")
    if len(thresholds) != B or len(editing) != B:
        raise ValueError(f"one threshold and one editing threshold per block: {len(thresholds)} and {len(editing)}, "
                         f"for {B} blocks")  # fmt: skip
    device = logits.device
    conf, guess = row_confidence(logits, mask_ids, block_v)
    tokens = tokens.to(torch.int64).contiguous()
    out = torch.empty_like(tokens)
    filled = torch.empty(B, N, dtype=torch.int8, device=device)
    edited = torch.empty(B, N, dtype=torch.int8, device=device)
    fill_above, edit_above = (torch.as_tensor(t, dtype=torch.float32, device=device) for t in (thresholds, editing))
    decisions_launch(conf, guess, tokens, frozen.to(torch.int8).contiguous(), mask_ids.to(torch.int64).contiguous(),
                     fill_above, edit_above, out, filled, edited).run()  # fmt: skip
    return out, filled.bool(), edited.bool(), conf


def row_confidence_reference(logits: torch.Tensor, mask_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain-PyTorch definition (it materialises the [B, N, V] softmax the kernel avoids): the
    argmax without the mask, its probability with it."""
    B, N, _ = logits.shape
    probs = logits.float().softmax(-1)
    token = logits.float().scatter(-1, mask_ids.view(B, 1, 1).expand(B, N, 1), float("-inf")).argmax(-1)
    return probs.gather(-1, token[..., None])[..., 0], token


def joint_threshold_reference(tokens, logits, frozen, mask_ids, thresholds, editing):
    conf, guess = row_confidence_reference(logits, mask_ids)
    fill_above = torch.tensor(thresholds, device=conf.device)[:, None]
    edit_above = torch.tensor(editing, device=conf.device)[:, None]
    masked = tokens == mask_ids[:, None]
    filled = masked & (conf > fill_above)
    best = conf.masked_fill(~masked, -1.0).argmax(-1, keepdim=True)
    fallback = torch.zeros_like(masked).scatter_(1, best, True) & masked
    filled = torch.where(filled.any(-1, keepdim=True), filled, fallback)
    edited = ~masked & ~frozen & (guess != tokens) & (conf > edit_above)
    return torch.where(filled | edited, guess, tokens), filled, edited, conf
