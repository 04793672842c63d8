"""Our own golden for LLaDA2.2 (tests/golden/llada22-tiny: a tiny random checkpoint with block routing
and edit ids, traces written by make.py --traces from a float64 run): every case replayed in float64
and float32, token for token, step for step, block for block. No reference implementation of LLaDA2.2
exists to match, so these traces lock our decoder; tests/engine/test_policy_indel.py checks its rules by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from llada_lsp import load_model
from llada_lsp.engine.decode import Engine

HERE = Path(__file__).resolve().parents[1] / "golden" / "llada22-tiny"
CASES = json.loads((HERE / "generate.json").read_text())["cases"]
DELETE, SPLIT, MASK = 509, 510, 511


@pytest.fixture(scope="module", autouse=True)
def one_thread(one_thread_per_module):
    """One torch thread for the module (conftest.torch_threads says why)."""


@pytest.fixture(scope="module")
def models():
    return {dtype: load_model(HERE, device="cpu", dtype=dtype) for dtype in (torch.float64, torch.float32)}


def run(model, case, **engine):
    gen = Engine(model, **engine).generation(case["prompt"], case["gen_length"], case["preset"],
                                             max_post_steps=case["max_post_steps"])  # fmt: skip
    trace = [{"block": d.block, "block_tokens": d.block_tokens} for d in gen]
    return gen.result, trace


def test_the_traces_exercise_every_edit():
    """The golden is worth its name only if its runs delete, insert and end blocks both ways."""
    blocks = [s["block_tokens"] for c in CASES for s in c["trace"]]
    ends = {end for c in CASES for _, _, end in c["block_ends"]}
    assert ends == {"cleanup", "converged"}
    # an INSERT leaves a new mask inside the generated part; a DELETE pads: both show as a mask count
    # that does not fall from one step to the next within a block
    grew = sum(b.count(MASK) >= a.count(MASK) and a.count(MASK) for a, b in zip(blocks, blocks[1:]))
    assert grew > 0
    assert all(DELETE not in b and SPLIT not in b for b in blocks)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("i", range(len(CASES)))
def test_replay(models, dtype, i):
    case = CASES[i]
    result, trace = run(models[dtype], case)
    assert result.tokens == case["tokens"]
    assert not {DELETE, SPLIT} & set(result.tokens)
    assert result.steps == case["steps"] and result.refreshed_blocks == case["refreshed_blocks"]
    assert [[b.block, b.forwards, b.end] for b in result.blocks] == case["block_ends"]
    assert trace == case["trace"]


@pytest.mark.parametrize("i", range(len(CASES)))
def test_the_recompute_loop_gives_the_same_tokens(models, i):
    """Without the block cache every step recomputes the whole prefix: a block that changed on its
    last step can only be right in the cached engine if its K/V were run again before the next block."""
    case = CASES[i]
    result, trace = run(models[torch.float64], case, use_cache=False)
    assert result.tokens == case["tokens"] and trace == case["trace"]


def test_a_batch_decodes_each_row_as_alone(models):
    """Rows at different blocks and offsets in one forward (block routing per row, padding out, the
    rule applied per row) give each case's own trace."""
    model = models[torch.float64]
    engine = Engine(model, max_batch=8)
    scheduler = engine.scheduler
    ids = {}
    for i, case in enumerate(CASES):
        settings = engine.settings(
            case["prompt"], case["gen_length"], case["preset"], max_post_steps=case["max_post_steps"]
        )
        ids[scheduler.add(settings)] = i
    results, traces = {}, {i: [] for i in ids.values()}
    batched = 0
    while len(results) < len(CASES):
        events = scheduler.step()
        batched = max(batched, sum(e.draft is not None for e in events))
        for e in events:
            if e.draft is not None:
                traces[ids[e.id]].append({"block": e.draft.block, "block_tokens": e.draft.block_tokens})
            if e.result is not None:
                results[ids[e.id]] = e.result
    assert batched > 1
    for i, case in enumerate(CASES):
        assert results[i].tokens == case["tokens"], i
        assert traces[i] == case["trace"], i


def test_a_draft_and_a_constrained_first_token_decode_alike_with_and_without_the_cache(models, monkeypatch):
    """A rewrite's draft (init_ids: the model's own answer to case 2, so it keeps most of it) and token
    healing's first_allowed under the InDel rule: the first generated position keeps its constraint,
    the cached engine, the recompute loop and one block per forward (no draft lookahead) agree, and
    no edit id comes out. (Block 1 here ends in a cleanup that changes it, which the next block's
    lookahead step must not build on: the recompute loop once did.)"""
    from llada_lsp.engine import sequence

    model, case = models[torch.float64], CASES[2]
    prompt, draft = case["prompt"], case["tokens"][:30]  # fills block 1's generated part and more
    outs, steps = [], []
    for lookahead, use_cache in ((sequence.DRAFT_LOOKAHEAD, True), (sequence.DRAFT_LOOKAHEAD, False), (1, True)):
        monkeypatch.setattr(sequence, "DRAFT_LOOKAHEAD", lookahead)
        gen = Engine(model, use_cache=use_cache).generation(prompt, 56, "speed", init_ids=draft,
                                                            first_allowed=[draft[0], 30])  # fmt: skip
        drafts = list(gen)
        outs.append(gen.result.tokens)
        steps.append(gen.result.steps)
        assert gen.result.tokens[0] in (draft[0], 30)
        assert all(DELETE not in d.generated and SPLIT not in d.generated for d in drafts)
    assert outs[0] == outs[1] == outs[2]
    assert steps[0] == steps[1] <= steps[2]


def test_make_rebuilds_these_exact_weights():
    """The checkpoint is data made by a script: the script must still make it, bit for bit."""
    import importlib.util

    from safetensors.torch import load_file

    from llada_lsp.model.loader import to_checkpoint_names

    spec = importlib.util.spec_from_file_location("make_llada22_tiny", HERE / "make.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    built = to_checkpoint_names(make.build().state_dict())
    stored = load_file(HERE / "model.safetensors")
    assert built.keys() == stored.keys()
    assert all(torch.equal(built[k], stored[k]) for k in stored)
    assert json.loads((HERE / "config.json").read_text()).items() >= make.CONFIG.items()
