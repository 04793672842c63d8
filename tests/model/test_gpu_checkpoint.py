"""The checkpoints the project writes, as the GPU servers that would take them read them: every
config.json carries the keys inclusionAI's reference and SGLang's LLaDA2MoeModelLM read (loaded back
through transformers' own config class, as a checkpoint's remote-code config subclasses it, offline), for a bf16 model and for an FP8 one (the flash checkpoint a
user takes to a cluster), with the router's expert bias and the FP8 block scales in the weights."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from transformers import PretrainedConfig

from llada_lsp.model import LLaDA2, LLaDA2Config, fp8, save_model
from llada_lsp.model.loader import load_model

# What SGLang's LLaDA2MoeModelLM (python/sglang/srt/models/llada2.py) and the reference's config read
# besides the sizes: a missing one makes SGLang fail, pick another class, or silently drop the bias.
SGLANG_READS = ["architectures", "model_type", "hidden_act", "moe_router_enable_expert_bias", "embedding_dropout",
                "router_dtype", "use_bias", "use_qkv_bias", "use_qk_norm", "head_dim", "partial_rotary_factor",
                "rope_theta", "max_position_embeddings", "rms_norm_eps", "num_experts", "num_experts_per_tok",
                "first_k_dense_replace", "num_shared_experts", "norm_topk_prob", "routed_scaling_factor",
                "score_function", "n_group", "topk_group", "moe_intermediate_size", "intermediate_size",
                "tie_word_embeddings", "norm_head", "vocab_size", "hidden_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads"]  # fmt: skip
REFERENCE_READS = ["attention_dropout", "output_dropout", "use_rmsnorm", "initializer_range", "dtype"]
TINY = dict(vocab_size=512, hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=64, intermediate_size=256, moe_intermediate_size=128, num_experts=8, num_experts_per_tok=2,
            n_group=2, topk_group=1, max_position_embeddings=256, mask_token_id=511, eos_token_id=508)  # fmt: skip


def written(folder) -> dict:
    return json.loads((folder / "config.json").read_text())


@pytest.mark.parametrize("quantized", [False, True], ids=["bf16", "fp8"])
def test_a_written_checkpoint_carries_what_sglang_and_the_reference_read(tmp_path, quantized):
    """A model built from a bare config (as training builds one), saved: the keys are there with the
    released checkpoints' values, transformers reads them back, and the weights hold what they promise."""
    extra = {"quantization_config": dict(fp8.QUANTIZATION_CONFIG)} if quantized else {}
    torch.manual_seed(0)
    model = LLaDA2(LLaDA2Config(**TINY, **extra))
    if quantized:
        for name, param in model.named_parameters():
            if param.dtype == fp8.FP8:
                q, scale = fp8.quantize(torch.randn(param.shape) * 0.1)
                param.data.copy_(q)
                dict(model.named_parameters())[f"{name}_scale_inv"].data.copy_(scale)
    save_model(model, tmp_path)
    raw = written(tmp_path)
    missing = [k for k in SGLANG_READS + REFERENCE_READS if k not in raw]
    assert not missing, f"config.json lacks {missing}"
    assert raw["architectures"] == ["LLaDA2MoeModelLM"] and raw["model_type"] == "llada2_moe"
    assert raw["hidden_act"] == "silu" and raw["moe_router_enable_expert_bias"] is True
    assert raw["embedding_dropout"] == 0.0 and raw["dtype"] == "bfloat16"
    back = PretrainedConfig.from_json_file(tmp_path / "config.json")
    for key in SGLANG_READS:
        assert getattr(back, key) == raw[key], key
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        names = set(f.keys())
    assert "model.layers.1.mlp.gate.expert_bias" in names  # what moe_router_enable_expert_bias promises
    if quantized:
        assert raw["quantization_config"] == fp8.QUANTIZATION_CONFIG
        assert "model.layers.1.mlp.experts.0.gate_proj.weight_scale_inv" in names
        assert fp8.is_fp8(back)
        assert load_model(tmp_path, device="cpu", dtype=torch.float32).config.architectures == raw["architectures"]


def test_a_checkpoints_own_values_are_kept_and_a_foreign_activation_is_refused(golden_dir, tmp_path):
    config = LLaDA2Config(**TINY, moe_router_enable_expert_bias=False, architectures=["Other"])
    assert config.moe_router_enable_expert_bias is False and config.architectures == ["Other"]
    with pytest.raises(ValueError, match="hidden_act"):
        LLaDA2Config(**TINY, hidden_act="gelu").validate_llada()
    model = load_model(golden_dir, device="cpu", dtype=torch.float32)
    save_model(model, tmp_path, dtype=torch.float32)
    assert {k: v for k, v in written(tmp_path).items() if k in SGLANG_READS} == {
        k: v for k, v in written(golden_dir).items() if k in SGLANG_READS
    }
