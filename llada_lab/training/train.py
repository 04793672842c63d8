"""The training loop of the embedded model: seeded, checkpointed, resumable, with a progress bar.

`train(TrainSettings(...))` trains the tokenizer (once, unless the run folder has one) and the network,
checkpoints to OUT/state.pt and resumes from it, and with `export` writes a shippable model folder.
The command line over it is `llada-lab train` (commands/train.py).
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import shutil
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from llada_lsp.completion.layouts import SpecialIds
from llada_lsp.model import LLaDA2, LLaDA2Config, load_model, save_model
from llada_lsp.model.loader import resolve_device

from . import corpus
from .checkpoint import RunState, adamw
from .objective import HOLE_KINDS, HOLE_WEIGHTS, SampleStream, block_diffusion_loss, training_mask
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


def update(model: LLaDA2, opt: torch.optim.Optimizer, params: list, loss: torch.Tensor) -> None:
    """One optimizer step on `loss`: gradients clipped to norm 1, then the experts' balance nudged."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    balance_experts(model)


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


def _opt(default, help: str, **argparse):
    """A setting: its default and what it means, which `llada-lab train` turns into an option."""
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata={"help": help, **argparse})
    return field(default=default, metadata={"help": help, **argparse})


@dataclass
class TrainSettings:
    """One run's settings, each with what it means; the defaults are those of the shipped model's run,
    on one GPU."""

    out: Path = _opt(Path("runs/tiny"), "run folder (checkpoints, tokenizer)")
    steps: int = _opt(20000, "total optimizer steps (sets the LR schedule)")
    batch: int = _opt(128, "sequences per step")
    seq_len: int = _opt(512, "tokens per sequence (multiple of the block)")
    block: int = _opt(32, "diffusion block size (as the engine decodes)")
    lr: float = _opt(3e-3, "peak learning rate (AdamW)")
    warmup: int = _opt(100, "linear warmup steps")
    edit_ratio: float = _opt(0.15, "share of visible tokens replaced, times t")
    keep_weight: float = _opt(0.1, "loss weight of kept visible tokens")
    confidence_weight: float = _opt(
        0.0,
        "weight of the entropy of correct predictions at masked positions "
        "(LLaDA2.0's confidence-aware training: sharper, so more tokens per step)",
    )
    self_fill: float = _opt(
        0.0,
        "share of blocks whose masks first get the model's own confident guesses (an "
        "extra no-grad forward), so it learns to revise its real mistakes, not only random tokens",
    )
    holes: tuple[float, ...] = _opt(
        HOLE_WEIGHTS,
        "sample mix, KIND=WEIGHT,... over "
        + ", ".join(HOLE_KINDS)
        + " (unnamed kinds keep the default weights, in that order)",
    )
    vocab_size: int = _opt(8192, "BPE size, when the tokenizer is trained")
    seed: int = _opt(0, "seeds the weights, the samples and the noise")
    threads: int = _opt(2, "CPU threads of the training process")
    device: str = _opt("auto", "cpu, cuda, or auto (cuda when available)")
    autocast: str = _opt("auto", "bf16 autocast (auto: on for CUDA)", choices=("auto", "on", "off"))
    workers: int | None = _opt(
        None, "processes that build samples (default: 8 on CUDA, 0 = in the training process on CPU)"
    )
    corpus: Path | None = _opt(
        None,
        "a corpus file: .corpus/train.jsonl.gz from `llada-lab corpus` "
        "(stdlib and third-party), or `llada-lab corpus train FILE` "
        "(stdlib alone) (default: this interpreter's stdlib, train split)",
    )
    save_every: int = _opt(200, "checkpoint every N steps")
    hours: float | None = _opt(
        None, "time budget: the LR schedule ends at whichever of --steps and --hours comes first"
    )
    export: Path | None = _opt(None, "also write a shippable model folder here")
    init_from: Path | None = _opt(
        None, "start a new run from an exported model folder (e.g. the shipped one) instead of random weights"
    )
    corpus_limit: int | None = _opt(None, "use only the first N training files (tests)")
    config: dict = _opt({}, "JSON of config overrides (tests use a smaller network)")


def train(run: TrainSettings) -> None:
    """Train (or resume) the run in `run.out` until `run.steps` steps or `run.hours` of training,
    SIGTERM or Ctrl-C, then write the checkpoint (and the export)."""
    torch.set_num_threads(run.threads)
    random.seed(run.seed)
    torch.manual_seed(run.seed)
    device = resolve_device(None if run.device == "auto" else run.device)
    use_autocast = run.autocast == "on" or (run.autocast == "auto" and device.type == "cuda")
    workers = run.workers if run.workers is not None else (8 if device.type == "cuda" else 0)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    run.out.mkdir(parents=True, exist_ok=True)
    files = (corpus.load(run.corpus) if run.corpus else corpus.iter_files("train"))[: run.corpus_limit]
    texts = [f.text for f in files]
    if run.init_from and not (run.out / "tokenizer.json").is_file():  # the weights' own tokenizer
        copy_tokenizer(run.init_from, run.out)
    tok = get_tokenizer(run.out, texts, run.vocab_size)
    special = SpecialIds.from_tokenizer(tok)

    config = LLaDA2Config(
        **{**TINY, "vocab_size": len(tok), **run.config},
        mask_token_id=special.mask,
        eos_token_id=special.eos,
        pad_token_id=special.eos,
    )
    model = LLaDA2(config)
    init_weights(model, run.seed)
    if run.init_from and not (run.out / "state.pt").is_file():
        warm = load_model(run.init_from, device="cpu", dtype=torch.float32)
        model.load_state_dict(warm.state_dict())
        print(f"initialised from {run.init_from}", flush=True)
    model.to(device)
    params, opt = adamw(model, run.lr, eps=1e-8, fused=device.type == "cuda")
    state = RunState(run.out / "state.pt", model, opt)
    saved = state.resume()
    step, losses = saved.get("step", 0), saved.get("losses", [])
    if saved:
        torch.set_rng_state(saved["torch_rng"])
        print(f"resumed from {state.path} at step {step}", flush=True)
    elapsed = state.elapsed

    def save() -> None:
        state.save(step=step, torch_rng=torch.get_rng_state(), losses=losses, args=asdict(run))
        if run.export:
            export(model, tok, run.export)

    stop = {"now": False}
    previous_handler = signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    # The data stream is reseeded from the step, so a resumed run sees new samples, deterministically.
    if workers:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the workers tokenize; no nested threads
    batches = Batches(texts, tok, run.seed * 1_000_003 + step, run.batch, run.seq_len, run.holes)
    loader = iter(
        torch.utils.data.DataLoader(
            batches,
            batch_size=None,
            num_workers=workers,
            pin_memory=device.type == "cuda",
            prefetch_factor=4 if workers else None,
        )
    )
    allow = training_mask(run.seq_len, run.block).to(device)

    def amp():
        return torch.autocast(device.type, dtype=torch.bfloat16) if use_autocast else contextlib.nullcontext()

    print(
        f"{sum(p.numel() for p in params) / 1e6:.1f}M parameters on {device}"
        f"{' (bf16 autocast)' if use_autocast else ''}, {len(files)} files, {workers} data workers",
        flush=True,
    )
    gen = torch.Generator().manual_seed(run.seed * 7919 + step)
    from tqdm import tqdm

    bar = tqdm(total=run.steps, initial=step, desc="train", dynamic_ncols=True, mininterval=5)
    tokens_seen = 0
    budget = run.hours * 3600 if run.hours else float("inf")
    model.train()
    try:
        while step < run.steps and not stop["now"]:
            x = next(loader)
            for group in opt.param_groups:
                group["lr"] = lr_at(step, max(step / run.steps, elapsed() / budget), run.lr, run.warmup)
            with amp():
                loss, stats = block_diffusion_loss(
                    model,
                    x,
                    special.mask,
                    run.block,
                    run.edit_ratio,
                    run.keep_weight,
                    allow,
                    gen,
                    run.confidence_weight,
                    run.self_fill,
                )
            update(model, opt, params, loss)
            step += 1
            losses.append(loss.item())
            tokens_seen += x.numel()
            bar.update(1)
            shown = {
                "loss": f"{losses[-1]:.3f}",
                "mask_loss": f"{stats['mask_loss']:.3f}",
                "acc": f"{stats['mask_acc']:.3f}",
            }
            if "entropy" in stats:
                shown["entropy"] = f"{stats['entropy']:.2f}"
            if "self_fill_wrong" in stats:
                shown["fill_wrong"] = f"{stats['self_fill_wrong']:.2f}"
            bar.set_postfix(**shown, tok_s=f"{tokens_seen / (time.time() - state.started):.0f}")
            if step % run.save_every == 0:
                save()
            if elapsed() > budget:
                break
    except KeyboardInterrupt:
        pass
    bar.close()
    signal.signal(signal.SIGTERM, previous_handler)
    save()
    print(f"stopped at step {step}; checkpoint {state.path}", flush=True)


class Batches(torch.utils.data.IterableDataset):
    """Endless [batch, seq_len] id tensors; each data worker draws its own seeded sample stream."""

    def __init__(
        self,
        texts: list[str],
        tokenizer,
        seed: int,
        batch: int,
        seq_len: int,
        hole_weights: tuple[float, ...] = HOLE_WEIGHTS,
    ):
        self.texts, self.tok, self.seed, self.batch, self.seq_len = texts, tokenizer, seed, batch, seq_len
        self.hole_weights = hole_weights

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        seed = self.seed + 7919 * (info.id if info else 0)
        # Samples of about one sequence, so most FIM holes keep their context in the same sequence.
        stream = SampleStream(
            self.texts, self.tok, seed, window_chars=3 * self.seq_len, hole_weights=self.hole_weights
        ).sequences(self.seq_len)
        while True:
            yield torch.tensor([next(stream) for _ in range(self.batch)])


def export(model: LLaDA2, tokenizer, folder: Path) -> None:
    """Write the shippable folder atomically enough: weights, config, tokenizer."""
    folder.mkdir(parents=True, exist_ok=True)
    was_training = model.training
    save_model(model, folder, dtype=torch.bfloat16)
    save_tokenizer(tokenizer, folder)
    model.train(was_training)
