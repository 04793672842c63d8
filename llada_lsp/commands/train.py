"""The training loop of the embedded model: seeded, checkpointed, resumable, with a progress bar.

`llada-lsp train --out runs/tiny` trains the tokenizer (once) and the network; `--export DIR` writes a
shippable model folder (config.json, bf16 model.safetensors, tokenizer files). The defaults are those
of the shipped model's run, on one GPU (bf16 autocast, samples built by worker processes); on a CPU, use
a smaller batch, e.g. `--batch 16 --hours 3`. The loop itself is training/train.py.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..training.objective import HOLE_KINDS, parse_hole_weights
from ..training.train import TrainSettings, train

D = TrainSettings()  # the defaults


def train_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="llada-lsp train",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("--out", type=Path, default=D.out, help="run folder (checkpoints, tokenizer)")
    ap.add_argument("--steps", type=int, default=D.steps, help="total optimizer steps (sets the LR schedule)")
    ap.add_argument("--batch", type=int, default=D.batch, help="sequences per step")
    ap.add_argument("--seq-len", type=int, default=D.seq_len, help="tokens per sequence (multiple of the block)")
    ap.add_argument("--block", type=int, default=D.block, help="diffusion block size (as the engine decodes)")
    ap.add_argument("--lr", type=float, default=D.lr, help="peak learning rate (AdamW)")
    ap.add_argument("--warmup", type=int, default=D.warmup, help="linear warmup steps")
    ap.add_argument("--edit-ratio", type=float, default=D.edit_ratio, help="share of visible tokens replaced, times t")
    ap.add_argument("--keep-weight", type=float, default=D.keep_weight, help="loss weight of kept visible tokens")
    ap.add_argument(
        "--confidence-weight",
        type=float,
        default=D.confidence_weight,
        help="weight of the entropy of correct predictions at masked positions (LLaDA2.0's "
        "confidence-aware training: sharper, so more tokens per step)",
    )
    ap.add_argument(
        "--self-fill",
        type=float,
        default=D.self_fill,
        help="share of blocks whose masks first get the model's own confident guesses (an extra "
        "no-grad forward), so it learns to revise its real mistakes, not only random tokens",
    )
    ap.add_argument(
        "--holes",
        type=_hole_weights,
        default=",".join(f"{k}={w}" for k, w in zip(HOLE_KINDS, D.holes)),
        help="sample mix, KIND=WEIGHT,... over " + ", ".join(HOLE_KINDS) + " (unnamed kinds keep "
        "the default weights, in that order)",
    )
    ap.add_argument("--vocab-size", type=int, default=D.vocab_size, help="BPE size, when the tokenizer is trained")
    ap.add_argument("--seed", type=int, default=D.seed, help="seeds the weights, the samples and the noise")
    ap.add_argument("--threads", type=int, default=D.threads, help="CPU threads of the training process")
    ap.add_argument("--device", default=D.device, help="cpu, cuda, or auto (cuda when available)")
    ap.add_argument(
        "--autocast", choices=("auto", "on", "off"), default=D.autocast, help="bf16 autocast (auto: on for CUDA)"
    )
    ap.add_argument(
        "--workers",
        type=int,
        default=D.workers,
        help="processes that build samples (default: 8 on CUDA, 0 = in the training process on CPU)",
    )
    ap.add_argument(
        "--corpus",
        type=Path,
        default=D.corpus,
        help="a corpus file: .corpus/train.jsonl.gz from `python -m llada_lsp.training.corpus` (stdlib and "
        "third-party), or `... corpus train FILE` (stdlib alone) (default: this interpreter's stdlib, train split)",
    )
    ap.add_argument("--save-every", type=int, default=D.save_every, help="checkpoint every N steps")
    ap.add_argument(
        "--hours",
        type=float,
        default=D.hours,
        help="time budget: the LR schedule ends at whichever of --steps and --hours comes first",
    )
    ap.add_argument("--export", type=Path, default=D.export, help="also write a shippable model folder here")
    ap.add_argument(
        "--init-from",
        type=Path,
        default=D.init_from,
        help="start a new run from an exported model folder (e.g. the shipped one) instead of random weights",
    )
    ap.add_argument(
        "--corpus-limit", type=int, default=D.corpus_limit, help="use only the first N training files (tests)"
    )
    ap.add_argument("--config", default=None, help="JSON of config overrides (tests use a smaller network)")
    args = ap.parse_args(argv)
    train(TrainSettings(**{**vars(args), "config": json.loads(args.config) if args.config else {}}))
    return 0


def _hole_weights(spec: str) -> tuple[float, ...]:
    try:
        return parse_hole_weights(spec)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
