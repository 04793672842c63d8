"""The decoding engine: block-diffusion generation over a block KV cache, as a generator of drafts."""

from .decode import BlockStats, Engine, Generation, GenerationResult, StepDraft, generate
from .policy import INDEL_PRESETS, PRESETS, JointThreshold, JointThresholdInDel, StepUpdate

__all__ = [
    "BlockStats", "StepDraft", "Engine", "Generation", "GenerationResult", "generate",
    "PRESETS", "JointThreshold", "StepUpdate", "INDEL_PRESETS", "JointThresholdInDel",
]  # fmt: skip
