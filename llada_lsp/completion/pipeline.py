"""What runs on the model thread: loading a model, and infill and rewrite requests from prompt to
post-processed drafts and result.

A request becomes a Plan: the engine settings of its sequence, what each draft shows (`on_draft`) and
the answer (`finish`). The service's worker hands many plans' sequences to the engine's scheduler at
once; `run_infill` / `run_rewrite` run one plan alone. Knows nothing of the LSP, pygls or threads:
plain values in and out, drafts through a callback.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

from ..errors import CheckpointError, Refused
from .postprocess import Cursor, bound_rewrite, finish, strip_special, unfence
from .codec import TextCodec
from .prompt import CHARS_PER_TOKEN, Healed, heal, infill_prompt, rewrite_prompt
from .syntax import check_rewrite

if TYPE_CHECKING:  # torch is imported on the model thread, when a model loads, not with the server
    from ..engine import Draft, Engine, GenerationResult
    from ..engine.sequence import Settings

MIN_PROMPT = 32  # positions always left to the prompt when a completion length is clamped to the model
MAX_TOKENS = 64  # a completion's length, unless a request says otherwise (the server's maxCompletionTokens)
CONTEXT_TOKENS = 1024  # the prompt's budget, unless a request says otherwise (the server's contextTokens)


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


@dataclass
class LoadedModel:
    spec: ModelSpec
    engine: Engine
    codec: TextCodec

    @property
    def max_positions(self) -> int:
        return self.engine.model.config.max_position_embeddings


@dataclass(frozen=True)
class Infill:
    text: str  # the whole document
    cursor: int  # str index of the cursor in `text`
    mode: str
    max_tokens: int
    context_tokens: int


@dataclass(frozen=True)
class Rewrite:
    text: str
    start: int  # the selection is text[start:end]
    end: int
    mode: str
    context_tokens: int
    instruction: str | None = None
    python: bool = False  # parse-checked with ast; other languages are held to their brackets and quotes


@dataclass(frozen=True)
class Outcome:
    text: str
    steps: int
    seconds: float
    # "done" | "unit" (the unit at the cursor was complete and stable) | "cancelled"; rewrites also
    # "unchanged" (the model kept the selection) and "refused" (it would break the code: see `reason`)
    stopped: str
    reason: str = ""
    tokens: int = 0  # positions the model generated (filled), for throughput figures


class InstructionUnsupported(Refused):
    """A rewrite instruction given to a model that cannot follow one (a fill-in-the-middle model)."""


def load(spec: ModelSpec, report: Callable[[str, int], None],
         cancelled: Callable[[], bool] | None = None) -> LoadedModel:  # fmt: skip
    """Raises CheckpointError with a one-line message when the model cannot be used; LoadAbandoned (a
    CheckpointError) at the next tensor once `cancelled()` is true."""
    report(f"reading {spec.name}", 10)
    import torch

    from ..engine import Engine
    from ..model import load_model

    if spec.threads:  # threads that outnumber the free cores spin against each other: a step can take 50x longer
        torch.set_num_threads(spec.threads)
    model = load_model(spec.path, device=spec.device, dtype=spec.dtype, cancelled=cancelled, quantize=spec.quantize,
                       devices=list(spec.devices) if spec.devices else None)  # fmt: skip
    report("reading the tokenizer", 70)
    codec = load_codec(spec.path, spec.name)
    if codec.special.mask is None and model.config.mask_token_id is None:
        raise CheckpointError(f"{spec.name}: the tokenizer has no <|mask|> token")
    report("warming up", 90)
    engine = Engine(model, cache_mb=spec.cache_mb, prefix_cache=spec.prefix_cache, max_batch=spec.max_batch,
                    max_queue=spec.max_queue)
    # First-call costs (allocations, kernel selection) are paid here, not on the first keystroke.
    engine.generation(codec.encode("def f():\n"), 1, "speed", mask_id=codec.special.mask).run()
    return LoadedModel(spec, engine, codec)


def load_codec(path: str | os.PathLike | None, name: str, where: str = "beside the weights") -> TextCodec:
    """The tokenizer of the model at `path` (None: the embedded one) as a TextCodec, token healing's
    lookup built; CheckpointError `NAME: no tokenizer (tokenizer.json) WHERE` when it has none."""
    from ..model import load_tokenizer  # transformers: on the loading thread

    tokenizer = load_tokenizer(path)
    if tokenizer is None:
        raise CheckpointError(f"{name}: no tokenizer (tokenizer.json) {where}")
    codec = TextCodec.from_tokenizer(tokenizer)
    if codec.special.has_fim:
        _ = codec.token_index  # token healing's lookup: built now, not on the first keystroke inside a word
    return codec


def cursor_context(text: str, offset: int) -> Cursor:
    line_start = text.rfind("\n", 0, offset) + 1
    line_end = text.find("\n", offset)
    line_end = len(text) if line_end < 0 else line_end
    next_line, pos = "", line_end + 1
    while pos < len(text) and pos - line_end < 10_000:  # the next non-blank line, looked for nearby
        end = text.find("\n", pos)
        end = len(text) if end < 0 else end
        if text[pos:end].strip():
            next_line = text[pos:end]
            break
        pos = end + 1
    return Cursor(text[line_start:offset], text[offset:line_end].rstrip("\r"), next_line.rstrip("\r"))


class Plan:
    """One request's sequence: `settings` for the engine, `on_draft(draft) -> (step, payload or None)`
    after each of its steps, `finish(result) -> Outcome` at its end."""

    settings: Settings

    def on_draft(self, draft: Draft) -> tuple[int, object]:
        raise NotImplementedError

    def finish(self, result: GenerationResult) -> Outcome:
        raise NotImplementedError

    def run(self, engine: Engine, emit: Callable[[int, object], None]) -> Outcome:
        """Alone: the engine's batch of one."""
        gen = engine.start(self.settings)
        for draft in gen:
            emit(*self.on_draft(draft))
        return self.finish(gen.result)


class InfillPlan(Plan):
    """Generates at the cursor; a draft's payload is the completion as it would be shown, None when
    it did not change (the first step always has one). Stops early once the unit at the cursor is
    complete (ended by the text, an end-of-text, or the last position filled) and unchanged for a step."""

    def __init__(self, model: LoadedModel, job: Infill, cancel: Flag):
        codec, cursor = model.codec, cursor_context(job.text, job.cursor)
        self.codec, self.cursor = codec, cursor
        # The rest of a line fits in one block: a model that never ends the line costs one block, not two.
        limit = job.max_tokens if cursor.on_empty_line else min(job.max_tokens, model.engine.block_size)
        self.gen_length = max(1, min(limit, model.max_positions - MIN_PROMPT))
        budget = min(job.context_tokens, model.max_positions - self.gen_length)
        before, after = window(job.text, job.cursor, job.cursor, budget * CHARS_PER_TOKEN)
        prompt = infill_prompt(before, after, codec, budget)
        self.chat = prompt.layout == "chat"
        self.healed = healed = heal(prompt, codec) or Healed(prompt.ids, "", None)
        self.stop = _StopWhen(cancel)
        self.settings = model.engine.settings(
            healed.ids, self.gen_length, job.mode, eos_early_stop=True, mask_id=codec.special.mask,
            eos_id=codec.special.eos, cancel=self.stop, first_allowed=healed.allowed, priority=0,
        )  # fmt: skip
        self.shown: str | None = None

    def on_draft(self, draft: Draft) -> tuple[int, str | None]:
        codec, mask = self.codec, self.codec.special.mask
        filled = draft.generated[: _first(draft.generated, mask)]
        raw, ended = codec.text_of(filled)
        raw = raw.removeprefix(self.healed.text)  # the first token starts with the text taken back
        # Every position filled: nothing will be added, only revised (post steps).
        completion = finish(raw, self.cursor, ended or len(filled) == self.gen_length, self.chat)
        if completion.complete and completion.text == self.shown:
            self.stop.enough = True  # stable for a step: further steps would mostly polish text past the unit
        changed = completion.text != self.shown or draft.step == 1
        self.shown = completion.text
        return draft.step, self.shown if changed else None

    def finish(self, result: GenerationResult) -> Outcome:
        mask = self.codec.special.mask
        filled = [t for t in result.tokens if t != mask]
        tokens = len(filled)
        if self.stop.enough:
            return Outcome(self.shown or "", result.steps, result.seconds, "unit", tokens=tokens)
        if result.cancelled:
            return Outcome(self.shown or "", result.steps, result.seconds, "cancelled", tokens=tokens)
        raw, _ = self.codec.text_of(filled)
        text = finish(raw.removeprefix(self.healed.text), self.cursor, True, self.chat).text
        return Outcome(text, result.steps, result.seconds, "done", tokens=tokens)


class RewritePlan(Plan):
    """Revises the selection in place: it is the initial draft of the generated blocks (token
    editing changes it, an end-of-text shrinks it, a few masks after it give it a little room to
    grow). A result that would turn code that parsed into code that does not is refused. Drafts
    carry no text (the payload is "": a step was made)."""

    def __init__(self, model: LoadedModel, job: Rewrite, cancel: Flag):
        codec = model.codec
        self.codec, self.job = codec, job
        if job.instruction and codec.special.has_fim:
            raise InstructionUnsupported(
                f"{model.spec.name} is a fill-in-the-middle model and cannot follow an instruction; rewrite "
                "without one, or load a chat model (LLaDA2.1) to use instructions"
            )  # fmt: skip
        self.selection = job.text[job.start : job.end]
        before, after = window(job.text, job.start, job.end, job.context_tokens * CHARS_PER_TOKEN)
        self.prompt = prompt = rewrite_prompt(before, self.selection, after, codec, model.max_positions,
                                              job.context_tokens, job.instruction)  # fmt: skip
        self.started = time.perf_counter()
        self.settings = model.engine.settings(
            prompt.prompt.ids, prompt.gen_length, job.mode, eos_early_stop=True, mask_id=codec.special.mask,
            eos_id=codec.special.eos, cancel=cancel, init_ids=prompt.init_ids, priority=1,
        )  # fmt: skip

    def on_draft(self, draft: Draft) -> tuple[int, str]:
        return draft.step, ""

    def finish(self, result: GenerationResult) -> Outcome:
        codec, job, selection = self.codec, self.job, self.selection
        seconds = time.perf_counter() - self.started
        filled = [t for t in result.tokens if t != codec.special.mask]
        tokens = len(filled)
        if result.cancelled:
            return Outcome("", result.steps, seconds, "cancelled", tokens=tokens)
        raw, _ = codec.text_of(filled)
        raw = strip_special(raw)
        if self.prompt.prompt.layout == "chat":
            raw, _ = unfence(raw, True)
        line_start = job.text[job.text.rfind("\n", 0, job.start) + 1 : job.start]
        text = _keep_line_ends(bound_rewrite(raw, selection, line_start), selection)
        if text == selection:
            return Outcome(text, result.steps, seconds, "unchanged", "the model proposed no change", tokens)
        reason = check_rewrite(job.text, job.start, job.end, text, job.python)
        if reason is not None:
            return Outcome(text, result.steps, seconds, "refused", reason, tokens)
        return Outcome(text, result.steps, seconds, "done", tokens=tokens)


def run_infill(model: LoadedModel, job: Infill, cancel: Flag, emit: Callable[[int, str | None], None]) -> Outcome:
    """One inline completion alone (InfillPlan); `emit(step, text or None)` after every step."""
    return InfillPlan(model, job, cancel).run(model.engine, emit)


def run_rewrite(model: LoadedModel, job: Rewrite, cancel: Flag, emit: Callable[[int, str], None]) -> Outcome:
    """One rewrite alone (RewritePlan); `emit(step, "")` after every step."""
    return RewritePlan(model, job, cancel).run(model.engine, emit)


def _keep_line_ends(text: str, selection: str) -> str:
    """The rewrite ends as the selection ends (unused room the model filled with blank lines is
    dropped), and CRLF files stay CRLF."""
    if "\r\n" in selection:
        text = text.replace("\r\n", "\n").replace("\n", "\r\n")
    ending = selection[len(selection.rstrip()) :]
    return text.rstrip() + ending


def window(text: str, start: int, end: int, chars: int) -> tuple[str, str]:
    """The text before `start` and after `end`, bounded for huge documents. The part before begins at
    a line start fixed by the line of `start`, so it does not move while the user types on that line."""
    line_start = text.rfind("\n", 0, start) + 1
    lo = max(0, line_start - chars)
    if lo > 0:
        lo = text.find("\n", lo, line_start) + 1 or line_start
    lo = max(lo, start - chars)  # a giant cursor line: its end only
    return text[lo:start], text[end : end + chars]


def _first(ids: list[int], value: int) -> int:
    try:
        return ids.index(value)
    except ValueError:
        return len(ids)


class _StopWhen:
    """The engine's cancel flag: the request's, or this job's own decision that it has enough."""

    def __init__(self, cancel: Flag):
        self.cancel, self.enough = cancel, False

    def is_set(self) -> bool:
        return self.enough or self.cancel.is_set()
