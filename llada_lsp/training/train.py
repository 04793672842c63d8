"""The training loop of the embedded model: seeded, checkpointed, resumable, with a progress bar.

`llada-lsp train --out runs/tiny` trains the tokenizer (once) and the network; `--export DIR` writes a
shippable model folder (config.json, bf16 model.safetensors, tokenizer files). The defaults are those
of the shipped model's run, on one GPU (bf16 autocast, samples built by worker processes); on a CPU, use
a smaller batch, e.g. `--batch 16 --hours 3`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shutil
import signal
import time
from pathlib import Path

import torch

from ..model import LLaDA2, LLaDA2Config, load_model, save_model
from ..model.loader import resolve_device
from ..completion.layouts import SpecialIds
from . import corpus
from .objective import HOLE_KINDS, HOLE_WEIGHTS, SampleStream, block_diffusion_loss, parse_hole_weights, training_mask
from .tokenizer import save_tokenizer, train_tokenizer

# The shipped size: the largest that trains well on two CPU cores in a few hours and stays under 25 MB
# in bf16. Same network class as LLaDA2.1, group-limited routing kept.
TINY = dict(
    vocab_size=8192, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=64, intermediate_size=768, moe_intermediate_size=192, num_experts=8, num_experts_per_tok=2,
    num_shared_experts=1, n_group=4, topk_group=2, first_k_dense_replace=1, routed_scaling_factor=2.5,
    max_position_embeddings=512, rope_theta=600000.0, partial_rotary_factor=0.5,
)  # fmt: skip


def init_weights(model: LLaDA2, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("expert_bias"):
            p.data.zero_()
        elif p.dim() == 1:
            p.data.fill_(1.0)
        else:
            fan_in = p.shape[-1]
            std = 0.02 if "word_embeddings" in name else fan_in**-0.5
            if name.endswith(("dense.weight", "down_proj.weight", "w_down")):
                std /= math.sqrt(2 * model.config.num_hidden_layers)  # residual branches start small
            p.data.normal_(0.0, std, generator=g)


def lr_at(step: int, progress: float, peak: float, warmup: int) -> float:
    """Linear warmup, then cosine to 10% of the peak over `progress` (0..1 of the run's budget)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def balance_experts(model: LLaDA2, rate: float = 1e-3) -> None:
    """Auxiliary-loss-free load balancing: nudge each expert's selection bias toward equal load."""
    for layer in model.model.layers:
        load = getattr(layer.mlp, "load", None)
        if load is not None:
            bias = layer.mlp.gate.expert_bias
            bias.data += rate * torch.sign(load.float().mean() - load.float())


def copy_tokenizer(src: Path, out: Path) -> None:
    """The tokenizer files of the model folder `src` into `out` (a run that keeps that vocabulary)."""
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, out / name)


def get_tokenizer(out: Path, train_texts: list[str], vocab_size: int):
    if (out / "tokenizer.json").is_file():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    print("training the tokenizer ...", flush=True)
    tok = train_tokenizer(train_texts, vocab_size)
    save_tokenizer(tok, out)
    return tok


def train_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="llada-lsp train", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("runs/tiny"), help="run folder (checkpoints, tokenizer)")
    ap.add_argument("--steps", type=int, default=20000, help="total optimizer steps (sets the LR schedule)")
    ap.add_argument("--batch", type=int, default=128, help="sequences per step")
    ap.add_argument("--seq-len", type=int, default=512, help="tokens per sequence (multiple of the block)")
    ap.add_argument("--block", type=int, default=32, help="diffusion block size (as the engine decodes)")
    ap.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (AdamW)")
    ap.add_argument("--warmup", type=int, default=100, help="linear warmup steps")
    ap.add_argument("--edit-ratio", type=float, default=0.15, help="share of visible tokens replaced, times t")
    ap.add_argument("--keep-weight", type=float, default=0.1, help="loss weight of kept visible tokens")
    ap.add_argument("--confidence-weight", type=float, default=0.0,
                    help="weight of the entropy of correct predictions at masked positions (LLaDA2.0's "
                         "confidence-aware training: sharper, so more tokens per step)")
    ap.add_argument("--self-fill", type=float, default=0.0,
                    help="share of blocks whose masks first get the model's own confident guesses (an extra "
                         "no-grad forward), so it learns to revise its real mistakes, not only random tokens")
    ap.add_argument("--holes", type=_hole_weights,
                    default=",".join(f"{k}={w}" for k, w in zip(HOLE_KINDS, HOLE_WEIGHTS)),
                    help="sample mix, KIND=WEIGHT,... over " + ", ".join(HOLE_KINDS) + " (unnamed kinds keep "
                         "the default weights, in that order)")
    ap.add_argument("--vocab-size", type=int, default=8192, help="BPE size, when the tokenizer is trained")
    ap.add_argument("--seed", type=int, default=0, help="seeds the weights, the samples and the noise")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads of the training process")
    ap.add_argument("--device", default="auto", help="cpu, cuda, or auto (cuda when available)")
    ap.add_argument("--autocast", choices=("auto", "on", "off"), default="auto",
                    help="bf16 autocast (auto: on for CUDA)")
    ap.add_argument("--workers", type=int, default=None,
                    help="processes that build samples (default: 8 on CUDA, 0 = in the training process on CPU)")
    ap.add_argument("--corpus", type=Path, default=None,
                    help="a corpus file: .corpus/train.jsonl.gz from `python -m llada_lsp.training.corpus` (stdlib and "
                         "third-party), or `... corpus train FILE` (stdlib alone) (default: this interpreter's stdlib, train split)")
    ap.add_argument("--save-every", type=int, default=200, help="checkpoint every N steps")
    ap.add_argument("--hours", type=float, default=None,
                    help="time budget: the LR schedule ends at whichever of --steps and --hours comes first")
    ap.add_argument("--export", type=Path, default=None, help="also write a shippable model folder here")
    ap.add_argument("--init-from", type=Path, default=None,
                    help="start a new run from an exported model folder (e.g. the shipped one) instead of random weights")
    ap.add_argument("--corpus-limit", type=int, default=None, help="use only the first N training files (tests)")
    ap.add_argument("--config", default=None, help="JSON of config overrides (tests use a smaller network)")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = resolve_device(None if args.device == "auto" else args.device)
    use_autocast = args.autocast == "on" or (args.autocast == "auto" and device.type == "cuda")
    workers = args.workers if args.workers is not None else (8 if device.type == "cuda" else 0)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    args.out.mkdir(parents=True, exist_ok=True)
    files = (corpus.load(args.corpus) if args.corpus else corpus.iter_files("train"))[: args.corpus_limit]
    texts = [f.text for f in files]
    if args.init_from and not (args.out / "tokenizer.json").is_file():  # the weights' own tokenizer
        copy_tokenizer(args.init_from, args.out)
    tok = get_tokenizer(args.out, texts, args.vocab_size)
    special = SpecialIds.from_tokenizer(tok)

    overrides = json.loads(args.config) if args.config else {}
    config = LLaDA2Config(**{**TINY, "vocab_size": len(tok), **overrides}, mask_token_id=special.mask,
                          eos_token_id=special.eos, pad_token_id=special.eos)
    model = LLaDA2(config)
    init_weights(model, args.seed)
    if args.init_from and not (args.out / "state.pt").is_file():
        warm = load_model(args.init_from, device="cpu", dtype=torch.float32)
        model.load_state_dict(warm.state_dict())
        print(f"initialised from {args.init_from}", flush=True)
    model.to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")
    step, spent, losses = 0, 0.0, []  # spent: training seconds of earlier runs of this folder
    state_file = args.out / "state.pt"
    if state_file.is_file():
        state = torch.load(state_file, map_location="cpu", weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, spent, losses = state["step"], state.get("seconds", 0.0), state.get("losses", [])
        torch.set_rng_state(state["torch_rng"])
        print(f"resumed from {state_file} at step {step}", flush=True)

    started = time.time()

    def elapsed() -> float:
        return spent + time.time() - started

    def save() -> None:
        tmp = state_file.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                    "torch_rng": torch.get_rng_state(), "seconds": elapsed(), "losses": losses, "args": vars(args)}, tmp)
        tmp.replace(state_file)  # atomic: an interrupted save never corrupts the checkpoint
        if args.export:
            export(model, tok, args.export)

    stop = {"now": False}
    previous_handler = signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    # The data stream is reseeded from the step, so a resumed run sees new samples, deterministically.
    if workers:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the workers tokenize; no nested threads
    batches = Batches(texts, tok, args.seed * 1_000_003 + step, args.batch, args.seq_len, args.holes)
    loader = iter(torch.utils.data.DataLoader(batches, batch_size=None, num_workers=workers,
                                              pin_memory=device.type == "cuda",
                                              prefetch_factor=4 if workers else None))
    allow = training_mask(args.seq_len, args.block).to(device)

    def amp():
        return torch.autocast(device.type, dtype=torch.bfloat16) if use_autocast else contextlib.nullcontext()

    print(f"{sum(p.numel() for p in params) / 1e6:.1f}M parameters on {device}"
          f"{' (bf16 autocast)' if use_autocast else ''}, {len(files)} files, {workers} data workers", flush=True)
    gen = torch.Generator().manual_seed(args.seed * 7919 + step)
    from tqdm import tqdm

    bar = tqdm(total=args.steps, initial=step, desc="train", dynamic_ncols=True, mininterval=5)
    tokens_seen = 0
    budget = args.hours * 3600 if args.hours else float("inf")
    model.train()
    try:
        while step < args.steps and not stop["now"]:
            x = next(loader)
            for group in opt.param_groups:
                group["lr"] = lr_at(step, max(step / args.steps, elapsed() / budget), args.lr, args.warmup)
            with amp():
                loss, stats = block_diffusion_loss(model, x, special.mask, args.block, args.edit_ratio,
                                                   args.keep_weight, allow, gen, args.confidence_weight, args.self_fill)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            balance_experts(model)
            step += 1
            losses.append(loss.item())
            tokens_seen += x.numel()
            bar.update(1)
            shown = {"loss": f"{losses[-1]:.3f}", "mask_loss": f"{stats['mask_loss']:.3f}",
                     "acc": f"{stats['mask_acc']:.3f}"}
            if "entropy" in stats:
                shown["entropy"] = f"{stats['entropy']:.2f}"
            if "self_fill_wrong" in stats:
                shown["fill_wrong"] = f"{stats['self_fill_wrong']:.2f}"
            bar.set_postfix(**shown, tok_s=f"{tokens_seen / (time.time() - started):.0f}")
            if step % args.save_every == 0:
                save()
            if elapsed() > budget:
                break
    except KeyboardInterrupt:
        pass
    bar.close()
    signal.signal(signal.SIGTERM, previous_handler)
    save()
    print(f"stopped at step {step}; checkpoint {state_file}", flush=True)
    return 0


def _hole_weights(spec: str) -> tuple[float, ...]:
    try:
        return parse_hole_weights(spec)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


class Batches(torch.utils.data.IterableDataset):
    """Endless [batch, seq_len] id tensors; each data worker draws its own seeded sample stream."""

    def __init__(self, texts: list[str], tokenizer, seed: int, batch: int, seq_len: int,
                 hole_weights: tuple[float, ...] = HOLE_WEIGHTS):
        self.texts, self.tok, self.seed, self.batch, self.seq_len = texts, tokenizer, seed, batch, seq_len
        self.hole_weights = hole_weights

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        seed = self.seed + 7919 * (info.id if info else 0)
        # Samples of about one sequence, so most FIM holes keep their context in the same sequence.
        stream = SampleStream(self.texts, self.tok, seed, window_chars=3 * self.seq_len,
                              hole_weights=self.hole_weights).sequences(self.seq_len)
        while True:
            yield torch.tensor([next(stream) for _ in range(self.batch)])


def export(model: LLaDA2, tokenizer, folder: Path) -> None:
    """Write the shippable folder atomically enough: weights, config, tokenizer."""
    folder.mkdir(parents=True, exist_ok=True)
    was_training = model.training
    save_model(model, folder, dtype=torch.bfloat16)
    save_tokenizer(tokenizer, folder)
    model.train(was_training)


if __name__ == "__main__":
    raise SystemExit(train_main())
