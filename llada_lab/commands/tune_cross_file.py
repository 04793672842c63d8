"""`llada-lab tune-cross-file`: fine-tune the embedded model to use snippets of other files (issue 44):
training sequences that start with related files of one package, rendered as the server renders them,
before the hole, mixed with the usual single-file infill objective; CPU-bounded (--minutes),
checkpointed to OUT/state.pt and resumed from it, the candidate exported to OUT/model. It replaces
nothing: whether it ships is for `llada-lab eval-infill --model OUT/model` (no loss on the held-out
split, sign test) and `eval-infill --cross-file --model OUT/model` (a win with context on) to say.
The samples are training/cross_file.py (CrossFileSamples).
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import torch


def tune_cross_file_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="llada-lab tune-cross-file", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)  # fmt: skip
    ap.add_argument("--corpus", type=Path, default=Path(".corpus"), help="corpus folder (its train.jsonl.gz)")
    ap.add_argument("--out", type=Path, default=Path("runs/cross_file"), help="run folder")
    ap.add_argument("--init-from", type=Path, default=None, help="model folder to start from (default: embedded)")
    ap.add_argument("--minutes", type=float, default=30.0, help="training time budget (this and earlier runs of OUT)")
    ap.add_argument("--cross-batch", type=int, default=4, help="sequences with other files' snippets per step")
    ap.add_argument("--infill-batch", type=int, default=4, help="single-file infill sequences per step")
    ap.add_argument("--shares", default="25,50", help="context shares (percent of the prompt) drawn per sample")
    ap.add_argument("--lr", type=float, default=2e-4, help="peak learning rate (AdamW, cosine to 10%%)")
    ap.add_argument("--save-every", type=int, default=25, help="checkpoint every N steps")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=44)
    args = ap.parse_args(argv)
    shares = tuple(int(s) for s in args.shares.split(",") if s)

    from llada_lsp.completion.codec import TextCodec
    from llada_lsp.model import EMBEDDED_MODEL

    from ..training.checkpoint import RunState, adamw, load_trainable, train_for
    from ..training.corpus import SPLIT_FILES, load
    from ..training.cross_file import CrossFileSamples, group_by_package
    from ..training.objective import block_diffusion_loss, training_mask
    from ..training.train import Batches, export, update

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model, tok = load_trainable(args.init_from or EMBEDDED_MODEL)
    codec = TextCodec.from_tokenizer(tok)
    config = model.config
    seq_len, block = config.max_position_embeddings, 32
    mask_id = codec.special.mask
    train_files = load(args.corpus / SPLIT_FILES["train"])  # the training split only: no held-out file
    packages = group_by_package(train_files)
    params, opt = adamw(model, args.lr)
    args.out.mkdir(parents=True, exist_ok=True)
    state = RunState(args.out / "state.pt", model, opt)
    step = torch.load(state.path, map_location="cpu", weights_only=False)["step"] if state.path.is_file() else 0
    seed = args.seed * 1_000_003 + step  # resumed runs see new draws, deterministically
    samples = CrossFileSamples(packages, codec, seq_len, seed, shares)  # ~20 s of parsing: before the clock starts
    print(f"{len(samples.files)} training files import another module of their package", flush=True)
    cross = samples.batches(args.cross_batch)
    saved = state.resume()
    log = saved.get("log", [])
    if saved:
        print(f"resumed at step {step} ({state.spent / 60:.1f} min spent)", flush=True)
    infill = iter(Batches([f.text for f in train_files], tok, seed, args.infill_batch, seq_len))
    gen = torch.Generator().manual_seed(args.seed * 7919 + step)
    random.seed(seed)
    allow = training_mask(seq_len, block)

    def save(step: int) -> None:
        state.save(step=step, log=log, args={k: str(v) for k, v in vars(args).items()})
        export(model, tok, args.out / "model")

    def one_step():
        loss, stats = block_diffusion_loss(model, torch.tensor(next(cross)), mask_id, block, 0.15, 0.1, allow, gen)
        infill_loss, infill_stats = block_diffusion_loss(model, next(infill), mask_id, block, 0.15, 0.1, allow, gen)
        loss = loss + infill_loss
        update(model, opt, params, loss)
        return loss, {"cross_acc": stats["mask_acc"], "infill_acc": infill_stats["mask_acc"]}

    train_for(state, args.minutes, args.lr, step, log, one_step, save, args.save_every)
    print(f"candidate {args.out / 'model'}", flush=True)
    return 0
