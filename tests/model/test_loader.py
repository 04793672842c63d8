"""Checkpoint loading: sharded folders, name mapping round trip, one-line errors for bad input, sizes
checked against the safetensors headers before anything is built, and loads that can be abandoned."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from llada_lsp import CheckpointError, load_model
from llada_lsp.backends.native import load
from llada_lsp.completion.generation import ModelSpec
from llada_lsp.errors import LoadAbandoned
from llada_lsp.model import EMBEDDED_MODEL, LLaDA2, LLaDA2Config, plan, save_model
from llada_lsp.model.loader import resolve_path
from llada_lsp.runtime.worker import ModelWorker


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


@pytest.fixture()
def embedded_with_config(tmp_path):
    """The embedded model's files, linked into a folder whose config.json the test writes."""
    folder = tmp_path / "model"
    folder.mkdir()
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (folder / name).symlink_to(EMBEDDED_MODEL / name)
    config = json.loads((EMBEDDED_MODEL / "config.json").read_text())

    def write(**changes) -> str:
        (folder / "config.json").write_text(json.dumps({**config, **changes}))
        return str(folder)

    return write


@pytest.mark.parametrize(
    "changes, message",
    [
        # Built as asked, a million layers grew memory by 30 MB/s for minutes, past every cancel.
        ({"num_hidden_layers": 1_000_000}, "config.json says 1000000 layers, the weights hold 4"),
        ({"num_hidden_layers": 2}, "config.json says 2 layers, the weights hold 4"),
        ({"num_experts": 100_000_000}, "config.json says 100000000 experts, the weights hold 8"),
        ({"vocab_size": 10**12}, r"tensor model\.word_embeddings\.weight has shape \(8192, 256\), config.json "
                                 r"implies \(1000000000000, 256\)"),
        ({"num_attention_heads": 0, "head_dim": None}, "num_attention_heads: 0 is not a positive integer"),
        ({"hidden_size": -256}, "hidden_size: -256 is not a positive integer"),
        ({"num_hidden_layers": "4"}, "num_hidden_layers: '4' is not a positive integer"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok: 9 > num_experts 8"),
    ],
)  # fmt: skip
def test_sizes_that_disagree_with_the_weights_fail_before_anything_is_built(embedded_with_config, changes, message):
    folder = embedded_with_config(**changes)
    started = time.perf_counter()
    with pytest.raises(CheckpointError, match=message) as caught:
        load_model(folder)
    assert time.perf_counter() - started < 2, "the sizes must be refused from the headers, before building"
    assert "\n" not in str(caught.value)


def test_weights_larger_than_the_device_are_refused_before_reading(embedded_with_config, monkeypatch):
    folder = embedded_with_config()
    monkeypatch.setattr(plan, "free_memory", lambda device: 2**20)
    with pytest.raises(CheckpointError, match=r"does not fit: cpu needs \d\d\.\d\d MB \(3\d\.\d\d MB weights \+ .* KV cache\) "
                                              r"but has 1\.05 MB"):  # fmt: skip
        load_model(folder, dtype="float32")


def test_weights_stored_as_integers_or_unreadable_are_named(golden_copy):
    tensors = load_file(golden_copy / "model.safetensors")
    tensors["model.norm.weight"] = tensors["model.norm.weight"].to(torch.int32)
    save_file(tensors, str(golden_copy / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"tensor model\.norm\.weight is stored as I32, not as floats"):
        load_model(golden_copy)
    (golden_copy / "model.safetensors").write_bytes(b"\xff" * 8 + b"{}")
    with pytest.raises(CheckpointError, match="model.safetensors: not a readable safetensors file"):
        load_model(golden_copy)


def test_a_cancelled_load_stops_at_the_next_tensor(golden_dir):
    asked = 0

    def cancelled() -> bool:
        nonlocal asked
        asked += 1
        return asked > 5

    with pytest.raises(LoadAbandoned, match="loading abandoned"):
        load_model(golden_dir, cancelled=cancelled)
    assert asked == 6  # the golden model has ~60 tensors: the rest were never read


async def test_stopping_the_model_thread_abandons_its_load():
    """ModelWorker.stop (server shutdown) no longer waits for a load to read every tensor."""
    reading, stopping = threading.Event(), threading.Event()
    asked_after_stop = 0

    def held_at_the_first_tensor(spec, report, cancelled):
        def check() -> bool:
            nonlocal asked_after_stop
            if not reading.is_set():  # park the load between two tensors until the test has cancelled
                reading.set()
                stopping.wait(10)
            asked_after_stop += 1
            return cancelled()

        return load(spec, report, check)

    worker = ModelWorker(asyncio.get_running_loop(), lambda line: None, loader=held_at_the_first_tensor)
    ticket = worker.load(ModelSpec(None, threads=1), lambda *_: None)
    assert await asyncio.to_thread(reading.wait, 10)
    worker.cancel_all()  # what stop() does first; then the parked load may go on, and must stop
    stopping.set()
    assert worker.stop(timeout=10)
    assert asked_after_stop == 1  # not one more tensor was read
    assert ticket.future.cancelled() and worker.model is None


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
