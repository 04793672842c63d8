"""Shared fixtures: the golden reference data and tiny checkpoints of the real architecture."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(os.environ.get("LLADA_GOLDEN", ROOT.parent / "shared" / "golden" / "llada2-tiny"))


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    if not (GOLDEN / "config.json").is_file():
        pytest.skip(f"golden data not found at {GOLDEN} (set LLADA_GOLDEN)")
    return GOLDEN


@pytest.fixture(scope="session")
def golden_generate(golden_dir) -> dict:
    return json.loads((golden_dir / "generate.json").read_text())
