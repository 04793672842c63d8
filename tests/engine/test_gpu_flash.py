"""flash-attn's varlen kernel in the batched step: rows whose queries are their active block see every
key of their prefix, so they need no mask; the step packs the real queries and each row's keys [0, end)
and calls flash_attn_varlen_func. On the CPU the packing is checked against SDPA with a plain-PyTorch
stand-in for the kernel; with CUDA and flash-attn, the real kernel against SDPA (part of the device run)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from llada_lsp import load_model
from llada_lsp.engine.cache import BlockCache
from llada_lsp.model import llada2


@pytest.fixture(scope="module", autouse=True)
def one_thread(one_thread_per_module):
    """One torch thread for the module (conftest.torch_threads says why)."""


def varlen_reference(q, k, v, cu_q, cu_k, max_q, max_k, causal=False):
    """flash_attn_varlen_func's definition: row b's queries q[cu_q[b]:cu_q[b+1]] attend to all of its
    keys k[cu_k[b]:cu_k[b+1]] (grouped-query heads), no mask."""
    assert not causal
    out = []
    for b in range(len(cu_q) - 1):
        qs, ks, vs = (t[lo:hi].transpose(0, 1)[None] for t, lo, hi in
                      ((q, cu_q[b], cu_q[b + 1]), (k, cu_k[b], cu_k[b + 1]), (v, cu_k[b], cu_k[b + 1])))  # fmt: skip
        assert qs.shape[2] <= max_q and ks.shape[2] <= max_k
        out.append(F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True)[0].transpose(0, 1))
    return torch.cat(out)


def batched_logits(model, device, dtype):
    """One batched forward over 4 rows of different lengths (one-block queries, a padded row) through
    the engine's paged view -> (logits [4, 32, V], whether the view took the varlen layout)."""
    bs = 32
    cache = BlockCache(model.config, 64, bs, device, dtype)
    rows, width = [], bs
    ends = [96, 64, 128, 40]  # the last row: its block is 8 queries into block 1 (prompt tail), left padded
    starts = [64, 32, 96, 32]
    torch.manual_seed(0)
    pages = [cache.allocate(-(-e // bs)) for e in ends]
    for r, (p, start, end) in enumerate(zip(pages, starts, ends)):
        ids = torch.randint(0, 500, (1, start), device=device)
        model(ids, kv=cache.view([(p, 0, start)], start), last_n=0)  # the cached prefix
        rows.append((p, start, end))
    ids = torch.randint(0, 500, (4, width), device=device)
    view = cache.view(rows, width)
    return model(ids, kv=view, last_n=bs), view.packed is not None


def test_the_varlen_layout_attends_as_the_padded_one(golden_dir, monkeypatch):
    model = load_model(golden_dir, device="cpu", dtype=torch.float64)
    padded, took = batched_logits(model, "cpu", torch.float64)
    assert took  # the view builds the layout whenever no row needs a mask
    monkeypatch.setattr(llada2, "flash_available", lambda device, dtype: True)
    monkeypatch.setattr(llada2, "flash_attn_varlen_func", varlen_reference)
    calls = []
    monkeypatch.setattr(llada2, "flash_attn_func", lambda *a, **k: calls.append(1))  # the padded fast path: unused
    varlen, _ = batched_logits(model, "cpu", torch.float64)
    assert not calls
    real = [slice(None), slice(None), slice(None), slice(32 - 8, None)]  # row 3's first 24 queries are padding
    for r, rows in enumerate(real):
        torch.testing.assert_close(varlen[r, rows], padded[r, rows], atol=1e-9, rtol=1e-9)


def test_the_engine_steps_a_batch_through_the_varlen_layout(golden_dir, cases, monkeypatch):
    """Four golden sequences served together: the same drafts through the varlen layout as through the
    padded one, and the varlen kernel really ran (steps that refresh a block keep the padded path)."""
    from llada_lsp import Engine

    model = load_model(golden_dir, device="cpu", dtype=torch.float64)

    def serve():
        engine = Engine(model, max_batch=4)
        for case in list(cases.values())[:4]:
            settings = engine.settings(case["prompt_ids"], case["gen_length"], "quality",
                                       mask_id=case["mask_token_id"], eos_id=case["eos_token_id"])  # fmt: skip
            engine.scheduler.add(settings)
        return [(e.id, e.draft.block_tokens) for e in engine.scheduler.drain() if e.draft is not None]

    padded = serve()
    calls = []
    monkeypatch.setattr(llada2, "flash_available", lambda device, dtype: True)
    monkeypatch.setattr(llada2, "flash_attn_varlen_func", lambda *a, **k: calls.append(1) or varlen_reference(*a, **k))
    monkeypatch.setattr(llada2, "flash_attn_func", lambda q, k, v, causal: F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True).transpose(1, 2))  # fmt: skip
    assert serve() == padded
    assert calls


@pytest.mark.skipif(not torch.cuda.is_available(), reason="flash-attn's kernel runs on CUDA only (device run)")
@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is None, reason="flash-attn is not installed")
def test_flash_attn_varlen_matches_sdpa_on_cuda(golden_dir, monkeypatch):
    model = load_model(golden_dir, device="cuda", dtype=torch.bfloat16)
    flash, took = batched_logits(model, "cuda", torch.bfloat16)
    assert took and llada2.flash_available(torch.device("cuda"), torch.bfloat16)
    monkeypatch.setattr(llada2, "flash_available", lambda device, dtype: False)
    sdpa, _ = batched_logits(model, "cuda", torch.bfloat16)
    for r in range(3):
        torch.testing.assert_close(flash[r].float(), sdpa[r].float(), atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(flash[3, 24:].float(), sdpa[3, 24:].float(), atol=3e-2, rtol=3e-2)
