"""Engine behaviour beyond parity (test_golden.py has that): prompt-block reuse across generations,
cancellation within one step, drafts that show the generation as it is refined, the two MoE paths
agreeing; the scheduler and the block cache: the prefix cache's verbs, eviction under a budget, the
bounded queue, priorities, aborts, and a pool that never moves."""

from __future__ import annotations

import threading

import pytest
import torch

from llada_lsp import Engine, load_model
from llada_lsp.engine import sequence
from llada_lsp.engine.cache import BlockCache, CacheFull
from llada_lsp.engine.policy import PRESETS
from llada_lsp.engine.scheduler import Scheduler
from llada_lsp.errors import Busy, TooLong


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
    # positions' confidences. The mask id is never the guess: {M: .8, 4: .12, 5: .08} guesses 4 at 0.12.
    strict = JointThreshold(threshold=0.9, editing_threshold=0.9)
    tokens = torch.tensor([M, 3, M, M])
    logits = torch.stack([logits_row({1: 0.6, 2: 0.4}), logits_row({3: 1.0}), logits_row({2: 0.7, 1: 0.3}),
                          logits_row({M: 0.8, 4: 0.12, 5: 0.08})])  # fmt: skip
    step = strict.step(tokens, logits, torch.zeros(4, dtype=torch.bool), M)
    assert step.filled.tolist() == [False, False, True, False] and step.tokens.tolist() == [M, 3, 2, M]
    last = strict.step(torch.tensor([3, M]), logits[[1, 3]], torch.zeros(2, dtype=torch.bool), M)
    assert last.tokens.tolist() == [3, 4], "a mask is never written: 4 is the best real token"


def test_confidence_is_the_reference_softmax_with_the_mask_in_it():
    """The reference's confidence is p(token) over the whole vocabulary, the mask included; the mask is
    only kept out of the argmax. Renormalising to p / (1 - p_mask) fills masks the reference would
    not: here position 0's guess 4 has p = 0.3 (0.75 renormalised) next to a 0.6 mask probability, so
    at threshold 0.5 only position 1 (p = 0.9) is filled."""
    from llada_lsp.engine.policy import JointThreshold, joint_threshold, step_guesses

    M = 7
    logits = torch.stack([logits_row({M: 0.6, 4: 0.3, 5: 0.1}), logits_row({2: 0.9, M: 0.1})])
    conf, token = step_guesses(logits, M)
    assert token.tolist() == [4, 2]  # never the mask, though it is position 0's most probable id
    torch.testing.assert_close(conf, torch.tensor([0.3, 0.9], dtype=conf.dtype))
    step = JointThreshold(threshold=0.5, editing_threshold=0.0).step(torch.tensor([M, M]), logits,
                                                                     torch.zeros(2, dtype=torch.bool), M)  # fmt: skip
    assert step.filled.tolist() == [False, True] and step.tokens.tolist() == [M, 2]

    # Exact fallback ties go where the reference's torch.topk puts them (on the CPU, not the first
    # index for a block of 32): every mask of this block has the same confidence, below the threshold.
    B, N = 1, 32
    tied = logits_row({1: 0.4, 2: 0.3, 3: 0.3}).expand(B, N, -1).clone()
    tokens = torch.full((B, N), M)
    update = joint_threshold(tokens, tied, torch.zeros(B, N, dtype=torch.bool), torch.tensor([M]), [0.9], [0.9])
    want = torch.full((B, N), 0.4, dtype=torch.float64).topk(1, dim=-1).indices
    assert update.filled.nonzero()[:, 1].tolist() == want[0].tolist()


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


def fixed_draft(model, prompt, gen_length):
    """A draft the model keeps: a result revised until checking it block by block changes nothing."""
    draft = Engine(model).generation(prompt, gen_length, "quality", mask_id=511, eos_id=508).run().tokens
    for _ in range(4):
        again = Engine(model).generation(prompt, gen_length, "quality", mask_id=511, eos_id=508, init_ids=draft)
        if again.run().tokens == draft:
            return draft
        draft = again.result.tokens
    raise AssertionError("no fixed draft")


def test_a_draft_the_model_keeps_is_checked_in_one_forward_across_its_blocks(model, monkeypatch):
    """A warm start whose draft spans blocks: while a block is mask-free, the forward also runs the
    next drafted block's first step (Sequence.ahead), so a kept draft costs one forward, not one per
    block, and ends as checking it block by block ends; a draft the model changes ends the same too."""
    prompt = PROMPT + [5, 9]  # 72 positions: the 56 generated ones fill blocks 2 and 3 exactly
    draft = fixed_draft(model, prompt, 56)
    changed = draft[:20] + [(t + 1) % 500 for t in draft[20:40]] + draft[40:]

    def run(init_ids, lookahead):
        monkeypatch.setattr(sequence, "DRAFT_LOOKAHEAD", lookahead)
        gen = Engine(model).generation(prompt, 56, "quality", mask_id=511, eos_id=508, init_ids=init_ids)
        drafts = [(d.block, d.generated) for d in gen]
        return gen.result, drafts

    stepwise, _ = run(draft, 1)
    ahead, drafts = run(draft, 4)
    assert (stepwise.steps, ahead.steps) == (2, 1)
    assert ahead.tokens == stepwise.tokens == draft and drafts == [(3, draft)]
    assert [(b.block, b.forwards, b.end) for b in ahead.blocks] == [(2, 1, "converged"), (3, 1, "converged")]
    stepwise, _ = run(changed, 1)
    ahead, _ = run(changed, 4)
    assert ahead.tokens == stepwise.tokens != changed and ahead.steps <= stepwise.steps


def test_a_draft_checked_ahead_batches_with_a_cold_start(model):
    """One forward holds a row deciding two blocks and a row deciding one: each gets the drafts it
    gets alone (the shorter row's extra positions are frozen and dropped)."""
    prompt = PROMPT + [5, 9]
    draft = fixed_draft(model, prompt, 56)

    def events(engine, which):
        ids = {}
        if "warm" in which:
            ids[engine.scheduler.add(engine.settings(prompt, 56, "quality", 16, False, 511, 508, init_ids=draft))] = (
                "warm"
            )
        if "cold" in which:
            ids[engine.scheduler.add(settings(engine, PROMPT[:50], 40, "quality"))] = "cold"
        out = {name: [] for name in which}
        for event in engine.scheduler.drain():
            out[ids[event.id]].append(event.draft.generated if event.draft else event.result.tokens)
        return out

    together = events(Engine(model), ("warm", "cold"))
    assert together["warm"] == events(Engine(model), ("warm",))["warm"] and len(together["warm"]) == 2
    assert together["cold"] == events(Engine(model), ("cold",))["cold"]


# --- the scheduler and the block cache ---------------------------------------------------------------
def settings(engine, prompt=PROMPT, gen_length=40, mode="speed", priority=0):
    return engine.settings(prompt, gen_length, PRESETS[mode], 16, False, 511, 508, priority=priority)


def drain(scheduler) -> dict:
    """Steps until idle; per sequence id its end event, and the order in which they ended."""
    ends = {}
    while not scheduler.idle():
        for event in scheduler.step():
            if event.draft is None:
                ends[event.id] = event
    return ends


def block(i):
    return tuple(range(32 * i, 32 * i + 32))


def test_cache_verbs_share_reference_and_evict_least_recently_used(model):
    cache = BlockCache(model.config, pages=6, block_size=32, device="cpu", dtype=torch.float64)
    assert (cache.free, cache.used) == (5, 0)
    a = cache.allocate(2)
    n0, taken = cache.commit(None, block(0), a[0])
    n1, _ = cache.commit(n0, block(1), a[1])
    assert taken and cache.cached == 2
    cache.release([n0, n1])  # the sequence leaves; its blocks stay cached
    assert cache.evictable() == 2 and cache.free == 3
    found = cache.match([block(0), block(1), block(5)])
    assert found == [n0, n1] and cache.stats.hit_rate == 2 / 3
    assert cache.evictable() == 0  # in use: never evicted
    with pytest.raises(CacheFull):
        cache.allocate(4)
    assert cache.free == 3  # a failed allocation takes nothing
    cache.release(found)
    b = cache.allocate(1)
    m0, _ = cache.commit(None, block(7), b[0])
    cache.release([m0])
    cache.match([block(7)])  # block 7 used last: blocks 1 then 0 go first
    cache.release([m0])
    assert cache.evict(1) == 1 and cache.match([block(0), block(1)]) == [n0]
    cache.release([n0])  # block 0 is now the more recent: block 7 goes
    assert cache.allocate(4) and cache.match([block(0)]) == [n0] and cache.match([block(7)]) == []
    assert cache.stats.evictions == 2


def test_a_second_prompt_with_the_same_leading_blocks_reuses_them(model):
    engine = Engine(model)
    first = engine.generation(PROMPT, 40, "speed", mask_id=511, eos_id=508).run()
    other = PROMPT[:64] + [9, 9, 9]  # another document with the same first two blocks
    second = engine.generation(other, 40, "quality", mask_id=511, eos_id=508).run()
    assert (first.reused_tokens, second.reused_tokens, second.prefill_forwards) == (0, 64, 0)
    off = Engine(model, prefix_cache=False)
    off.generation(PROMPT, 40, "speed", mask_id=511, eos_id=508).run()
    cold = off.generation(other, 40, "quality", mask_id=511, eos_id=508).run()
    assert (cold.reused_tokens, cold.prefill_forwards) == (0, 1)
    assert (second.tokens, second.steps) == (cold.tokens, cold.steps)
    assert off.cache.cached == 0 and off.cache.used == 0  # nothing kept, every page back


def test_a_small_budget_evicts_and_still_gives_the_same_results(model):
    """A pool just big enough for one sequence of the model's length: each new prompt evicts the last."""
    engine = Engine(model, cache_mb=0)
    assert engine.cache.pages == 512 // 32 + 1
    fresh = Engine(model).generation(PROMPT, 40, "speed", mask_id=511, eos_id=508).run()
    for n in range(3):
        prompt = [n] * 300 + PROMPT
        engine.generation(prompt, 40, "speed", mask_id=511, eos_id=508).run()
    r = engine.generation(PROMPT, 40, "speed", mask_id=511, eos_id=508).run()
    assert engine.cache.stats.evictions > 0
    assert (r.tokens, r.steps) == (fresh.tokens, fresh.steps)


def test_the_queue_is_bounded(model):
    engine = Engine(model, max_batch=1, max_queue=2)
    scheduler = engine.scheduler
    scheduler.add(settings(engine))
    scheduler.add(settings(engine))
    with pytest.raises(Busy, match="busy"):
        scheduler.add(settings(engine))
    scheduler.step()  # one is admitted: room for one more
    scheduler.add(settings(engine))
    assert len(drain(scheduler)) == 3


def test_inline_completions_go_ahead_of_rewrites(model):
    engine = Engine(model, max_batch=1)
    scheduler = engine.scheduler
    rewrite = scheduler.add(settings(engine, gen_length=8, priority=1))
    inline = scheduler.add(settings(engine, gen_length=8, priority=0))
    ends = list(drain(scheduler))
    assert ends == [inline, rewrite]


def test_an_abort_stops_a_sequence_before_its_next_forward(model):
    engine = Engine(model, max_batch=4)
    scheduler = engine.scheduler
    a = scheduler.add(settings(engine, gen_length=96, mode="strict"))
    b = scheduler.add(settings(engine, gen_length=96, mode="strict"))
    waiting = scheduler.add(settings(engine, priority=1))
    scheduler.step()
    scheduler.abort(a)
    events = scheduler.step()
    assert [e.id for e in events if e.draft is not None] == [b, waiting]
    assert [e.id for e in events if e.result is not None] == [a]
    assert next(e for e in events if e.id == a).result.cancelled
    scheduler.abort(b)
    scheduler.abort(waiting)
    ends = drain(scheduler)
    assert set(ends) == {b, waiting} and all(e.result.cancelled for e in ends.values())
    assert engine.cache.used == engine.cache.cached  # every private page came back


def test_the_pool_is_allocated_once(model):
    engine = Engine(model, max_batch=4)
    k, v = engine.cache.k, engine.cache.v
    scheduler = engine.scheduler
    for n in range(6):
        scheduler.add(settings(engine, prompt=[n] * 40 + PROMPT, mode=("speed", "quality")[n % 2]))
    drain(scheduler)
    assert engine.cache.k is k and engine.cache.v is v
    assert engine.scheduler.stats.batch_max == 4


def test_a_sequence_longer_than_the_pool_is_refused(model):
    engine = Engine(model)
    pool = BlockCache(model.config, pages=4, block_size=32, device="cpu", dtype=torch.float64)
    scheduler = Scheduler(model, pool)
    with pytest.raises(TooLong, match="--cache-mb"):
        scheduler.add(settings(engine, prompt=PROMPT * 2, gen_length=64))  # 7 blocks, 3 pages
    assert scheduler.idle()


def test_nan_logits_fail_the_request_with_a_message(model):
    """A broken model (a NaN weight) fails the generation with that said, never an empty completion;
    other sequences of the same batch are answered on their own."""
    import copy

    from llada_lsp.errors import BadLogits

    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.lm_head.weight[5] = float("nan")
    with pytest.raises(BadLogits, match="NaN or infinite logits at step 1"):
        Engine(broken).generation(PROMPT, 40, "speed", mask_id=511, eos_id=508).run()
    engine = Engine(broken, max_batch=2)
    a = engine.scheduler.add(settings(engine))
    b = engine.scheduler.add(settings(engine, mode="quality"))
    ends = drain(engine.scheduler)
    assert set(ends) == {a, b} and all(isinstance(e.error, BadLogits) for e in ends.values())
    assert engine.cache.used == engine.cache.cached  # every private page came back (prompt blocks stay cached)
