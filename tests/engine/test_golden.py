"""Parity with the reference implementation on the golden tiny checkpoint: logits, tokens, step
counts and every per-step trace entry.

One exhaustive sweep: all 22 generate cases in float64 through the cached engine, compared exactly
(ids, forward counts, every trace entry, block ends, cache extras). The other variants (float32, the
recompute loop) run a fixed sample of cases, chosen so that it holds every kind of setting the cases
have (`test_the_sample_covers_every_setting_kind` keeps it so). The sample is also the float64 part
of the fast subset (`-m "not slow"`); the rest of the sweep is marked slow.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import SAMPLE, force_moe, settings_of  # the sample: conftest says why each case is in it
from safetensors.torch import load_file

from llada_lsp import Engine, JointThreshold, generate, load_model
from llada_lsp.engine.policy import PRESETS

# Read at collection to name one test per case. A missing file gives no parameters here; the tests
# below then still fail, through conftest's `golden_dir` (a broken checkout fails, never skips).
_GENERATE = Path(__file__).resolve().parents[1] / "golden" / "llada2-tiny" / "generate.json"
CASE_IDS = [c["id"] for c in json.loads(_GENERATE.read_text())["cases"]] if _GENERATE.is_file() else ["missing"]


def sample_then_rest():
    """Every case; those outside the sample are slow (they only repeat what the sample covers)."""
    return [pytest.param(c, id=c, marks=() if c in SAMPLE else pytest.mark.slow) for c in CASE_IDS]


@pytest.fixture(scope="module", autouse=True)
def one_thread(one_thread_per_module):
    """One torch thread for the module (conftest.torch_threads says why)."""


@pytest.fixture(scope="module")
def model32(golden_dir):
    return load_model(golden_dir, device="cpu", dtype=torch.float32)


def forward_cases(golden_dir):
    return json.loads((golden_dir / "forward.json").read_text())["cases"]


@pytest.mark.parametrize("moe", ["sparse", "dense"])
@pytest.mark.parametrize("dtype", ["fp64", "fp32"])
def test_logits_match_reference(dtype, moe, request, golden_dir):
    model = request.getfixturevalue("model64" if dtype == "fp64" else "model32")
    tensors = load_file(golden_dir / "forward.safetensors")
    force_moe(model, moe)
    try:
        for case in forward_cases(golden_dir):
            ids = tensors[case["input_ids_key"]][None]
            L = ids.shape[1]
            allow = None if case["mask_kind"] == "block_causal" else torch.ones(L, L, dtype=torch.bool)
            logits = model(ids, allow=allow)[0].double()
            if model.dtype == torch.float64:
                if "logits_fp64_key" in case:
                    assert (logits - tensors[case["logits_fp64_key"]]).abs().max() <= 1e-9, case["name"]
                assert (logits - tensors[case["logits_key"]]).abs().max() <= 5e-5, case["name"]
            else:
                assert (logits - tensors[case["logits_key"]]).abs().max() <= 1e-4, case["name"]
    finally:
        force_moe(model, None)


def test_block_causal_differs_from_bidirectional(model64, golden_dir):
    """The mask matters: the first block must not see the later one."""
    tensors = load_file(golden_dir / "forward.safetensors")
    ids = tensors["bc45.input_ids"][None]
    bidir = model64(ids, allow=torch.ones(45, 45, dtype=torch.bool))[0].double()
    assert (bidir - tensors["bc45.logits"]).abs().max() > 1.0
    assert (bidir - tensors["bidir45.logits"]).abs().max() <= 1e-4


def run_case(model, case, use_cache: bool):
    engine = Engine(model, use_cache=use_cache)
    gen = engine.generation(
        case["prompt_ids"], case["gen_length"], JointThreshold(case["threshold"], case["editing_threshold"]),
        case["max_post_steps"], case["eos_early_stop"], case["mask_token_id"], case["eos_token_id"],
    )  # fmt: skip
    drafts = list(gen)
    return gen.result, drafts


def check_case(model, case, use_cache: bool) -> None:
    """Exact parity (see check_trace), and the cache's own counts (which the reference does not make)."""
    result, drafts = run_case(model, case, use_cache)
    check_trace(case, result, drafts)
    name, P = case["id"], case["prompt_length"]
    assert result.reused_tokens == 0, name
    if use_cache:
        assert result.prefill_forwards == (1 if P >= 32 else 0), name  # whole prompt blocks: one prefill
        # A block whose last step changed tokens is run again, fused with the next block's first step.
        assert result.refreshed_blocks == sum(b["last_forward_changed_tokens"] for b in case["blocks"][:-1]), name
    else:
        assert result.prefill_forwards == 0 and result.refreshed_blocks == 0, name


def check_trace(case, result, drafts) -> None:
    """Exact parity: ids, forward count, every trace entry, block ends, the last draft's canvas."""
    name = case["id"]
    assert result.tokens == case["output_ids"], name
    assert result.steps == case["num_forward_calls"] == len(drafts), name
    trace = [(d.block, d.block_tokens, d.filled, d.edited) for d in drafts]
    expected = [(e["block"], e["tokens_after"], e["m2t"], e["t2t"]) for e in case["trace"]]
    for i, (mine, ref) in enumerate(zip(trace, expected)):
        assert mine == ref, f"{name}: forward {i + 1} (block {ref[0]}) differs"
    assert len(trace) == len(expected), name
    ends = [(b.block, b.forwards, b.mask_free_forwards, b.end, b.last_forward_changed_tokens) for b in result.blocks]
    assert ends == [
        (b["block"], b["forwards"], b["mask_free_forwards"], b["end"], b["last_forward_changed_tokens"])
        for b in case["blocks"]
    ], name  # fmt: skip
    P, G = case["prompt_length"], case["gen_length"]
    hi = (drafts[-1].block + 1) * 32
    assert drafts[-1].generated == case["final_canvas"][P : min(hi, P + G)], name
    assert [d.step for d in drafts] == list(range(1, len(drafts) + 1)), name
    assert not result.cancelled, name


@pytest.mark.parametrize("case_id", sample_then_rest())
def test_generate_float64_cached_every_case(model64, cases, case_id):
    check_case(model64, cases[case_id], use_cache=True)


@pytest.mark.parametrize("case_id", SAMPLE)
def test_generate_float32_cached_sample(model32, cases, case_id):
    check_case(model32, cases[case_id], use_cache=True)


@pytest.mark.parametrize("case_id", SAMPLE)
def test_generate_float64_recompute_sample(model64, cases, case_id):
    check_case(model64, cases[case_id], use_cache=False)


def test_the_sample_covers_every_setting_kind(cases):
    """The sample holds every value of every setting the cases vary, and every kind of outcome."""
    assert set(CASE_IDS) == set(cases) and len(cases) == 22
    sample = [cases[c] for c in SAMPLE]

    def kinds(group):
        return {
            "preset": {c["preset"] for c in group},
            "prompt length": {c["prompt_length"] for c in group},
            "prompt ends inside a block": {c["prompt_length"] % 32 != 0 for c in group},
            "gen length": {c["gen_length"] for c in group},
            "max post steps": {c["max_post_steps"] for c in group},
            "eos early stop": {c["eos_early_stop"] for c in group},
            "stopped early": {len(c["blocks"]) < c["num_blocks_total"] - c["first_decoded_block"] for c in group},
            "output ends with eos": {c["output_ends_with_eos"] for c in group},
            "block end": {b["end"] for c in group for b in c["blocks"]},
            "last forward changed": {b["last_forward_changed_tokens"] for c in group for b in c["blocks"]},
            "fallback step": {e["m2t_fallback"] for c in group for e in c["trace"]},
            "several filled at once": {len(e["m2t"]) > 1 for c in group for e in c["trace"]},
            "edits": {bool(e["t2t"]) for c in group for e in c["trace"]},
        }

    assert kinds(sample) == kinds(cases.values())


def test_the_presets_are_the_reference_thresholds(golden_generate):
    """The modes users pick by name decide with the thresholds the cases were made with."""
    assert set(golden_generate["presets"]) <= set(PRESETS)
    for name, preset in golden_generate["presets"].items():
        assert PRESETS[name] == JointThreshold(preset["threshold"], preset["editing_threshold"]), name


def test_public_generate_api(model64, cases):
    case = cases["A01_P20_G64_quality"]
    r = generate(model64, case["prompt_ids"], gen_length=case["gen_length"], threshold=case["threshold"],
                 editing_threshold=case["editing_threshold"], block_length=32, max_post_steps=16,
                 eos_early_stop=False, mask_id=511, eos_id=508)  # fmt: skip
    assert (r.tokens, r.steps) == (case["output_ids"], case["num_forward_calls"])
    # None ids come from the checkpoint's config.
    assert generate(model64, case["prompt_ids"], gen_length=case["gen_length"], threshold=case["threshold"],
                    editing_threshold=case["editing_threshold"]).tokens == case["output_ids"]  # fmt: skip


# --- many sequences at once: the scheduler's batches must not change a single decision ---------------
def run_batch(engine, arrivals: list[tuple[int, dict]]) -> dict:
    """Adds each case at its step (0: before the first) and steps until all are done; per case id its
    result, drafts, and the largest batch it ran in. Checks that a finished sequence leaves at once."""
    scheduler = engine.scheduler
    names, drafts, results = {}, {}, {}
    step, arrivals = 0, sorted(arrivals, key=lambda a: a[0])
    while arrivals or not scheduler.idle():
        while arrivals and arrivals[0][0] <= step:
            case = arrivals.pop(0)[1]
            names[scheduler.add(settings_of(engine, case))] = case["id"]
            drafts[case["id"]] = []
        for event in scheduler.step():
            name = names[event.id]
            if event.draft is not None:
                assert name not in results, f"{name}: a draft after its end"
                drafts[name].append(event.draft)
            else:
                results[name] = event.result
                assert all(names[e.id] != name for e in scheduler.running), f"{name} did not leave"
        step += 1
    return {name: (results[name], drafts[name]) for name in names.values()}


@pytest.mark.parametrize("order", ["as listed", "reversed"])
def test_all_cases_as_one_batch(model64, cases, order):
    """All 22 cases start together (speed, quality and strict rows side by side, prompts and
    generations of every length): each gives the reference's tokens, steps and trace."""
    listed = list(cases.values()) if order == "as listed" else list(cases.values())[::-1]
    engine = Engine(model64, max_batch=len(listed))
    out = run_batch(engine, [(0, case) for case in listed])
    for case in listed:
        check_trace(case, *out[case["id"]])
    assert engine.scheduler.stats.batch_max == len(listed)


def test_cases_joining_and_leaving_mid_way(model64, cases):
    """Cases arrive every few steps, at most 5 run at a time (the rest wait their turn), and a
    second pass finds their prompt blocks in the prefix cache: nothing changes a decision."""
    engine = Engine(model64, max_batch=5)
    listed = list(cases.values())
    out = run_batch(engine, [(3 * i, case) for i, case in enumerate(listed)])
    for case in listed:
        check_trace(case, *out[case["id"]])
    stats = engine.scheduler.stats
    assert stats.batch_max == 5 and 1 < stats.batch_mean < 5
    again = run_batch(engine, [(2 * i, case) for i, case in enumerate(listed[::-1])])
    for case in listed:
        result, drafts = again[case["id"]]
        check_trace(case, result, drafts)
        whole = case["prompt_length"] // 32 * 32
        assert result.reused_tokens == whole and result.prefill_forwards == 0, case["id"]
