"""Checkpoint loading: sharded folders, name mapping round trip, and one-line errors for bad input."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from llada_lsp import CheckpointError, load_model
from llada_lsp.model import LLaDA2, LLaDA2Config, save_model
from llada_lsp.model.loader import resolve_path


@pytest.fixture()
def golden_copy(golden_dir, tmp_path):
    dst = tmp_path / "ckpt"
    dst.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(golden_dir / name, dst / name)
    return dst


def test_sharded_checkpoint_loads_identically(golden_dir, golden_copy):
    tensors = load_file(golden_copy / "model.safetensors")
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(golden_copy / shard))
    (golden_copy / "model.safetensors").unlink()
    index = {"metadata": {}, "weight_map": {k: s for s, keys in shards.items() for k in keys}}
    (golden_copy / "model.safetensors.index.json").write_text(json.dumps(index))
    a, b = load_model(golden_dir, dtype="float64"), load_model(golden_copy, dtype="float64")
    ids = torch.arange(40)[None]
    assert torch.equal(a(ids), b(ids))
    (golden_copy / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors.*missing"):
        load_model(golden_copy)


def test_save_and_reload_round_trip(golden_dir, tmp_path):
    model = load_model(golden_dir, dtype="float32")
    save_model(model, tmp_path / "out", dtype=torch.float32)
    saved = load_file(tmp_path / "out" / "model.safetensors")
    assert "model.layers.1.mlp.experts.15.down_proj.weight" in saved  # real checkpoint names
    again = load_model(tmp_path / "out", dtype="float32")
    ids = torch.arange(33)[None]
    assert torch.equal(model(ids), again(ids))


def test_errors_name_the_culprit(golden_copy, tmp_path):
    with pytest.raises(CheckpointError, match="no such model folder"):
        load_model(tmp_path / "missing")
    with pytest.raises(CheckpointError, match="unknown dtype 'float8'"):
        load_model(golden_copy, dtype="float8")
    with pytest.raises(CheckpointError, match="unknown device"):
        load_model(golden_copy, device="tpu:0")

    config = json.loads((golden_copy / "config.json").read_text())
    (golden_copy / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    with pytest.raises(CheckpointError, match="config.json: model_type is 'llama'"):
        load_model(golden_copy)

    (golden_copy / "config.json").write_text(json.dumps({**config, "hidden_size": 96, "some_new_key": 1}))
    with pytest.raises(CheckpointError, match=r"tensor model\.\S+ has shape"):
        load_model(golden_copy)

    (golden_copy / "config.json").write_text(json.dumps({**config, "future_key": {"x": 1}}))
    assert load_model(golden_copy).config.vocab_size == 512  # unknown keys are ignored

    tensors = load_file(golden_copy / "model.safetensors")
    del tensors["model.layers.2.mlp.experts.3.up_proj.weight"]
    save_file(tensors, str(golden_copy / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"experts\.3\.up_proj\.weight: missing"):
        load_model(golden_copy)


def test_hf_id_is_never_downloaded(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(CheckpointError, match="not in the local Hugging Face cache"):
        resolve_path("inclusionAI/LLaDA2.1-mini")


def test_prompt_longer_than_positions_is_refused(golden_dir):
    from llada_lsp import generate

    model = load_model(golden_dir)
    with pytest.raises(ValueError, match="exceeds the model's 512 positions"):
        generate(model, list(range(500)), gen_length=64)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        generate(model, [600], gen_length=8)


def test_config_rejects_what_the_network_cannot_be():
    with pytest.raises(ValueError, match="n_group"):
        LLaDA2(LLaDA2Config(num_experts=10, n_group=4, hidden_size=32, num_attention_heads=2, head_dim=16))
