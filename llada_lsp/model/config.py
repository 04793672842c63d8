"""The LLaDA2 (`llada2_moe`) configuration, read from the real checkpoints' `config.json` keys.

A plain class, read from and written to `config.json` as JSON: loading a checkpoint imports no
transformers (0.4-0.8 s of every start), and a local folder loads without remote code. Knows nothing
of weights, tokenizers or decoding.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .family import Family, family_of

# The size check lives in the torch-free files.py (`llada-lsp plan` runs it too); re-exported here.
from .files import MAY_BE_ZERO, SIZE_KEYS, check_sizes  # noqa: F401

# LLaDA2.2's keys (model/family.py): written to config.json only when set, so a LLaDA2.1 config saved
# here reads back as LLaDA2.1.
FAMILY_KEYS = ("block_size", "expert_capacity", "delete_token_id", "split_token_id")

# Keys this network does not read but inclusionAI's reference and SGLang's LLaDA2MoeModelLM do, with the
# values of the released checkpoints: every config.json the project writes carries them. SGLang picks
# its model class by `architectures`, rejects a `hidden_act` other than silu when it is missing, builds
# `Dropout(embedding_dropout)`, and without `moe_router_enable_expert_bias` silently drops the router's
# expert bias (the weight names all match, so nothing else would tell).
READ_BY_OTHERS = {
    "architectures": ["LLaDA2MoeModelLM"],
    "hidden_act": "silu",
    "moe_router_enable_expert_bias": True,
    "embedding_dropout": 0.0,
    "attention_dropout": 0.0,
    "output_dropout": 0.0,
    "router_dtype": "fp32",
    "norm_head": False,
    "use_rmsnorm": True,
    "initializer_range": 0.02,
    "output_router_logits": False,
    "use_sliding_window": False,
}


# Keys transformers writes into every config.json that say nothing about the network: not kept.
NOT_KEPT = ("model_type", "transformers_version")


class LLaDA2Config:
    """Defaults are those of LLaDA2.1-mini; every key of the real `config.json` is accepted and unknown
    ones are kept as attributes (written back by `save_pretrained`) and ignored. `sliding_window` is
    ignored on purpose: the real implementations never apply it."""

    model_type = "llada2_moe"

    def __init__(
        self,
        vocab_size: int = 157184,
        hidden_size: int = 2048,
        num_hidden_layers: int = 20,
        num_attention_heads: int = 16,
        num_key_value_heads: int = 4,
        head_dim: int | None = 128,
        intermediate_size: int = 5120,
        moe_intermediate_size: int = 512,
        num_experts: int = 256,
        num_experts_per_tok: int = 8,
        num_shared_experts: int = 1,
        n_group: int = 8,
        topk_group: int = 4,
        first_k_dense_replace: int = 1,
        routed_scaling_factor: float = 2.5,
        norm_topk_prob: bool = True,
        score_function: str = "sigmoid",
        rms_norm_eps: float = 1e-6,
        rope_theta: float = 600000.0,
        partial_rotary_factor: float = 0.5,
        rotary_dim: int | None = None,
        max_position_embeddings: int = 32768,
        use_qk_norm: bool = True,
        use_bias: bool = False,
        use_qkv_bias: bool = False,
        tie_word_embeddings: bool = False,
        mask_token_id: int | None = None,
        eos_token_id: int | None = None,
        pad_token_id: int | None = None,
        block_size: int | None = None,
        expert_capacity: int | None = None,
        delete_token_id: int | None = None,
        split_token_id: int | None = None,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.intermediate_size = intermediate_size
        self.moe_intermediate_size = moe_intermediate_size
        self.num_experts = num_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.num_shared_experts = num_shared_experts
        self.n_group = n_group
        self.topk_group = topk_group
        self.first_k_dense_replace = first_k_dense_replace
        self.routed_scaling_factor = routed_scaling_factor
        self.norm_topk_prob = norm_topk_prob
        self.score_function = score_function
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.partial_rotary_factor = partial_rotary_factor
        self.rotary_dim = rotary_dim or int(self.head_dim * partial_rotary_factor)
        self.max_position_embeddings = max_position_embeddings
        self.use_qk_norm = use_qk_norm
        self.use_bias = use_bias
        self.use_qkv_bias = use_qkv_bias
        self.mask_token_id = mask_token_id
        self.block_size, self.expert_capacity = block_size, expert_capacity
        self.delete_token_id, self.split_token_id = delete_token_id, split_token_id
        # (delete, split) given by the user at load time (loader's `edit_ids`); never written to config.json
        self.edit_ids_override: tuple[int, int] | None = None
        # Real configs carry `rope_scaling: null`; kept under this name, and refused by validate_llada when set.
        self.unsupported_rope_scaling = kwargs.pop("rope_scaling", None)
        self.eos_token_id, self.pad_token_id = eos_token_id, pad_token_id
        self.tie_word_embeddings = tie_word_embeddings
        self.dtype = kwargs.pop("dtype", kwargs.pop("torch_dtype", None))  # the weights' as saved, if said
        for key, value in READ_BY_OTHERS.items():  # a checkpoint's own values win; copies: no shared list
            kwargs.setdefault(key, list(value) if isinstance(value, list) else value)
        for key in NOT_KEPT:
            kwargs.pop(key, None)
        vars(self).update(kwargs)

    def save_pretrained(self, folder: str | Path) -> None:
        """`folder/config.json`, keys sorted, as transformers writes it (and reads it back)."""
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True)
        (Path(folder) / "config.json").write_text(text + "\n")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LLaDA2Config) and self.to_dict() == other.to_dict()

    __hash__ = None  # mutable, compared by value

    def __repr__(self) -> str:
        return f"LLaDA2Config({json.dumps(self.to_dict(), sort_keys=True)})"

    def to_dict(self) -> dict[str, Any]:
        out = {key: value for key, value in vars(self).items() if not key.startswith("_")}
        out["model_type"] = self.model_type
        out.pop("edit_ids_override", None)
        if out.get("dtype") is None:
            out.pop("dtype", None)
        for key in FAMILY_KEYS:
            if out.get(key) is None:
                out.pop(key, None)
        if out.get("unsupported_rope_scaling") is None:  # only a real (rejected) value is worth writing
            out.pop("unsupported_rope_scaling", None)
        return out

    @property
    def family(self) -> Family:
        """LLaDA2.1 or LLaDA2.2, with LLaDA2.2's routing block, capacity and edit ids (ValueError for a
        config that mixes the two)."""
        return family_of(vars(self), self.edit_ids_override)

    @property
    def block_routing(self) -> bool:
        """Whether the MoE admits `expert_capacity` experts per block of `block_size` tokens (LLaDA2.2)."""
        return self.expert_capacity is not None

    @property
    def edit_ids(self) -> tuple[int, int] | None:
        """(DELETE, INSERT) ids of a LLaDA2.2 checkpoint; None for LLaDA2.1."""
        return self.family.edit_ids

    def validate_llada(self) -> None:
        """Raise ValueError naming the key when the numbers cannot form this network."""
        check_sizes({key: getattr(self, key) for key in SIZE_KEYS})
        family_of(vars(self), self.edit_ids_override)  # raises for a config that mixes LLaDA2.1 and LLaDA2.2
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(f"num_experts_per_tok: {self.num_experts_per_tok} > num_experts {self.num_experts}")
        if self.unsupported_rope_scaling:
            raise ValueError(
                f"rope_scaling: {self.unsupported_rope_scaling!r} is not supported (LLaDA2 uses plain RoPE)"
            )
        if self.use_bias or self.use_qkv_bias:
            raise ValueError("use_bias/use_qkv_bias: LLaDA2 has no biases; checkpoints with biases are not supported")
        if self.tie_word_embeddings:
            raise ValueError("tie_word_embeddings: LLaDA2 has an untied lm_head")
        if getattr(self, "hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act: only 'silu' (SwiGLU) is supported, got {self.hidden_act!r}")
        if self.score_function != "sigmoid":
            raise ValueError(f"score_function: only 'sigmoid' routing is supported, got {self.score_function!r}")
        if self.num_experts % self.n_group:
            raise ValueError(f"n_group: {self.n_group} does not divide num_experts {self.num_experts}")
        if self.topk_group > self.n_group:
            raise ValueError(f"topk_group: {self.topk_group} > n_group {self.n_group}")
        if self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
            raise ValueError(f"rotary_dim: {self.rotary_dim} must be even and <= head_dim {self.head_dim}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_key_value_heads must divide num_attention_heads")
