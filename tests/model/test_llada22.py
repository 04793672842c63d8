"""LLaDA2.2 recognised from its config: block routing (`expert_capacity`, `block_size`) and the edit ids
(config, LLaDA2.2-flash defaults, or the loader's override); every incoherent mix refused with a
message naming the key; the family and decoding rule named for `plan` and the status lines.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from llada_lsp import CheckpointError, Engine, load_model
from llada_lsp.model.config import LLaDA2Config
from llada_lsp.model.plan import make_plan, render

TINY22 = Path(__file__).resolve().parents[1] / "golden" / "llada22-tiny"
FLASH_VOCAB = 157184


@pytest.fixture(scope="module", autouse=True)
def one_thread(one_thread_per_module):
    """One torch thread for the module (conftest.torch_threads says why)."""


def variant(tmp_path: Path, source: Path, **changes) -> Path:
    """A copy of a checkpoint folder whose config.json has `changes` (None removes a key)."""
    folder = tmp_path / "ckpt"
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("*.json", "*.py"))
    raw = json.loads((source / "config.json").read_text())
    for key, value in changes.items():
        raw.pop(key, None) if value is None else raw.__setitem__(key, value)
    (folder / "config.json").write_text(json.dumps(raw))
    return folder


def test_the_tiny_checkpoint_is_llada22_with_its_own_edit_ids():
    model = load_model(TINY22, device="cpu", dtype=torch.float32)
    family = model.config.family
    assert (family.name, family.decoding_rule) == ("LLaDA2.2", "JointThresholdInDel")
    assert model.config.block_routing and model.config.edit_ids == (509, 510)
    assert family.edit_ids_from == "config"
    assert family.describe() == ("LLaDA2.2: block routing (8 experts per 32-token block), decoding "
                                 "JointThresholdInDel (DELETE 509, INSERT 510, config)")  # fmt: skip


def test_llada21_stays_llada21(golden_dir):
    config = load_model(golden_dir, device="cpu", dtype=torch.float32).config
    assert (config.family.name, config.family.decoding_rule) == ("LLaDA2.1", "JointThreshold")
    assert not config.block_routing and config.edit_ids is None
    assert not {"block_size", "expert_capacity", "delete_token_id", "split_token_id"} & set(config.to_dict())


def test_flash_defaults_apply_when_the_config_omits_the_edit_ids():
    config = LLaDA2Config(
        vocab_size=FLASH_VOCAB, expert_capacity=48, block_size=32, num_experts=256, num_experts_per_tok=8
    )
    assert config.edit_ids == (156930, 156931) and config.family.edit_ids_from == "default"
    config.edit_ids_override = (157000, 157001)
    assert config.edit_ids == (157000, 157001) and config.family.edit_ids_from == "override"


def test_defaults_that_do_not_fit_the_vocabulary_are_refused_unless_overridden(tmp_path):
    folder = variant(tmp_path, TINY22, delete_token_id=None, split_token_id=None)
    with pytest.raises(CheckpointError, match=r"delete_token_id: 156930 is not an id of the vocabulary .*defaults"):
        load_model(folder, device="cpu", dtype=torch.float32)
    model = load_model(folder, device="cpu", dtype=torch.float32, edit_ids=(505, 506))
    assert model.config.edit_ids == (505, 506) and model.config.family.edit_ids_from == "override"


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"expert_capacity": None, "block_size": None}, "delete_token_id/split_token_id without expert_capacity"),
        ({"block_size": None}, "block_size: None is not a positive integer"),
        ({"expert_capacity": 2}, "expert_capacity: 2 must lie between num_experts_per_tok 4 and num_experts 16"),
        ({"split_token_id": None}, "split_token_id: missing while delete_token_id is given"),
        ({"delete_token_id": 512}, r"delete_token_id: 512 is not an id of the vocabulary \(size 512\)"),
        ({"split_token_id": 509}, "delete_token_id and split_token_id are both 509"),
        ({"delete_token_id": 511}, "mask_token_id: 511 is also an edit id"),
    ],
)
def test_incoherent_configs_are_refused_with_the_key(tmp_path, changes, message):
    with pytest.raises(CheckpointError, match=message):
        load_model(variant(tmp_path, TINY22, **changes), device="cpu", dtype=torch.float32)


def test_an_edit_id_override_for_llada21_is_refused(golden_dir):
    with pytest.raises(CheckpointError, match="without expert_capacity"):
        load_model(golden_dir, device="cpu", dtype=torch.float32, edit_ids=(505, 506))


def test_decoding_must_use_the_routing_block():
    model = load_model(TINY22, device="cpu", dtype=torch.float32)
    with pytest.raises(ValueError, match="block size 16: .* per block of 32 tokens"):
        Engine(model, block_size=16)
    assert Engine(model, block_size=32).block_size == 32


def test_plan_names_the_family(golden_dir):
    assert "family: LLaDA2.2: block routing (8 experts per 32-token block)" in render(
        make_plan(TINY22, memory=[10**12])
    )
    assert "family: LLaDA2.1: per-token routing, decoding JointThreshold" in render(
        make_plan(golden_dir, memory=[10**12])
    )


def test_plan_refuses_an_incoherent_config(tmp_path):
    with pytest.raises(CheckpointError, match="without expert_capacity"):
        make_plan(variant(tmp_path, TINY22, expert_capacity=None), memory=[10**12])


def test_the_engine_decodes_llada22_with_the_indel_rule_at_the_presets_thresholds(golden_dir):
    from llada_lsp.engine.policy import JointThreshold, JointThresholdInDel

    engine = Engine(load_model(TINY22, device="cpu", dtype=torch.float32))
    assert engine.settings([1, 2], 8, "quality").policy == JointThresholdInDel(0.7, 0.5)
    assert engine.settings([1, 2], 8, JointThreshold(0.6, 0.1)).policy == JointThresholdInDel(0.6, 0.1)
    assert engine.settings([1, 2], 8).edit_ids == (509, 510)
    with pytest.raises(ValueError, match="init_ids hold an edit id"):
        engine.settings([1, 2], 8, init_ids=[3, 509])
    with pytest.raises(ValueError, match="post-edit budget"):
        engine.settings([1, 2], 8, max_post_steps=-1)
    old = Engine(load_model(golden_dir, device="cpu", dtype=torch.float32))
    assert old.settings([1, 2], 8, "speed").policy == JointThreshold(0.5, 0.0)
    with pytest.raises(ValueError, match="needs a checkpoint with edit tokens"):
        old.settings([1, 2], 8, JointThresholdInDel())
    with pytest.raises(ValueError, match="JointThreshold sequence for a model whose rule is JointThresholdInDel"):
        engine.scheduler.add(old.settings([1, 2], 8))
