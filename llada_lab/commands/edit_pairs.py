"""`llada-lab edit-pairs`: rebuild the next-edit cases from training/edit_manifest.json and local git
copies of the repositories it names.

The manifest names each repository, its licence, its split (`train`: mined for the fine-tune;
`eval`: held out by repository, the evaluation set in data/next_edit/), the head commit mined and the commits
(and, for eval, the files) the cases come from. Without --discover this rebuilds exactly those cases
(same seed, same commits); with --discover it mines each repository's whole history at its head,
picks the evaluation set afresh and rewrites the manifest. The cutting is training/edit_pairs.py.

Needs git and each repository's history on disk (`--git-dir owner/name=PATH`, or the layout of
--mirrors); never the network.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
from pathlib import Path

from ..training import edit_pairs as ep
from ..training.edit_pairs import EVAL_SET, MANIFEST

TRAIN_SET = Path("runs") / "edit_pairs" / "train.jsonl.gz"


def edit_pairs_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="llada-lab edit-pairs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", default=str(MANIFEST), help="default: the lab's training/edit_manifest.json")
    ap.add_argument(
        "--mirrors",
        default="/work/.mirror/{owner}+{name}/repo",
        help="where each repository's git directory is, {owner} and {name} filled in (default: %(default)s)",
    )
    ap.add_argument(
        "--git-dir",
        action="append",
        default=[],
        metavar="OWNER/NAME=PATH",
        help="this repository's git directory (overrides --mirrors; repeatable)",
    )
    ap.add_argument(
        "--discover",
        action="store_true",
        help="mine the whole history at each head, choose the evaluation set anew, rewrite the manifest",
    )
    ap.add_argument("--eval-out", default=str(EVAL_SET), help="default: the lab's data/next_edit/cases.jsonl.gz")
    ap.add_argument("--train-out", default=str(TRAIN_SET), help="default: %(default)s (not kept in the repository)")
    ap.add_argument("--only", choices=["eval", "train"], default=None, help="rebuild one split only")
    args = ap.parse_args(argv)
    manifest = json.loads(Path(args.manifest).read_text())
    overrides = dict(item.split("=", 1) for item in args.git_dir)
    seed, n_eval = manifest["seed"], manifest["eval_cases"]
    out: dict[str, list[dict]] = {"eval": [], "train": []}
    for entry in manifest["repos"]:
        if args.only and entry["split"] != args.only:
            continue
        owner, name = entry["repo"].split("/")
        git_dir = overrides.get(entry["repo"]) or args.mirrors.format(owner=owner, name=name)
        if not Path(git_dir).exists():
            print(f"llada-lab edit-pairs: no git directory for {entry['repo']} at {git_dir}", file=sys.stderr)
            return 2
        if args.discover:
            entry["head"] = subprocess.run(
                ["git", "--git-dir", git_dir, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
            ).stdout.strip()
            commits = ep.python_commits(git_dir, entry["head"])
        else:
            commits = entry["commits"]
        cases = ep.mine(git_dir, entry["repo"], entry["licence"], commits, seed)
        if entry["split"] == "eval" and not args.discover:
            wanted = {(c["commit"], c["path"]) for c in entry["cases"]}
            cases = [c for c in cases if (c["commit"], c["path"]) in wanted]
        for c in cases:
            ep.check(c)
        out[entry["split"]].extend(cases)
        print(f"{entry['repo']} ({entry['split']}): {len(commits)} commits, {len(cases)} cases", file=sys.stderr)
    if args.discover:
        eval_repos = [e for e in manifest["repos"] if e["split"] == "eval"]
        out["eval"] = ep.select(out["eval"], n_eval, seed)
        for entry in eval_repos:
            mine = [c for c in out["eval"] if c["repo"] == entry["repo"]]
            entry["cases"] = [{"commit": c["commit"], "path": c["path"]} for c in mine]
            entry["commits"] = sorted({c["commit"] for c in mine})
        for entry in manifest["repos"]:
            if entry["split"] == "train":
                entry["commits"] = sorted({c["commit"] for c in out["train"] if c["repo"] == entry["repo"]})
        Path(args.manifest).write_text(json.dumps(manifest, indent=1) + "\n")
    for cases in out.values():  # one order whichever way they were made
        cases.sort(key=lambda c: (c["repo"], c["commit"], c["path"]))
    if args.only != "train":
        ep.write_jsonl_gz(args.eval_out, out["eval"])
        print(
            f"eval: {len(out['eval'])} cases {dict(collections.Counter(c['kind'] for c in out['eval']))} -> {args.eval_out}"
        )
    if args.only != "eval":
        ep.write_jsonl_gz(args.train_out, out["train"])
        print(
            f"train: {len(out['train'])} cases {dict(collections.Counter(c['kind'] for c in out['train']))} -> {args.train_out}"
        )
    return 0
