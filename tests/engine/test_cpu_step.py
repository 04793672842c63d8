"""The engine's CPU step outside the model's forward against the generic (device) path it replaces: the
host-made slot tables and mask (cpu_step.paged_tables) equal device_tables'; the step rule's searches in
numba (engine/cpu_step.guesses) give the reference's tokens and bit-identical confidences; the packed
decisions (cpu_step.packed_decisions) equal policy.packed_decisions' on batched rows with padding,
drafts checked ahead, ties in the fallback fill and NaN / inf logits; and the engine on the golden
checkpoint makes the same drafts either way. LLaDA2.2's rows keep their own host rule."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from llada_lsp import Engine, load_model
from llada_lsp.engine import cache as cache_module
from llada_lsp.engine import cpu_step, policy
from llada_lsp.engine import scheduler as scheduler_module
from llada_lsp.engine.cache import SCRATCH, all_visible, device_tables, paged_tables, row_descriptor
from llada_lsp.engine.policy import _reference_guesses, step_guesses
from llada_lsp.engine.step_layout import FROZEN, MASK, OUTSIDE, Ints
from llada_lsp.kernels import cpu

pytestmark = pytest.mark.skipif(cpu.numba is None, reason="numba is not installed: the CPU kernels do not run")

M = 5  # the mask id of the rule's tests


@pytest.fixture(scope="module", autouse=True)
def one_thread(one_thread_per_module):
    """One torch thread for the module (conftest.torch_threads says why)."""


# --- the slot tables -------------------------------------------------------------------------------


def random_rows(rng: random.Random, B: int, bs: int = 32):
    """B rows (pages, start, end) of a batched step: ends of 1 to 6 blocks, queries from 1 position up
    to two blocks back, pages drawn from a pool of 40."""
    rows = []
    for _ in range(B):
        end = rng.randint(1, 6 * bs)
        start = max(0, end - rng.randint(1, 2 * bs))
        rows.append((rng.sample(range(1, 40), -(-end // bs)), start, end))
    return rows


@pytest.mark.parametrize("seed", range(6))
def test_host_tables_equal_the_device_tables(seed):
    rng = random.Random(seed)
    bs = 32
    for B in (1, 2, 5):
        rows = random_rows(rng, B, bs)
        width = max(end - start for _, start, end in rows) + rng.choice([0, 3])  # left padding on some rows
        S = max(end for _, _, end in rows)
        packed = torch.tensor([row_descriptor(p, a, b, -(-S // bs), bs) for p, a, b in rows])
        for visible in {all_visible(rows, width, bs), False}:
            want = device_tables(packed, width, S, bs, visible)
            got = cpu_step.paged_tables(packed.numpy(), width, S, bs, visible, SCRATCH)
            assert (got[3] is None) == (want[3] is None)
            for mine, theirs in zip(got, want):
                if theirs is not None:
                    assert mine.dtype == theirs.dtype and mine.shape == theirs.shape
                    assert torch.equal(mine, theirs)


def test_one_block_with_every_key_visible_needs_no_mask():
    """The cold step's shape (one row, its 32 queries one block): no mask on either path, and the CPU's
    paged_tables is the host's."""
    rows = [([3, 7, 9], 64, 96)]
    packed = torch.tensor([row_descriptor(*rows[0], 3, 32)])
    assert all_visible(rows, 32, 32)
    positions, writes, reads, allow, real = paged_tables(packed, 32, 96, 32, True)
    assert allow is None and bool(real.all())
    assert positions[0].tolist() == list(range(64, 96))
    assert writes.tolist() == [9 * 32 + i for i in range(32)]
    assert reads[0, :32].tolist() == [3 * 32 + i for i in range(32)]


# --- the step rule's guesses -----------------------------------------------------------------------


def same_as_reference(logits: torch.Tensor, mask_id) -> None:
    ref_conf, ref_token = _reference_guesses(logits, mask_id, renormalised=False)
    conf, token = cpu_step.guesses(logits, mask_id)
    in_place = cpu_step.guesses(logits.clone(), mask_id, overwrite=True)
    assert conf.tobytes() == in_place[0].tobytes() and token.tobytes() == in_place[1].tobytes()
    assert token.tolist() == ref_token.tolist()
    conf = torch.from_numpy(conf)
    assert conf.dtype == ref_conf.dtype
    assert torch.equal(conf.isnan(), ref_conf.isnan())  # bit for bit, NaN where the reference has NaN
    assert torch.equal(conf.nan_to_num(-7.0), ref_conf.nan_to_num(-7.0))


@pytest.mark.parametrize("seed", range(4))
def test_guesses_match_the_reference_bit_for_bit(seed):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 32, 8192, generator=gen) * 4
    logits[0, :8, M] = 50.0  # the mask is these rows' clear favourite: they are searched again
    logits[1, 3, M] = logits[1, 3].max()  # the mask tied with the row's max
    same_as_reference(logits, M)
    same_as_reference(logits, torch.tensor([M, M + 1, M]))  # one mask id per row


@pytest.mark.parametrize("V", [16, 100, 8192])  # no chunk of 32 fits: one chunk, the whole row
def test_ties_go_to_the_first_id_with_the_mask_left_out(V):
    logits = torch.zeros(2, 4, V)
    logits[:, :, M] = 3.0
    logits[:, :, 9] = logits[:, :, 2] = 2.0  # tied second best: the first id, 2, wins
    logits[1, 1, M - 1] = 3.0  # tied with the mask, before it: the first maximum is not the mask
    logits[1, 2, M + 1] = 3.0  # tied with the mask, after it: the mask is the first maximum
    conf, token = cpu_step.guesses(logits, M)
    assert token.tolist() == [[2, 2, 2, 2], [2, M - 1, M + 1, 2]]
    same_as_reference(logits, M)
    same_as_reference(logits, torch.tensor([M, 2]))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("where", [0, M, 15, 300])
def test_non_finite_logits_match_the_reference(value, where):
    gen = torch.Generator().manual_seed(where)
    logits = torch.randn(2, 3, 512, generator=gen)
    logits[0, 1, where] = value
    logits[0, 2, where] = logits[0, 2, M] = value  # at the mask and elsewhere
    logits[1, 2, :] = float("-inf")  # a row with nothing at all
    logits[1, 0, :] = value  # a row of nothing else
    same_as_reference(logits, M)
    same_as_reference(logits, torch.tensor([M, 0]))


def test_the_engine_rule_takes_the_kernel_on_the_cpu(monkeypatch):
    calls = []
    kernel = cpu_step.guesses
    monkeypatch.setattr(cpu_step, "guesses", lambda *a: calls.append(1) or kernel(*a))
    logits = torch.randn(1, 32, 1024)
    with torch.inference_mode():
        conf, token = step_guesses(logits, M)
    assert calls == [1]
    ref_conf, ref_token = _reference_guesses(logits, M, renormalised=False)
    assert torch.equal(conf, ref_conf) and torch.equal(token, ref_token)


# --- the packed decisions --------------------------------------------------------------------------


def step_inputs(rng: random.Random, gen: torch.Generator, B: int, D: int, V: int, scale: float):
    """StepInputs' `ints` and `limits` for B rows deciding D positions, and their logits [B, D, V]: rows
    with prompt positions, drafts checked ahead (`outside` > 0, the mask id among those positions too),
    queries before the D decided ones on some, a padding row last, per-row mask ids and thresholds."""
    width = D + rng.choice([0, 5])
    ints, limits = [], []
    for _ in range(B - 1):
        mask = rng.choice([M, M + 2, V - 1])  # the last id: a draft's mask outside the row wraps to 0
        outside = rng.choice([0, 0, 32]) if D > 32 else 0
        ids = [rng.choice([mask, mask, rng.randrange(V)]) for _ in range(width)]
        ints.append(Ints.row(ids, width, rng.randint(0, 32), mask, -1, outside, [0, width, 1]))
        limits.append([rng.choice([0.5, 0.7, 0.95]), rng.choice([0.0, 0.5, 0.9, float("inf")])])
    ints.append(Ints.row([], width, D, M, -1, 0, [0, width, 0]))  # a padding row: all frozen
    limits.append([1.0, 1.0])
    logits = torch.randn(B, D, V, generator=gen) * scale
    return torch.tensor(ints), torch.tensor(limits, dtype=torch.float32), width, logits


def same_decisions(ints, width: int, D: int, logits, limits, V: int) -> torch.Tensor:
    want = policy.packed_decisions(ints, Ints(width), D, logits, limits, V)  # grad on: the torch path all through
    with torch.inference_mode():
        got = cpu_step.packed_decisions(ints, Ints(width), D, logits.clone(), limits, V)
    assert got.dtype == want.dtype == torch.int64
    assert got.tolist() == want.tolist()
    return got


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("scale", [0.5, 3.0, 12.0])  # few masks above the threshold, some, most
def test_decisions_equal_the_generic_path(seed, scale):
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    for B, D in ((1, 32), (4, 32), (5, 64)):
        ints, limits, width, logits = step_inputs(rng, gen, B, D, 512, scale)
        same_decisions(ints, width, D, logits, limits, 512)


def test_a_tied_fallback_takes_topks_choice():
    """No mask above the threshold and the best masks tied exactly: the fill is the one torch.topk
    picks (its own order, not necessarily the first), on both paths."""
    V, D = 256, 32
    ints = torch.tensor([Ints.row([M] * D, D, 0, M, -1, 0, [0, D, 1])] * 2)
    limits = torch.tensor([[0.95, 0.0], [0.95, 0.0]])
    logits = torch.zeros(2, D, V)
    logits[0, [3, 17, 29], 7] = 1.0  # three positions tied at the best confidence
    logits[1, :, 7] = 1.0  # every position tied
    got = same_decisions(ints, D, D, logits, limits, V)
    assert got[:, D : 2 * D].sum(1).tolist() == [1, 1]  # one fill each
    assert got[0, D : 2 * D].nonzero().item() in (3, 17, 29)


def test_a_confidence_at_a_threshold_is_not_above_it():
    """Thresholds set to confidences the step computes: a mask at exactly the fill threshold (the second
    best), a token at exactly the editing one, are neither filled nor edited (`>`), on both paths."""
    rng, gen = random.Random(1), torch.Generator().manual_seed(1)
    V, D = 512, 32
    ints, limits, width, logits = step_inputs(rng, gen, 2, D, V, 3.0)
    ints[0, width - D : width - D + 4] = ints[0, width + MASK]  # masks at 0..3
    ints[0, width - D + 4 : width] = 9  # the rest a token the guesses differ from
    ints[0, width + FROZEN] = 0  # no prompt position
    conf, _ = step_guesses(logits, ints[:, width + MASK])
    limits[0] = torch.stack([conf[0, :4].sort().values[-2], conf[0, 4:].median()])
    got = same_decisions(ints, width, D, logits, limits, V)
    assert got[0, D : D + 4].sum() == 1  # only the mask above the second best
    assert 0 < got[0, 2 * D + 4 : 3 * D].sum() < D - 4


def test_non_finite_logits_fail_only_the_rows_own_positions():
    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    V, D = 512, 64
    ints, limits, width, logits = step_inputs(rng, gen, 4, D, V, 2.0)
    ints[0, width + OUTSIDE] = 32  # row 0 checks a draft: its first 32 decisions are not its own
    ints[1:3, width + OUTSIDE] = 0
    logits[0, 5, 11] = float("nan")  # outside row 0's own: never read, the row stays finite
    logits[1, 40, 3] = float("inf")  # inside row 1's own: the row fails
    logits[2, 7, :] = float("nan")  # a masked position's NaN confidence: the fallback's topk sees it
    ints[2, width - D + 7] = ints[2, width + MASK]
    got = same_decisions(ints, width, D, logits, limits, V)
    assert got[0, 4 * D] == 1 and got[1, 4 * D] == 0 and got[2, 4 * D] == 0


# --- the engine ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model32(golden_dir):
    return load_model(golden_dir, device="cpu", dtype=torch.float32)


def generic_path(monkeypatch) -> None:
    """The scheduler's CPU step made the device's: tables by torch ops, decisions and the rule's searches
    by torch (the model's own CPU kernels untouched)."""
    monkeypatch.setattr(scheduler_module, "paged_tables", cache_module.device_tables)
    monkeypatch.setattr(policy, "cpu", SimpleNamespace(enabled=lambda x: False))


def batch_drafts(model, cases) -> list:
    """Four sequences at once (prompts of different lengths: padded rows), two of them drafts checked
    ahead (their rows decide more blocks than the others), one with token healing's first_allowed;
    every event of every step."""
    engine = Engine(model, max_batch=4)
    for i, case in enumerate(list(cases.values())[:4]):
        P = case["prompt_ids"]
        draft = P[-40:] + P[:24] if i in (0, 2) else None  # 64 drafted ids: two blocks
        settings = engine.settings(P, 64, "quality" if i % 2 else "speed", mask_id=case["mask_token_id"],
                                   eos_id=case["eos_token_id"], init_ids=draft,
                                   first_allowed=[1, 2, 3] if i == 1 else None)  # fmt: skip
        engine.scheduler.add(settings)
    return [(e.id, e.draft, e.result and e.result.tokens) for e in engine.scheduler.drain()]


def test_the_engine_makes_the_same_drafts_on_both_paths(model32, cases, monkeypatch):
    calls = []
    kernel = cpu_step.packed_decisions
    monkeypatch.setattr(cpu_step, "packed_decisions", lambda *a: calls.append(a[2]) or kernel(*a))
    fast = batch_drafts(model32, cases)
    assert calls and max(calls) > 32  # the kernel ran, on steps that checked a draft ahead too
    monkeypatch.undo()
    generic_path(monkeypatch)
    assert fast == batch_drafts(model32, cases)


def test_llada22_rows_keep_their_host_rule(tmp_path, monkeypatch):
    from conftest import make_llada22_checkpoint

    model = load_model(make_llada22_checkpoint(tmp_path), device="cpu", dtype=torch.float32)
    engine = Engine(model)  # (its start warms the kernels up)
    monkeypatch.setattr(cpu_step, "packed_decisions", lambda *a: pytest.fail("the JointThreshold kernel ran"))
    fast = engine.generation(list(range(10, 50)), 32, "speed").run()
    generic_path(monkeypatch)
    assert engine.generation(list(range(10, 50)), 32, "speed").run().tokens == fast.tokens


def test_an_engine_started_on_the_cpu_compiles_nothing_in_its_first_answers(golden_dir):
    """The scheduler's start runs cpu_step.warm_up: a fresh process's first steps (one row, then a batch
    with a draft checked ahead) find every kernel's types already compiled or loaded."""
    import subprocess
    import sys

    script = f"""
import torch
from llada_lsp import Engine, load_model
from llada_lsp.engine import cpu_step
engine = Engine(load_model({str(golden_dir)!r}, device="cpu", dtype=torch.float32))
kernels = {{k: v for k, v in vars(cpu_step).items() if hasattr(v, "signatures")}}
before = {{k: len(v.signatures) for k, v in kernels.items()}}
assert before["_tables_kernel"] and before["_decisions_kernel"], before  # the engine's start ran them
ids = list(range(20, 120))
engine.generation(ids, 32, "speed").run()
engine.scheduler.add(engine.settings(ids, 32, "speed"))
engine.scheduler.add(engine.settings(ids[:70], 64, "quality", init_ids=ids[:64]))
engine.scheduler.drain()
print({{k: len(v.signatures) - before[k] for k, v in kernels.items()}})
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert set(eval(out.stdout).values()) == {0}, out.stdout
