"""A candidate embedded model, end to end: train it on the built corpus within a time budget, score it
beside the shipped model on held-out standard-library and third-party files, and say whether it ships.

`llada-lab candidate --out runs/v2 --minutes 7` (on a GPU: `llada_lab/scripts/train_gpu.sh`).
Both phases resume: training continues from OUT/state.pt up to the same total budget, and a finished
budget is not trained again. Training is `llada-lab train` (its flags pass through); the scoring and the
shipping rule are training/candidate.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from ..training import corpus
from ..training.candidate import compare, trained_seconds
from ..training.train import copy_tokenizer
from .train import train_main

# The scratch network: v1's (training.train.TINY) with 6 layers and narrower experts, 12.3M parameters,
# 24.7 MB in bf16.
V2_SCRATCH = {"num_hidden_layers": 6, "moe_intermediate_size": 184}
RECIPES = {
    # Continue the shipped network (its 340M tokens kept) on the broader corpus, with the confidence loss.
    "warm": ["--lr", "1e-3", "--warmup", "50"],
    # A larger network from random weights.
    "scratch": ["--config", json.dumps(V2_SCRATCH), "--lr", "3e-3", "--warmup", "200"],
}


def train_phase(args: argparse.Namespace, extra: list[str]) -> None:
    budget = args.minutes * 60
    if (done := trained_seconds(args.out)) >= budget:
        print(f"training: {done:.0f}s of {budget:.0f}s already spent in {args.out}, not trained again", flush=True)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    if not (args.out / "tokenizer.json").is_file():  # v1's vocabulary: the two models stay comparable
        copy_tokenizer(args.baseline, args.out)
    recipe = RECIPES[args.recipe] + (["--init-from", str(args.baseline)] if args.recipe == "warm" else [])
    argv = ["--out", str(args.out), "--corpus", str(args.corpus / corpus.SPLIT_FILES["train"]),
            "--hours", str(args.minutes / 60), "--export", str(args.out / "export"), "--device", args.device,
            "--confidence-weight", "0.5", "--save-every", "250", *recipe, *extra]  # fmt: skip
    print("training: llada-lab train " + " ".join(argv), flush=True)
    if train_main(argv) != 0:
        raise SystemExit("training failed")
    if torch.cuda.is_available():  # the evaluation processes need the memory training's allocator holds
        torch.cuda.empty_cache()


def eval_phase(args: argparse.Namespace) -> dict:
    if not (args.out / "export" / "model.safetensors").is_file():
        raise SystemExit(f"no candidate at {args.out / 'export'}: train first (--phase train)")
    modes = [m for m in args.modes.split(",") if m]
    if "speed" not in modes:
        raise SystemExit("--modes must include speed (the rule is decided in speed mode)")
    return compare(
        args.out, args.corpus, args.baseline, modes, args.eval_device, args.jobs, args.n, args.n_other, args.task_seed
    )


def candidate_main(argv: list[str] | None = None) -> int:
    from llada_lsp.model.loader import EMBEDDED_MODEL

    ap = argparse.ArgumentParser(
        prog="llada-lab candidate",
        description=__doc__.split("\n\n")[0],
        epilog="Other flags go to `llada-lab train` (later ones win), e.g. --batch 64.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("--out", type=Path, default=Path("runs/v2"), help="run folder; the candidate is OUT/export")
    ap.add_argument("--corpus", type=Path, default=corpus.DEFAULT_CACHE,
                    help="the folder `llada-lab corpus` built")  # fmt: skip
    ap.add_argument("--minutes", type=float, default=7.0, help="training budget, resumed runs included")
    ap.add_argument("--phase", choices=("all", "train", "eval"), default="all", help="what to run")
    ap.add_argument("--recipe", choices=tuple(RECIPES), default="warm",
                    help="warm: continue the shipped network; scratch: a 12.3M network from random weights")  # fmt: skip
    ap.add_argument("--baseline", type=Path, default=EMBEDDED_MODEL, help="the model to beat (the shipped one)")
    ap.add_argument("--device", default="auto", help="training device: cpu, cuda, auto")
    ap.add_argument("--eval-device", default="auto", help="evaluation device: cpu, cuda, auto")
    ap.add_argument("--jobs", type=int, default=1, help="evaluation processes")
    ap.add_argument("--n", type=int, default=300, help="rest-of-line tasks per split")
    ap.add_argument("--n-other", type=int, default=100, help="whole-line and block-body tasks each, per split")
    ap.add_argument("--modes", default="speed,quality,no-edit", help="the modes compared; speed decides")
    ap.add_argument("--task-seed", type=int, default=1234, help="which tasks are cut")
    args, extra = ap.parse_known_args(argv)
    missing = [name for name in corpus.SPLIT_FILES.values() if not (args.corpus / name).is_file()]
    if missing:
        print(
            f"{ap.prog}: error: {args.corpus} lacks {', '.join(missing)}: build it first with "
            f"`llada-lab corpus --cache {args.corpus}` (needs the network once)",
            file=sys.stderr,
        )
        return 2
    if args.phase in ("all", "train"):
        train_phase(args, extra)
    elif extra:
        ap.error(f"unknown arguments for --phase eval: {' '.join(extra)}")
    if args.phase in ("all", "eval"):
        eval_phase(args)
    return 0
