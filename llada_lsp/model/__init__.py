"""The LLaDA2 network, its config and its checkpoint loader; nothing here knows about decoding.

Lazy like the package's face: `llada_lsp.model.plan` (and so `llada-lsp plan`) reads config.json and
safetensors headers with no torch and no transformers; a name below is imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

_LAZY = {
    "LLaDA2Config": ".config", "LLaDA2": ".llada2", "BlockKVCache": ".llada2", "block_causal_mask": ".llada2",
    "EMBEDDED_MODEL": ".files", "CheckpointError": "..errors", "load_model": ".loader",
    "load_tokenizer": ".loader", "load_serving_tokenizer": ".loader", "save_model": ".loader",
}  # fmt: skip
__all__ = list(_LAZY)

if TYPE_CHECKING:  # what type checkers and IDEs see
    from ..errors import CheckpointError
    from .config import LLaDA2Config
    from .files import EMBEDDED_MODEL
    from .llada2 import BlockKVCache, LLaDA2, block_causal_mask
    from .loader import load_model, load_serving_tokenizer, load_tokenizer, save_model


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
