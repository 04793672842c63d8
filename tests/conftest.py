"""Shared fixtures: the golden reference data (in the repository, so a fresh clone runs every parity
test) and tiny checkpoints of the real architecture."""

from __future__ import annotations

import json
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
