"""bf16 parity on a CUDA device, with SDPA and with flash-attn. Skipped, with the reason, where the
machine has no CUDA device or no flash-attn: these checks need the hardware and are never faked."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from llada_lsp import Engine, load_model
from llada_lsp.model import llada2

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")


@needs_cuda
@pytest.mark.parametrize("attention", ["sdpa", "flash"])
def test_bf16_logits_and_tokens_on_cuda(golden_dir, golden_generate, attention, monkeypatch):
    if attention == "flash" and llada2.flash_attn_func is None:
        pytest.skip("flash-attn is not installed")
    if attention == "sdpa":
        monkeypatch.setattr(llada2, "flash_attn_func", None)
    model = load_model(golden_dir, device="cuda", dtype="bfloat16")
    tensors = load_file(golden_dir / "forward.safetensors")
    ids = tensors["bc100_masks.input_ids"][None].cuda()
    ref = tensors["bc100_masks.logits"].cuda()
    logits = model(ids)[0].double()
    # bf16 keeps ~3 significant digits; logits reach |24|: a structural error moves them by 12 or more.
    assert (logits - ref).abs().max() < 0.5
    assert (logits.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9
    case = golden_generate["cases"][1]
    r = Engine(model).generation(case["prompt_ids"], case["gen_length"], "quality", mask_id=511, eos_id=508).run()
    assert len(r.tokens) > 0 and r.steps > 0
