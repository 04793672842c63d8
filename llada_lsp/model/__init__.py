"""The LLaDA2 network, its config and its checkpoint loader; nothing here knows about decoding.

Lazy like the package's face: `llada_lsp.model.plan` (and so `llada-lsp plan`) reads config.json and
safetensors headers with no torch and no transformers; a name below is imported on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_LAZY = {
    "LLaDA2Config": ".config", "LLaDA2": ".llada2", "BlockKVCache": ".llada2", "block_causal_mask": ".llada2",
    "EMBEDDED_MODEL": ".files", "CheckpointError": "..errors", "load_model": ".loader",
    "load_tokenizer": ".loader", "save_model": ".loader",
}  # fmt: skip
__all__ = list(_LAZY)

if TYPE_CHECKING:  # what type checkers and IDEs see
    from .config import LLaDA2Config
    from .llada2 import LLaDA2, BlockKVCache, block_causal_mask
    from ..errors import CheckpointError
    from .files import EMBEDDED_MODEL
    from .loader import load_model, load_tokenizer, save_model


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_LAZY[name], __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
