"""The LLaDA2 network, its config and its checkpoint loader; nothing here knows about decoding."""

from .config import LLaDA2Config
from .llada2 import LLaDA2, BlockKVCache, block_causal_mask
from .loader import EMBEDDED_MODEL, CheckpointError, load_model, load_tokenizer, save_model

__all__ = [
    "LLaDA2", "LLaDA2Config", "BlockKVCache", "block_causal_mask",
    "EMBEDDED_MODEL", "CheckpointError", "load_model", "load_tokenizer", "save_model",
]  # fmt: skip
