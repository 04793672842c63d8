"""The CPU step's trimmed model ops against the plain formulas they replace, bit for bit: RMSNorm through
torch's kernel, q and k normed and rotated together (in place, the sign in the sin table), in float32,
float64 and bfloat16; the CPU weight layout (transposed storage, gate and up joined for the runner) and
the grouped expert GEMMs against the plain layout and the per-expert loop; the attention mask made additive once."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from llada_lsp.model import cpu_runner, llada2
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
def test_attention_norms_and_rotates_q_and_k_as_separate_heads_would(dtype, monkeypatch):
    # the torch path, bit for bit (the numba kernel's numbers are held to it in tests/kernels/test_cpu_kernels.py)
    from llada_lsp import kernel_backend
    from llada_lsp.model import LLaDA2Config

    monkeypatch.setattr(kernel_backend, "_current", kernel_backend.Backend(False, "none", False, "forced"))
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_rope_is_the_textbook_rotation(dtype):
    """apply_rope (in place, rope_cos_sin's sin carrying the minus) against x1 cos - x2 sin, x2 cos + x1 sin
    on the first r dims, written out from the angles; the other dims untouched."""
    gen = torch.Generator().manual_seed(1)
    r, theta = 32, 600000.0
    positions = torch.arange(100, 132)
    x = torch.randn(1, 6, 32, 64, generator=gen).to(dtype)
    inv_freq = 1.0 / (theta ** (torch.arange(0, r, 2, dtype=compute_dtype(dtype)) / r))
    angles = positions.to(compute_dtype(dtype))[:, None] * inv_freq  # [T, r/2]
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    x1, x2 = x[..., : r // 2], x[..., r // 2 : r]
    want = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., r:]], dim=-1)
    got = apply_rope(x.clone(), *rope_cos_sin(positions, r, theta, dtype))
    assert torch.equal(got, want)


def plain_copy(model):
    """The model as built, before cpu_runner.prepare: every weight contiguous, no shared storage, no runner."""
    import copy

    plain = copy.deepcopy(model)
    for p in plain.parameters():
        p.data = p.data.contiguous()
    plain.runner = None  # the modules' own path
    return plain


def test_the_cpu_layout_keeps_every_weight_and_every_decision():
    """The embedded model loads with the CPU layout: the same tensors (names, shapes, values), logits within
    float32 rounding of the plain layout's through the modules, and the same tokens and steps from the engine."""
    from llada_lsp.engine import Engine
    from llada_lsp.model import load_model

    model = load_model(None, device="cpu", dtype=torch.float32)
    assert not model.lm_head.weight.is_contiguous() and model.lm_head.weight.T.is_contiguous()
    experts = model.model.layers[1].mlp.experts
    assert experts.w_gate.untyped_storage().data_ptr() == experts.w_up.untyped_storage().data_ptr()  # joined
    plain = plain_copy(model)
    for (name, a), (_, b) in zip(model.state_dict().items(), plain.state_dict().items()):
        assert a.shape == b.shape and torch.equal(a, b), name
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(8, 8184, (1, 96), generator=gen)
    with torch.inference_mode():
        # (the flat CPU layers' norms sum in another order than torch's: within 1e-4, not 1e-5)
        torch.testing.assert_close(model(ids), plain(ids), rtol=1e-4, atol=1e-4)
    for seed in range(3):
        prompt = torch.randint(8, 8184, (160,), generator=torch.Generator().manual_seed(seed)).tolist()
        got = Engine(model).generation(prompt_ids=prompt, gen_length=32, policy="speed").run()
        want = Engine(plain).generation(prompt_ids=prompt, gen_length=32, policy="speed").run()
        assert (got.tokens, got.steps) == (want.tokens, want.steps)


def test_grouped_experts_are_the_per_expert_loop_bit_for_bit(monkeypatch):
    """On the CPU in float32 the sparse MoE runs grouped GEMMs; the per-expert loop on the same weights gives
    the same numbers, with experts that take no token, one token, or all of them, on the weights as built
    and as cpu_runner.layout stores them (views of a joined storage)."""
    if llada2.GROUPED_MM is None:
        pytest.skip("this torch has no grouped_mm: the loop is the only path")
    torch.manual_seed(0)
    experts = llada2.Experts(8, 256, 192)
    for w in (experts.w_gate, experts.w_up, experts.w_down):
        torch.nn.init.normal_(w, std=0.05)
    model = torch.nn.Module()
    model.experts = experts
    x = torch.randn(40, 256)
    routings = [torch.randint(0, 8, (40, 2)), torch.zeros(40, 2, dtype=torch.long), torch.arange(80).view(40, 2) % 3]
    for laid_out in (False, True):
        if laid_out:
            cpu_runner.layout(model)
            assert not experts.w_gate.is_contiguous()
        for ids in routings:
            weights = torch.rand(40, 2)
            with torch.inference_mode():
                assert experts.groups(x)
                grouped = experts.sparse(x, ids, weights)
                with monkeypatch.context() as m:
                    m.setattr(experts, "groups", lambda x: False)
                    looped = experts.sparse(x, ids, weights)
            assert torch.equal(grouped, looped)
    assert not experts.groups(x)  # autograd records here: the differentiable loop
    with torch.inference_mode():
        assert not experts.groups(x.double())


def test_laid_out_modules_compute_as_built_and_train():
    """After cpu_runner.layout the modules multiply their parameters, views of the joined storage, as they
    would the weights as built (within float32 rounding), and a gradient reaches every one of them."""
    import copy

    torch.manual_seed(0)
    holder = torch.nn.Module()
    holder.mlp = llada2.MLP(64, 96)
    built = copy.deepcopy(holder)
    cpu_runner.layout(holder)
    mlp = holder.mlp
    assert not mlp.gate_proj.weight.is_contiguous()
    assert mlp.gate_proj.weight.untyped_storage().data_ptr() == mlp.up_proj.weight.untyped_storage().data_ptr()
    x = torch.randn(5, 64)
    with torch.inference_mode():
        torch.testing.assert_close(mlp(x), built.mlp(x), rtol=1e-6, atol=1e-6)
    mlp(x).square().sum().backward()
    built.mlp(x).square().sum().backward()
    for (name, p), q in zip(mlp.named_parameters(), built.mlp.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=name)
    wide = mlp.to(torch.float64)  # new storage: the plain modules still run, in float64
    with torch.inference_mode():
        torch.testing.assert_close(wide(x.double()), built.mlp.double()(x.double()), rtol=1e-12, atol=1e-12)


def test_qk_norm_weight_follows_the_norm_weights():
    from llada_lsp.model import LLaDA2Config
    from llada_lsp.model.llada2 import Attention

    config = LLaDA2Config(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                          num_hidden_layers=2, vocab_size=512, max_position_embeddings=512)  # fmt: skip
    attention = Attention(config, 0)
    with torch.no_grad():
        attention.key_layernorm.weight.fill_(3.0)
        again = attention.qk_norm_weight()
    assert torch.equal(again[:4], attention.query_layernorm.weight.expand(4, -1))
    assert torch.equal(again[4:], torch.full((2, 64), 3.0))


def test_additive_mask_is_the_same_attention():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 96, 64, generator=gen) for h in (4, 2, 2))
    allow = llada2.block_causal_mask(torch.arange(96), torch.arange(96), 32)
    allow[5] = False  # a query that sees nothing (a padding row)
    for dtype in (torch.float32, torch.float64):
        a, b, c = (t.to(dtype) for t in (q, k, v))
        want = F.scaled_dot_product_attention(a, b, c, attn_mask=allow, enable_gqa=True)
        got = F.scaled_dot_product_attention(a, b, c, attn_mask=llada2.additive_mask(allow, dtype), enable_gqa=True)
        assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0))


def test_a_saved_cpu_layout_model_loads_equal(tmp_path):
    from llada_lsp.model import load_model, save_model

    model = load_model(None, device="cpu", dtype=torch.float32)
    save_model(model, tmp_path, dtype=torch.float32)
    again = load_model(tmp_path, device="cpu", dtype=torch.float32)
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name
