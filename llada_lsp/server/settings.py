"""Server settings: one typed, fully defaulted dataclass, parsed from the client's camelCase objects.

Knows nothing of pygls, the model or documents: a dict goes in, settings and error strings come out.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..address import parse_address
from ..completion.jobs import CONTEXT_TOKENS, MAX_CONTEXT_SHARE, MAX_TOKENS

MODES = ("speed", "quality")
_DEFAULT = object()  # a value that asks for the default (`"model": null`: the server's default model)


@dataclass(frozen=True)
class Settings:
    """The keys of `initializationOptions` / `workspace/didChangeConfiguration` (docs/protocol.md)."""

    model: str | None = field(default=None, metadata={"kind": "model"})  # None: the embedded model
    inline_mode: str = field(default="speed", metadata={"choices": MODES})
    rewrite_mode: str = field(default="quality", metadata={"choices": MODES})
    max_completion_tokens: int = field(default=MAX_TOKENS, metadata={"range": (1, 512)})
    context_tokens: int = field(default=CONTEXT_TOKENS, metadata={"range": (64, 8192)})
    # How long a rewrite waits for the client's answer to workspace/applyEdit (a review included).
    apply_edit_timeout: int = field(default=120, metadata={"range": (1, 3600)})
    next_edit: bool = field(default=True, metadata={"kind": "bool"})
    next_edit_delay_ms: int = field(default=400, metadata={"range": (0, 60_000)})  # the client's idle time
    next_edit_history: bool = field(default=True, metadata={"kind": "bool"})  # False: prompts without recent edits
    # Typing through a suggestion revises it from where it stands (a warm start) instead of from masks.
    revise: bool = field(default=True, metadata={"kind": "bool"})
    # Snippets of other files (open documents, imported workspace modules, recent edits, llada/context
    # chunks) start the prompt; they take at most `context_files_share` percent of it.
    context_files: bool = field(default=True, metadata={"kind": "bool"})
    context_files_share: int = field(default=25, metadata={"range": (0, MAX_CONTEXT_SHARE)})
    # Open documents outside the workspace folders (and those with no local path) may be snippets too.
    context_outside_workspace: bool = field(default=False, metadata={"kind": "bool"})
    # Snippets go to an engine service over TCP or with the SGLang backend (they may leave the machine).
    context_remote: bool = field(default=False, metadata={"kind": "bool"})
    # Where the model runs (read at `initialize`; None: the command line's --engine).
    engine: str | None = field(default=None, metadata={"kind": "engine"})


def camel(name: str) -> str:
    """The one place snake_case field names become the protocol's camelCase keys."""
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def settings_section(settings: Any) -> Any:
    """`didChangeConfiguration` may carry the object as `settings` or as `settings.llada`."""
    if isinstance(settings, dict) and isinstance(settings.get("llada"), dict):
        return settings["llada"]
    return settings


def parse_settings(raw: Any, current: Settings, defaults: Settings) -> tuple[Settings, list[str]]:
    """Keys present in `raw` replace those of `current`; unknown keys are ignored; a bad value is
    reported and replaced by its value in `defaults` (the built-in default or the command line's)."""
    if raw is None:
        return current, []
    if not isinstance(raw, dict):
        return current, [f"settings must be an object, got {type(raw).__name__}; ignored"]
    changes: dict[str, Any] = {}
    errors: list[str] = []
    for f in dataclasses.fields(Settings):
        key = camel(f.name)
        if key not in raw:
            continue
        value, problem = _check(raw[key], f.metadata)
        if problem:
            errors.append(f"setting {key}: {problem}; using {getattr(defaults, f.name)!r}")
        changes[f.name] = getattr(defaults, f.name) if problem or value is _DEFAULT else value
    return dataclasses.replace(current, **changes), errors


def _check(value: Any, rule: dict) -> tuple[Any, str | None]:
    """(value, None) when acceptable, else (None, why)."""
    if rule.get("kind") == "model":
        if value is None or value == "":
            return _DEFAULT, None
        if isinstance(value, str):
            return value, None
        return None, f"expected a path or Hugging Face id, got {value!r}"
    if rule.get("kind") == "engine":
        if value is None or value == "":
            return _DEFAULT, None
        if value in ("auto", "local"):
            return value, None
        try:
            parse_address(value if isinstance(value, str) else None)
        except ValueError as err:
            return None, str(err)
        if isinstance(value, str):
            return value, None
        return None, f"expected auto, local, unix:PATH or tcp://HOST:PORT, got {value!r}"
    if rule.get("kind") == "bool":
        return (value, None) if isinstance(value, bool) else (None, f"expected true or false, got {value!r}")
    if "choices" in rule:
        if value in rule["choices"]:
            return value, None
        return None, f"expected one of {', '.join(map(repr, rule['choices']))}, got {value!r}"
    lo, hi = rule["range"]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi:
        return value, None
    return None, f"expected an integer in {lo}..{hi}, got {value!r}"
