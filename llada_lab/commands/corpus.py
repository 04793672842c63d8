"""`llada-lab corpus`: rebuild the training corpus from its manifest into a cache folder (`build`, the
default), record a package in the manifest (`add NAME==VERSION`), or write one split of the standard
library alone (`train|heldout FILE`, as v1 did). The corpus itself is training/corpus.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..training.corpus import DEFAULT_CACHE, MANIFEST, CorpusError, add, build, iter_files, pip_download, write


def corpus_main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["train"], ["heldout"]):  # v1's form: one split of the standard library alone
        ap = argparse.ArgumentParser(
            prog="llada-lab corpus SPLIT",
            description="Write one split of this interpreter's stdlib as a corpus file.",
        )
        ap.add_argument("split", choices=("train", "heldout"))
        ap.add_argument("out", type=Path, help="output file (.jsonl.gz)")
        args = ap.parse_args(argv)
        write(iter_files(args.split), args.out)
        return 0
    ap = argparse.ArgumentParser(
        prog="llada-lab corpus",
        description="Rebuild the training corpus (this interpreter's stdlib and the manifest's third-party sdists) "
                    "into CACHE: train.jsonl.gz, heldout.jsonl.gz, heldout-thirdparty.jsonl.gz. "
                    "`... corpus train|heldout FILE` writes one stdlib split alone.")  # fmt: skip
    ap.add_argument(
        "command",
        nargs="?",
        choices=("build", "add"),
        default="build",
        help="build (default): fetch, verify and write the corpus; add: record NAME==VERSION in the manifest",
    )
    ap.add_argument("packages", nargs="*", help="for add: NAME==VERSION ...")
    ap.add_argument(
        "--cache", type=Path, default=DEFAULT_CACHE, help="where sdists and the corpus files go (default: %(default)s)"
    )
    ap.add_argument("--manifest", type=Path, default=MANIFEST, help="default: the lab's training/corpus_manifest.json")
    ap.add_argument(
        "--offline", action="store_true", help="never download: every sdist must already be in CACHE/sdists"
    )
    ap.add_argument(
        "--stdlib", type=Path, default=None, help="the standard library's folder (default: this interpreter's)"
    )
    args = ap.parse_args(argv)
    try:
        if args.command == "add":
            if not args.packages:
                ap.error("add needs NAME==VERSION ...")
            add(args.packages, args.cache, args.manifest)
        else:
            if args.packages:
                ap.error("build takes no packages (add records them)")
            build(args.cache, args.manifest, None if args.offline else pip_download, args.stdlib)
    except CorpusError as e:
        print(f"{ap.prog}: error: {e}", file=sys.stderr)
        return 1
    return 0
