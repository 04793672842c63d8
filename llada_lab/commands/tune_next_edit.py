"""`llada-lab tune-next-edit`: fine-tune the embedded model on mined next-edit cases, mixed with its
infill objective; CPU-bounded (--minutes), checkpointed to OUT/state.pt and resumed from it, the
candidate exported to OUT/model. It replaces nothing: whether it ships is for `llada-lab eval-infill
--model OUT/model` (no loss on the held-out infill split, sign test) and `eval-next-edit --model` to say.
The examples and the loss are training/edit_tune.py.
"""

from __future__ import annotations

import argparse
import math
import random
import signal
from pathlib import Path

import torch


def tune_next_edit_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="llada-lab tune-next-edit",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("--cases", default="runs/edit_pairs/train.jsonl.gz", help="training cases (`llada-lab edit-pairs`)")
    ap.add_argument("--out", type=Path, default=Path("runs/next_edit_tune"), help="run folder")
    ap.add_argument(
        "--init-from", type=Path, default=None, help="model folder to start from (default: the embedded model)"
    )
    ap.add_argument("--minutes", type=float, default=30.0, help="training time budget (this and earlier runs of OUT)")
    ap.add_argument("--edit-batch", type=int, default=6, help="edit examples per step")
    ap.add_argument("--infill-batch", type=int, default=4, help="infill sequences per step (the usual objective)")
    ap.add_argument("--lr", type=float, default=3e-4, help="peak learning rate (AdamW, cosine to 10%%)")
    ap.add_argument("--keep-weight", type=float, default=0.3, help="loss weight of draft tokens already right")
    ap.add_argument(
        "--no-history-share",
        type=float,
        default=0.0,
        help="share of edit examples built without the history (the baseline's prompt)",
    )
    ap.add_argument(
        "--max-changed",
        type=int,
        default=None,
        help="leave out edit examples whose target differs from the draft at more than N positions (its gap aside): "
        "an edit that shifts the tokens after it is out of a small model's reach",
    )
    ap.add_argument(
        "--synthetic",
        type=int,
        default=0,
        help="this many more cases cut from the infill corpus's training files (edit_pairs.synthetic_case)",
    )
    ap.add_argument("--save-every", type=int, default=25, help="checkpoint every N steps")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=27)
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    from llada_lsp.completion.codec import TextCodec
    from llada_lsp.completion.next_edit import GAP_TOKENS
    from llada_lsp.model import EMBEDDED_MODEL, LLaDA2, load_model

    from ..training import corpus
    from ..training.checkpoint import RunState, adamw
    from ..training.edit_pairs import read_jsonl_gz, synthetic_cases
    from ..training.edit_tune import edit_batch, edit_loss, served_example
    from ..training.objective import block_diffusion_loss, training_mask
    from ..training.train import Batches, export, update

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    source = args.init_from or EMBEDDED_MODEL
    tok = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
    codec = TextCodec.from_tokenizer(tok)
    warm = load_model(source, device="cpu", dtype=torch.float32)  # loaded for inference: copy it into a trainable one
    config = warm.config
    model = LLaDA2(config)
    # The exported model says it fills the gap its drafts leave at the cursor (completion/next_edit.py).
    config.next_edit_gap = GAP_TOKENS
    model.load_state_dict(warm.state_dict())
    del warm
    seq_len, block = config.max_position_embeddings, 32
    mask_id, eos_id = codec.special.mask, codec.special.eos
    cases = list(read_jsonl_gz(args.cases))
    train_files = corpus.iter_files("train")  # the infill half's texts, and the synthetic cases' sources
    if args.synthetic:
        cases += synthetic_cases([(f.path, f.text) for f in train_files], args.synthetic, args.seed + 1)
    rng = random.Random(args.seed)
    examples = [
        e for c in cases if (e := served_example(c, codec, seq_len, 1024, rng.random() >= args.no_history_share, block))
    ]
    if args.max_changed is not None:
        examples = [
            e for e in examples if sum(a != b and a != mask_id for a, b in zip(e.init, e.target)) <= args.max_changed
        ]
    print(
        f"{len(examples)} edit examples of {len(cases)} cases "
        f"({sum(e.target == [eos_id if t == mask_id else t for t in e.init] for e in examples)} no-edit)",
        flush=True,
    )
    params, opt = adamw(model, args.lr)
    args.out.mkdir(parents=True, exist_ok=True)
    state = RunState(args.out / "state.pt", model, opt)
    saved = state.resume()
    step, log = saved.get("step", 0), saved.get("log", [])
    if saved:
        print(f"resumed at step {step} ({state.spent / 60:.1f} min spent)", flush=True)
    rng = random.Random(args.seed * 1_000_003 + step)  # resumed runs see new draws, deterministically
    gen = torch.Generator().manual_seed(args.seed * 7919 + step)
    texts = [f.text for f in train_files]
    infill = (
        iter(Batches(texts, tok, args.seed * 1_000_003 + step, args.infill_batch, seq_len))
        if args.infill_batch
        else None
    )
    allow = training_mask(seq_len, block)
    budget = args.minutes * 60
    elapsed = state.elapsed

    def save() -> None:
        state.save(step=step, log=log, args={k: str(v) for k, v in vars(args).items()})
        export(model, tok, args.out / "model")

    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    model.train()
    try:
        while elapsed() < budget and not stop["now"]:
            lr = (
                args.lr
                * min(1.0, (step + 1) / 10)
                * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, elapsed() / budget))))
            )
            for group in opt.param_groups:
                group["lr"] = lr
            x, noisy, w = edit_batch(
                rng.sample(examples, min(args.edit_batch, len(examples))),
                seq_len,
                block,
                mask_id,
                eos_id,
                args.keep_weight,
                rng,
            )
            loss, stats = edit_loss(model, x, noisy, w, allow)
            if infill is not None:
                infill_loss, infill_stats = block_diffusion_loss(
                    model, next(infill), mask_id, block, 0.15, 0.1, allow, gen
                )
                loss = loss + infill_loss
                stats["infill_acc"] = infill_stats["mask_acc"]
            update(model, opt, params, loss)
            step += 1
            log.append({"step": step, "loss": loss.item(), **stats})
            if step % 5 == 0:
                print(
                    f"step {step} {elapsed() / 60:.1f} min loss {loss.item():.3f} "
                    + " ".join(f"{k} {v:.3f}" for k, v in stats.items()),
                    flush=True,
                )
            if step % args.save_every == 0:
                save()
    except KeyboardInterrupt:
        pass
    save()
    print(f"stopped at step {step} after {elapsed() / 60:.1f} min; candidate {args.out / 'model'}", flush=True)
    return 0
