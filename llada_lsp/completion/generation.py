"""What a plan asks of a backend and what it gets back, in terms every backend can serve: one neutral
`GenerationRequest` (checked here, in one place), `Draft`s after each step, and a `Result`; and the
model as plans see it (`LoadedModel`: its tokenizer and its limits) and as a command line names it
(`ModelSpec`).

Plain values and the standard library: nothing of torch, HTTP, threads or the LSP. The backends
(backends/native.py, backends/sglang.py) turn a request into their own calls.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import TooLong
from .codec import TextCodec


class Flag(Protocol):
    def is_set(self) -> bool: ...


@dataclass(frozen=True)
class ModelSpec:
    path: str | None  # None: the embedded model
    device: str | None = None
    dtype: str | None = None
    threads: int | None = None  # torch's CPU threads (None: torch's default)
    max_batch: int = 8  # sequences decoded in one forward (1: one at a time)
    cache_mb: float | None = None  # the K/V pool (None: the engine's default for the device)
    prefix_cache: bool = True  # reuse the K/V of prompt blocks an earlier request computed
    max_queue: int = 64  # sequences that may wait for a row; more are refused as busy
    quantize: str | None = None  # "fp8": routed experts in FP8 with 128x128 block scales
    devices: tuple[str, ...] | None = None  # a model split over several devices (instead of `device`)
    cuda_graph: bool = False  # each denoising step replayed from a CUDA graph per batch bucket (CUDA only)
    prefill_chunk: int | None = None  # most prompt tokens per prefill forward (None: the engine's default)
    edit_ids: tuple[int, int] | None = None  # LLaDA2.2's (DELETE, INSERT) ids over config.json's (--edit-ids)

    @property
    def name(self) -> str:
        return self.path or "embedded"


def add_model_arguments(ap: argparse.ArgumentParser) -> None:
    """The command-line options of a ModelSpec, for the processes that load a model (the language
    server in-process, the engine service)."""
    ap.add_argument("--model", metavar="PATH|HF-ID", help="a model folder or a Hugging Face id in the local cache "
                    "(nothing is downloaded); default: the embedded tiny model")  # fmt: skip
    ap.add_argument("--device", help="cpu, cuda or cuda:N; default: cuda if available, else cpu")
    ap.add_argument("--dtype", help="float32, bfloat16, float16 or float64; default: bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                    help="CPU threads of the model (default: half the cores, the rest left to the editors)")  # fmt: skip
    add_edit_ids_argument(ap)


def add_edit_ids_argument(ap: argparse.ArgumentParser) -> None:
    """`--edit-ids DELETE,INSERT`, for every command that reads a checkpoint (generate and plan too)."""
    ap.add_argument("--edit-ids", type=edit_ids_argument, metavar="DELETE,INSERT",
                    help="LLaDA2.2: its DELETE and INSERT (split) token ids, over config.json's; without either, "
                    "LLaDA2.2-flash's 156930,156931 when they fit")  # fmt: skip


def edit_ids_argument(text: str) -> tuple[int, int]:
    """'156930,156931' -> (156930, 156931); whether they fit the vocabulary is the loader's to say."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: give two token ids, DELETE,INSERT (e.g. 156930,156931)")
    delete, insert = int(parts[0]), int(parts[1])
    if delete == insert:
        raise argparse.ArgumentTypeError(f"{text!r}: DELETE and INSERT must be two different ids")
    return delete, insert


@dataclass
class LoadedModel:
    """A model as plans see it: its tokenizer and its limits. `batch` is what the native model thread
    decodes on (backends/native.NativeBatch); None where generation runs elsewhere (SGLang).
    `edit_gap`: the model was tuned to fill a next edit's gap at the cursor (its config says
    `next_edit_gap`, as `llada-lab tune-next-edit` writes it); other models get drafts without one.
    `family`: model/family.Family (which LLaDA2 and its decoding rule); `edit_ids`: its (DELETE, INSERT)
    where it edits drafts in place (LLaDA2.2), None for fixed positions. `kernels`: the kernel backend's
    line (kernel_backend.Backend.line) where this process runs the model; None where it runs elsewhere."""

    spec: Any  # a ModelSpec, or what a backend names its model with (str() is shown to users)
    codec: TextCodec
    max_positions: int
    block_size: int
    batch: Any = None
    edit_gap: bool = False
    family: Any = None
    kernels: str | None = None

    @property
    def edit_ids(self) -> tuple[int, int] | None:
        return None if self.family is None else self.family.edit_ids

    def family_fields(self) -> dict[str, str]:
        """What status says of the family (wire.Status's fields; the LSP status takes the first two)."""
        if self.family is None:
            return {}
        return {"family": self.family.name, "decoding": self.family.decoding_rule,
                "family_line": self.family.describe(), **({"kernels": self.kernels} if self.kernels else {})}  # fmt: skip


@dataclass(frozen=True)
class GenerationRequest:
    """One sequence to generate after `prompt_ids`: `gen_length` positions decoded with `mode`'s
    thresholds, starting from `init_ids` (then masks) instead of masks; `first_allowed`: the only ids
    the first position may hold (token healing); lower `priority` is admitted first; `cancel` is
    checked between steps. A backend that cannot honour a field says so (docs/sglang.md)."""

    prompt_ids: list[int]
    gen_length: int
    mode: str
    mask_id: int | None
    eos_id: int | None
    eos_early_stop: bool = True
    cancel: Flag | None = None
    init_ids: list[int] | None = None
    first_allowed: list[int] | None = None
    priority: int = 0


def check_request(request: GenerationRequest, max_positions: int) -> GenerationRequest:
    """The request, or ValueError (a bug of the caller's) / TooLong (the user's text: said to them).
    Each backend checks the mode against its own (the native engine's presets, SGLang's servers)."""
    if request.gen_length < 1:
        raise ValueError(f"gen_length must be at least 1, got {request.gen_length}")
    if len(request.init_ids or ()) > request.gen_length:
        raise ValueError(f"{len(request.init_ids)} init_ids do not fit in gen_length {request.gen_length}")
    if len(request.prompt_ids) + request.gen_length > max_positions:
        raise TooLong(f"a prompt of {len(request.prompt_ids)} tokens and {request.gen_length} to generate exceed "
                      f"the model's {max_positions} positions")  # fmt: skip
    return request


@dataclass(frozen=True)
class Draft:
    """After a step: the ids generated so far (masks where none is committed yet). `final`: the
    backend knows these ids will not change (SGLang's finished blocks); the native engine may still
    revise any of them, and says False."""

    step: int
    generated: list[int]
    final: bool = False
    # per generated position, the probability the model gave its id at the last step that ran it
    # (0.0: not run yet); empty where a backend does not report it (SGLang)
    confidence: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Result:
    tokens: list[int]
    steps: int  # denoising steps (SGLang: blocks received, as it reports no steps)
    seconds: float
    cancelled: bool = False
