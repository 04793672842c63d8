"""bf16: on the CPU always, on a CUDA device with SDPA and with flash-attn. The CUDA cases are skipped,
with the reason, where the machine has no CUDA device or no flash-attn: they need the hardware and
are never faked.

What bf16 can get wrong and float64 parity cannot see: the float32 islands (norms, router, RoPE and the
expert bias stay float32 in a bf16 model), and the one-block fast path through the K/V cache (no mask:
flash-attn on CUDA), which the whole-sequence forward never takes.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import force_moe
from safetensors.torch import load_file

from llada_lsp import Engine, load_model
from llada_lsp.model import BlockKVCache, llada2

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
BLOCK_CAUSAL = ("bc45", "bc64", "bc100_masks")  # the forward cases with the mask the model is used with


@pytest.fixture(scope="module", autouse=True)
def one_thread(one_thread_per_module):
    """One torch thread for the module (conftest.torch_threads says why)."""


def row_errors(logits: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the largest absolute logit difference, and whether the argmax is the same."""
    logits, ref = logits.double().cpu(), ref.double().cpu()
    return (logits - ref).abs().max(-1).values, logits.argmax(-1) == ref.argmax(-1)


def check_bf16_logits(model, golden_dir, device: str) -> None:
    """bf16 against the float64 reference, all block-causal cases (209 rows) together. A structural
    error moves every row by 12 or more. bf16 rounding moves most rows by 0.2-0.3, but it can flip a
    near-tied expert choice, and a row whose routing flipped moves by up to ~13: on the CPU 9 rows of
    209 move by more than 1 and 5 change their argmax. Running the float32 islands in bf16 instead
    doubles both (19 and 19 rows), so the bounds sit between."""
    tensors = load_file(golden_dir / "forward.safetensors")
    errors, same = [], []
    for case in BLOCK_CAUSAL:
        ids = tensors[f"{case}.input_ids"][None].to(device)
        with torch.no_grad():
            err, agree = row_errors(model(ids)[0], tensors[f"{case}.logits"])
        errors.append(err)
        same.append(agree)
    err, agree = torch.cat(errors), torch.cat(same)
    assert err.median() < 0.4, err
    assert (err > 1.0).float().mean() <= 0.07, err
    assert agree.float().mean() >= 0.94, agree


def check_cache_path(model, golden_dir, device: str) -> None:
    """One block at a time through the K/V cache (the decoder's path: no mask, flash-attn where it
    is used) gives the whole-sequence forward's logits, up to bf16 rounding."""
    ids = load_file(golden_dir / "forward.safetensors")["bc100_masks.input_ids"][None].to(device)
    L = ids.shape[1]
    cache = BlockKVCache(model.config, 128, model.device, model.dtype)
    assert cache.k.dtype == model.dtype
    with torch.no_grad():
        whole = model(ids)[0]
        blocks = torch.cat([model(ids[:, lo : min(lo + 32, L)], cache=cache, start=lo)[0] for lo in range(0, L, 32)])
    err, agree = row_errors(blocks, whole)
    assert err.median() <= 0.125 and (err > 1.0).float().mean() <= 0.03, err  # on the CPU: equal
    assert agree.float().mean() >= 0.97, agree


def check_generation(model, case: dict) -> None:
    """A whole bf16 generation of golden case A04_P20_G96_quality (its tokens are not the float64 ones:
    decisions near a threshold go either way): consistent with itself, no mask left, cut at the first
    EOS, one draft per forward."""
    gen = Engine(model).generation(case["prompt_ids"], case["gen_length"], "quality", mask_id=511, eos_id=508)
    drafts = list(gen)
    r = gen.result
    assert r.steps == len(drafts) == sum(b.forwards for b in r.blocks) > 0
    assert [b.block for b in r.blocks] == list(range(0, 4)) and all(b.end != "cancelled" for b in r.blocks)
    assert 0 < len(r.tokens) <= case["gen_length"] and 511 not in r.tokens
    assert 508 not in r.tokens[:-1]
    assert drafts[-1].generated[: len(r.tokens)] == r.tokens


@pytest.mark.parametrize("moe", ["sparse", "dense"])  # dense: what CUDA runs for one block
def test_bf16_logits_on_cpu(golden_dir, moe):
    model = load_model(golden_dir, device="cpu", dtype="bfloat16")
    force_moe(model, moe)
    check_bf16_logits(model, golden_dir, "cpu")


def test_bf16_keeps_its_float32_islands(golden_dir):
    """The expert bias only chooses experts, by small differences between large values: rounded to
    bf16 it would choose others. The router, norms and RoPE compute in float32 too."""
    model = load_model(golden_dir, device="cpu", dtype="bfloat16")
    assert model.dtype == torch.bfloat16 and model.lm_head.weight.dtype == torch.bfloat16
    gates = [layer.mlp.gate for layer in model.model.layers if hasattr(layer.mlp, "gate")]
    assert gates and all(g.expert_bias.dtype == torch.float32 for g in gates)
    reference = json.loads((golden_dir / "config.json").read_text())
    assert len(gates) == reference["num_hidden_layers"] - reference["first_k_dense_replace"]
    assert llada2.compute_dtype(torch.bfloat16) == torch.float32
    cos, sin = llada2.rope_cos_sin(torch.arange(400), 8, 600000.0, torch.bfloat16)
    exact_cos, _ = llada2.rope_cos_sin(torch.arange(400), 8, 600000.0, torch.float64)
    assert cos.dtype == torch.bfloat16 and (cos.double() - exact_cos).abs().max() <= 2**-8  # bf16's own rounding


def test_bf16_cache_path_and_generation_on_cpu(golden_dir, cases):
    model = load_model(golden_dir, device="cpu", dtype="bfloat16")
    check_cache_path(model, golden_dir, "cpu")
    check_generation(model, cases["A04_P20_G96_quality"])


@needs_cuda
@pytest.mark.parametrize("attention", ["sdpa", "flash"])
def test_bf16_on_cuda(golden_dir, cases, attention, monkeypatch):
    if attention == "flash" and llada2.flash_attn_func is None:
        pytest.skip("flash-attn is not installed")
    if attention == "sdpa":
        monkeypatch.setattr(llada2, "flash_attn_func", None)
    model = load_model(golden_dir, device="cuda", dtype="bfloat16")
    check_bf16_logits(model, golden_dir, "cuda")
    check_cache_path(model, golden_dir, "cuda")  # with flash-attn: the only place it runs
    cpu = load_model(golden_dir, device="cpu", dtype="bfloat16")
    ids = load_file(golden_dir / "forward.safetensors")["bc100_masks.input_ids"][None]
    with torch.no_grad():
        err, agree = row_errors(model(ids.cuda())[0], cpu(ids)[0])
    assert err.median() <= 0.25 and agree.float().mean() >= 0.95, err  # the same network on both devices
    check_generation(model, cases["A04_P20_G96_quality"])
