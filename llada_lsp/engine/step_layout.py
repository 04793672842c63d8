"""The layouts a denoising step's tensors travel in, named once: what the scheduler writes before the
forward (`Ints`, StepInputs' `ints` buffer; the `limits` buffer), and what the device step returns for
the one host read (`Decisions` for JointThreshold, `Candidates` for JointThresholdInDel). The scheduler,
the torch step and the CPU step kernels (cpu_step.py) build and read them here, never by raw offsets.

`ints` [B, T + HEAD + 2 + pages] int64, one row per sequence:
    [0, T)           the query ids, right-aligned (left padding 0)
    T + FROZEN       the active block's prompt positions (never changed)
    T + MASK         the mask id
    T + ALLOWED_AT   the decided position whose ids are constrained (first_allowed; -1: none)
    T + OUTSIDE      how many of the D decided positions lie before the row's active block (a draft's)
    T + HEAD ...     cache.row_descriptor's [start, end, page of each block...]
`limits` [B, 2] float32: THRESHOLD, EDITING.

Knows nothing of sequences or the model.
"""

from __future__ import annotations

import torch

FROZEN, MASK, ALLOWED_AT, OUTSIDE = 0, 1, 2, 3  # `ints`' head columns, after the T query ids
HEAD = 4
THRESHOLD, EDITING = 0, 1  # `limits`' columns
TOKENS, FILLED, EDITED, CONFIDENCE, FINITE = 0, 1, 2, 3, 4  # Decisions' parts, D columns each (FINITE: one)
CONFIDENCE_SCALE = 1_000_000  # a step's confidences travel to the host as integers in millionths


def limits_row(threshold: float, editing: float) -> list[float]:
    """One row of `limits`."""
    row = [0.0, 0.0]
    row[THRESHOLD], row[EDITING] = threshold, editing
    return row


class Ints:
    """StepInputs' `ints` for queries `width` wide: the columns' slices and one row's list."""

    def __init__(self, width: int):
        self.width = width

    @staticmethod
    def columns(width: int, n_pages: int) -> int:
        return width + HEAD + 2 + n_pages

    @staticmethod
    def row(ids: list[int], width: int, frozen: int, mask_id: int, allowed_at: int, outside: int,
            descriptor: list[int]) -> list[int]:  # fmt: skip
        """One row: `ids` right-aligned in `width`, the head, then the row descriptor."""
        head = [0] * HEAD
        head[FROZEN], head[MASK], head[ALLOWED_AT], head[OUTSIDE] = frozen, mask_id, allowed_at, outside
        return [0] * (width - len(ids)) + list(ids) + head + list(descriptor)

    def ids(self, ints):
        return ints[:, : self.width]

    def decided_ids(self, ints, D: int):
        """The last D query ids: the positions the step decides."""
        return ints[:, self.width - D : self.width]

    def head(self, ints):
        """[B, HEAD]: FROZEN, MASK, ALLOWED_AT, OUTSIDE (the CPU kernel reads them by these names)."""
        return ints[:, self.width : self.width + HEAD]

    def column(self, ints, name: int):
        return ints[:, self.width + name]

    def descriptors(self, ints):
        """cache.row_descriptor of each row: [start, end, pages...]."""
        return ints[:, self.width + HEAD :]


class Decisions:
    """JointThreshold's decisions [B, 4D + 1] int64 for the last D queries of each row: TOKENS, FILLED,
    EDITED, CONFIDENCE (times CONFIDENCE_SCALE) D each, then one FINITE flag (every logit of the row's own
    positions finite)."""

    def __init__(self, D: int):
        self.D = D

    @staticmethod
    def width(D: int) -> int:
        return FINITE * D + 1

    @staticmethod
    def pack(tokens, filled, edited, confidence, finite) -> torch.Tensor:
        """[B, D] each ([B, 1] finite; confidence already scaled) -> [B, 4D + 1]."""
        return torch.cat([tokens, filled.long(), edited.long(), confidence, finite], dim=1)

    def unpack(self, row: list[int], skip: int) -> tuple[list[int], list[int], list[int], list[float]] | None:
        """One host row -> (tokens, filled, edited, confidence) of the row's own positions (the first
        `skip` are another block's), or None where its logits were not all finite."""
        D = self.D
        if not row[FINITE * D]:
            return None
        part = [row[k * D + skip : (k + 1) * D] for k in (TOKENS, FILLED, EDITED, CONFIDENCE)]
        return part[0], part[1], part[2], [c / CONFIDENCE_SCALE for c in part[3]]


class Candidates:
    """JointThresholdInDel's rows [B, 2KD + 1] int64: each of the D positions' K ranked ids, then their
    probabilities as float64 bits (exact through the one host read), then one FINITE flag."""

    def __init__(self, D: int, K: int):
        self.D, self.K = D, K

    @staticmethod
    def pack(ids: torch.Tensor, probs: torch.Tensor, finite: torch.Tensor) -> torch.Tensor:
        """ids, probs [B, D, K]; finite [B, 1] -> [B, 2KD + 1]."""
        bits = probs.double().contiguous().view(torch.int64)
        return torch.cat([ids.flatten(1), bits.flatten(1), finite], dim=1)

    def unpack(self, row: list[int], skip: int) -> tuple[list[list[int]], list[list[float]]] | None:
        """One host row -> each own position's (ids, probabilities), or None where not all finite."""
        D, K = self.D, self.K
        if not row[2 * K * D]:
            return None
        probs = torch.tensor(row[K * D : 2 * K * D], dtype=torch.int64).view(torch.float64).tolist()
        return ([row[i * K : (i + 1) * K] for i in range(skip, D)],
                [probs[i * K : (i + 1) * K] for i in range(skip, D)])  # fmt: skip
