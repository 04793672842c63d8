"""Figures as the commands that measure them print and publish them: tables aligned for the terminal,
and the same tables as a Markdown file that names its command, commit, date and machine.

docs/results.md is assembled from such files (benchmarks/results.py); a figure is quoted only with the
command that produced it. Imports no torch (it names torch's version only where torch is loaded already).
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Table:
    """Rows of cells under a header; cells are printed as given (format numbers before adding them)."""

    header: list[str]
    rows: list[list[str]] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        if len(cells) != len(self.header):
            raise ValueError(f"{len(cells)} cells for {len(self.header)} columns")
        self.rows.append([str(cell) for cell in cells])

    def text(self) -> str:
        """Left column left-aligned, the rest right-aligned, as a terminal table."""
        widths = [max(len(row[i]) for row in [self.header, *self.rows]) for i in range(len(self.header))]
        lines = []
        for row in [self.header, *self.rows]:
            cells = [row[0].ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(row[1:], widths[1:])]
            lines.append("  ".join(cells).rstrip())
        return "\n".join(lines)

    def markdown(self) -> str:
        def line(cells: list[str]) -> str:
            return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

        return "\n".join([line(self.header), "|" + "---|" * len(self.header), *map(line, self.rows)])


def commit() -> str:
    """The checkout's commit, `+changes` when the tree differs from it; `unknown` outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True, timeout=10).stdout.strip()  # fmt: skip
        # The published figures themselves are not the code that made them.
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs/results"],
                               cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


def machine() -> str:
    """CPU model and cores, OS, Python, and torch (with the GPU) when the command loaded it."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    parts = [f"{cpu}, {os.cpu_count()} cores", f"{platform.system()} {platform.machine()}",
             f"Python {platform.python_version()}"]  # fmt: skip
    torch = sys.modules.get("torch")
    if torch is not None:
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
        parts.append(f"torch {torch.__version__} ({gpu})")
    return "; ".join(parts)


def command_line(argv: list[str] | None = None) -> str:
    """How this process was started, as a reader would type it (`llada-lsp bench ...`, `python X.py ...`)."""
    argv = sys.argv if argv is None else argv
    program = Path(argv[0]).name
    if program == "__main__.py":  # python -m PACKAGE
        program = Path(argv[0]).parent.name.replace("_", "-")
    head = [program] if program in ("llada-lsp", "llada-lab") else ["python", os.path.relpath(argv[0], ROOT)]
    return shlex.join(head + argv[1:])


@dataclass
class Report:
    """One command's published figures: a title, tables and notes, written as one Markdown file."""

    title: str
    parts: list[str] = field(default_factory=list)

    def table(self, table: Table, caption: str = "") -> None:
        self.parts.append((f"{caption}\n\n" if caption else "") + table.markdown())

    def note(self, text: str) -> None:
        self.parts.append(text)

    def markdown(self, argv: list[str] | None = None) -> str:
        stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        head = (f"## {self.title}\n\nCommand: `{command_line(argv)}`  \nCommit: `{commit()}`  \nDate: {stamp}  \n"
                f"Machine: {machine()}")  # fmt: skip
        return "\n\n".join([head, *self.parts]) + "\n"

    def write(self, path: str | Path, argv: list[str] | None = None) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(self.markdown(argv), encoding="utf-8")
        print(f"wrote {path}", file=sys.stderr)


def add_markdown_argument(ap) -> None:
    ap.add_argument("--markdown", metavar="FILE", help="also write the tables as Markdown with this command, the "
                    "commit, the date and the machine (the files docs/results.md is assembled from)")  # fmt: skip
