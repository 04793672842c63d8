"""FP8 routed experts: the block layout (weight ~= fp8 * scale per 128x128 tile, partial tiles included),
quantizing a bf16 checkpoint at load, loading and saving an FP8 checkpoint as is, and the accuracy of
the FP8 model against bf16 on the CPU, through the same reference path every device runs.

The accuracy bar is the issue's (median per-row |error| < 0.5, at most 5% of rows past 1.0, argmax
agreement >= 0.9), met by a random MoE layer at cut-down LLaDA2.1-mini shapes. The golden tiny
checkpoint misses it (0.75 / 12.9% / 89.5%): see test_fp8_logits_of_the_golden_checkpoint.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from llada_lsp import CheckpointError, Engine, load_model
from llada_lsp.model import fp8, llada2, save_model
from llada_lsp.model.plan import ModelShape, make_plan, plan_of

ROOT = Path(__file__).resolve().parents[2]
MINI = ROOT / "tests" / "data" / "configs" / "llada2.1-mini.json"


def example(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = example("bench_fp8")


@pytest.fixture(scope="module", autouse=True)
def one_thread(one_thread_per_module):
    """One torch thread for the module (conftest.torch_threads says why)."""


@pytest.fixture(scope="module")
def golden_fp8(golden_dir):
    return load_model(golden_dir, device="cpu", dtype="bfloat16", quantize="fp8")


# --- the layout --------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(256, 384), (130, 200), (32, 64), (3, 192, 256)])  # whole, partial, stacked
def test_blocks_hold_each_tile_with_its_own_scale(shape):
    w = torch.randn(shape, generator=torch.Generator().manual_seed(0)) * torch.linspace(0.01, 10, shape[-1])
    q, scale = fp8.quantize(w)
    R, C = shape[-2:]
    assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape
    assert scale.dtype == torch.float32 and scale.shape == (*shape[:-2], -(-R // 128), -(-C // 128))
    # DeepSeek-V3's weight_scale_inv: the tile (i, j) is fp8 * scale[i, j]; each tile's largest entry is 448
    tile = (..., slice(128, 256) if R > 128 else slice(0, R), slice(0, min(C, 128)))
    i = 1 if R > 128 else 0
    assert torch.allclose(q[tile].float() * scale[..., i, 0, None, None], fp8.dequantize(q, scale, torch.float32)[tile])
    assert (q[tile].float().abs().amax(dim=(-2, -1)) == 448).all()
    back = fp8.dequantize(q, scale, torch.float32)
    assert ((back - w).norm() / w.norm()) < 0.035  # e4m3 rounding: ~2.7% rms
    assert ((back - w).abs() <= w.abs() * 2**-4 + scale.max() * 2**-9).all()  # half a step of 3 mantissa bits


def test_a_zero_tile_stays_zero_and_activations_keep_their_scale():
    q, scale = fp8.quantize(torch.zeros(4, 200))
    assert not fp8.dequantize(q, scale, torch.float32).any() and torch.isfinite(scale).all()
    x = torch.randn(5, 200) * 1000
    assert ((fp8.quantized_activations(x) - x).norm() / x.norm()) < 0.035


def test_unsupported_fp8_schemes_are_named():
    assert fp8.is_fp8({"quantization_config": fp8.QUANTIZATION_CONFIG})
    assert not fp8.is_fp8({"quantization_config": {"quant_method": "awq"}}) and not fp8.is_fp8({})
    with pytest.raises(ValueError, match="128x128"):
        fp8.is_fp8({"quantization_config": {"quant_method": "fp8", "weight_block_size": [64, 64]}})


# --- loading and saving ------------------------------------------------------------------------------
def test_quantize_at_load_makes_only_the_routed_experts_fp8(golden_dir, golden_fp8, caplog):
    bf16 = load_model(golden_dir, device="cpu", dtype="bfloat16")
    experts = [layer.mlp.experts for layer in golden_fp8.model.layers if hasattr(layer.mlp, "experts")]
    assert experts and all(isinstance(e, llada2.FP8Experts) for e in experts)
    assert all(e.w_down.dtype == torch.float8_e4m3fn and e.w_down_scale_inv.shape == (16, 1, 1) for e in experts)
    ours, theirs = golden_fp8.state_dict(), bf16.state_dict()
    for name, tensor in theirs.items():
        if ".experts." not in name:
            assert torch.equal(ours[name], tensor), name  # everything else is the bf16 model's
    w = theirs["model.layers.1.mlp.experts.w_up"][3].float()
    name = "model.layers.1.mlp.experts.w_up"
    back = fp8.dequantize(ours[name][3], ours[f"{name}_scale_inv"][3], torch.float32)
    assert ((back - w).norm() / w.norm()) < 0.035
    with caplog.at_level(logging.INFO, logger="llada_lsp.model"):
        load_model(golden_dir, device="cpu", dtype="bfloat16", quantize="fp8")
    assert "96 routed expert matrices quantized to FP8 at load" in caplog.text and "largest shard" in caplog.text


def test_host_memory_of_quantizing_stays_below_one_shard(golden_dir, tmp_path, caplog):
    """A checkpoint in 3 shards: the bytes held at once for quantizing are one tensor's, never the
    whole model's (the log line states both)."""
    tensors = load_file(golden_dir / "model.safetensors")
    names = sorted(tensors)
    weight_map = {}
    for i in range(3):
        shard = f"model-{i + 1:05d}-of-00003.safetensors"
        part = {n: tensors[n] for n in names[i::3]}
        save_file(part, str(tmp_path / shard))
        weight_map |= dict.fromkeys(part, shard)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    shutil.copy(golden_dir / "config.json", tmp_path / "config.json")
    with caplog.at_level(logging.INFO, logger="llada_lsp.model"):
        load_model(tmp_path, device="cpu", dtype="bfloat16", quantize="fp8")
    line = next(r.getMessage() for r in caplog.records if "quantized to FP8" in r.getMessage())
    held = float(line.split("at most ")[1].split(" kB")[0]) * 1e3
    smallest_shard = min(f.stat().st_size for f in tmp_path.glob("*.safetensors"))
    assert 0 < held < smallest_shard


def test_an_fp8_checkpoint_saves_and_loads_as_is(golden_dir, golden_fp8, tmp_path):
    save_model(golden_fp8, tmp_path, torch.bfloat16)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["quantization_config"]["weight_block_size"] == [128, 128]
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert f.get_slice("model.layers.1.mlp.experts.0.gate_proj.weight").get_dtype() == "F8_E4M3"
        scale = f.get_slice("model.layers.1.mlp.experts.0.gate_proj.weight_scale_inv")
        assert scale.get_dtype() == "F32" and scale.get_shape() == [1, 1]
        assert f.get_slice("model.layers.1.mlp.shared_experts.gate_proj.weight").get_dtype() == "BF16"
    again = load_model(tmp_path, device="cpu", dtype="bfloat16")  # no quantize: the scales say FP8
    ids = load_file(golden_dir / "forward.safetensors")["bc64.input_ids"][None]
    with torch.no_grad():
        assert torch.equal(again(ids), golden_fp8(ids))
    # the plan reads the stored FP8 bytes as they are, and agrees with planning the bf16 one as FP8
    planned_fp8 = make_plan(golden_dir, memory=[10**12], quantize="fp8")
    assert make_plan(tmp_path, memory=[10**12]).weights == planned_fp8.weights


def test_fp8_experts_without_their_scales_are_refused(golden_dir, golden_fp8, tmp_path):
    save_model(golden_fp8, tmp_path, torch.bfloat16)
    tensors = load_file(tmp_path / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if not k.endswith("_scale_inv")}, str(tmp_path / "model.safetensors"))
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop("quantization_config")
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"experts\.0\.gate_proj\.weight is stored as F8_E4M3, not as floats"):
        load_model(tmp_path)


# --- accuracy ----------------------------------------------------------------------------------------
def test_fp8_logits_of_the_golden_checkpoint(golden_dir):
    """The golden checkpoint misses the issue's bar (0.75 / 12.9% / 89.5%, measured). Not routing
    flips: with every expert choice forced to bf16's the median is still 0.75. FP8 rounds each expert
    weight and activation by ~2.7% rms, 16x bf16's step, and this 64-wide random model turns that into
    logit moves of 0.5-1 (bf16 alone moves its rows by 0.25 against float64). So this guards the figure
    it has, well below what a broken scale does (activations 10% off: median 3.3; weight scales 1.5x:
    median 14, every row past 1.0)."""
    f = bench.golden_figures(golden_dir)
    assert f["rows"] == 209
    assert f["median"] < 1.0 and f["past_1"] <= 0.2 and f["argmax"] >= 0.85, f


def test_fp8_meets_the_bar_on_a_random_layer_at_cut_down_mini_shapes():
    """One MoE layer with mini's head dim, heads, routing (256 experts, top 8 of 4 groups of 8) and a
    partial expert tile (width 192), cut down in width and vocabulary to run in seconds."""
    raw = json.loads(MINI.read_text())
    raw |= {"hidden_size": 384, "moe_intermediate_size": 192, "intermediate_size": 768, "vocab_size": 4096,
            "mask_token_id": 4095, "eos_token_id": 4094, "pad_token_id": 4094}  # fmt: skip
    f = bench.random_layer_figures(raw, tokens=64)
    assert bench.meets_bar(f), f


def test_an_fp8_model_generates(golden_fp8, cases):
    case = cases["A06_P32_G64_speed"]
    result = Engine(golden_fp8).generation(case["prompt_ids"], case["gen_length"], "speed", mask_id=511,
                                           eos_id=508).run()  # fmt: skip
    assert result.steps > 0 and 0 < len(result.tokens) <= case["gen_length"] and 511 not in result.tokens


# --- the device check --------------------------------------------------------------------------------
def test_the_device_check_builds_what_the_plan_counts():
    """benchmarks/host_flash_check.py's network, at cut-down shapes on the CPU: its bytes are the plan's."""
    raw = json.loads(MINI.read_text())
    raw |= {"hidden_size": 256, "moe_intermediate_size": 192, "intermediate_size": 512, "vocab_size": 1024,
            "num_experts": 16, "n_group": 4, "topk_group": 2, "num_hidden_layers": 2, "mask_token_id": 1023,
            "eos_token_id": 1022, "pad_token_id": 1022}  # fmt: skip
    raw.pop("dtype")
    model = example("host_flash_check").build(raw, torch.device("cpu"))
    held = sum(t.nbytes for t in model.state_dict().values())
    shape = ModelShape.from_config(raw, "cut-down")
    plan = plan_of("cut-down", shape, None, ["cpu"], [10**12], "bfloat16", "fp8", 0, 1)
    assert held == plan.weights
    with torch.no_grad():
        assert torch.isfinite(model(torch.arange(40)[None])).all()


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="a CUDA device is here: run benchmarks/host_flash_check.py itself"
)
def test_the_device_check_says_it_needs_a_gpu():
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "host_flash_check.py")], capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert p.returncode == 2 and "no CUDA device" in p.stdout
