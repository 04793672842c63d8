"""Shared fixtures: the golden reference data (in the repository, so a fresh clone runs every parity
test) and tiny checkpoints of the real architecture. The golden helpers that are plain functions or
constants (SAMPLE, settings_of, force_moe) are imported as `from conftest import ...`."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "llada2-tiny"
# The servers, services and editors the tests start inherit this: tests/hooks/sitecustomize.py is the
# step-delay hook (LLADA_LSP_TEST_STEP_DELAY_MS), kept out of the package.
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(ROOT / "tests" / "hooks"), os.environ.get("PYTHONPATH")) if p
)
# Each folder of tests on sys.path, as pytest's import mode puts a test module's own folder there when
# it collects it: a test may import a helper from another folder's module (`from test_sglang import
# FakeSGLang`) whichever folders a run collects. Basenames are unique across tests/ (test_layout).
sys.path[:0] = sorted({str(path.parent) for path in (ROOT / "tests").glob("*/test_*.py")} - set(sys.path))


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    # Part of the repository: missing means a broken checkout, which must fail, never skip.
    assert (GOLDEN / "config.json").is_file(), f"the golden data is missing from the repository: {GOLDEN}"
    return GOLDEN


@pytest.fixture(scope="session")
def golden_generate(golden_dir) -> dict:
    return json.loads((golden_dir / "generate.json").read_text())


@pytest.fixture(scope="session")
def cases(golden_generate) -> dict:
    """The generate cases by id."""
    return {c["id"]: c for c in golden_generate["cases"]}


@pytest.fixture(scope="module")
def model64(golden_dir):
    """The golden checkpoint in float64 on the CPU (one per module)."""
    import torch  # here, not at the top: see torch_threads

    from llada_lsp import load_model

    return load_model(golden_dir, device="cpu", dtype=torch.float64)


# A sample of the generate cases that holds every kind of setting they have (test_golden's
# `test_the_sample_covers_every_setting_kind` keeps it so), one reason each (block = 32 positions):
# A network small enough to train a few steps in a test (config overrides of `llada-lab train --config`).
TINY_NETWORK = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                    intermediate_size=128, moe_intermediate_size=32, num_experts=4, n_group=2, topk_group=1)  # fmt: skip

SAMPLE = (
    "A01_P20_G64_quality",  # quality; prompt tail inside block 0; ends post-step budget, then converged
    "A06_P32_G64_speed",  # speed (always follow the argmax); the prompt is exactly one block (a prefill)
    "A13_P45_G64_quality",  # prompt across a block boundary; the output cut right after an EOS
    "A18_P45_G96_quality_eosstop",  # EOS early stop after the first block (11 forwards instead of 55)
    "A19_P20_G96_strict_eosstop",  # strict; mostly single-mask fallback steps; EOS stop after 3 of 4 blocks
    "A21_P45_G64_speed_post2",  # max_post_steps 2: every block ends on the post-step budget
)


def settings_of(engine, case: dict):
    """The engine's settings for a golden generate case."""
    from llada_lsp import JointThreshold

    policy = JointThreshold(case["threshold"], case["editing_threshold"])
    return engine.settings(case["prompt_ids"], case["gen_length"], policy, case["max_post_steps"],
                           case["eos_early_stop"], case["mask_token_id"], case["eos_token_id"])  # fmt: skip


def force_moe(model, mode: str | None) -> None:
    """Every MoE layer's path forced ("sparse", "dense"), or left to its own choice (None)."""
    for layer in model.model.layers:
        if hasattr(layer.mlp, "force"):
            layer.mlp.force = mode


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """torch's CPU thread count set to `n` (None: left alone), and put back afterwards, so later tests
    see the count they would have seen. One thread: on a busy 2-core machine two spin against each
    other (a case then takes 10x longer), and the servers run on one."""
    import torch  # here, not at the top: tests of what must not import torch run without it

    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def one_thread_per_module() -> Iterator[None]:
    with torch_threads(1):
        yield


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    with torch_threads(1):
        yield


@pytest.fixture
def restore_threads() -> Iterator[None]:
    """For code that sets the count itself (train and eval-infill's --threads)."""
    with torch_threads(None):
        yield


# A LLaDA2.2-shaped checkpoint paired with the embedded tokenizer (tests/commands/test_llada22_product.py): its
# edit ids are two ordinary tokens of that tokenizer, so an edit id that leaked into an answer would be
# readable text, which the tests look for.
LLADA22_EDIT_IDS = (8187, 8191)  # " ASTERISK", " TestableTest"


def make_llada22_checkpoint(folder: Path, seed: int = 3, edit_boost: float = 0.0) -> Path:
    """The embedded model's shapes with LLaDA2.2's keys (block routing over 4 of its 8 experts, the
    edit ids declared), seeded random weights and the embedded tokenizer. `edit_boost` scales the
    output rows of the edit ids, so that the model writes them often."""
    import torch

    from llada_lab.training.train import init_weights
    from llada_lsp.model import EMBEDDED_MODEL, LLaDA2, LLaDA2Config, save_model

    raw = json.loads((EMBEDDED_MODEL / "config.json").read_text())
    raw = {k: v for k, v in raw.items() if k not in ("model_type", "transformers_version", "dtype")}
    delete, split = LLADA22_EDIT_IDS
    config = LLaDA2Config(**raw, block_size=32, expert_capacity=4, delete_token_id=delete, split_token_id=split)
    network = LLaDA2(config)
    init_weights(network, seed=seed)
    if edit_boost:
        with torch.no_grad():
            network.lm_head.weight[list(LLADA22_EDIT_IDS)] *= edit_boost
    folder.mkdir(parents=True, exist_ok=True)
    save_model(network, folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(EMBEDDED_MODEL / name, folder / name)
    return folder
