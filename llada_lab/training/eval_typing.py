"""A simulated user typing held-out code, and what it gains from inline suggestions: the spans typed,
what the user does at each keystroke (type on, or take a suggestion that matches with Tab), and the
scores of a replay (characters saved, suggestions shown, acceptance, forwards and times).

Pure: strings and numbers in, a table out. The replay through the real server over stdio, as an
editor drives it, is `llada-lab eval-typing` (commands/eval_typing.py).
"""

from __future__ import annotations

import ast
import hashlib
import random
import statistics
from dataclasses import dataclass, field

from llada_lsp.report import Table

from .corpus import SourceFile
from .eval_infill import sign_test


@dataclass(frozen=True)
class Span:
    """Lines a user types into `path`, whose text is `before + text + after`: on the empty line the
    user opened for them (`after` starts with its line end), their line ends included but the last."""

    path: str
    before: str
    text: str
    after: str


def make_spans(files: list[SourceFile], chars: int, seed: int, max_lines: int = 4,
               max_chars: int = 240) -> list[Span]:  # fmt: skip
    """Spans of 1..`max_lines` whole non-blank lines from files that parse, about `chars` characters
    to type in all; deterministic for a seed."""
    rng = random.Random(seed)
    usable = []
    for f in files:
        try:
            ast.parse(f.text)
        except (SyntaxError, ValueError):
            continue
        if f.text.count("\n") > 10:
            usable.append(f)
    if not usable:
        raise ValueError("no held-out file parses: nothing to type")
    spans, total, attempts = [], 0, 0
    while total < chars and attempts < 100 * max(1, chars):
        attempts += 1
        f = rng.choice(usable)
        lines = f.text.splitlines(keepends=True)
        start = rng.randrange(len(lines))
        take = lines[start : start + rng.randint(1, max_lines)]
        text = "".join(take)
        if not text.strip() or len(text) > max_chars or any(not line.strip() for line in take):
            continue
        before, text = "".join(lines[:start]), text.removesuffix("\n")
        spans.append(Span(f.path, before, text, "\n" + "".join(lines[start + len(take) :])))
        total += len(text)
    return spans


def coin(seed: int, span: int, position: int) -> float:
    """The user's draw at one decision point, the same in every run: runs are compared keystroke by
    keystroke, so the same suggestion at the same point gets the same choice."""
    digest = hashlib.sha256(f"{seed}:{span}:{position}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@dataclass
class Keystroke:
    """One user action (a typed character, or Tab) and the request it started."""

    kind: str  # "through" (typed the next character of the suggestion on screen) | "tab" | "other"
    steps: int | None = None  # denoising forwards of its request (None: unknown)
    first_shown: float | None = None  # seconds from the request to its first non-empty draft or answer
    final: float | None = None  # seconds to its answer
    answer: str = ""
    shown: bool = False  # answered within the pacing interval with a non-empty suggestion


@dataclass
class Replay:
    """One setting's run over all spans: every keystroke, and per span the characters Tab saved."""

    keystrokes: list[Keystroke] = field(default_factory=list)
    saved: dict[tuple[int, int], bool] = field(default_factory=dict)  # (span, character) -> accepted
    chars: int = 0
    accepted: int = 0
    shown: int = 0
    wrong_next: int = 0  # shown suggestions that the next keystroke contradicted


class User:
    """The simulated user of one span: types the span's characters; when a suggestion is on screen and
    the span goes on with it, takes it (Tab) with probability `accept`, else types on."""

    def __init__(self, replay: Replay, seed: int, span_index: int, span: Span, accept: float = 0.5):
        self.replay, self.seed, self.index, self.span, self.accept = replay, seed, span_index, span, accept
        self.pos = 0
        self.on_screen = ""
        replay.chars += len(span.text)

    @property
    def done(self) -> bool:
        return self.pos >= len(self.span.text)

    def act(self) -> tuple[str, Keystroke]:
        """The next action: the text it inserts at the cursor, and its keystroke (to fill in)."""
        rest, shown, replay = self.span.text[self.pos :], self.on_screen, self.replay
        if shown and rest.startswith(shown) and coin(self.seed, self.index, self.pos) < self.accept:
            for i in range(self.pos, self.pos + len(shown)):
                replay.saved[(self.index, i)] = True
            replay.accepted += len(shown)
            self.pos += len(shown)
            return shown, Keystroke("tab")
        typed = rest[0]
        replay.saved[(self.index, self.pos)] = False
        if shown and shown[0] != typed:
            replay.wrong_next += 1
        self.pos += 1
        through = len(shown) > 1 and shown[0] == typed
        return typed, Keystroke("through" if through else "other")

    def see(self, keystroke: Keystroke, interval: float) -> None:
        """The answer to the action's request: on screen if it came before the next keystroke."""
        keystroke.shown = bool(keystroke.answer) and keystroke.final is not None and keystroke.final <= interval
        self.on_screen = keystroke.answer if keystroke.shown else ""
        self.replay.shown += keystroke.shown
        self.replay.keystrokes.append(keystroke)


def _quantiles(values: list[float]) -> tuple[float, float] | None:
    if not values:
        return None
    values = sorted(values)
    return statistics.median(values), values[min(len(values) - 1, int(0.95 * len(values)))]


def scores(replay: Replay) -> dict[str, object]:
    """The figures of one run (times in ms)."""
    ks = replay.keystrokes
    out: dict[str, object] = {
        "keystrokes": len(ks),
        "typing_through": sum(k.kind == "through" for k in ks),
        "chars_saved": replay.accepted / max(replay.chars, 1),
        "shown_per_100": 100 * replay.shown / max(len(ks), 1),
        "acceptance": sum(k.kind == "tab" for k in ks) / max(replay.shown, 1),
        "wrong_next": replay.wrong_next / max(replay.shown, 1),
    }
    for group, keep in (("through", lambda k: k.kind == "through"), ("rest", lambda k: k.kind != "through")):
        chosen = [k for k in ks if keep(k)]
        steps = [k.steps for k in chosen if k.steps is not None]
        out[f"{group}_forwards"] = (statistics.fmean(steps), statistics.median(steps)) if steps else None
        out[f"{group}_first"] = _quantiles([1000 * k.first_shown for k in chosen if k.first_shown is not None])
        out[f"{group}_final"] = _quantiles([1000 * k.final for k in chosen if k.final is not None])
    return out


def paired_saved(on: Replay, off: Replay) -> tuple[int, int, float]:
    """Characters of the spans that only one run saved (Tab), and the sign test's p of that split."""
    keys = on.saved.keys() & off.saved.keys()
    only_on = sum(on.saved[k] and not off.saved[k] for k in keys)
    only_off = sum(off.saved[k] and not on.saved[k] for k in keys)
    return only_on, only_off, sign_test(only_on, only_off)


def _pair(value, fmt: str) -> str:
    return "-" if value is None else " / ".join(format(v, fmt) for v in value)


def table(splits: dict[str, tuple[dict, dict, tuple[int, int, float]]]) -> tuple[Table, list[str]]:
    """Per split, revise on and off side by side; and a line per split with the bars' ratios and the
    sign test."""
    rows = [
        ("keystrokes (typing through)", lambda s: f"{s['keystrokes']} ({s['typing_through']})"),
        ("characters saved", lambda s: f"{s['chars_saved']:.1%}"),
        ("suggestions shown / 100 keystrokes", lambda s: f"{s['shown_per_100']:.1f}"),
        ("acceptance (accepted / shown)", lambda s: f"{s['acceptance']:.1%}"),
        ("shown, wrong at the next keystroke", lambda s: f"{s['wrong_next']:.1%}"),
        ("forwards / request, typing through (mean / p50)", lambda s: _pair(s["through_forwards"], ".2f")),
        ("forwards / request, rest (mean / p50)", lambda s: _pair(s["rest_forwards"], ".2f")),
        ("first shown ms, typing through (p50 / p95)", lambda s: _pair(s["through_first"], ".0f")),
        ("first shown ms, rest (p50 / p95)", lambda s: _pair(s["rest_first"], ".0f")),
        ("final ms, typing through (p50 / p95)", lambda s: _pair(s["through_final"], ".0f")),
        ("final ms, rest (p50 / p95)", lambda s: _pair(s["rest_final"], ".0f")),
    ]
    out = Table([""] + [f"{name}: revise {side}" for name in splits for side in ("on", "off")])
    for label, cell in rows:
        out.add(label, *(cell(run) for on, off, _ in splits.values() for run in (on, off)))
    notes = []
    for name, (on, off, (only_on, only_off, p)) in splits.items():
        fwd = _ratio(on["through_forwards"], off["through_forwards"], 0)
        p50 = _ratio(on["through_final"], off["through_final"], 0)
        notes.append(f"{name}: typing through, forwards/request on/off = {fwd}, p50 final on/off = {p50}; "
                     f"characters saved {on['chars_saved']:.1%} vs {off['chars_saved']:.1%}, paired by keystroke: "
                     f"saved only with revise on {only_on}, only off {only_off} (sign test p = {p:.3g})")  # fmt: skip
    return out, notes


def _ratio(a, b, i: int) -> str:
    if a is None or b is None or not b[i]:
        return "-"
    return f"{a[i] / b[i]:.2f}x"
