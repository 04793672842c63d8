"""llada-lsp: a code-completion language server on LLaDA2.1 block-diffusion models.

The stable API: `load_model`, `generate`, `Engine`; the server lives in `llada_lsp.server`.

The face is lazy: `import llada_lsp` (and so `llada-lsp --help`, the headless client and the pure-text
post-processing) imports no torch and no transformers; a name is imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_names

_LAZY = {
    "Engine": ".engine", "GenerationResult": ".engine", "JointThreshold": ".engine", "PRESETS": ".engine",
    "generate": ".engine", "load_model": ".model", "load_tokenizer": ".model", "CheckpointError": ".errors",
}  # fmt: skip
__all__ = [*_LAZY, "__version__"]

if TYPE_CHECKING:  # what type checkers and IDEs see
    from .engine import PRESETS, Engine, GenerationResult, JointThreshold, generate
    from .errors import CheckpointError
    from .model import load_model, load_tokenizer


_lazy_name, __dir__ = lazy_names(__name__, _LAZY, globals())


def __getattr__(name: str):
    """The lazy names, and `__version__`, read from the installed metadata on first use (importlib.metadata
    costs the headless client a twentieth of a second it does not need)."""
    if name != "__version__":
        return _lazy_name(name)
    from importlib.metadata import PackageNotFoundError, version

    try:
        value = version("llada-lsp")
    except PackageNotFoundError:  # run from a source tree that was never installed
        value = "0+unknown"
    globals()["__version__"] = value
    return value
