"""Engine behaviour beyond parity: prompt-block reuse across generations, cancellation within one
step, drafts that show the generation as it is refined, and the two MoE paths agreeing."""

from __future__ import annotations

import threading

import pytest
import torch

from llada_lsp import Engine, load_model


@pytest.fixture(scope="module", autouse=True)
def one_thread(one_thread_per_module):
    """One torch thread for the module (conftest.torch_threads says why)."""


@pytest.fixture(scope="module")
def model(golden_dir):
    return load_model(golden_dir, dtype="float64")


PROMPT = [(7 * i + 3) % 500 for i in range(70)]


def test_reused_prompt_blocks_give_identical_results(model):
    fresh = Engine(model).generation(PROMPT + [5, 9], 40, "quality", mask_id=511, eos_id=508).run()
    engine = Engine(model)
    engine.generation(PROMPT + [1, 2, 3], 40, "quality", mask_id=511, eos_id=508).run()
    again = engine.generation(PROMPT + [5, 9], 40, "quality", mask_id=511, eos_id=508).run()
    assert again.reused_tokens == 64 and again.prefill_forwards == 0  # two whole prompt blocks reused
    assert (again.tokens, again.steps) == (fresh.tokens, fresh.steps)


@pytest.mark.parametrize("at, reused", [(0, 0), (40, 32)])
def test_changed_prompt_block_is_recomputed(model, at, reused):
    """An edit inside a block invalidates that whole block (its earlier positions attended to the
    edited one), and everything after it; the blocks before it are reused."""
    engine = Engine(model)
    engine.generation(PROMPT, 40, "speed", mask_id=511, eos_id=508).run()
    edited = PROMPT[:at] + [PROMPT[at] + 1] + PROMPT[at + 1 :]
    r = engine.generation(edited, 40, "speed", mask_id=511, eos_id=508).run()
    assert r.reused_tokens == reused and r.prefill_forwards == 1
    fresh = Engine(model).generation(edited, 40, "speed", mask_id=511, eos_id=508).run()
    assert (r.tokens, r.steps) == (fresh.tokens, fresh.steps)


def test_an_accepted_completion_reuses_only_final_blocks(model):
    """The completion is accepted and the next request's prompt holds it. The last block's tokens
    changed on its last step, so its cached K/V are those of older tokens: it is recomputed."""
    engine = Engine(model)
    ready = threading.Event()
    ready.set()  # a request cancelled at once leaves a cache sized for 270 positions
    engine.generation(PROMPT, 200, "speed", mask_id=511, eos_id=508, cancel=ready).run()
    first = engine.generation(PROMPT[:64], 64, "speed", mask_id=511, eos_id=508).run()
    assert len(first.tokens) == 64 and first.blocks[-1].last_forward_changed_tokens
    accepted = PROMPT[:64] + first.tokens + [5]
    again = engine.generation(accepted, 40, "speed", mask_id=511, eos_id=508).run()
    assert again.reused_tokens == 96 and again.prefill_forwards == 1  # the prompt and the first block
    fresh = Engine(model).generation(accepted, 40, "speed", mask_id=511, eos_id=508).run()
    assert (again.tokens, again.steps) == (fresh.tokens, fresh.steps)


def test_cancel_stops_within_one_step(model):
    """A cancel set while the third draft is handled: no fourth forward runs."""
    cancel = threading.Event()
    gen = Engine(model).generation(PROMPT, 96, "strict", mask_id=511, eos_id=508, cancel=cancel)
    drafts = []
    for draft in gen:
        drafts.append(draft)
        if len(drafts) == 3:
            cancel.set()
    assert len(drafts) == 3 and gen.result.steps == 3 and gen.result.cancelled
    assert gen.result.blocks[-1].end == "cancelled"
    event = threading.Event()
    event.set()
    gen = Engine(model).generation(PROMPT, 96, "speed", mask_id=511, eos_id=508, cancel=event)
    assert list(gen) == [] and gen.result.steps == 0


def test_drafts_grow_into_the_result(model):
    gen = Engine(model).generation(PROMPT, 64, "quality", mask_id=511, eos_id=508)
    drafts = list(gen)
    assert [d.step for d in drafts] == list(range(1, len(drafts) + 1))
    masks = [d.generated.count(511) for d in drafts if d.block == drafts[0].block]
    assert masks[0] > 0 and masks[-1] == 0  # the first draft has holes, the block ends filled
    assert sum(len(d.filled) for d in drafts) >= len(gen.result.tokens)
    final = drafts[-1].generated[: len(gen.result.tokens)]
    assert final == gen.result.tokens


def test_dense_and_sparse_experts_agree(model):
    ids = torch.tensor([PROMPT[:40]])
    outs = []
    for mode in ("dense", "sparse"):
        for layer in model.model.layers:
            if hasattr(layer.mlp, "force"):
                layer.mlp.force = mode
        outs.append(model(ids))
    for layer in model.model.layers:
        if hasattr(layer.mlp, "force"):
            layer.mlp.force = None
    assert (outs[0] - outs[1]).abs().max() < 1e-10


def logits_row(probs: dict[int, float], V: int = 8) -> torch.Tensor:
    """Float64 logits whose softmax gives exactly `probs` (other ids: probability 0)."""
    row = torch.full((V,), float("-inf"), dtype=torch.float64)
    for token, p in probs.items():
        row[token] = torch.tensor(p, dtype=torch.float64).log()
    return row


def test_the_step_rule_at_its_boundaries():
    """One step of the joint-threshold rule on hand-made confidences (mask id 7): thresholds are
    strict, the fallback fills the single most confident mask, edits spare the prompt, a mask is never
    written. Parity data never sit on a boundary; these do."""
    from llada_lsp.engine.policy import JointThreshold

    M = 7
    rule = JointThreshold(threshold=0.5, editing_threshold=0.5)
    tokens = torch.tensor([M, M, 3, 3, 4])
    frozen = torch.tensor([False, False, False, False, True])
    logits = torch.stack([
        logits_row({1: 0.5, 2: 0.5}),  # mask at exactly the threshold: not filled
        logits_row({2: 0.75, 1: 0.25}),  # mask above it: filled
        logits_row({5: 0.5, 6: 0.5}),  # at exactly the editing threshold: not edited
        logits_row({5: 0.75, 3: 0.25}),  # above it: edited
        logits_row({6: 1.0}),  # a prompt position: never edited
    ])  # fmt: skip
    step = rule.step(tokens, logits, frozen, M)
    assert step.tokens.tolist() == [M, 2, 3, 5, 4]
    assert step.filled.tolist() == [False, True, False, False, False]
    assert step.edited.tolist() == [False, False, False, True, False]

    # No mask above the threshold: only the most confident mask is filled, whatever the filled
    # positions' confidences. Confidence leaves the mask id out: {M: .8, 4: .12, 5: .08} is 0.6 for 4.
    strict = JointThreshold(threshold=0.9, editing_threshold=0.9)
    tokens = torch.tensor([M, 3, M, M])
    logits = torch.stack([logits_row({1: 0.6, 2: 0.4}), logits_row({3: 1.0}), logits_row({2: 0.7, 1: 0.3}),
                          logits_row({M: 0.8, 4: 0.12, 5: 0.08})])  # fmt: skip
    step = strict.step(tokens, logits, torch.zeros(4, dtype=torch.bool), M)
    assert step.filled.tolist() == [False, False, True, False] and step.tokens.tolist() == [M, 3, 2, M]
    last = strict.step(torch.tensor([3, M]), logits[[1, 3]], torch.zeros(2, dtype=torch.bool), M)
    assert last.tokens.tolist() == [3, 4], "a mask is never written: 4 is the best real token"


def test_unknown_mode_is_refused(model):
    with pytest.raises(ValueError, match="unknown mode 'fast'"):
        Engine(model).generation(PROMPT, 8, "fast")


def test_first_allowed_holds_the_first_position_to_the_given_ids(model):
    free = Engine(model).generation(PROMPT, 40, "speed", mask_id=511, eos_id=508).run()
    allowed = [t for t in (17, 42, 99) if t != free.tokens[0]][:2]
    gen = Engine(model).generation(PROMPT, 40, "speed", mask_id=511, eos_id=508, first_allowed=allowed)
    firsts = [d.generated[0] for d in gen if d.generated[0] != 511]
    assert firsts and set(firsts) <= set(allowed)  # every draft, edits included
    assert gen.result.tokens[0] in allowed
    with pytest.raises(ValueError):
        Engine(model).generation(PROMPT, 40, "speed", mask_id=511, eos_id=508, first_allowed=[])
