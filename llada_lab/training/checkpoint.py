"""A training run's state file and its optimizer: resumed when the file is there, written atomically,
and the training seconds of every run of the folder added up (a time budget spans resumed runs)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch


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
