"""LLaDA2.2's block routing against the report's equation (eq. 1), written here in a few lines of plain
torch, independently of model/llada2.py: per block of 32 absolute positions, the `expert_capacity`
experts with the highest block score (the max over the block's tokens of the biased sigmoid score)
are admitted, each token takes its top-k among them, weights as in LLaDA2.1. Rows of a batch sit at
different block offsets with left padding, as the scheduler lays them out; every Experts path (dense,
sparse, the fused kernel's input, FP8) takes the same routing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llada_lsp import load_model
from llada_lsp.engine.cache import BlockCache
from llada_lsp.model import llada2
from llada_lsp.model.config import LLaDA2Config
from llada_lsp.model.llada2 import RoutingBlocks

TINY22 = Path(__file__).resolve().parents[1] / "golden" / "llada22-tiny"


@pytest.fixture(scope="module", autouse=True)
def one_thread(one_thread_per_module):
    """One torch thread for the module (conftest.torch_threads says why)."""


def reference_routing(x, positions, real, W, bias, capacity, top_k, scale, block=32):
    """x [N, C], positions [N], real [N] bool (one row) -> {token: {expert: weight}} for its real tokens."""
    s = torch.sigmoid(x.double() @ W.double().T)  # [N, E]
    biased = s + bias.double()
    out = {}
    for b in sorted({int(p) // block for p, r in zip(positions, real) if r}):
        members = [i for i in range(len(x)) if real[i] and int(positions[i]) // block == b]
        admitted = biased[members].max(0).values.topk(capacity).indices.tolist()
        for i in members:
            chosen = sorted(admitted, key=lambda e: -biased[i, e].item())[:top_k]
            w = s[i, chosen] / s[i, chosen].sum()
            out[i] = {e: scale * w[k].item() for k, e in enumerate(chosen)}
    return out


def routed(expert_ids, weights, rows):
    return {i: dict(zip(expert_ids[i].tolist(), weights[i].double().tolist())) for i in rows}


def assert_same_routing(got: dict, want: dict):
    assert got.keys() == want.keys()
    for i in want:
        assert got[i].keys() == want[i].keys(), f"token {i}: experts {sorted(got[i])} != {sorted(want[i])}"
        for e in want[i]:
            assert got[i][e] == pytest.approx(want[i][e], rel=1e-5)


def small_router(capacity=5, experts=16, top_k=3, hidden=24, seed=0, bias=0.3):
    config = LLaDA2Config(hidden_size=hidden, num_experts=experts, num_experts_per_tok=top_k, n_group=4, topk_group=2,
                          expert_capacity=capacity, block_size=32, vocab_size=600)  # fmt: skip
    router = llada2.Router(config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        router.weight.copy_(torch.randn(experts, hidden, generator=g))
        router.expert_bias.copy_(bias * torch.randn(experts, generator=g))
    return router, config


def test_a_block_admits_capacity_experts_and_tokens_choose_among_them():
    router, config = small_router()
    g = torch.Generator().manual_seed(1)
    # one row, 96 positions from 0: three whole blocks
    x = torch.randn(96, 24, generator=g)
    positions = torch.arange(96)
    ids, w = router(x, RoutingBlocks.of(positions, None, 1, 32))
    want = reference_routing(x, positions, [True] * 96, router.weight, router.expert_bias, 5, 3, 2.5)
    assert_same_routing(routed(ids, w, range(96)), want)
    per_block = [set(ids[b * 32 : (b + 1) * 32].flatten().tolist()) for b in range(3)]
    assert all(len(experts) <= 5 for experts in per_block)
    # without the block rule a token would pick experts outside its block's five: the rule is doing something
    free = (torch.sigmoid(x @ router.weight.T) + router.expert_bias).topk(3).indices
    assert any(not set(free[i].tolist()) <= per_block[i // 32] for i in range(96))


def test_rows_at_different_block_offsets_with_left_padding():
    """The scheduler's layout: queries right-aligned in a [B, T] tensor, padding on the left at position
    0, each row at its own absolute positions (a refresh of the previous block plus the active one, a
    single active block, a partial block at the start of a recompute). Padding joins no block."""
    router, _ = small_router(capacity=4, seed=3, bias=0.05)
    g = torch.Generator().manual_seed(4)
    T = 64
    spans = [(32, 96), (160, 192), (0, 64), (40, 64)]  # [start, end) per row
    positions = torch.zeros(len(spans), T, dtype=torch.long)
    real = torch.zeros(len(spans), T, dtype=torch.bool)
    for r, (a, b) in enumerate(spans):
        positions[r, T - (b - a) :] = torch.arange(a, b)
        real[r, T - (b - a) :] = True
    x = torch.randn(len(spans) * T, 24, generator=g) * 0.1  # scores near 0.5: no block saturates
    # padding that would win a place for the expert every block likes least, if it took part
    least = (torch.sigmoid(x @ router.weight.T) + router.expert_bias).amax(0).argmin()
    x[~real.flatten()] = 30 * router.weight[least].detach()
    ids, w = router(x, RoutingBlocks.of(positions, real, len(spans), 32))
    for r in range(len(spans)):
        rows = [r * T + i for i in range(T) if real[r, i]]
        want = reference_routing(x[rows], positions.flatten()[rows], [True] * len(rows), router.weight,
                                 router.expert_bias, 4, 3, 2.5)  # fmt: skip
        got = routed(ids, w, rows)
        assert_same_routing({k: got[rows[k]] for k in range(len(rows))}, want)


def test_a_batched_engine_forward_routes_each_row_as_alone(tmp_path):
    """End to end through the block cache's paged view: two rows at different offsets in one forward
    give the logits each row gets alone (padding in the shorter row changes no block's admitted set)."""
    model = load_model(TINY22, device="cpu", dtype=torch.float64)
    cache = BlockCache.for_budget(model.config, 8, 32, "cpu", torch.float64)
    g = torch.Generator().manual_seed(5)
    seqs = [torch.randint(0, 500, (96,), generator=g), torch.randint(0, 500, (64,), generator=g)]
    pages = [cache.allocate(3), cache.allocate(2)]
    alone = []
    for ids in seqs:  # reference: the whole sequence in one plain forward, block-causal
        alone.append(model(ids[None])[0])
    # prefill each row's first blocks, then one batched forward: row 0 its last 64 (two blocks), row 1 its last 32
    model(seqs[0][None, :32], kv=cache.view([(pages[0], 0, 32)], 32), last_n=0)
    model(seqs[1][None, :32], kv=cache.view([(pages[1], 0, 32)], 32), last_n=0)
    width = 64
    ids = torch.zeros(2, width, dtype=torch.long)
    ids[0] = seqs[0][32:96]
    ids[1, 32:] = seqs[1][32:64]
    view = cache.view([(pages[0], 32, 96), (pages[1], 32, 64)], width)
    assert view.real is not None and not view.real[1, :32].any()
    logits = model(ids, kv=view)
    torch.testing.assert_close(logits[0], alone[0][32:96], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(logits[1, 32:], alone[1][32:64], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("quantize", [None, "fp8"])
def test_every_experts_path_takes_the_reference_routing(quantize, monkeypatch):
    """The routing each Experts path receives (dense, sparse, and the fused kernel's input, recorded at
    kernels.moe), in bf16 and with FP8 experts, is the reference's for every MoE layer."""
    from llada_lsp import kernels

    model = load_model(TINY22, device="cpu", dtype=torch.float32, quantize=quantize)
    assert isinstance(model.model.layers[1].mlp.experts, llada2.FP8Experts) == (quantize == "fp8")
    g = torch.Generator().manual_seed(6)
    ids = torch.randint(0, 500, (1, 64), generator=g)
    inputs, seen = {}, {}
    for i, layer in enumerate(model.model.layers[1:], start=1):
        layer.mlp.register_forward_pre_hook(lambda m, a, i=i: inputs.__setitem__(i, a[0].reshape(-1, a[0].shape[-1])))
    for mode in ("dense", "sparse", "fused"):
        for layer in model.model.layers[1:]:
            experts = layer.mlp.experts
            layer.mlp.force = mode
            if mode != "fused":
                original = getattr(type(experts), mode)
                monkeypatch.setattr(experts, mode, lambda x, e, w, o=original, ex=experts, m=mode: (
                    seen.setdefault(m, []).append((e, w)) or o(ex, x, e, w)))  # fmt: skip
        if mode == "fused":  # no GPU here: record the kernel's input and let the sparse path compute
            monkeypatch.setattr(kernels, "moe", lambda x, e, w, *rest: seen.setdefault("fused", []).append((e, w)))
        model(ids)
    for mode in ("dense", "sparse", "fused"):
        # the fused run's fallback (no kernel here) records the sparse path once more: its first two calls
        for (e, w), i in zip(seen[mode][:2], (1, 2)):
            mlp = model.model.layers[i].mlp
            want = reference_routing(inputs[i], torch.arange(64), [True] * 64, mlp.gate.weight, mlp.gate.expert_bias,
                                     8, 4, 2.5)  # fmt: skip
            assert_same_routing(routed(e, w, range(64)), want)
    for layer in model.model.layers[1:]:
        layer.mlp.force = None
