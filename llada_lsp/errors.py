"""Errors that cross layers, in a module that imports nothing heavy: the LSP front catches them
without importing torch."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message names the file, key or tensor."""


class DoesNotFit(CheckpointError):
    """A model refused before any allocation because its plan (weights + K/V cache per device) does not
    fit the devices' free memory. The message is the reason on one line, then the plan's table as
    `llada-lsp plan` prints it (also kept apart: `reason`, `table`)."""

    def __init__(self, reason: str, table: str):
        super().__init__(f"{reason}\n{table}")
        self.reason, self.table = reason, table


class LoadAbandoned(CheckpointError):
    """A load stopped part-way because nobody wants its model any more (a newer load, a stopping server)."""


class Refused(ValueError):
    """A request refused for a reason the user is told (a selection too long for the model, an
    instruction it cannot follow): answered and logged as one line, not as a crash."""


class Busy(Refused):
    """The engine's queue is full: the request is answered at once rather than queued without bound."""


class TooLong(Refused):
    """A request longer than the model or the engine's K/V memory can hold."""


class BadLogits(RuntimeError):
    """The model produced NaN or infinite logits (broken weights, an overflow in half precision): the
    request fails with that said, rather than with a silently empty completion."""
