"""The CPU step's trimmed model ops against the plain formulas they replace, bit for bit: RMSNorm through
torch's kernel, q and k normed and rotated together, in float32, float64 and bfloat16."""

from __future__ import annotations

import pytest
import torch

from llada_lsp.model.llada2 import RMSNorm, apply_rope, compute_dtype, rms_norm, rope_cos_sin


def composite_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as first written: widened, normalised, narrowed, weighted."""
    h = x.to(compute_dtype(x.dtype))
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_rms_norm_is_the_composite_bit_for_bit(dtype):
    gen = torch.Generator().manual_seed(0)
    for scale in (1e-3, 1.0, 1e3):
        x = (torch.randn(2, 32, 6, 64, generator=gen) * scale).to(dtype)
        w = torch.randn(64, generator=gen).to(dtype)
        per_head = torch.randn(6, 64, generator=gen).to(dtype)
        assert torch.equal(rms_norm(x, w, 1e-6), composite_norm(x, w, 1e-6))
        assert torch.equal(rms_norm(x, per_head, 1e-6), composite_norm(x, per_head, 1e-6))
        norm = RMSNorm(64, 1e-6).to(dtype)
        norm.weight.data.copy_(w)
        assert torch.equal(norm(x), composite_norm(x, w, 1e-6))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_attention_norms_and_rotates_q_and_k_as_separate_heads_would(dtype):
    from llada_lsp.model import LLaDA2Config
    from llada_lsp.model.llada2 import Attention

    torch.manual_seed(0)
    config = LLaDA2Config(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                          num_hidden_layers=2, vocab_size=512, max_position_embeddings=512)  # fmt: skip
    attention = Attention(config, 0).to(dtype)
    for norm in (attention.query_layernorm, attention.key_layernorm):
        norm.weight.data.normal_()  # two different weights: a head must take its own
    x = torch.randn(1, 32, 256).to(dtype)
    cos, sin = rope_cos_sin(torch.arange(64, 96), config.rotary_dim, config.rope_theta, dtype)
    with torch.inference_mode():
        got = attention(x, cos, sin, None, None)
        qkv = attention.query_key_value(x).view(1, 32, 8, 64)
        q, k, v = qkv.split([4, 2, 2], dim=2)
        q = apply_rope(composite_norm(q, attention.query_layernorm.weight, 1e-6).transpose(1, 2), cos, sin)
        k = apply_rope(composite_norm(k, attention.key_layernorm.weight, 1e-6).transpose(1, 2), cos, sin)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v.transpose(1, 2), enable_gqa=True)
        want = attention.dense(out.transpose(1, 2).reshape(1, 32, -1))
    assert torch.equal(got, want)
