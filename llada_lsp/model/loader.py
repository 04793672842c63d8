"""Loading and saving LLaDA2 checkpoints: a local folder or a Hugging Face cache entry, offline only.

Owns the weight-name mapping between the checkpoint and the network. Never runs remote code and never
touches the network. Knows nothing of decoding.
"""

from __future__ import annotations

import json
import math
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from transformers import AutoConfig

from ..errors import CheckpointError, LoadAbandoned
from .config import SIZE_KEYS, LLaDA2Config, check_sizes
from .llada2 import LLaDA2, compute_dtype

DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "float64": torch.float64, "fp64": torch.float64,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}  # fmt: skip
FLOAT_STORAGE = frozenset({"F16", "BF16", "F32", "F64"})  # safetensors' names of the dtypes a weight may have

# Routed experts are stored one tensor per expert; the network stacks them (see llada2.Experts).
EXPERT_KEY = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.")
STACKED_NAME = {"gate_proj": "w_gate", "up_proj": "w_up", "down_proj": "w_down"}


EMBEDDED_MODEL = Path(__file__).resolve().parent.parent / "data" / "tiny"


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if dtype is None:  # bf16 where it is fast, fp32 on the CPU
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise CheckpointError(f"unknown dtype {dtype!r}; choose one of {', '.join(sorted(DTYPES))}")
    return DTYPES[dtype]


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise CheckpointError(f"unknown device {device!r}: {err}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CheckpointError(f"device {device} requested but CUDA is not available on this machine")
    return device


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


def load_config(folder: Path) -> LLaDA2Config:
    file = folder / "config.json"
    if not file.is_file():
        raise CheckpointError(f"{file}: missing")
    try:
        raw = json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{file}: not valid JSON ({err})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{file}: not a JSON object")
    if raw.get("model_type") != LLaDA2Config.model_type:
        raise CheckpointError(f"{file}: model_type is {raw.get('model_type')!r}, expected 'llada2_moe'")
    try:
        # Sizes first: the constructor divides by some of them, and a string or a zero fails there far
        # from its key. A key left out takes its default.
        check_sizes({key: raw[key] for key in SIZE_KEYS if key in raw})
        config = AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
        config.validate_llada()
    except ValueError as err:
        raise CheckpointError(f"{file}: {err}") from None
    return config


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
    is read). The library refuses a header whose offsets do not tile its file, so the shapes are what
    the bytes hold."""
    stored: dict[str, tuple[tuple[int, ...], str]] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for key in f.keys():
                    tensor = f.get_slice(key)
                    stored[key] = (tuple(tensor.get_shape()), tensor.get_dtype())
        except (SafetensorError, OSError) as err:
            raise CheckpointError(f"{file}: not a readable safetensors file ({err})") from None
    return stored


def check_counts(config: LLaDA2Config, names: list[str], folder: Path) -> None:
    """config.json's layer and expert counts against the tensors the files list. Run before the network
    is built: it has a module per layer and a checkpoint name per expert, so a count off by a factor of
    a million would otherwise build for minutes before any shape could disagree."""
    layers = {int(m[1]) for name in names if (m := LAYER_KEY.match(name))}
    held = max(layers, default=-1) + 1
    if config.num_hidden_layers != held:
        raise CheckpointError(f"{folder}: config.json says {config.num_hidden_layers} layers, the weights hold {held}")
    if config.num_hidden_layers <= config.first_k_dense_replace:
        return  # every layer is dense: no routed experts to count
    experts = {int(m[2]) for name in names if (m := EXPERT_KEY.match(name))}
    held = max(experts, default=-1) + 1
    if config.num_experts != held:
        raise CheckpointError(f"{folder}: config.json says {config.num_experts} experts, the weights hold {held}")


def check_shapes(expected: dict[str, tuple[int, ...]], stored: dict[str, tuple[tuple[int, ...], str]],
                 folder: Path) -> None:  # fmt: skip
    """Checkpoint names -> the shapes config.json implies, against those the headers list."""
    missing = [name for name in expected if name not in stored]
    if missing:
        raise CheckpointError(f"{folder}: tensor {missing[0]}: missing from the checkpoint ({len(missing)} missing)")
    for name, want in expected.items():
        shape, dtype = stored[name]
        if shape != want:
            raise CheckpointError(f"{folder}: tensor {name} has shape {shape}, config.json implies {want}")
        if dtype not in FLOAT_STORAGE:
            raise CheckpointError(f"{folder}: tensor {name} is stored as {dtype}, not as floats")


def device_memory(device: torch.device) -> int | None:
    """The bytes the device has in all (None: unknown); what other processes hold is not subtracted,
    so a refusal on it is never wrong, only late."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[1]
    if device.type == "cpu" and hasattr(os, "sysconf"):
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            return None
    return None


def check_memory(expected: dict[str, tuple[int, ...]], dtype: torch.dtype, device: torch.device, folder: Path) -> None:
    need = sum(math.prod(shape) * tensor_dtype(name, dtype).itemsize for name, shape in expected.items())
    have = device_memory(device)
    if have is not None and need > have:
        raise CheckpointError(f"{folder}: the weights need {_bytes(need)} as {str(dtype).removeprefix('torch.')}, "
                              f"more than the {_bytes(have)} of {device}")  # fmt: skip


def _bytes(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def from_checkpoint_names(tensors: dict[str, torch.Tensor], config: LLaDA2Config) -> dict[str, torch.Tensor]:
    """Checkpoint names -> network names: stacks the per-expert tensors of each layer."""
    out, experts = {}, {}
    for name, tensor in tensors.items():
        m = EXPERT_KEY.match(name)
        if m:
            experts.setdefault((m[1], m[3]), {})[int(m[2])] = tensor
        else:
            out[name] = tensor
    for (prefix, proj), per_expert in experts.items():
        missing = sorted(set(range(config.num_experts)) - set(per_expert))
        if missing:
            raise CheckpointError(f"{prefix}.{missing[0]}.{proj}.weight: missing from the checkpoint")
        out[f"{prefix}.{STACKED_NAME[proj]}"] = torch.stack([per_expert[e] for e in range(config.num_experts)])
    return out


def to_checkpoint_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Network names -> checkpoint names (the inverse of from_checkpoint_names)."""
    out = {}
    inverse = {v: k for k, v in STACKED_NAME.items()}
    for name, tensor in state.items():
        prefix, _, leaf = name.rpartition(".")
        if leaf in inverse and prefix.endswith(".mlp.experts"):
            for e in range(tensor.shape[0]):
                out[f"{prefix}.{e}.{inverse[leaf]}.weight"] = tensor[e].contiguous()
        else:
            out[name] = tensor.contiguous()
    return out


def tensor_dtype(name: str, dtype: torch.dtype) -> torch.dtype:
    """The expert bias only ranks experts; bf16 would reorder near-ties, so it stays in >= fp32."""
    return compute_dtype(dtype) if name.endswith("expert_bias") else dtype


@contextmanager
def _no_init():
    """The initialisers of torch.nn.init as no-ops: a network built to receive a checkpoint's
    tensors need not draw random ones first. On the meta device drawing costs nothing, but torch
    routes it through torch._refs, whose first use imports torch._dynamo: 1.7 s of every model load."""
    names = [n for n in dir(nn.init) if n.endswith("_") and not n.startswith("_") and callable(getattr(nn.init, n))]
    saved = {n: getattr(nn.init, n) for n in names}
    try:
        for n in names:
            setattr(nn.init, n, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for n, fn in saved.items():
            setattr(nn.init, n, fn)


def load_model(
    path: str | Path | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> LLaDA2:
    """Build on the meta device, then assign the checkpoint's tensors (cast to `dtype` on `device`).

    Every size is checked against the safetensors headers before anything is built or read, so a
    config.json that disagrees with its weights fails at once. `cancelled()` is asked before each tensor
    is read or moved; True stops the load there with LoadAbandoned. `config.mask_token_id` /
    `eos_token_id` are filled from the tokenizer when the config lacks them.
    """
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    folder = resolve_path(path)
    config = load_config(folder)
    files = weight_files(folder)
    stored = stored_shapes(files)
    check_counts(config, list(stored), folder)
    with torch.device("meta"), _no_init():
        model = LLaDA2(config)
    expected = {name: tuple(t.shape) for name, t in to_checkpoint_names(model.state_dict()).items()}
    check_shapes(expected, stored, folder)
    check_memory(expected, dtype, device, folder)

    def stop_if_cancelled() -> None:
        if cancelled is not None and cancelled():
            raise LoadAbandoned(f"{folder}: loading abandoned")

    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for key in f.keys():
                # Unexpected extra tensors (e.g. rotary caches some exporters write) are never read.
                if key in expected:
                    stop_if_cancelled()
                    tensors[key] = f.get_tensor(key)
    state = from_checkpoint_names(tensors, config)
    del tensors
    weights = {}
    for name in model.state_dict():
        stop_if_cancelled()
        weights[name] = state.pop(name).to(device=device, dtype=tensor_dtype(name, dtype))
    model.load_state_dict(weights, assign=True)
    model.eval().requires_grad_(False)
    fill_special_ids(model.config, folder)
    return model


def fill_special_ids(config: LLaDA2Config, folder: Path) -> None:
    if config.mask_token_id is not None and config.eos_token_id is not None:
        return
    tokenizer = load_tokenizer(folder)
    if tokenizer is None:
        return
    if config.mask_token_id is None:
        mask = tokenizer.convert_tokens_to_ids("<|mask|>")
        config.mask_token_id = mask if mask != tokenizer.unk_token_id else None
    if config.eos_token_id is None:
        config.eos_token_id = tokenizer.eos_token_id


def load_tokenizer(path: str | Path | None = None):
    """The checkpoint's tokenizer through AutoTokenizer (no remote code), or None if it has none."""
    folder = resolve_path(path)
    if not any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)


def save_model(model: LLaDA2, folder: str | Path, dtype: torch.dtype = torch.bfloat16) -> None:
    """Write config.json + model.safetensors under the real checkpoint names."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", tensor_dtype(k, dtype)) for k, v in model.state_dict().items()}
    save_file(to_checkpoint_names(state), str(folder / "model.safetensors"), metadata={"format": "pt"})
    model.config.dtype = str(dtype).removeprefix("torch.")
    model.config.save_pretrained(folder)
