"""Engine behaviour beyond parity: prompt-block reuse across generations, cancellation within one
step, drafts that show the generation as it is refined, and the two MoE paths agreeing."""

from __future__ import annotations

import threading

import pytest
import torch

from llada_lsp import Engine, load_model


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


def test_changed_prompt_block_is_recomputed(model):
    engine = Engine(model)
    engine.generation(PROMPT, 40, "speed", mask_id=511, eos_id=508).run()
    edited = [PROMPT[0] + 1] + PROMPT[1:]
    r = engine.generation(edited, 40, "speed", mask_id=511, eos_id=508).run()
    assert r.reused_tokens == 0 and r.prefill_forwards == 1
    assert r.tokens == Engine(model).generation(edited, 40, "speed", mask_id=511, eos_id=508).run().tokens


class CountingCancel:
    """Sets itself after `after` checks, and counts the checks made."""

    def __init__(self, after: int):
        self.after, self.checks = after, 0

    def is_set(self) -> bool:
        self.checks += 1
        return self.checks > self.after


def test_cancel_stops_within_one_step(model):
    cancel = CountingCancel(after=3)
    gen = Engine(model).generation(PROMPT, 96, "strict", mask_id=511, eos_id=508, cancel=cancel)
    drafts = list(gen)
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
