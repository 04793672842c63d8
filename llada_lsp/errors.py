"""Errors that cross layers, in a module that imports nothing heavy: the LSP front catches them
without importing torch."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message names the file, key or tensor."""


class Refused(ValueError):
    """A request refused for a reason the user is told (a selection too long for the model, an
    instruction it cannot follow): answered and logged as one line, not as a crash."""
