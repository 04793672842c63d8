"""The scheduler and the block cache beyond parity (test_golden.py has that): the prefix cache's
verbs, eviction under a budget, the bounded queue, priorities, aborts, and a pool that never moves."""

from __future__ import annotations

import pytest
import torch

from llada_lsp import Engine, load_model
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
