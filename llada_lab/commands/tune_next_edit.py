"""`llada-lab tune-next-edit`: fine-tune the embedded model on mined next-edit cases, mixed with its
infill objective; CPU-bounded (--minutes), checkpointed to OUT/state.pt and resumed from it, the
candidate exported to OUT/model. It replaces nothing: whether it ships is for `llada-lab eval-infill
--model OUT/model` (no loss on the held-out infill split, sign test) and `eval-next-edit --model` to say.
The examples and the loss are training/edit_tune.py.

With --edit-tokens it teaches the model LLaDA2.2's DELETE and INSERT instead (issue 43): two tokens
added to the tokenizer and the vocabulary, a LLaDA2.2 config (block routing with every expert
admitted, the edit ids), the drafts the server gives such a model (no gap; rewrites too), labelled
round by round with the report's LCS labels (training/edit_tokens.py), mixed with the same infill
objective.
"""

from __future__ import annotations

import argparse
import random
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
    ap.add_argument(
        "--edit-tokens",
        action="store_true",
        help="add DELETE and INSERT and train them (LLaDA2.2 editing) instead of the gap at the cursor",
    )
    ap.add_argument(
        "--no-rewrites", action="store_true", help="with --edit-tokens: no rewrite examples made from the cases"
    )
    ap.add_argument(
        "--edit-row-boost",
        type=float,
        default=10.0,
        help="with --edit-tokens: the learning rate of the edit tokens' new rows, times the rest's",
    )
    ap.add_argument("--save-every", type=int, default=25, help="checkpoint every N steps")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=27)
    args = ap.parse_args(argv)

    from llada_lsp.completion.codec import TextCodec
    from llada_lsp.completion.next_edit import GAP_TOKENS
    from llada_lsp.model import EMBEDDED_MODEL

    from ..training import corpus
    from ..training.checkpoint import load_trainable, start_run, train_for
    from ..training.edit_pairs import read_jsonl_gz, synthetic_cases
    from ..training.edit_tune import edit_batch, edit_loss, served_example
    from ..training.objective import block_diffusion_loss, training_mask
    from ..training.train import Batches, export, update

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.edit_tokens:
        return tune_edit_tokens(args)
    model, tok = load_trainable(args.init_from or EMBEDDED_MODEL)
    codec = TextCodec.from_tokenizer(tok)
    config = model.config
    # The exported model says it fills the gap its drafts leave at the cursor (completion/next_edit.py).
    config.next_edit_gap = GAP_TOKENS
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
    params, opt, state, step, log = start_run(args.out, model, args.lr)
    rng = random.Random(args.seed * 1_000_003 + step)  # resumed runs see new draws, deterministically
    gen = torch.Generator().manual_seed(args.seed * 7919 + step)
    texts = [f.text for f in train_files]
    infill = (
        iter(Batches(texts, tok, args.seed * 1_000_003 + step, args.infill_batch, seq_len))
        if args.infill_batch
        else None
    )
    allow = training_mask(seq_len, block)

    def save(step: int) -> None:
        state.save(step=step, log=log, args={k: str(v) for k, v in vars(args).items()})
        export(model, tok, args.out / "model")

    def one_step():
        x, noisy, w = edit_batch(rng.sample(examples, min(args.edit_batch, len(examples))), seq_len, block, mask_id,
                                 eos_id, args.keep_weight, rng)  # fmt: skip
        loss, stats = edit_loss(model, x, noisy, w, allow)
        if infill is not None:
            infill_loss, infill_stats = block_diffusion_loss(model, next(infill), mask_id, block, 0.15, 0.1, allow, gen)
            loss = loss + infill_loss
            stats["infill_acc"] = infill_stats["mask_acc"]
        update(model, opt, params, loss)
        return loss, stats

    train_for(state, args.minutes, args.lr, step, log, one_step, save, args.save_every)
    print(f"candidate {args.out / 'model'}", flush=True)
    return 0


def tune_edit_tokens(args: argparse.Namespace) -> int:
    """--edit-tokens: the model with DELETE and INSERT (a run folder's own, or the source's new rows),
    trained on LCS-labelled rounds of next edits and rewrites mixed with the infill objective."""

    from llada_lsp.completion.codec import TextCodec
    from llada_lsp.model import EMBEDDED_MODEL

    from ..training import corpus
    from ..training.checkpoint import load_trainable, start_run, train_for
    from ..training.edit_pairs import read_jsonl_gz, synthetic_cases
    from ..training.edit_tokens import (
        EditIds,
        RowBoost,
        edit_token_batch,
        edit_token_loss,
        make_example,
        next_edit_pair,
        rewrite_pair,
        with_edit_tokens,
    )
    from ..training.objective import block_diffusion_loss, training_mask
    from ..training.train import Batches, export, update

    model, tok = load_trainable(args.init_from or EMBEDDED_MODEL)
    if model.config.edit_ids is None:
        model, tok, ids = with_edit_tokens(model, tok)
    else:  # already has them (a candidate tuned further): train it as it is
        delete, insert = model.config.edit_ids
        ids = EditIds(delete, insert, model.config.mask_token_id)
    codec = TextCodec.from_tokenizer(tok)
    config = model.config
    seq_len, block = config.max_position_embeddings, config.block_size
    eos = codec.special.eos
    cases = list(read_jsonl_gz(args.cases))
    train_files = corpus.iter_files("train")
    if args.synthetic:
        cases += synthetic_cases([(f.path, f.text) for f in train_files], args.synthetic, args.seed + 1)
    makers = [next_edit_pair] + ([] if args.no_rewrites else [rewrite_pair])
    examples = [make_example(*pair, ids, eos, block) for c in cases for make in makers
                if (pair := make(c, codec, seq_len, 1024, block)) is not None]  # fmt: skip
    editing = sum(e.edits > 0 for e in examples)
    print(f"{len(examples)} edit-token examples of {len(cases)} cases ({editing} with edits, "
          f"{sum(e.edits for e in examples)} editing rounds)", flush=True)  # fmt: skip
    params, opt, state, step, log = start_run(args.out, model, args.lr)
    rng = random.Random(args.seed * 1_000_003 + step)
    gen = torch.Generator().manual_seed(args.seed * 7919 + step)
    texts = [f.text for f in train_files]
    infill = iter(Batches(texts, tok, args.seed * 1_000_003 + step, args.infill_batch, seq_len)) \
        if args.infill_batch else None  # fmt: skip
    allow = training_mask(seq_len, block)
    # Half of the edit examples drawn from those that edit: most blocks of any example only keep.
    edited = [e for e in examples if e.edits] or examples
    new_rows = [model.model.word_embeddings.weight, model.lm_head.weight]

    def save(step: int) -> None:
        state.save(step=step, log=log, args={k: str(v) for k, v in vars(args).items()})
        export(model, tok, args.out / "model")

    def one_step():
        half = args.edit_batch // 2
        chosen = rng.sample(edited, min(half, len(edited))) + rng.sample(examples, args.edit_batch - half)
        x, noisy, labels, w = edit_token_batch(chosen, seq_len, args.keep_weight, eos, rng)
        loss, stats = edit_token_loss(model, x, noisy, labels, w, allow, ids)
        if infill is not None:
            infill_loss, infill_stats = block_diffusion_loss(model, next(infill), ids.mask, block, 0.15, 0.1,
                                                             allow, gen)  # fmt: skip
            loss = loss + infill_loss
            stats["infill_acc"] = infill_stats["mask_acc"]
        with RowBoost(new_rows, [ids.delete, ids.insert], args.edit_row_boost):
            update(model, opt, params, loss)
        return loss, stats

    train_for(state, args.minutes, args.lr, step, log, one_step, save, args.save_every)
    print(f"candidate {args.out / 'model'}", flush=True)
    return 0
