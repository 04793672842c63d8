"""What a checkpoint folder holds, read without torch or transformers: where the folder is, its weight
files, the tensors' shapes and stored dtypes from the safetensors headers, and the check of config.json's
sizes. `llada-lsp plan` (model/plan.py) needs no more; the loader builds on the same functions.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from safetensors import SafetensorError, safe_open

from ..errors import CheckpointError

EMBEDDED_MODEL = Path(__file__).resolve().parent.parent / "data" / "tiny"

# The sizes the network is built from; checked before anything is built, since a division by zero or a
# negative width would surface as an error far from the key that caused it.
SIZE_KEYS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "moe_intermediate_size", "num_experts", "num_experts_per_tok", "num_shared_experts",
    "n_group", "topk_group", "first_k_dense_replace", "rotary_dim", "max_position_embeddings",
)  # fmt: skip
MAY_BE_ZERO = frozenset({"num_shared_experts", "first_k_dense_replace", "rotary_dim"})


def check_sizes(values: dict, keys: tuple[str, ...] = SIZE_KEYS) -> None:
    """Raise ValueError naming the first of `keys` (in their order) whose size in `values` (a config or
    config.json's raw keys) is not a whole number of the right sign. None stands for a size derived from
    the others."""
    for key in keys:
        value = values.get(key)
        if value is None and key in ("head_dim", "rotary_dim"):
            continue
        # bool is an int to Python; `true` for a size is a typo, not 1
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if key in MAY_BE_ZERO else 1):
            least = "a non-negative" if key in MAY_BE_ZERO else "a positive"
            raise ValueError(f"{key}: {value!r} is not {least} integer")


def resolve_path(path: str | Path | None) -> Path:
    """A local folder, or a Hugging Face id found in the local cache (never downloaded); None is the
    embedded model shipped inside the package."""
    if path is None:
        return EMBEDDED_MODEL
    local = Path(path).expanduser()
    if local.is_dir():
        return local
    if local.exists():
        raise CheckpointError(f"{local}: not a folder (a model is a folder with config.json and weights)")
    if re.fullmatch(r"[\w.-]+/[\w.-]+", str(path)):
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        try:
            return Path(snapshot_download(str(path), local_files_only=True))
        except LocalEntryNotFoundError:
            raise CheckpointError(
                f"{path}: no such folder, and not in the local Hugging Face cache (nothing is downloaded)"
            ) from None
    raise CheckpointError(f"{path}: no such model folder")


def weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        for shard in shards:
            if not (folder / shard).is_file():
                raise CheckpointError(f"{folder / shard}: shard listed in {index.name} is missing")
        return [folder / s for s in shards]
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    raise CheckpointError(f"{folder}: no model.safetensors or model.safetensors.index.json")


def stored_shapes(files: list[Path]) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every tensor's shape and stored dtype ("BF16"), read from the safetensors headers alone (no tensor
    is read, so the numpy framework serves, FP8 included, and torch is never imported). The library
    refuses a header whose offsets do not tile its file, so the shapes are what the bytes hold."""
    stored: dict[str, tuple[tuple[int, ...], str]] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="numpy") as f:
                for key in f.keys():
                    tensor = f.get_slice(key)
                    stored[key] = (tuple(tensor.get_shape()), tensor.get_dtype())
        except (SafetensorError, OSError) as err:
            raise CheckpointError(f"{file}: not a readable safetensors file ({err})") from None
    return stored
