"""The training corpus: the Python standard library (tests included) of the interpreter that runs.

The split is by file and deterministic: a file is held out when the first byte of the SHA-1 of its
path relative to the stdlib root is below HELD_OUT_BYTE (about 5% of files). Held-out files are never
trained on; the infill evaluation cuts its tasks from them. Third-party packages are never read.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

HELD_OUT_BYTE = 13  # 13/256 = 5.1% of files
SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__", "lib2to3/tests/data", "test/tokenizedata"}


@dataclass(frozen=True)
class SourceFile:
    path: str  # relative to the stdlib root, '/'-separated
    text: str


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_held_out(rel_path: str) -> bool:
    return hashlib.sha1(rel_path.encode()).digest()[0] < HELD_OUT_BYTE


def iter_files(split: str, root: Path | None = None, max_bytes: int = 400_000) -> list[SourceFile]:
    """All `.py` files of one split ('train' or 'heldout'), sorted by path, readable as UTF-8."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    root = root or stdlib_root()
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if any(part in rel for part in SKIP_DIRS) or path.stat().st_size > max_bytes:
            continue
        if is_held_out(rel) != (split == "heldout"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            files.append(SourceFile(rel, text))
    return files
