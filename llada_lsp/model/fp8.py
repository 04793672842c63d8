"""FP8 routed experts: float8_e4m3fn weights with one float32 scale per 128x128 tile, stored beside
them as `weight_scale_inv` (the DeepSeek-V3 layout: weight ~= fp8 * scale), and the matmul that uses
them with activations quantized per token at run time.

Plain tensors in, tensors out: knows nothing of checkpoint files, routing or decoding. Shape legend:
R rows (outputs), C columns (inputs), N tokens, Rt / Ct tiles of 128 rows / columns.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BLOCK = 128  # a weight scale covers a 128x128 tile; an activation scale 128 channels of one token
FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448
# config.json's key for a checkpoint whose routed experts are FP8 (the form SGLang and transformers read)
QUANTIZATION_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                       "weight_block_size": [BLOCK, BLOCK]}  # fmt: skip


def tiles(n: int) -> int:
    return -(-n // BLOCK)


def is_fp8(config) -> bool:
    """Whether a config (or config.json's dict) says its routed experts are FP8 in 128x128 blocks;
    ValueError for an FP8 scheme this network cannot run."""
    if isinstance(config, dict):
        raw = config.get("quantization_config")
    else:
        raw = getattr(config, "quantization_config", None)
    if not isinstance(raw, dict) or raw.get("quant_method") != "fp8":
        return False
    if list(raw.get("weight_block_size") or ()) != [BLOCK, BLOCK] or raw.get("fmt", "e4m3") != "e4m3":
        raise ValueError(f"quantization_config: {raw!r}: only e4m3 with 128x128 block scales is supported")
    return True


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., R, C] -> (fp8 [..., R, C], scale_inv [..., Rt, Ct] float32) with w ~= fp8 * scale per tile.
    A partial tile at the edge (R or C not a multiple of 128) has a scale of its own like any other."""
    R, C = w.shape[-2:]
    ct = torch.promote_types(w.dtype, torch.float32)
    padded = F.pad(w.to(ct), (0, tiles(C) * BLOCK - C, 0, tiles(R) * BLOCK - R))  # zeros never raise a max
    blocks = padded.unflatten(-1, (tiles(C), BLOCK)).unflatten(-3, (tiles(R), BLOCK))  # [..., Rt, 128, Ct, 128]
    amax = blocks.abs().amax(dim=(-3, -1))  # [..., Rt, Ct]
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))  # an all-zero tile stays zero
    q = (blocks / scale[..., :, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.flatten(-4, -3).flatten(-2, -1)[..., :R, :C].contiguous(), scale.to(torch.float32)


def dequantize(q: torch.Tensor, scale_inv: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp8 [..., R, C] and scale_inv [..., Rt, Ct] -> weights [..., R, C] in `dtype`."""
    R, C = q.shape[-2:]
    scale = scale_inv.repeat_interleave(BLOCK, -2)[..., :R, :].repeat_interleave(BLOCK, -1)[..., :C]
    return (q.to(torch.promote_types(dtype, torch.float32)) * scale).to(dtype)


def quantized_activations(x: torch.Tensor) -> torch.Tensor:
    """x [N, C] as an FP8 matmul sees it: each token's 128-channel groups in e4m3 with a scale of their
    own (per-token, DeepSeek-V3's 1x128), returned dequantized in x's dtype."""
    N, C = x.shape
    ct = torch.promote_types(x.dtype, torch.float32)
    groups = F.pad(x.to(ct), (0, tiles(C) * BLOCK - C)).view(N, tiles(C), BLOCK)  # [N, Ct, 128]
    amax = groups.abs().amax(-1, keepdim=True)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (groups / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return (q.to(ct) * scale).flatten(1)[:, :C].to(x.dtype)


def linear(x: torch.Tensor, q: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    """x [N, C] @ the FP8 weight q [R, C] (transposed) -> [N, R] in x's dtype: the numbers of an FP8
    matmul (per-token activation scales, 128x128 weight scales, wide accumulation), computed by
    dequantizing per block. Every device runs this reference; a fused FP8 kernel would replace it here."""
    return quantized_activations(x) @ dequantize(q, scale_inv, x.dtype).T
