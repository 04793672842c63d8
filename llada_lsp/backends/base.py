"""What the engine service and the in-process front run requests on: the `Backend` protocol, and the
tokenizer every backend reads beside its model.

A backend loads a model (`load`), takes jobs keyed for supersede (`submit`), cancels them, reports
its state and figures (`stats`) and closes. Two implementations: runtime.worker.ModelWorker over the
native engine (backends/native.py) and backends/sglang.SGLangWorker. Knows nothing of sockets or the LSP.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Protocol

from ..completion.codec import TextCodec
from ..completion.generation import LoadedModel
from ..errors import CheckpointError

Report = Callable[[str, int], None]  # (what the load is doing, percent)


class Backend(Protocol):
    state: str  # "loading" | "ready" | "error"
    error: str | None
    spec: Any  # what it serves; str() names it, `.name` too
    model: LoadedModel | None
    # Whether a generation can start from a draft (init_ids); without the attribute it can (the native
    # model thread). False: a revision (an infill's draft) is served as a cold start.
    revises: bool

    def load(self, spec: Any, report: Report) -> Any:
        """Starts loading `spec`; returns the load's ticket (`when_done` to learn its end)."""

    def submit(self, key: str | None, label: str, job: Callable, on_draft: Callable | None = None,
               group: Any = None) -> Any:  # fmt: skip
        """`job(model, ticket) -> Plan` is generated; a newer job of `key` cancels this one; jobs of
        different `group`s (connections) are served in turn."""

    def cancel_key(self, key: str) -> None: ...

    def stats(self) -> dict[str, Any]:
        """Plain numbers for the status (empty before the model is loaded)."""

    def stop(self, timeout: float = 10.0) -> bool:
        """Cancels everything; False if what runs did not end in time."""

    async def aclose(self) -> None:
        """After `stop`: waits for what the backend still owes (SGLang's aborts) and frees it."""


def load_codec(path: str | os.PathLike | None, name: str, where: str = "beside the weights") -> TextCodec:
    """The tokenizer of the model at `path` (None: the embedded one) as a TextCodec, token healing's
    lookup built; CheckpointError `NAME: no tokenizer (tokenizer.json) WHERE` when it has none."""
    from ..model import load_serving_tokenizer  # tokenizers (or transformers): on the loading thread

    tokenizer = load_serving_tokenizer(path)
    if tokenizer is None:
        raise CheckpointError(f"{name}: no tokenizer (tokenizer.json) {where}")
    codec = TextCodec.from_tokenizer(tokenizer)
    if codec.special.has_fim:
        _ = codec.token_index  # token healing's lookup: built now, not on the first keystroke inside a word
    return codec
