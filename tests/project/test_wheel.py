"""The wheel a user installs: the product's data (the embedded model and its tokenizer) and both
commands, and none of the lab's data (the next-edit cases and their licences, the corpus and edit
manifests), which the repository keeps for the lab and the tests.

Built offline from a copy of the sources (so the build's scratch files stay out of the checkout), with
the setuptools of this environment."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    pytest.importorskip("setuptools", reason="the wheel is built with this environment's setuptools")
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).is_file():
            shutil.copy(ROOT / name, src / name)
    for package in ("llada_lsp", "llada_lab"):
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                        "-w", str(out), str(src)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    (built,) = out.glob("*.whl")
    with zipfile.ZipFile(built) as z:
        yield z


def test_the_wheel_holds_the_embedded_model_and_its_tokenizer(wheel):
    names = set(wheel.namelist())
    for file in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"):
        assert f"llada_lsp/data/tiny/{file}" in names, file
    assert "llada_lsp/cli.py" in names and "llada_lab/cli.py" in names  # the lab's code comes along


def test_the_wheel_holds_no_research_data(wheel):
    lab_data = [n for n in wheel.namelist()
                if "next_edit/" in n or n.endswith("_manifest.json") or n.endswith(".jsonl.gz")
                or n.startswith(("llada_lab/data/", "llada_lab/scripts/", "llada_lsp/training/"))]  # fmt: skip
    assert not lab_data, lab_data
    assert (ROOT / "llada_lab/data/next_edit/cases.jsonl.gz").is_file()  # the repository keeps it
    assert (ROOT / "llada_lab/training/corpus_manifest.json").is_file()


def test_the_wheel_declares_both_commands(wheel):
    (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    scripts = wheel.read(entry_points).decode().split("[console_scripts]", 1)[1]
    declared = dict(line.replace(" ", "").split("=", 1) for line in scripts.strip().splitlines() if "=" in line)
    assert declared == {"llada-lsp": "llada_lsp.cli:main", "llada-lab": "llada_lab.cli:main"}
