"""Errors that cross layers, in a module that imports nothing heavy: the LSP front catches them
without importing torch."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message names the file, key or tensor."""
