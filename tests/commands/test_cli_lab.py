"""The product apart from the lab: `llada-lsp --help` lists what a user runs and no research tool, and
every research tool answers `--help` from `llada-lab`, with the lab's usage."""

from __future__ import annotations

import subprocess
import sys

import pytest

from llada_lab.cli import SUBCOMMANDS as LAB
from llada_lab.cli import main as lab_main

# Training, corpus building, edit mining, fine-tuning, the evaluations, kernel builds: the lab's.
RESEARCH = ("train", "corpus", "candidate", "eval-infill", "eval-rewrite", "eval-typing", "edit-pairs",
            "tune-next-edit", "tune-cross-file", "eval-next-edit", "compile-kernels")  # fmt: skip


def run(package: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", package, *args], capture_output=True, text=True, timeout=120)


def listed(help_text: str) -> list[str]:
    """The subcommand names of a `--help`: the first word of each line under "subcommands:"."""
    lines = help_text.split("subcommands:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    return [line.split()[0] for line in lines]


def test_the_products_help_lists_at_most_8_subcommands_and_no_research_tool():
    p = run("llada_lsp", "--help")
    assert p.returncode == 0, p.stderr
    names = listed(p.stdout)
    assert {"serve", "engine", "complete", "rewrite", "plan"} <= set(names) and len(names) <= 8, names
    assert not set(names) & set(RESEARCH), names
    assert "llada-lab --help" in p.stdout  # where the research tools went


def test_a_research_tool_is_not_a_product_subcommand():
    p = run("llada_lsp", "train", "--help")
    assert p.returncode == 2 and "unknown subcommand 'train'" in p.stderr


def test_the_labs_help_lists_every_research_tool():
    assert list(LAB) == list(RESEARCH)
    p = run("llada_lab", "--help")
    assert p.returncode == 0, p.stderr
    assert listed(p.stdout) == list(RESEARCH)


@pytest.mark.parametrize("name", RESEARCH)
def test_each_research_tool_answers_help_from_the_lab(name, capsys):
    with pytest.raises(SystemExit) as done:  # argparse's --help exits 0 after printing
        lab_main([name, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: llada-lab {name} ")


def test_the_labs_help_imports_no_torch_and_a_typo_gets_the_closest_name():
    code = "from llada_lab.cli import main; main(['--help']); import sys; assert 'torch' not in sys.modules"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    p = run("llada_lab", "eval-infil")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "did you mean 'eval-infill'?" in p.stderr
    p = run("llada_lab")
    assert p.returncode == 2 and p.stderr.startswith("usage: llada-lab")
