"""docs/results.md: every table under the command and commit that produced it, the file assembled from
docs/results/ (never edited by hand), and no measurement history left in the project's prose."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from llada_lsp.report import Report, Table

ROOT = Path(__file__).resolve().parents[2]
COMMIT = re.compile(r"^Commit: `[0-9a-f]{7,40}(\+changes)?`", re.M)
COMMAND = re.compile(r"^Command: `[^`]+`", re.M)


def sections_with_tables(markdown: str) -> list[tuple[str, str]]:
    """(heading, text) of each `## ` section that holds a table; a table outside any section is its own."""
    chunks = re.split(r"^(?=## )", markdown, flags=re.M)
    return [(chunk.splitlines()[0], chunk) for chunk in chunks if re.search(r"^\|.*\|\s*$", chunk, re.M)]


def unnamed(markdown: str) -> list[str]:
    return [head for head, text in sections_with_tables(markdown) if not (COMMAND.search(text) and COMMIT.search(text))]


def test_every_table_in_the_results_names_its_command_and_commit():
    text = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert sections_with_tables(text), "docs/results.md has no table"
    assert unnamed(text) == []


def test_the_results_are_assembled_from_their_parts():
    done = subprocess.run([sys.executable, "benchmarks/results.py", "--check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_the_check_finds_a_table_without_its_command():
    assert unnamed("## A\n\nCommit: `0123abc`\n\n| a |\n|---|\n| 1 |\n") == ["## A"]
    assert unnamed("| a |\n|---|\n| 1 |\n") == ["| a |"]


def test_a_report_names_its_command_commit_and_machine():
    table = Table(["prompt", "ms | p50"])
    table.add(256, "1.5")
    report = Report("Speed")
    report.table(table, "One row.")
    text = report.markdown(["llada-lsp", "bench", "--threads", "1"])
    assert "Command: `llada-lsp bench --threads 1`" in text and "Machine: " in text
    assert "| prompt | ms \\| p50 |\n|---|---|\n| 256 | 1.5 |" in text
    assert unnamed(text) == []
    assert table.text().splitlines()[1].endswith("1.5")
    with pytest.raises(ValueError):
        table.add(1)


def test_no_measurement_history_in_the_prose():
    """Figures age in place: the project's Markdown and code name no "stop N" run (git keeps the history)."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    found = []
    for name in tracked:
        if Path(name).suffix in (".md", ".py", ".lua", ".ts", ".txt") and not name.startswith("tests/golden/"):
            text = (ROOT / name).read_text(encoding="utf-8", errors="replace")
            found += [f"{name}: {m.group(0)}" for m in re.finditer(r"\bstops? \d+\b", text, re.I)]
    assert found == []
