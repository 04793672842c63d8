"""Prompt layouts shared by training, evaluation and the server: fill-in-the-middle ids for models
with FIM tokens, the LLaDA2.1 chat template for those without.

Knows token ids and strings only; nothing of documents, positions or the LSP.
"""

from __future__ import annotations

from dataclasses import dataclass

FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE = "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"
SPECIAL_TOKENS = ["<|endoftext|>", "<|mask|>", FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE]
CHAT_TEMPLATE = (
    "<role>SYSTEM</role>detailed thinking off<|role_end|>"
    "<role>HUMAN</role>{prompt}<|role_end|><role>ASSISTANT</role>"
)


@dataclass(frozen=True)
class SpecialIds:
    eos: int | None
    mask: int | None
    fim_prefix: int | None = None
    fim_suffix: int | None = None
    fim_middle: int | None = None

    @property
    def has_fim(self) -> bool:
        return None not in (self.fim_prefix, self.fim_suffix, self.fim_middle)

    @classmethod
    def from_tokenizer(cls, tokenizer) -> "SpecialIds":
        vocab = tokenizer.get_vocab()
        return cls(*(vocab.get(t) for t in SPECIAL_TOKENS))


def fim_ids(prefix_ids: list[int], suffix_ids: list[int], middle_ids: list[int], special: SpecialIds) -> list[int]:
    """The suffix comes before the hole, so the generated blocks can attend to it under the
    block-causal mask (a suffix placed after the hole would be invisible to it)."""
    return [special.fim_prefix, *prefix_ids, special.fim_suffix, *suffix_ids, special.fim_middle, *middle_ids]


def chat_infill_prompt(prefix: str, suffix: str, instruction: str | None = None) -> str:
    """For checkpoints without FIM tokens (the real LLaDA2.1): the hole is described in words."""
    task = instruction or "Write the code that goes at <HOLE>. Answer with that code only, no explanation."
    body = f"{task}\n\n```\n{prefix}<HOLE>{suffix}\n```"
    return CHAT_TEMPLATE.format(prompt=body)
