"""Chunked prefill: a prompt's blocks the prefix cache lacks are prefilled in forwards of whole blocks,
a bounded number of tokens per step, while the running sequences keep denoising; the tokens are those
of one whole-prompt prefill (and of the reference's recompute-everything loop), and the peak memory of
prefilling a 16k-token prompt stays within 2x of a 2k-token one's (CPU, resident memory)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from llada_lsp import Engine, load_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def one_thread(one_thread_per_module):
    """One torch thread for the module (conftest.torch_threads says why)."""


@pytest.fixture(scope="module")
def model(golden_dir):
    return load_model(golden_dir, device="cpu", dtype=torch.float64)


PROMPT = [(11 * i + 5) % 500 for i in range(300)]  # 9 whole blocks and a tail


def lengths_of_forwards(model) -> list[int]:
    seen: list[int] = []
    model.register_forward_pre_hook(lambda m, args, kwargs: seen.append(args[0].shape[1]), with_kwargs=True)
    return seen


def test_chunked_prefill_gives_the_same_tokens(model):
    whole = Engine(model, prefill_chunk=4096).generation(PROMPT, 48, "quality").run()
    reference = Engine(model, use_cache=False).generation(PROMPT, 48, "quality").run()
    chunked = Engine(model, prefill_chunk=64).generation(PROMPT, 48, "quality").run()
    assert chunked.tokens == whole.tokens == reference.tokens
    assert chunked.steps == whole.steps == reference.steps
    assert whole.prefill_forwards == 1 and chunked.prefill_forwards > 4


def test_a_long_prompt_prefills_in_bounded_forwards_while_another_denoises(golden_dir):
    model = load_model(golden_dir, device="cpu", dtype=torch.float64)
    engine = Engine(model, prefill_chunk=64)
    sched = engine.scheduler
    short = sched.add(engine.settings(PROMPT[:20], 64, "strict"))
    sched.step()
    long = sched.add(engine.settings(PROMPT, 32, "strict"))
    seen = lengths_of_forwards(model)
    interleaved = 0
    while any(e.id == long for e in sched.waiting) or any(e.id == long and e.prefilling for e in sched.running):
        events = sched.step()
        interleaved += any(e.id == short and e.draft is not None for e in events)
    assert interleaved >= 3, "the short sequence must keep stepping while the long prompt prefills"
    assert max(seen) <= 64, "a prefill forward runs at most prefill_chunk tokens (denoising ones 32 or 64)"
    assert len(seen) > interleaved  # prefill forwards besides the short sequence's steps
    sched.drain()


def test_a_rewrites_long_prompt_prefills_in_small_chunks_while_a_completion_denoises(golden_dir, monkeypatch):
    """A rewrite (priority 1) prefills BACKGROUND_PREFILL tokens a step while an inline completion
    decodes (a huge selection must not stall a typing user's steps), the whole chunk once it is alone;
    an inline completion's prompt is prefilled before it; the tokens are those of an unchunked prefill."""
    from llada_lsp.engine import scheduler

    BACKGROUND_PREFILL = 64  # the tiny model's 512 positions hold no prompt past the real 256
    monkeypatch.setattr(scheduler, "BACKGROUND_PREFILL", BACKGROUND_PREFILL)
    model = load_model(golden_dir, device="cpu", dtype=torch.float64)
    prompt = PROMPT  # 288 tokens to prefill: past BACKGROUND_PREFILL, within one default chunk
    alone = Engine(model).generation(prompt, 32, "strict").run()
    engine = Engine(model)
    sched = engine.scheduler
    short = sched.add(engine.settings(PROMPT[:20], 64, "strict"))
    sched.step()
    seen = lengths_of_forwards(model)
    rewrite = sched.add(engine.settings(prompt, 32, "strict", priority=1))
    late = sched.add(engine.settings(PROMPT[:40], 16, "strict"))
    sched.step()
    assert seen[0] == 32, f"the completion's prompt first ({seen})"
    assert seen[1] == BACKGROUND_PREFILL, seen
    results = {}
    while len(results) < 3:
        for event in sched.step():
            if event.result is not None and event.draft is None:
                results[event.id] = event.result
    assert max(seen) <= BACKGROUND_PREFILL, seen
    assert alone.prefill_forwards == 1 and results[rewrite].prefill_forwards == -(-288 // BACKGROUND_PREFILL)
    assert results[rewrite].tokens == alone.tokens
    assert {short, late} <= results.keys()


MEASURE = """
import faulthandler, re, sys
faulthandler.dump_traceback_later(400, exit=True)  # a stuck run says where it was stuck
import torch
from llada_lsp import Engine
from llada_lsp.model import LLaDA2, LLaDA2Config

def status(key):
    return int(re.search(key + r":\\s+(\\d+)", open("/proc/self/status").read()).group(1))

length = int(sys.argv[1])
torch.set_num_threads(1)
torch.manual_seed(0)
config = LLaDA2Config(vocab_size=512, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=32, intermediate_size=256, moe_intermediate_size=64,
                      num_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
                      max_position_embeddings=16448, mask_token_id=511, eos_token_id=508)
model = LLaDA2(config).eval().requires_grad_(False)
for p in model.parameters():  # the experts are built with torch.empty: garbage (NaN) weights end a run early
    torch.nn.init.normal_(p, std=0.02)
engine = Engine(model, cache_mb=40)  # the pool is allocated here, before the measurement
engine.scheduler.add(engine.settings(torch.randint(0, 500, (length,)).tolist(), 32, "speed"))
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # VmHWM (peak resident memory) starts again from the current VmRSS
before = status("VmRSS")
sched = engine.scheduler
while sched.waiting or any(e.prefilling for e in sched.running):
    sched.step()
print(engine.scheduler.stats.prefills, (status("VmHWM") - before) / 1024)
"""


@pytest.mark.slow  # two fresh processes, ~15 s on an idle 2-core machine, minutes on a busy one
@pytest.mark.timeout(900)
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs")
def test_a_16k_prompt_prefills_within_twice_the_peak_memory_of_a_2k_one():
    peaks = {}
    for length in (2048, 16384):
        run = subprocess.run([sys.executable, "-c", MEASURE, str(length)], cwd=ROOT, capture_output=True, text=True,
                             timeout=420, check=False)  # fmt: skip
        assert run.returncode == 0, run.stderr[-4000:]
        forwards, mib = run.stdout.split()
        peaks[length] = float(mib)
        print(f"prefill of {length} tokens: {forwards} forwards, peak {float(mib):.1f} MiB above the level before it")
    assert peaks[16384] <= 2 * peaks[2048], peaks
