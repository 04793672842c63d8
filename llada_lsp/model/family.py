"""Which member of the LLaDA2 family a `llada2_moe` config is, read from its keys alone (no torch):
LLaDA2.1 (per-token routing, JointThreshold) or LLaDA2.2 (block routing, Levenshtein edits).

Both share `architectures` and `model_type`, so only LLaDA2.2's own keys tell them apart. Knows
nothing of weights or decoding; the config, the loader and `llada-lsp plan` all ask it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# LLaDA2.2-flash's edit ids: its official config may not declare them (SGLang asks for them as an
# override when missing), so they are the default whenever they fit the vocabulary.
FLASH_DELETE_ID, FLASH_SPLIT_ID = 156930, 156931
EDIT_KEYS = ("delete_token_id", "split_token_id")


@dataclass(frozen=True)
class Family:
    name: str  # "LLaDA2.1" | "LLaDA2.2"
    decoding_rule: str  # "JointThreshold" | "JointThresholdInDel"
    block_size: int | None = None  # LLaDA2.2: the routing block, which decoding must use too
    expert_capacity: int | None = None  # LLaDA2.2: experts admitted per block
    delete_id: int | None = None
    split_id: int | None = None  # INSERT in the report; SGLang's and the config's name is split
    edit_ids_from: str | None = None  # "config" | "default" | "override"

    @property
    def edit_ids(self) -> tuple[int, int] | None:
        return None if self.delete_id is None else (self.delete_id, self.split_id)

    def describe(self) -> str:
        """One line for `plan` and the status lines: the family, its routing and its decoding rule."""
        if self.name == "LLaDA2.1":
            return "LLaDA2.1: per-token routing, decoding JointThreshold"
        return (f"LLaDA2.2: block routing ({self.expert_capacity} experts per {self.block_size}-token block), "
                f"decoding JointThresholdInDel (DELETE {self.delete_id}, INSERT {self.split_id}, "
                f"{self.edit_ids_from})")  # fmt: skip


def family_of(values: Mapping, edit_ids: tuple[int, int] | None = None) -> Family:
    """The family of a config (config.json's raw keys, or a config's attributes as a mapping).
    `edit_ids`: (delete, split) given by the user, which win over the config's. Raises ValueError,
    naming the key, for a config that mixes the two families: decoded either way, it would be wrong."""
    capacity, block = values.get("expert_capacity"), values.get("block_size")
    declared = [values.get(key) for key in EDIT_KEYS]
    if capacity is None:
        if edit_ids is not None or any(v is not None for v in declared):
            raise ValueError("delete_token_id/split_token_id without expert_capacity: edit tokens belong to "
                             "LLaDA2.2, whose MoE routes per block; this config routes per token (LLaDA2.1)")  # fmt: skip
        return Family("LLaDA2.1", "JointThreshold")
    for key, value in (("expert_capacity", capacity), ("block_size", block)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key}: {value!r} is not a positive integer (LLaDA2.2 routes per block of "
                             "block_size tokens, expert_capacity experts each)")  # fmt: skip
    experts, top_k = values.get("num_experts"), values.get("num_experts_per_tok")
    if isinstance(experts, int) and isinstance(top_k, int) and not top_k <= capacity <= experts:
        raise ValueError(f"expert_capacity: {capacity} must lie between num_experts_per_tok {top_k} "
                         f"and num_experts {experts}")  # fmt: skip
    if edit_ids is not None:
        (delete, split), source = edit_ids, "override"
    elif any(v is not None for v in declared):
        if None in declared:
            missing = EDIT_KEYS[declared.index(None)]
            raise ValueError(f"{missing}: missing while {EDIT_KEYS[declared.index(None) ^ 1]} is given")
        (delete, split), source = declared, "config"
    else:
        (delete, split), source = (FLASH_DELETE_ID, FLASH_SPLIT_ID), "default"
    vocab = values.get("vocab_size")
    for key, value in zip(EDIT_KEYS, (delete, split)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < (vocab or 0):
            hint = (" (the LLaDA2.2-flash defaults do not fit this vocabulary: give both edit ids in the "
                    "config or as an override)") if source == "default" else ""  # fmt: skip
            raise ValueError(f"{key}: {value!r} is not an id of the vocabulary (size {vocab}){hint}")
    if delete == split:
        raise ValueError(f"delete_token_id and split_token_id are both {delete}")
    for key in ("mask_token_id", "eos_token_id", "pad_token_id"):
        if values.get(key) in (delete, split):
            raise ValueError(f"{key}: {values[key]} is also an edit id")
    return Family("LLaDA2.2", "JointThresholdInDel", block, capacity, delete, split, source)
