"""Shared fixtures: the golden reference data (in the repository, so a fresh clone runs every parity
test) and tiny checkpoints of the real architecture."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "llada2-tiny"


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    # Part of the repository: missing means a broken checkout, which must fail, never skip.
    assert (GOLDEN / "config.json").is_file(), f"the golden data is missing from the repository: {GOLDEN}"
    return GOLDEN


@pytest.fixture(scope="session")
def golden_generate(golden_dir) -> dict:
    return json.loads((golden_dir / "generate.json").read_text())


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
