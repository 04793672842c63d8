"""A training run's state file and its optimizer: resumed when the file is there, written atomically,
and the training seconds of every run of the folder added up (a time budget spans resumed runs)."""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def load_trainable(source: str | Path) -> tuple[torch.nn.Module, Any]:
    """(a trainable float32 copy of the model in folder `source`, its tokenizer): `load_model` gives a
    model for inference (no gradients), so its weights are copied into a fresh LLaDA2 of its config."""
    from transformers import AutoTokenizer

    from llada_lsp.model import LLaDA2, load_model

    tok = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
    loaded = load_model(source, device="cpu", dtype=torch.float32)
    model = LLaDA2(loaded.config)
    model.load_state_dict(loaded.state_dict())
    return model, tok


def start_run(
    out: Path, model: torch.nn.Module, lr: float
) -> tuple[list[torch.nn.Parameter], torch.optim.AdamW, RunState, int, list[dict]]:
    """A fine-tune's run folder `out`: AdamW over `model`, resumed from out/state.pt when it is there ->
    (params, optimizer, state, the step reached, the log so far)."""
    params, opt = adamw(model, lr)
    out.mkdir(parents=True, exist_ok=True)
    state = RunState(out / "state.pt", model, opt)
    saved = state.resume()
    step, log = saved.get("step", 0), saved.get("log", [])
    if saved:
        print(f"resumed at step {step} ({state.spent / 60:.1f} min spent)", flush=True)
    return params, opt, state, step, log


def adamw(model: torch.nn.Module, lr: float, **options: Any) -> tuple[list[torch.nn.Parameter], torch.optim.AdamW]:
    """The trainable parameters and AdamW over them: weight decay 0.1 on matrices, none on norms and biases."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]  # fmt: skip
    return params, torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), **options)


class RunState:
    """`path` (a run folder's state.pt) for `model` and `opt`; the clock starts at `resume`."""

    def __init__(self, path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer):
        self.path, self.model, self.opt = path, model, opt
        self.spent, self.started = 0.0, time.time()  # spent: training seconds of earlier runs of the folder

    def resume(self) -> dict[str, Any]:
        """Loads the weights and the optimizer if the file is there; the saved entries (step, log, ...),
        or {} for a new run."""
        state: dict[str, Any] = {}
        if self.path.is_file():
            state = torch.load(self.path, map_location="cpu", weights_only=False)
            self.model.load_state_dict(state.pop("model"))
            self.opt.load_state_dict(state.pop("opt"))
            self.spent = state.get("seconds", 0.0)
        self.started = time.time()
        return state

    def elapsed(self) -> float:
        return self.spent + time.time() - self.started

    def save(self, **entries: Any) -> None:
        """Weights, optimizer, the seconds so far and `entries`; atomic: an interrupted save never
        corrupts the checkpoint."""
        tmp = self.path.with_suffix(".tmp")
        torch.save({"model": self.model.state_dict(), "opt": self.opt.state_dict(), "seconds": self.elapsed(),
                    **entries}, tmp)  # fmt: skip
        tmp.replace(self.path)


def lr_at(base: float, step: int, spent: float, budget: float) -> float:
    """10 warm-up steps, then a cosine over the time budget down to a tenth of `base`."""
    return base * min(1.0, (step + 1) / 10) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, spent / budget))))


def train_for(state: RunState, minutes: float, lr: float, step: int, log: list[dict],
              one_step: Callable[[], tuple[torch.Tensor, dict[str, float]]], save: Callable[[int], None],
              save_every: int) -> int:  # fmt: skip
    """A fine-tune's loop: `one_step()` (a batch, its loss and the update -> (loss, stats)) under
    `lr_at`'s schedule until `minutes` of training time are spent (resumed runs count theirs), SIGTERM or
    Ctrl-C; a line every 5 steps, `save(step)` every `save_every` and at the end. -> the step reached."""
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    budget = minutes * 60
    state.model.train()
    try:
        while state.elapsed() < budget and not stop["now"]:
            for group in state.opt.param_groups:
                group["lr"] = lr_at(lr, step, state.elapsed(), budget)
            loss, stats = one_step()
            step += 1
            log.append({"step": step, "loss": loss.item(), **stats})
            if step % 5 == 0:
                print(f"step {step} {state.elapsed() / 60:.1f} min loss {loss.item():.3f} "
                      + " ".join(f"{k} {v:.3f}" for k, v in stats.items()), flush=True)  # fmt: skip
            if step % save_every == 0:
                save(step)
    except KeyboardInterrupt:
        pass
    save(step)
    print(f"stopped at step {step} after {state.elapsed() / 60:.1f} min", flush=True)
    return step
