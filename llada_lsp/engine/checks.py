"""The checks of a generation's values, shared by `Engine` (the Python API) and `llada-lsp generate`
(which prints the same words on one line and exits 2): every bad value is a ValueError that says which
value and why, never an error deeper down (a ZeroDivisionError, an IndexError, a pool too small).

Plain values only: nothing of tensors or checkpoints beyond the numbers passed in.
"""

from __future__ import annotations

import math
from typing import Any


def whole(name: str, value: Any, least: int, most: int | None = None) -> int:
    """`value` as an integer in least..most (most None: no bound), else ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"the {name} must be an integer, got {value!r}")
    if value < least or (most is not None and value > most):
        bound = f"at least {least}" if most is None else f"in {least}..{most}"
        raise ValueError(f"the {name} must be {bound}, got {value}")
    return value


def block_size(value: Any, max_positions: int) -> int:
    """A diffusion block's length: 1 up to the model's positions."""
    return whole("block length", value, 1, max_positions)


def token_id(name: str, value: Any, vocab: int, edit_ids: tuple[int, ...] | None = None) -> int:
    """An id the generation writes or stops at (the mask, the end of text): inside the vocabulary and
    not one of LLaDA2.2's edit ids (DELETE, INSERT)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"the {name} must be an integer, got {value!r}")
    if not 0 <= value < vocab:
        raise ValueError(f"the {name} {value} is outside the vocabulary (ids 0..{vocab - 1})")
    if edit_ids and value in edit_ids:
        raise ValueError(f"the {name} {value} is an edit id (DELETE or INSERT) of this checkpoint")
    return value


def thresholds(threshold: Any, editing_threshold: Any) -> None:
    """A fill threshold in 0..1 and an editing threshold in 0..1 or +inf (never edit)."""
    for name, value, never in (("threshold", threshold, False), ("editing threshold", editing_threshold, True)):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
        ok = ok and (0.0 <= value <= 1.0 or (never and value == math.inf))
        if not ok:
            extra = " (or inf: never edit)" if never else ""
            raise ValueError(f"the {name} must be a number in 0..1{extra}, got {value!r}")


def amount(name: str, value: Any) -> float:
    """A finite number, 0 or more (a size: 0 asks for the least there can be)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    if not ok:
        raise ValueError(f"the {name} must be a finite number, 0 or more, got {value!r}")
    return value
