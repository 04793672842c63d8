"""llada-lsp: a code-completion language server on LLaDA2.1 block-diffusion models.

The stable API: `load_model`, `generate`, `Engine`; the server lives in `llada_lsp.server`.
"""

from .engine import Engine, GenerationResult, JointThreshold, PRESETS, generate
from .model import CheckpointError, load_model, load_tokenizer

__all__ = ["Engine", "GenerationResult", "JointThreshold", "PRESETS", "generate", "CheckpointError", "load_model", "load_tokenizer"]
__version__ = "0.1.0"
