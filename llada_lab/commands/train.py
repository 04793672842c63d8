"""The training loop of the embedded model: seeded, checkpointed, resumable, with a progress bar.

`llada-lab train --out runs/tiny` trains the tokenizer (once) and the network; `--export DIR` writes a
shippable model folder (config.json, bf16 model.safetensors, tokenizer files). The defaults are those
of the shipped model's run, on one GPU (bf16 autocast, samples built by worker processes); on a CPU, use
a smaller batch, e.g. `--batch 16 --hours 3`. The loop itself is training/train.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import typing
from pathlib import Path

from ..training.objective import HOLE_KINDS, parse_hole_weights
from ..training.train import TrainSettings, train


def train_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="llada-lab train",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_settings(ap, TrainSettings)
    train(TrainSettings(**vars(ap.parse_args(argv))))
    return 0


def add_settings(ap: argparse.ArgumentParser, settings: type) -> None:
    """One option per field of a settings dataclass: `--seq-len` for `seq_len`, parsed by its annotation
    (the hole mix and the JSON config by their own parsers), with the field's default and help."""
    types = typing.get_type_hints(settings)
    for f in dataclasses.fields(settings):
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        kind = next((t for t in typing.get_args(types[f.name]) if t is not type(None)), types[f.name])
        parse = {"holes": _hole_weights, "config": _json_object}.get(
            f.name, kind if kind in (int, float, Path) else None
        )
        if f.name == "holes":  # shown as it is written; argparse parses a string default
            default = ",".join(f"{k}={w}" for k, w in zip(HOLE_KINDS, default))
        ap.add_argument("--" + f.name.replace("_", "-"), type=parse, default=default, **f.metadata)


def _hole_weights(spec: str) -> tuple[float, ...]:
    try:
        return parse_hole_weights(spec)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object of config overrides")
    return value
