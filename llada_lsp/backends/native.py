"""The native backend: the model loaded in this process and its engine's scheduler, behind the
pipeline's neutral generation requests (`NativeBatch`), driven by the model thread (runtime/worker.py).

Owns loading (weights, tokenizer, warm-up) and the mapping of GenerationRequest onto the engine's DecodeSettings
and of the engine's drafts and results back. Knows nothing of plans' text, sockets or the LSP.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

from .. import kernel_backend
from ..completion.generation import Draft, GenerationRequest, LoadedModel, ModelSpec, Result
from ..errors import CheckpointError
from ..runtime.worker import ModelWorker
from .base import Report, load_codec

if TYPE_CHECKING:  # torch is imported on the model thread, when a model loads, not with the server
    from ..engine import Engine
    from ..engine.scheduler import Event


class NativeBatch:
    """The engine's scheduler in the pipeline's terms: `add` a request, `step` every running one in one
    batched forward (events with neutral drafts and results), `abort`, `drain`, `stats`."""

    def __init__(self, engine: Engine):
        self.engine, self.scheduler = engine, engine.scheduler

    def settings(self, request: GenerationRequest):
        return self.engine.settings(
            request.prompt_ids, request.gen_length, request.mode, eos_early_stop=request.eos_early_stop,
            mask_id=request.mask_id, eos_id=request.eos_id, cancel=request.cancel, init_ids=request.init_ids,
            first_allowed=request.first_allowed, priority=request.priority,
        )  # fmt: skip

    def add(self, request: GenerationRequest) -> int:
        """The sequence's id; Busy when the queue is full, TooLong when the K/V pool cannot hold it."""
        return self.scheduler.add(self.settings(request))

    @property
    def max_rows(self) -> int:
        """Sequences decoded together in one forward, at most."""
        return self.scheduler.max_batch

    def has_room(self) -> bool:
        """Whether a sequence added now would get a row at the next step (none is left waiting)."""
        return len(self.scheduler.running) + self.scheduler.queued < self.scheduler.max_batch

    def step(self) -> list[tuple[int, Draft | None, Result | None, Exception | None]]:
        """(sequence id, draft, result, error) for every running sequence the forward advanced or ended."""
        return [_neutral(event) for event in self.scheduler.step()]

    def abort(self, seq_id: int) -> None:
        self.scheduler.abort(seq_id)

    def drain(self) -> None:
        self.scheduler.drain()

    @property
    def idle(self) -> bool:
        return self.scheduler.idle()

    def stats(self) -> dict[str, Any]:
        """The scheduler's and the cache's counts (plain numbers, never torch)."""
        scheduler, cache = self.scheduler, self.engine.cache
        return {"running": len(scheduler.running), "queued": scheduler.queued, "steps": scheduler.stats.steps,
                "batch_mean": scheduler.stats.batch_mean, "batch_max": scheduler.stats.batch_max,
                "cache_blocks_used": cache.used, "cache_blocks_free": cache.free,
                "cache_hit_rate": cache.stats.hit_rate}  # fmt: skip

    def generate(self, request: GenerationRequest) -> Generator[Draft, None, Result]:
        """One sequence alone (the scheduler otherwise idle): its drafts, then its result."""
        gen = self.engine.start(self.settings(request))
        for draft in gen:
            yield Draft(draft.step, draft.generated, confidence=draft.confidence)
        return _result(gen.result)


def _neutral(event: Event) -> tuple[int, Draft | None, Result | None, Exception | None]:
    d = event.draft
    draft = Draft(d.step, d.generated, confidence=d.confidence) if d is not None else None
    result = _result(event.result) if event.result is not None else None
    return event.id, draft, result, event.error


def _result(result) -> Result:
    return Result(result.tokens, result.steps, result.seconds, result.cancelled)


def load(spec: ModelSpec, report: Report, cancelled: Callable[[], bool] | None = None) -> LoadedModel:
    """Raises CheckpointError with a one-line message when the model cannot be used; LoadAbandoned (a
    CheckpointError) at the next tensor once `cancelled()` is true."""
    report(f"reading {spec.name}", 10)
    import torch

    from ..engine import Engine
    from ..model import load_model

    if spec.threads:  # threads that outnumber the free cores spin against each other: a step can take 50x longer
        torch.set_num_threads(spec.threads)
    model = load_model(spec.path, device=spec.device, dtype=spec.dtype, cancelled=cancelled, quantize=spec.quantize,
                       devices=list(spec.devices) if spec.devices else None, edit_ids=spec.edit_ids)  # fmt: skip
    report("reading the tokenizer", 70)
    codec = load_codec(spec.path, spec.name)
    if codec.special.mask is None and model.config.mask_token_id is None:
        raise CheckpointError(f"{spec.name}: the tokenizer has no <|mask|> token")
    report("warming up", 90)
    try:
        engine = Engine(model, cache_mb=spec.cache_mb, prefix_cache=spec.prefix_cache, max_batch=spec.max_batch,
                        max_queue=spec.max_queue, cuda_graph=spec.cuda_graph, prefill_chunk=spec.prefill_chunk)  # fmt: skip
    except ValueError as err:  # settings the model's placement cannot take (CUDA graphs off CUDA)
        raise CheckpointError(f"{spec.name}: {err}") from None
    # First-call costs (allocations, kernel selection) are paid here, not on the first keystroke. Not on
    # the CPU, where the load has warmed its kernels already (the model's layout, the scheduler's step):
    # there a warm-up generation cost 0.22-0.36 s of CPU and the first answer took as long after it as
    # without it, with the CPU kernels and without; it was a third of a second more for every
    # `llada-lsp complete`.
    if model.device.type != "cpu":
        engine.generation(codec.encode("def f():\n"), 1, "speed", mask_id=codec.special.mask).run()
    # ... and are not served work: `engine status` counts batches and cache hits from here.
    engine.scheduler.stats, engine.cache.stats = type(engine.scheduler.stats)(), type(engine.cache.stats)()
    return LoadedModel(spec, codec, model.config.max_position_embeddings, engine.block_size, NativeBatch(engine),
                       bool(getattr(model.config, "next_edit_gap", 0)), model.config.family,
                       kernel_backend.current().line())  # fmt: skip


def start(loop: asyncio.AbstractEventLoop, log: Callable[[str], None]) -> ModelWorker:
    """The model thread over this backend (what `load` reads is loaded there)."""
    return ModelWorker(loop, log, loader=load)
