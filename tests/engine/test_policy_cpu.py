"""The CPU step rule (policy._cpu_guesses: no copy of float32 logits, the mask kept out of the argmax
without rewriting the row) against the rule as written first (policy._reference_guesses): the same
tokens and bit-identical confidences, ties, NaN and +-inf included, in float32, float64 and bfloat16."""

from __future__ import annotations

import pytest
import torch

from llada_lsp.engine.policy import _cpu_guesses, _reference_guesses, first_max, joint_threshold

M = 5  # the mask id of these tests


def same(logits: torch.Tensor, mask_id) -> None:
    fast_conf, fast_token = _cpu_guesses(logits, mask_id)
    ref_conf, ref_token = _reference_guesses(logits, mask_id, renormalised=False)
    assert fast_token.tolist() == ref_token.tolist()
    assert fast_conf.dtype == ref_conf.dtype
    # bit for bit: NaN where the reference has NaN, the same float everywhere else
    assert torch.equal(fast_conf.isnan(), ref_conf.isnan())
    assert torch.equal(fast_conf.nan_to_num(-7.0), ref_conf.nan_to_num(-7.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("seed", range(4))
def test_random_blocks_match_the_reference_bit_for_bit(dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(3, 32, 8192, generator=gen) * 4).to(dtype)
    logits[0, :8, M] = 50.0  # the mask is these rows' clear favourite
    same(logits, M)
    same(logits, torch.tensor([M, M + 1, M]))  # one mask id per row


def test_a_mask_that_wins_gives_the_best_other_id_first_on_ties():
    logits = torch.zeros(2, 4, 16)
    logits[:, :, M] = 3.0
    logits[:, :, 9] = logits[:, :, 2] = 2.0  # tied second best: the first id, 2, wins
    logits[1, 1, M - 1] = 3.0  # tied with the mask, before it: the first maximum is not the mask
    logits[1, 2, M + 1] = 3.0  # tied with the mask, after it: the mask is the first maximum
    conf, token = _cpu_guesses(logits, M)
    assert token.tolist() == [[2, 2, 2, 2], [2, M - 1, M + 1, 2]]
    same(logits, M)
    same(logits, torch.tensor([M, 2]))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("where", [0, M, 15])
def test_non_finite_logits_match_the_reference(value, where):
    logits = torch.randn(2, 3, 16, dtype=torch.float64)
    logits[0, 1, where] = value
    logits[1, 2, :] = float("-inf")  # a row with nothing at all
    same(logits, M)
    same(logits, torch.tensor([M, 0]))


def test_float32_logits_are_read_in_place():
    """No float copy of logits that are float32 already: the pass allocates [rows] tensors and one
    shifted copy for the exponentials, never a second [rows, V] one."""
    logits = torch.randn(1, 32, 8192)
    before = logits.clone()
    _cpu_guesses(logits, M)
    assert torch.equal(logits, before)  # the mask's logit is not rewritten either


def test_the_step_rule_decides_as_the_reference_does():
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(2, 32, 512, generator=gen) * 3
    tokens = torch.where(torch.rand(2, 32, generator=gen) < 0.5, M, torch.randint(0, 512, (2, 32), generator=gen))
    frozen = torch.zeros(2, 32, dtype=torch.bool)
    update = joint_threshold(tokens, logits, frozen, torch.tensor([M, M]), [0.5, 0.9], [0.0, 0.5])
    conf, argmax = _reference_guesses(logits, torch.tensor([M, M]), renormalised=False)
    assert torch.equal(update.confidence, conf)
    masked = tokens == M
    assert torch.equal(update.tokens[update.filled], argmax[update.filled]) and not (update.filled & ~masked).any()


@pytest.mark.parametrize("V", [8192, 16, 100, 37])
def test_first_max_is_torch_max_first_index_nan_first(V):
    """first_max's two-level search against torch's max over the row: ties to the first index, a NaN
    wins (the first one), +-inf and rows of one value included; V not a multiple of a chunk falls back."""
    gen = torch.Generator().manual_seed(V)
    x = torch.randint(-3, 4, (6, 5, V), generator=gen).double()  # many exact ties
    x[0, 0] = 2.0
    x[1, 1, V // 2] = float("nan")
    x[1, 1, V - 1] = float("nan")
    x[2, 2, 3] = float("inf")
    x[2, 3, :] = float("-inf")
    x[3, 4, -1] = 9.0
    top, index = first_max(x)
    want_top, want_index = x.max(-1)
    assert torch.equal(index, want_index) and torch.equal(top.nan_to_num(-7.0), want_top.nan_to_num(-7.0))
