"""Loading and saving LLaDA2 checkpoints: a local folder or a Hugging Face cache entry, offline only.

Owns the weight-name mapping between the checkpoint and the network. Never runs remote code and never
touches the network. Knows nothing of decoding.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from ..errors import CheckpointError, DoesNotFit, LoadAbandoned
from . import cpu_runner, fp8
from .config import LLaDA2Config
from .family import EDIT_KEYS
from .files import EMBEDDED_MODEL, SIZE_KEYS, check_sizes, resolve_path, stored_shapes, weight_files  # noqa: F401
from .llada2 import LLaDA2, compute_dtype
from .plan import LAYER_OF_NAME, MemoryPlan, ModelShape, device_of_slots, fmt_bytes, plan_of, render, slot_of
from .tokenizer import read_tokenizer

logger = logging.getLogger("llada_lsp.model")

DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "float64": torch.float64, "fp64": torch.float64,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}  # fmt: skip
FLOAT_STORAGE = frozenset({"F16", "BF16", "F32", "F64"})  # safetensors' names of the dtypes a weight may have

# Routed experts are stored one tensor per expert, FP8 ones with their block scales beside them
# (`weight_scale_inv`, the DeepSeek-V3 layout); the network stacks them (see llada2.Experts).
EXPERT_KEY = re.compile(
    r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.(weight|weight_scale_inv)$"
)
STACKED_NAME = {"gate_proj": "w_gate", "up_proj": "w_up", "down_proj": "w_down"}
STACKED_SUFFIX = {"weight": "", "weight_scale_inv": "_scale_inv"}


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


def load_config(folder: Path, edit_ids: tuple[int, int] | None = None) -> LLaDA2Config:
    """config.json, checked; `edit_ids` (delete, split) override a LLaDA2.2 checkpoint's own."""
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
        config = LLaDA2Config(**raw)
        config.edit_ids_override = None if edit_ids is None else tuple(edit_ids)
        config.validate_llada()
    except (ValueError, TypeError) as err:  # TypeError: a key of the wrong kind (a string for a number)
        raise CheckpointError(f"{file}: {err}") from None
    return config


def check_counts(config: LLaDA2Config, names: list[str], folder: Path) -> None:
    """config.json's layer and expert counts against the tensors the files list. Run before the network
    is built: it has a module per layer and a checkpoint name per expert, so a count off by a factor of
    a million would otherwise build for minutes before any shape could disagree."""
    layers = {int(m[1]) for name in names if (m := LAYER_OF_NAME.match(name))}
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
                 folder: Path, fp8_names: frozenset[str] = frozenset()) -> None:  # fmt: skip
    """Checkpoint names -> the shapes config.json implies, against those the headers list; `fp8_names`
    must be stored as float8_e4m3fn, the rest as floats."""
    missing = [name for name in expected if name not in stored]
    if missing:
        raise CheckpointError(f"{folder}: tensor {missing[0]}: missing from the checkpoint ({len(missing)} missing)")
    for name, want in expected.items():
        shape, dtype = stored[name]
        if shape != want:
            raise CheckpointError(f"{folder}: tensor {name} has shape {shape}, config.json implies {want}")
        if name in fp8_names and dtype != "F8_E4M3":
            raise CheckpointError(f"{folder}: tensor {name} is stored as {dtype}, not as F8_E4M3 beside its scales")
        if name not in fp8_names and dtype not in FLOAT_STORAGE:
            raise CheckpointError(f"{folder}: tensor {name} is stored as {dtype}, not as floats")


def check_plan(config: LLaDA2Config, stored: dict[str, tuple[tuple[int, ...], str]], devices: list[torch.device],
               dtype: torch.dtype, quantize: str | None, folder: Path) -> MemoryPlan:  # fmt: skip
    """The memory plan of this load (`llada-lsp plan`'s: the weights as they will be held, and one
    sequence of the model's full length of K/V, the least the engine allocates), checked against the
    devices' free memory before anything is allocated."""
    family = config.family  # with the user's edit ids, which config.json does not hold
    raw = {**config.to_dict(), **dict(zip(EDIT_KEYS, family.edit_ids or ()))}
    shape = dataclasses.replace(ModelShape.from_config(raw, str(folder / "config.json")), family=family)
    plan = plan_of(str(folder), shape, stored, [str(d) for d in devices], None, str(dtype).removeprefix("torch."),
                   quantize, None, 1)  # fmt: skip
    if not plan.fits:
        raise DoesNotFit(f"{folder}: does not fit: {plan.reason()}", render(plan))
    return plan


def hops_of(plan: MemoryPlan, devices: list[torch.device], n_layers: int) -> dict[int, torch.device]:
    """Where a split model changes device: the first layer on each next device (n_layers: the head)."""
    index = device_of_slots(plan)
    labels = ["embed", *map(str, range(n_layers)), "head"]
    return {(n_layers if label == "head" else int(label)): devices[index[label]]
            for before, label in zip(labels, labels[1:]) if index[label] != index[before]}  # fmt: skip


def network_name(key: str) -> tuple[str, int | None]:
    """Checkpoint name -> (network name, the expert's index in its layer's stack, or None)."""
    m = EXPERT_KEY.match(key)
    if m is None:
        return key, None
    return f"{m[1]}.{STACKED_NAME[m[3]]}{STACKED_SUFFIX[m[4]]}", int(m[2])


def to_checkpoint_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Network names -> checkpoint names (the inverse of network_name)."""
    out = {}
    inverse = {v + suffix: f"{k}.{leaf}" for k, v in STACKED_NAME.items() for leaf, suffix in STACKED_SUFFIX.items()}
    for name, tensor in state.items():
        prefix, _, leaf = name.rpartition(".")
        if leaf in inverse and prefix.endswith(".mlp.experts"):
            for e in range(tensor.shape[0]):
                out[f"{prefix}.{e}.{inverse[leaf]}"] = tensor[e].contiguous()
        else:
            out[name] = tensor.contiguous()
    return out


def tensor_dtype(name: str, dtype: torch.dtype, built: torch.dtype) -> torch.dtype:
    """The dtype a tensor is held in: `dtype`, but FP8 experts and their block scales keep the dtype the
    network built them with (`built`), and the expert bias stays in >= fp32: it only ranks experts, and
    bf16 would reorder near-ties."""
    if built == fp8.FP8 or name.endswith("_scale_inv"):
        return built
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
    quantize: str | None = None,
    devices: list[str | torch.device] | None = None,
    edit_ids: tuple[int, int] | None = None,
) -> LLaDA2:
    """Build on the meta device, then assign the checkpoint's tensors (cast to `dtype` on `device`).

    Every size is checked against the safetensors headers before anything is built or read, so a
    config.json that disagrees with its weights fails at once; then the memory plan against the
    devices' free memory (DoesNotFit, with the plan's table). `cancelled()` is asked before each tensor
    is read; True stops the load there with LoadAbandoned. `config.mask_token_id` / `eos_token_id` are
    filled from the tokenizer when the config lacks them.

    `quantize="fp8"`: the routed experts become float8_e4m3fn with 128x128 block scales as each is
    read, shard by shard; a checkpoint whose experts are FP8 already (`weight_scale_inv` beside them)
    loads as is. `devices` (instead of `device`): contiguous layer ranges balanced by bytes, the
    embedding on the first, the final norm and head on the last.

    `edit_ids` (delete, split): a LLaDA2.2 checkpoint's DELETE and INSERT ids, over its config's (and
    over the LLaDA2.2-flash defaults the config falls back to); refused for a LLaDA2.1 checkpoint.
    """
    if quantize not in (None, "fp8"):
        raise CheckpointError(f"quantize {quantize!r}: only fp8 is supported")
    if devices and device is not None:
        raise CheckpointError("give either device or devices, not both")
    targets = [resolve_device(d) for d in devices] if devices else [resolve_device(device)]
    dtype = resolve_dtype(dtype, targets[0])
    folder = resolve_path(path)
    config = load_config(folder, edit_ids)
    files = weight_files(folder)
    stored = stored_shapes(files)
    check_counts(config, list(stored), folder)
    stored_fp8 = any(name.endswith(".weight_scale_inv") for name in stored)
    try:
        if (stored_fp8 or quantize == "fp8") and not fp8.is_fp8(config):
            config.quantization_config = dict(fp8.QUANTIZATION_CONFIG)  # FP8 scales speak for themselves
    except ValueError as err:
        raise CheckpointError(f"{folder / 'config.json'}: {err}") from None
    quantizing = quantize == "fp8" and not stored_fp8
    with torch.device("meta"), _no_init():
        model = LLaDA2(config)
    built = model.state_dict()
    expected = {name: tuple(t.shape) for name, t in to_checkpoint_names(built).items()}
    if quantizing:  # the block scales are made here, not read
        expected = {name: shape for name, shape in expected.items() if not name.endswith("_scale_inv")}
    held_fp8 = {name: t for name, t in built.items() if t.dtype == fp8.FP8}
    fp8_names = frozenset() if quantizing else frozenset(to_checkpoint_names(held_fp8))
    check_shapes(expected, stored, folder, fp8_names)
    plan = check_plan(config, stored, targets, dtype, "fp8" if quantizing else None, folder)
    device_of = {label: targets[i] for label, i in device_of_slots(plan).items()}

    def stop_if_cancelled() -> None:
        if cancelled is not None and cancelled():
            raise LoadAbandoned(f"{folder}: loading abandoned")

    weights: dict[str, torch.Tensor] = {}

    def place(key: str, tensor: torch.Tensor) -> None:
        name, expert = network_name(key)
        where, held_as = device_of[slot_of(name)], tensor_dtype(name, dtype, built[name].dtype)
        if expert is None:
            weights[name] = tensor.to(device=where, dtype=held_as)
            return
        if name not in weights:  # the layer's stack, filled expert by expert: never a second copy of it
            weights[name] = torch.empty(built[name].shape, device=where, dtype=held_as)
        weights[name][expert].copy_(tensor)

    staged = quantized = 0  # the most host bytes held at once before placing; expert matrices quantized
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for key in f.keys():
                # Unexpected extra tensors (e.g. rotary caches some exporters write) are never read.
                if key not in expected:
                    continue
                stop_if_cancelled()
                tensor = f.get_tensor(key)
                pieces = [(key, tensor)]
                if quantizing and EXPERT_KEY.match(key):  # on its device: a GPU quantizes far faster
                    q, scale = fp8.quantize(tensor.to(device_of[slot_of(key)]))
                    pieces, quantized = [(key, q), (f"{key}_scale_inv", scale)], quantized + 1
                on_host = {id(t): t for t in (tensor, *(piece for _, piece in pieces)) if t.device.type == "cpu"}
                staged = max(staged, sum(t.nbytes for t in on_host.values()))
                for name, piece in pieces:
                    place(name, piece)
    if quantizing:
        logger.info("%s: %d routed expert matrices quantized to FP8 at load, shard by shard; host memory held "
                    "at once for it: at most %s (largest shard %s)", folder, quantized, fmt_bytes(staged),
                    fmt_bytes(max(file.stat().st_size for file in files)))  # fmt: skip
    model.load_state_dict(weights, assign=True)
    model.eval().requires_grad_(False)
    model.hops = hops_of(plan, targets, config.num_hidden_layers)
    if all(t.type == "cpu" for t in targets):
        cpu_runner.prepare(model)  # the weights laid out for the CPU's GEMM, and the flat runner where it runs
    fill_special_ids(model.config, folder)
    return model


def fill_special_ids(config: LLaDA2Config, folder: Path) -> None:
    if config.mask_token_id is not None and config.eos_token_id is not None:
        return
    tokenizer = load_serving_tokenizer(folder)
    if tokenizer is None:
        return
    if config.mask_token_id is None:
        mask = tokenizer.convert_tokens_to_ids("<|mask|>")
        config.mask_token_id = mask if mask != tokenizer.unk_token_id else None
    if config.eos_token_id is None:
        config.eos_token_id = tokenizer.eos_token_id


def load_tokenizer(path: str | Path | None = None):
    """The checkpoint's tokenizer through transformers' AutoTokenizer (no remote code), or None if it has
    none: the whole of transformers' interface, for scripts and training."""
    folder = resolve_path(path)
    return _transformers_tokenizer(folder) if _has_tokenizer(folder) else None


def load_serving_tokenizer(path: str | Path | None = None):
    """The tokenizer serving reads, or None if it has none: where it is a plain tokenizer.json, read with
    the tokenizers library alone (model/tokenizer.py: the same ids, without transformers' 0.8 s import),
    else `load_tokenizer`'s. Either is called as transformers' are (`tok(text)["input_ids"]`, `decode`)."""
    folder = resolve_path(path)
    if not _has_tokenizer(folder):
        return None
    return read_tokenizer(folder) or _transformers_tokenizer(folder)


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json"))


def _transformers_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)


def save_model(model: LLaDA2, folder: str | Path, dtype: torch.dtype = torch.bfloat16) -> None:
    """Write config.json + model.safetensors under the real checkpoint names; FP8 experts are written as
    they are held, with their `weight_scale_inv` (config.json keeps its quantization_config)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", tensor_dtype(k, dtype, v.dtype)) for k, v in model.state_dict().items()}
    save_file(to_checkpoint_names(state), str(folder / "model.safetensors"), metadata={"format": "pt"})
    model.config.dtype = str(dtype).removeprefix("torch.")
    model.config.save_pretrained(folder)
