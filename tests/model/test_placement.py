"""A model split over several devices (load_model's `devices`): contiguous layer ranges from the memory
plan, one hand-off of the activations per boundary, each layer's K/V pages beside it, and not one token
changed. Two or five `cpu` slots run the hand-off code for real on a machine without GPUs."""

from __future__ import annotations

import pytest
import torch
from conftest import SAMPLE, settings_of  # the golden sample: every kind of setting

from llada_lsp import CheckpointError, Engine, load_model
from llada_lsp.errors import DoesNotFit
from llada_lsp.model import llada2, plan
from llada_lsp.model.plan import make_plan


@pytest.fixture(scope="module", autouse=True)
def one_thread(one_thread_per_module):
    """One torch thread for the module (conftest.torch_threads says why)."""


@pytest.fixture(scope="module")
def split(golden_dir):
    return load_model(golden_dir, devices=["cpu", "cpu"], dtype=torch.float64)


@pytest.fixture
def hand_offs(monkeypatch) -> list[int]:
    """How many tensors each hand-off moved, one entry per hand-off."""
    seen: list[int] = []
    real = llada2.hand_off

    def counting(device, *tensors):
        seen.append(len(tensors))
        return real(device, *tensors)

    monkeypatch.setattr(llada2, "hand_off", counting)
    return seen


def run(model, case):
    engine = Engine(model)
    gen = engine.start(settings_of(engine, case))
    drafts = [(d.block, d.block_tokens) for d in gen]
    return engine, gen.result, drafts


def test_the_split_follows_the_plan(golden_dir, split):
    plan = make_plan(golden_dir, ["cpu", "cpu"], [10**12], dtype="float64", context=None)
    first, last = plan.devices
    assert first.layers and last.layers and first.layers[-1] + 1 == last.layers[0]
    assert split.hops == {last.layers[0]: torch.device("cpu")}
    assert split.layer_devices == [torch.device("cpu")] * 3


@pytest.mark.parametrize("case_id", SAMPLE)
def test_two_slots_give_the_unsplit_tokens(model64, split, cases, hand_offs, case_id):
    case = cases[case_id]
    _, expected, expected_drafts = run(model64, case)
    assert hand_offs == []  # one device: no hand-off
    forwards = []
    hook = split.register_forward_pre_hook(lambda *_: forwards.append(1))
    try:
        engine, result, drafts = run(split, case)
    finally:
        hook.remove()
    assert result.tokens == expected.tokens == case["output_ids"]
    assert (result.steps, drafts) == (expected.steps, expected_drafts)
    assert len(hand_offs) == len(forwards) > 0 and set(hand_offs) == {4}  # x, cos, sin, mask: once a forward
    assert isinstance(engine.cache.k, list) and len(engine.cache.k) == 3  # a page pool per layer


def test_batched_decoding_across_the_split(split, golden_generate):
    """All 22 cases as one batch on the split model: the reference's tokens, as on one device."""
    cases = golden_generate["cases"]
    engine = Engine(split, max_batch=len(cases))
    scheduler, names, results = engine.scheduler, {}, {}
    for case in cases:
        names[scheduler.add(settings_of(engine, case))] = case["id"]
    while not scheduler.idle():
        for event in scheduler.step():
            if event.result is not None:
                results[names[event.id]] = event.result
    assert scheduler.stats.batch_max == len(cases)
    for case in cases:
        assert results[case["id"]].tokens == case["output_ids"], case["id"]


def test_more_devices_than_layers_hand_off_before_the_head(golden_dir, cases, hand_offs):
    """Five slots for embedding, 3 layers and head: a hop before every layer and before the head."""
    model = load_model(golden_dir, devices=["cpu"] * 5, dtype=torch.float64)
    assert sorted(model.hops) == [0, 1, 2, 3]
    case = cases["A06_P32_G64_speed"]
    _, result, _ = run(model, case)
    assert result.tokens == case["output_ids"]
    assert 1 in hand_offs  # the hop before the head carries the activations alone


def test_device_and_devices_together_are_refused(golden_dir):
    with pytest.raises(CheckpointError, match="device or devices"):
        load_model(golden_dir, device="cpu", devices=["cpu", "cpu"])


def test_the_plan_of_a_split_load_is_checked_per_device(monkeypatch):
    """Each device must hold its share (the embedded model needs ~40 MB in float32; two devices of
    15 MB cannot hold it), refused before a single tensor is read."""
    monkeypatch.setattr(plan, "free_memory", lambda device: 15 * 10**6)
    asked = []
    with pytest.raises(DoesNotFit) as refused:
        load_model(None, devices=["cpu", "cpu"], dtype="float32", cancelled=lambda: asked.append(1) or False)
    assert asked == [] and "does not fit: cpu needs" in refused.value.reason
    assert refused.value.table.splitlines()[-1].split()[1:] in (["NO", "NO"], ["NO", "yes"], ["yes", "NO"])
