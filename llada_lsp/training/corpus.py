"""The training corpus: the Python standard library (tests included) of the interpreter that runs.

The split is by file and deterministic: a file is held out when the first byte of the SHA-1 of its
path relative to the stdlib root is below HELD_OUT_BYTE (about 5% of files). Held-out files are never
trained on; the infill evaluation cuts its tasks from them. Third-party packages are never read.

`python -m llada_lsp.training.corpus train FILE` writes one split as gzipped JSON lines, so that a
machine with another Python (a GPU box) trains on exactly this interpreter's files (`train --corpus`).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
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


def dump(files: list[SourceFile], path: Path) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for sf in files:
            f.write(json.dumps({"path": sf.path, "text": sf.text}) + "\n")


def load(path: Path) -> list[SourceFile]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [SourceFile(**json.loads(line)) for line in f if line.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llada_lsp.training.corpus",
                                 description="Write one split of this interpreter's stdlib as a corpus file.")
    ap.add_argument("split", choices=("train", "heldout"))
    ap.add_argument("out", type=Path, help="output file (.jsonl.gz)")
    args = ap.parse_args(argv)
    files = iter_files(args.split)
    dump(files, args.out)
    print(f"{len(files)} files, {sum(len(f.text) for f in files) / 1e6:.1f} M characters -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
