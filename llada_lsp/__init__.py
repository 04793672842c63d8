"""llada-lsp: a code-completion language server on LLaDA2.1 block-diffusion models.

The stable API: `load_model`, `generate`, `Engine`; the server lives in `llada_lsp.server`.

The face is lazy: `import llada_lsp` (and so `llada-lsp --help`, the headless client and the pure-text
post-processing) imports no torch and no transformers; a name is imported on first use.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

from ._lazy import lazy_names

try:
    __version__ = version("llada-lsp")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

_LAZY = {
    "Engine": ".engine", "GenerationResult": ".engine", "JointThreshold": ".engine", "PRESETS": ".engine",
    "generate": ".engine", "load_model": ".model", "load_tokenizer": ".model", "CheckpointError": ".errors",
}  # fmt: skip
__all__ = [*_LAZY, "__version__"]

if TYPE_CHECKING:  # what type checkers and IDEs see
    from .engine import PRESETS, Engine, GenerationResult, JointThreshold, generate
    from .errors import CheckpointError
    from .model import load_model, load_tokenizer


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
