"""The memory plan of a LLaDA2 checkpoint: bytes of the weights by part and of the KV cache, placed on
one or several devices, and whether each device holds its share.

Plain arithmetic on config.json (and, when present, the safetensors headers: shapes and dtypes, never a
tensor); torch is asked only for a CUDA device's free memory. Knows nothing of decoding.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CheckpointError
from .family import Family, family_of
from .files import check_sizes, resolve_path, stored_shapes, weight_files

PARTS = ("embeddings", "attention", "dense MLP", "routed experts", "shared experts", "router", "norms", "lm_head")
DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float64": 8, "fp64": 8,
    "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2,
}  # fmt: skip
STORED_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1}  # safetensors' dtype names
FP8_BLOCK = 128  # block-wise scales of FP8 experts: one float32 per 128x128 tile (the DeepSeek-V3 layout)

# Checkpoint names -> the part they count in; first match wins (`mlp.gate.` is the router, `mlp.gate_proj`
# the dense MLP). Tensors matching nothing are never read by the loader, so they are not counted.
PART_OF_NAME = (
    (re.compile(r"^model\.word_embeddings\."), "embeddings"),
    (re.compile(r"^model\.norm\."), "norms"),
    (re.compile(r"^lm_head\."), "lm_head"),
    (re.compile(r"^model\.layers\.\d+\.(input_layernorm|post_attention_layernorm)\."), "norms"),
    (re.compile(r"^model\.layers\.\d+\.attention\.(query_layernorm|key_layernorm)\."), "norms"),
    (re.compile(r"^model\.layers\.\d+\.attention\."), "attention"),
    (re.compile(r"^model\.layers\.\d+\.mlp\.gate\."), "router"),
    (re.compile(r"^model\.layers\.\d+\.mlp\.experts\."), "routed experts"),
    (re.compile(r"^model\.layers\.\d+\.mlp\.shared_experts\."), "shared experts"),
    (re.compile(r"^model\.layers\.\d+\.mlp\.(gate_proj|up_proj|down_proj)\."), "dense MLP"),
)  # fmt: skip
LAYER_OF_NAME = re.compile(r"^model\.layers\.(\d+)\.")
REQUIRED_KEYS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "intermediate_size", "moe_intermediate_size", "num_experts", "first_k_dense_replace",
)  # fmt: skip
UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip


@dataclass(frozen=True)
class ModelShape:
    """The sizes the weights and the KV cache follow from (config.json's keys)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    moe_intermediate_size: int
    num_experts: int
    num_shared_experts: int
    first_k_dense_replace: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    family: Family = Family("LLaDA2.1", "JointThreshold")  # model/family.py: routing and decoding rule

    @classmethod
    def from_config(cls, raw: dict, source: str, edit_ids: tuple[int, int] | None = None) -> ModelShape:
        """`edit_ids`: LLaDA2.2's (DELETE, INSERT) given by the user (`--edit-ids`), over the config's."""
        missing = [key for key in REQUIRED_KEYS if key not in raw]
        if missing:
            raise CheckpointError(f"{source}: {missing[0]} missing ({len(missing)} size keys missing)")
        sizes = {key: raw[key] for key in REQUIRED_KEYS}
        sizes["num_shared_experts"] = raw.get("num_shared_experts", 0)
        sizes["head_dim"] = raw.get("head_dim") or raw["hidden_size"] // max(raw["num_attention_heads"], 1)
        sizes["max_position_embeddings"] = raw.get("max_position_embeddings", 32768)
        try:
            check_sizes(sizes, tuple(sizes))
        except ValueError as err:
            raise CheckpointError(f"{source}: {err}") from None
        try:
            family = family_of(raw, edit_ids)
        except ValueError as err:
            raise CheckpointError(f"{source}: {err}") from None
        return cls(**sizes, tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)), family=family)


@dataclass
class Slot:
    """What goes on one device as a unit: the embedding, one decoder layer, or the final norm + head."""

    label: str  # "embed", "3", "head"
    layer: int | None
    parts: dict[str, int] = field(default_factory=dict)  # part -> bytes

    def add(self, part: str, nbytes: int) -> None:
        self.parts[part] = self.parts.get(part, 0) + nbytes


@dataclass(frozen=True)
class DevicePlan:
    device: str
    slots: tuple[Slot, ...]
    kv_bytes: int
    memory: int | None  # bytes the device offers; None: unknown

    @property
    def layers(self) -> list[int]:
        return [s.layer for s in self.slots if s.layer is not None]

    def part(self, name: str) -> int:
        return sum(s.parts.get(name, 0) for s in self.slots)

    @property
    def weights(self) -> int:
        return sum(self.part(p) for p in PARTS)

    @property
    def total(self) -> int:
        return self.weights + self.kv_bytes

    @property
    def fits(self) -> bool | None:
        return None if self.memory is None else self.total <= self.memory


@dataclass(frozen=True)
class MemoryPlan:
    model: str
    source: str  # "config.json" or "safetensors headers"
    dtype: str
    quantize: str | None
    context: int
    batch: int
    kv_bytes_per_token: int
    devices: tuple[DevicePlan, ...]
    family: Family = Family("LLaDA2.1", "JointThreshold")

    @property
    def weights(self) -> int:
        return sum(d.weights for d in self.devices)

    @property
    def kv_bytes(self) -> int:
        return sum(d.kv_bytes for d in self.devices)

    @property
    def fits(self) -> bool:
        return all(d.fits is not False for d in self.devices)

    def reason(self) -> str | None:
        """One line naming the first device that does not hold its share; None when all do."""
        for d in self.devices:
            if d.fits is False:
                return (f"{d.device} needs {fmt_bytes(d.total)} ({fmt_bytes(d.weights)} weights + "
                        f"{fmt_bytes(d.kv_bytes)} KV cache) but has {fmt_bytes(d.memory)}")  # fmt: skip
        return None


# --- weights ---------------------------------------------------------------------------------------


def fp8_scale_bytes(rows: int, cols: int) -> int:
    return math.ceil(rows / FP8_BLOCK) * math.ceil(cols / FP8_BLOCK) * 4


def empty_slots(shape: ModelShape) -> list[Slot]:
    return [Slot("embed", None), *(Slot(str(i), i) for i in range(shape.num_hidden_layers)), Slot("head", None)]


def weights_from_config(shape: ModelShape, dtype: str = "bfloat16", quantize: str | None = None) -> list[Slot]:
    """Bytes per slot and part, from the sizes alone (the tensors llada2.LLaDA2 builds)."""
    b, f32 = dtype_bytes(dtype), max(dtype_bytes(dtype), 4)  # norms' weights are floats like the rest
    C, H, K, D = shape.hidden_size, shape.num_attention_heads, shape.num_key_value_heads, shape.head_dim
    E, I = shape.num_experts, shape.moe_intermediate_size
    slots = empty_slots(shape)
    slots[0].add("embeddings", shape.vocab_size * C * b)
    for slot in slots[1:-1]:
        slot.add("attention", ((H + 2 * K) * D * C + C * H * D) * b)
        slot.add("norms", (2 * C + 2 * D) * b)
        if slot.layer < shape.first_k_dense_replace:
            slot.add("dense MLP", 3 * C * shape.intermediate_size * b)
            continue
        slot.add("router", E * C * b + E * f32)  # expert_bias stays >= fp32: bf16 would reorder near-ties
        if quantize == "fp8":  # per expert: gate/up [I, C] and down [C, I]
            slot.add("routed experts", E * (3 * I * C + 2 * fp8_scale_bytes(I, C) + fp8_scale_bytes(C, I)))
        else:
            slot.add("routed experts", E * 3 * I * C * b)
        if shape.num_shared_experts:
            slot.add("shared experts", 3 * C * I * shape.num_shared_experts * b)
    slots[-1].add("norms", C * b)
    if not shape.tie_word_embeddings:
        slots[-1].add("lm_head", shape.vocab_size * C * b)
    return slots


def weights_from_headers(stored: dict[str, tuple[tuple[int, ...], str]], shape: ModelShape,
                         dtype: str = "bfloat16", quantize: str | None = None) -> list[Slot]:  # fmt: skip
    """Bytes per slot and part, from the tensors the checkpoint holds (files.stored_shapes), as they
    will sit in memory: floats cast to `dtype`, FP8 tensors and their scales as stored."""
    b = dtype_bytes(dtype)
    slots = empty_slots(shape)
    by_label = {s.label: s for s in slots}
    already_fp8 = {name.removesuffix("_scale_inv") for name in stored if name.endswith(".weight_scale_inv")}
    for name, (dims, stored_dtype) in stored.items():
        part = next((p for pattern, p in PART_OF_NAME if pattern.match(name)), None)
        if part is None or stored_dtype not in STORED_BYTES:
            continue
        n = math.prod(dims)
        if part == "embeddings":
            slot = by_label["embed"]
        elif (m := LAYER_OF_NAME.match(name)) is not None:
            slot = by_label.get(m[1])
            if slot is None:
                raise CheckpointError(f"tensor {name}: layer {m[1]} beyond num_hidden_layers {shape.num_hidden_layers}")
        else:
            slot = by_label["head"]
        if stored_dtype.startswith("F8") or name.endswith("_scale_inv"):
            slot.add(part, n * STORED_BYTES[stored_dtype])  # loaded as stored
        elif name.endswith("expert_bias"):
            slot.add(part, n * max(b, 4))
        elif quantize == "fp8" and part == "routed experts" and name not in already_fp8 and len(dims) == 2:
            slot.add(part, n + fp8_scale_bytes(*dims))
        else:
            slot.add(part, n * b)
    return slots


# --- KV cache and placement ------------------------------------------------------------------------


def kv_bytes_per_token_layer(shape: ModelShape, dtype: str = "bfloat16") -> int:
    return 2 * shape.num_key_value_heads * shape.head_dim * dtype_bytes(dtype)  # K and V


def kv_bytes_per_token(shape: ModelShape, dtype: str = "bfloat16") -> int:
    return shape.num_hidden_layers * kv_bytes_per_token_layer(shape, dtype)


def place(costs: list[int], n_devices: int) -> list[range]:
    """Contiguous ranges of `costs` indices, one per device in order, minimising the largest sum (a
    device may get none when there are more devices than slots)."""
    n = len(costs)
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    # best[d][i]: the least possible largest sum putting the first i slots on d devices
    best = [[math.inf] * (n + 1) for _ in range(n_devices + 1)]
    cut = [[0] * (n + 1) for _ in range(n_devices + 1)]
    best[0][0] = 0
    for d in range(1, n_devices + 1):
        for i in range(n + 1):
            for j in range(i + 1):
                worst = max(best[d - 1][j], prefix[i] - prefix[j])
                if worst < best[d][i]:
                    best[d][i], cut[d][i] = worst, j
    ranges, i = [], n
    for d in range(n_devices, 0, -1):
        ranges.append(range(cut[d][i], i))
        i = cut[d][i]
    return ranges[::-1]


# --- memory ----------------------------------------------------------------------------------------


def parse_bytes(text: str) -> int:
    """ "141GB" (decimal, 1e9), "80GiB" (2**30), "512MB", a plain number of bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m[2].lower() not in UNITS:
        raise ValueError(f"{text!r} is not a size like 141GB, 80GiB or 512MB")
    return int(float(m[1]) * UNITS[m[2].lower()])


def free_memory(device: str) -> int | None:
    """Bytes a device offers now: a CUDA device's free memory, the machine's available RAM for `cpu`;
    None when the device is not on this machine. The one memory check: `llada-lsp plan` and every load
    (loader.check_plan) ask it."""
    if device == "cpu":
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return None
    m = re.fullmatch(r"cuda(?::(\d+))?", device)
    if m is None:
        raise ValueError(f"unknown device {device!r}; use cpu, cuda or cuda:N")
    import torch  # only here: the arithmetic needs no torch

    index = int(m[1] or 0)
    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        return None
    # Blocks torch's caching allocator keeps but nothing uses (a model just dropped for another) are
    # free to this process, though not to the driver.
    unused_cache = torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index)
    return torch.cuda.mem_get_info(index)[0] + unused_cache


# --- the plan --------------------------------------------------------------------------------------


def read_model(
    model: str | Path | None, edit_ids: tuple[int, int] | None = None
) -> tuple[str, ModelShape, dict | None]:
    """(name, shape, stored tensors or None) of a model folder, a Hugging Face id in the local cache, a
    bare config.json, or None for the embedded model."""
    path = Path(model).expanduser() if model is not None else None
    if path is not None and path.is_file():
        config_file, folder = path, None
    else:
        folder = resolve_path(model)  # a folder, or the Hugging Face cache lookup
        config_file = folder / "config.json"
    try:
        raw = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{config_file}: not a readable config.json ({err})") from None
    if not isinstance(raw, dict) or raw.get("model_type") != "llada2_moe":
        raise CheckpointError(f"{config_file}: model_type is not 'llada2_moe'")
    shape = ModelShape.from_config(raw, str(config_file), edit_ids)
    name = str(model) if model is not None else "embedded model"
    if folder is None or not any((folder / f).is_file() for f in ("model.safetensors", "model.safetensors.index.json")):
        return name, shape, None
    return name, shape, stored_shapes(weight_files(folder))


def make_plan(model: str | Path | None = None, devices: list[str] | None = None, memory: list[int | None] | None = None,
              dtype: str = "bfloat16", quantize: str | None = None, context: int | None = None,
              batch: int = 1, edit_ids: tuple[int, int] | None = None) -> MemoryPlan:  # fmt: skip
    """The plan of `model` on `devices` (default one `cpu`); `memory` per device in bytes, or None to
    ask the device (free_memory). `context` defaults to the model's max_position_embeddings.
    `edit_ids`: LLaDA2.2's (DELETE, INSERT) over the config's, as the loader takes them."""
    if quantize not in (None, "fp8"):
        raise ValueError(f"quantize {quantize!r}: only fp8 is supported")
    dtype_bytes(dtype)
    devices = devices or ["cpu"]
    if memory is not None and len(memory) not in (1, len(devices)):
        raise ValueError(f"{len(memory)} memory sizes for {len(devices)} devices")
    memory = [memory[0]] * len(devices) if memory is not None and len(memory) == 1 else memory
    name, shape, stored = read_model(model, edit_ids)
    return plan_of(name, shape, stored, devices, memory, dtype, quantize, context, batch)


def plan_of(name: str, shape: ModelShape, stored: dict | None, devices: list[str], memory: list[int | None] | None,
            dtype: str, quantize: str | None, context: int | None, batch: int) -> MemoryPlan:  # fmt: skip
    """make_plan for a model already read (the loader has its config and headers in hand)."""
    if stored is None:
        source, slots = "config.json", weights_from_config(shape, dtype, quantize)
    else:
        source, slots = "safetensors headers", weights_from_headers(stored, shape, dtype, quantize)
    context = shape.max_position_embeddings if context is None else context
    kv_layer = kv_bytes_per_token_layer(shape, dtype) * context * batch  # each layer's cache on its layer's device
    costs = [sum(s.parts.values()) + (kv_layer if s.layer is not None else 0) for s in slots]
    plans = []
    for i, (device, where) in enumerate(zip(devices, place(costs, len(devices)))):
        mine = tuple(slots[j] for j in where)
        have = memory[i] if memory is not None and memory[i] is not None else free_memory(device)
        plans.append(DevicePlan(device, mine, kv_layer * sum(s.layer is not None for s in mine), have))
    return MemoryPlan(name, source, dtype, quantize, context, batch, kv_bytes_per_token(shape, dtype), tuple(plans),
                shape.family)  # fmt: skip


def slot_of(name: str) -> str:
    """The slot label ("embed", a layer's index, "head") a checkpoint or network tensor name belongs to."""
    if name.startswith("model.word_embeddings."):
        return "embed"
    m = LAYER_OF_NAME.match(name)
    return m[1] if m is not None else "head"


def device_of_slots(plan: MemoryPlan) -> dict[str, int]:
    """Slot label -> the index of its device in the plan (the same device may be listed twice)."""
    return {s.label: i for i, d in enumerate(plan.devices) for s in d.slots}


def dtype_bytes(dtype: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(sorted(DTYPE_BYTES))}")
    return DTYPE_BYTES[dtype]


# --- rendering -------------------------------------------------------------------------------------


def fmt_bytes(n: int | None) -> str:
    """Decimal units (1 GB = 1e9 bytes), as the model cards and GPU vendors quote them."""
    if n is None:
        return "?"
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def fmt_layers(layers: list[int]) -> str:
    return "-" if not layers else str(layers[0]) if len(layers) == 1 else f"{layers[0]}-{layers[-1]}"


def render(plan: MemoryPlan) -> str:
    """The plan as a plain-text table: a row per part, a column per device (and a total column when
    there are several)."""
    experts = "fp8 routed experts (128x128 block scales), rest " if plan.quantize == "fp8" else ""
    kv = f"{plan.kv_bytes_per_token / 1024:.1f} KiB/token x context {plan.context} x batch {plan.batch}"
    title = f"plan of {plan.model} (from {plan.source}): {experts}{plan.dtype} weights; KV cache {kv}"
    devices, several = plan.devices, len(plan.devices) > 1
    fits = {True: "yes", False: "NO", None: "?"}

    def byte_row(label: str, of) -> list[str]:  # summed in the total column
        cells = [fmt_bytes(of(d)) if of(d) else "-" for d in devices]
        return [label, *cells, *([fmt_bytes(sum(of(d) for d in devices))] if several else [])]

    def text_row(label: str, of) -> list[str]:
        return [label, *(of(d) for d in devices), *([""] if several else [])]

    rows = [["", *(d.device for d in devices), *(["total"] if several else [])],
            text_row("layers", lambda d: fmt_layers(d.layers)),
            *(byte_row(p, lambda d, p=p: d.part(p)) for p in PARTS),
            byte_row("weights", lambda d: d.weights),
            byte_row("KV cache", lambda d: d.kv_bytes),
            byte_row("total", lambda d: d.total),
            text_row("memory", lambda d: fmt_bytes(d.memory)),
            text_row("fits", lambda d: fits[d.fits])]  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    lines = [line(r) for r in rows]
    return "\n".join([title, f"family: {plan.family.describe()}", *lines])
