"""The engine protocol: what an LSP front and the engine service say to each other, and how it is
framed. Both sides import this module; it imports only the standard library and msgpack.

A frame is a 4-byte big-endian length and that many bytes of one msgpack map with a string `type`.
Frames over `MAX_FRAME` bytes are refused before they are read. Every field is checked against its
annotation: a frame with a missing, unknown or mistyped field is a WireError (a broken peer), which
the service answers by closing that connection. The first frame a client sends is `hello`; the
service answers `welcome`, or `failed` and closes. Versioned by `VERSION`: a service refuses a hello
of another version; `hello` alone tolerates unknown fields, so that a newer client is told its
version is wrong instead of its frame.

Client to service: hello, infill, rewrite, next_edit, cancel, status. Service to client: welcome, draft, done,
failed, status. Fields are documented with each message class below.
"""

from __future__ import annotations

import asyncio
import functools
import struct
import types
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Union, get_args, get_origin, get_type_hints

import msgpack

# 2: done's `steps` became `step` (done is the last draft); 3: status's family, decoding, family_line;
# 4: infill's `context`, `context_share` and `warm`, rewrite's and next_edit's `context` and `context_share`
# (snippets of other files: a version-3 service would refuse the fields)
VERSION = 4
MAX_FRAME = 16 * 2**20  # a 2 MB document's window is far smaller; anything this big is a broken peer
MAX_ITEMS = 256  # entries in any map or list of a frame
_HEADER = struct.Struct(">I")


class WireError(ValueError):
    """A frame that cannot be taken: too large, not msgpack, not a known message, a missing field."""


@functools.cache
def _field_names(cls: type) -> tuple[tuple[str, bool], ...]:
    """(name, whether None is its default) of each field of a message class (fields() is slow per frame)."""
    return tuple((f.name, f.default is None) for f in fields(cls))


@dataclass(frozen=True)
class Message:
    type: ClassVar[str]
    open: ClassVar[bool] = False  # unknown fields are dropped instead of refused (hello only)

    def to_dict(self) -> dict[str, Any]:
        """The frame's map; an optional field at its None default is left out (a required None, as
        a connection-level Failed's id, is kept)."""
        out: dict[str, Any] = {"type": self.type}
        for name, optional in _field_names(type(self)):
            value = getattr(self, name)
            if not (optional and value is None):
                out[name] = value
        return out


@dataclass(frozen=True)
class Hello(Message):
    type: ClassVar[str] = "hello"
    open: ClassVar[bool] = True
    version: int
    client: str  # who is speaking, for the service's log and status
    token: str | None = None  # required by a service that listens on TCP
    totals: bool = False  # asks for the service's totals in status (granted to its own user on a Unix socket)


@dataclass(frozen=True)
class Welcome(Message):
    type: ClassVar[str] = "welcome"
    version: int
    model: str
    state: str  # "loading" | "ready" | "error"
    modes: list[str] = field(default_factory=list)  # the engine's decoding presets
    # max_frame always; max_positions and block_size once a model is ready
    limits: dict[str, int] = field(default_factory=dict)
    # False: the backend cannot start a generation from a draft (SGLang), so an infill's `draft` is
    # ignored (a cold start). Absent: it can.
    revise: bool | None = None


@dataclass(frozen=True)
class Infill(Message):
    """An inline completion at the cursor of `before + after` (the window the front cut around it)."""

    type: ClassVar[str] = "infill"
    id: int
    key: str  # a newer request with the same key (per connection) supersedes this one
    before: str
    after: str
    mode: str
    max_tokens: int
    context_tokens: int
    drafts: bool = False  # send a `draft` frame per denoising step
    # A revision (warm start): the rest of the suggestion the front last showed here, the canvas the
    # generation starts from, and how many characters at the end of `before` were typed through since
    # it began. Absent: a cold start from masks.
    draft: str | None = None
    typed: int | None = None
    # Snippets of the client's other files, most alike first: [{"path", "text"}] (at most 16, each at
    # most 8000 characters: completion/snippets.py), and the percent of the prompt they may take.
    context: list[dict[str, str]] | None = None
    context_share: int | None = None
    # Only prefill the prompt (the prefix cache keeps it) in idle time: a new set of snippets is made
    # ready before the next keystroke needs it. Answered `done` with what the one step made, unshown.
    warm: bool | None = None


@dataclass(frozen=True)
class RewriteAsk:
    """What a rewrite asks: revise `selection`, which sits between `before` and `after` (the window
    around it). The frame below carries it; the engine's job (completion/jobs.Rewrite) is it."""

    before: str
    selection: str
    after: str
    mode: str
    context_tokens: int
    instruction: str | None = None
    python: bool = False  # parse-checked with ast; other languages are held to their brackets and quotes
    # As infill's: snippets of other files, and their share (by name only: `drafts` follows positionally)
    context: list[dict[str, str]] | None = field(default=None, kw_only=True)
    context_share: int | None = field(default=None, kw_only=True)


@dataclass(frozen=True)
class Rewrite(Message, RewriteAsk):
    """The request's fields (`RewriteAsk`) come first; `id` and `key` are passed by name."""

    type: ClassVar[str] = "rewrite"
    drafts: bool = False  # send a `draft` frame per denoising step, with empty text (progress only)
    id: int = field(kw_only=True)
    key: str = field(kw_only=True)


@dataclass(frozen=True)
class NextEdit(Message):
    """A next-edit suggestion: revise `window` (between `before` and `after`) given the recent edits
    (`history`: diff texts, oldest first); `last_*`: the user's last edit in before + window + after
    (`last_new` at `last_start`, where `last_old` was), never to be undone. `done.text` is the revised
    window (stopped `done`), or the window itself (`unchanged`) or the dropped proposal (`refused`)."""

    type: ClassVar[str] = "next_edit"
    id: int
    key: str
    before: str
    window: str
    after: str
    history: list[str]
    mode: str
    context_tokens: int
    python: bool = False
    last_start: int | None = None
    last_old: str | None = None
    last_new: str | None = None
    drafts: bool = False  # send a `draft` frame per denoising step, with empty text (progress only)
    cursor: int | None = None  # the cursor's offset in `window`: where the draft leaves room to insert
    context: list[dict[str, str]] | None = None  # as infill's: snippets of other files, and their share
    context_share: int | None = None


@dataclass(frozen=True)
class Cancel(Message):
    """Cancels a request of this connection; the engine stops it within one denoising step. An id
    that is not in flight (already answered, unknown) is ignored."""

    type: ClassVar[str] = "cancel"
    id: int


@dataclass(frozen=True)
class Answer(Message):
    """What the service says of a request's text: `step` denoising steps so far, the text they made."""

    id: int
    step: int
    text: str


@dataclass(frozen=True)
class Draft(Answer):
    """The text generated so far (infill: post-processed, sent when it changed; rewrite: empty)."""

    type: ClassVar[str] = "draft"


@dataclass(frozen=True)
class Done(Answer):
    """A request's answer: the final text, the steps (`step`) and seconds it took, how it stopped."""

    type: ClassVar[str] = "done"
    seconds: float
    stopped: str  # as jobs.Outcome.stopped, but never "cancelled": a cancelled request answers `failed`
    reason: str = ""
    tokens: int = 0  # positions the model generated (filled) for this answer


@dataclass(frozen=True)
class Failed(Message):
    type: ClassVar[str] = "failed"
    id: int | None  # None: about the connection (a bad hello), not one request
    # "cancelled" (a cancel, a newer request with the same key) | "no_model" | "too_long" | "unsupported"
    # | "busy" | "bad_request" | "version" | "auth" | "internal"
    kind: str
    message: str


@dataclass(frozen=True)
class Status(Message):
    """Pushed by the service on load progress and every change of state; asked for by a client with
    no fields, and answered with all it knows."""

    type: ClassVar[str] = "status"
    state: str | None = None  # "loading" | "ready" | "error"
    model: str | None = None
    progress: int | None = None  # percent, while loading
    message: str | None = None  # what the load is doing ("reading the tokenizer")
    error: str | None = None
    clients: int | None = None  # connections that said hello
    queue: int | None = None  # requests in flight, all connections together
    # The scheduler (engine/scheduler.py), counted since the model loaded:
    running: int | None = None  # sequences decoding now (rows of the batch)
    queued: int | None = None  # sequences waiting for a row or for cache blocks
    steps: int | None = None  # batched denoising forwards
    batch_mean: float | None = None  # mean rows per forward
    batch_max: int | None = None
    cache_blocks_used: int | None = None  # 32-token K/V blocks held (running sequences + prefix cache)
    cache_blocks_free: int | None = None
    cache_hit_rate: float | None = None  # whole prompt blocks found in the prefix cache / looked up
    # once loaded: the model's family ("LLaDA2.1" | "LLaDA2.2"), its decoding rule ("JointThreshold" |
    # "JointThresholdInDel") and the line `llada-lsp plan` prints for it (model/family.Family.describe)
    family: str | None = None
    decoding: str | None = None
    family_line: str | None = None
    kernels: str | None = None  # the kernel backend this service runs the model with (kernel_backend.Backend.line)


MESSAGES: dict[str, type[Message]] = {m.type: m for m in (Hello, Welcome, Infill, Rewrite, NextEdit, Cancel, Draft, Done,
                                                          Failed, Status)}  # fmt: skip
_HINTS = {cls: {f.name: get_type_hints(cls)[f.name] for f in fields(cls)} for cls in MESSAGES.values()}


def encode(message: Message) -> bytes:
    body = msgpack.packb(message.to_dict(), use_bin_type=True)
    if len(body) > MAX_FRAME:
        raise WireError(f"a {message.type} frame of {len(body)} bytes is over the {MAX_FRAME}-byte limit")
    return _HEADER.pack(len(body)) + body


def decode(body: bytes) -> Message:
    """One frame's body -> its message; WireError for anything else."""
    try:
        # No message has more than a few dozen fields or list items: a map of millions is refused by its
        # header, before it costs the loop a second to build and its refusal a megabyte to name.
        data = msgpack.unpackb(body, raw=False, strict_map_key=True, max_map_len=MAX_ITEMS, max_array_len=MAX_ITEMS)
    except Exception as err:  # msgpack raises several unrelated types for bad input
        raise WireError(f"not a msgpack frame: {err}") from None
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise WireError("a frame must be a map with a string 'type'")
    kind = data.pop("type")
    cls = MESSAGES.get(kind)
    if cls is None:
        raise WireError(f"unknown message type {kind[:40]!r}")
    hints = _HINTS[cls]
    if not cls.open and any(name not in hints for name in data):
        unknown = [name for name in data if name not in hints]
        named = ", ".join(repr(name[:40]) for name in unknown[:3])  # str or bytes: strict_map_key
        more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
        raise WireError(f"{cls.type}: unknown fields {named}{more}")
    data = {name: value for name, value in data.items() if name in hints}
    for name, value in data.items():
        if not _conforms(value, hints[name]):
            raise WireError(f"{cls.type}: {name} must be {hints[name]}, not {type(value).__name__}")
    try:
        return cls(**data)
    except TypeError as err:  # a required field is missing
        raise WireError(f"{cls.type}: {err}") from None


def _conforms(value: Any, hint: Any) -> bool:
    """Whether a decoded msgpack value fits a field's annotation (the few shapes messages use)."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        return any(_conforms(value, arg) for arg in args)
    if origin is list:
        return isinstance(value, list) and all(_conforms(v, args[0]) for v in value)
    if origin is dict:
        items = value.items() if isinstance(value, dict) else None
        return items is not None and all(_conforms(k, args[0]) and _conforms(v, args[1]) for k, v in items)
    if hint is type(None):
        return value is None
    if isinstance(value, bool):  # a bool is an int to Python, never to the protocol
        return hint is bool
    if hint is float:
        return isinstance(value, (int, float))
    return isinstance(value, hint)


async def read(reader: asyncio.StreamReader, max_frame: int = MAX_FRAME) -> Message | None:
    """The next message, or None at a clean end of stream; WireError for a bad or oversized frame
    (its body is never read), asyncio.IncompleteReadError for a stream cut inside a frame."""
    try:
        header = await reader.readexactly(_HEADER.size)
    except asyncio.IncompleteReadError as err:
        if not err.partial:
            return None
        raise
    (size,) = _HEADER.unpack(header)
    if size > max_frame:
        raise WireError(f"a frame of {size} bytes is over the {max_frame}-byte limit")
    return decode(await reader.readexactly(size))


def write(writer: asyncio.StreamWriter, message: Message) -> None:
    writer.write(encode(message))
