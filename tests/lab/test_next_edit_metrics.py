"""The scores of `llada-lab eval-next-edit` on small known examples (training/eval_next_edit.py)."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from llada_lab.training import eval_next_edit as m

CURRENT = "def area(width, height):\n    return w * h\n"
RIGHT = "def area(width, height):\n    return width * height\n"


def test_changed_region_is_the_smallest_span():
    assert m.changed_region("abcdef", "abXYef") == (2, 4, "XY")
    assert m.changed_region("abc", "abc") == (3, 3, "")
    assert m.changed_region("aaa", "aaaa") == (3, 3, "a")  # an insertion into a run: at its end


def test_exact_match_of_the_changed_region():
    assert m.exact_match(CURRENT, RIGHT, RIGHT)
    assert m.exact_match(CURRENT, RIGHT, RIGHT.replace("height\n", "height   \n"))  # trailing whitespace aside
    assert not m.exact_match(CURRENT, RIGHT, CURRENT.replace("w *", "width *"))  # half the edit
    assert not m.exact_match(CURRENT, RIGHT, None)  # silence on an edit case
    assert m.exact_match(CURRENT, None, None)  # silence on a no-edit case
    assert not m.exact_match(CURRENT, None, RIGHT)  # an edit where none was due
    assert m.exact_match(CURRENT, None, CURRENT)  # an edit that changes nothing is silence


def _full_delta_chrf(o: str, e: str, a: str, order: int = 6, beta: float = 2.0) -> float:
    """The same score computed on the whole texts, nothing cut: what the cut must agree with."""
    return m._delta_score(m._collapse(o), m._collapse(e), m._collapse(a), order, beta)


def test_delta_chrf_on_known_examples():
    assert m.delta_chrf(CURRENT, RIGHT, RIGHT) == 100.0  # the expected change, exactly
    assert m.delta_chrf(CURRENT, RIGHT, CURRENT) == 0.0  # silence where an edit was due
    assert m.delta_chrf(CURRENT, CURRENT, CURRENT) == 100.0  # nothing due, nothing done
    assert m.delta_chrf(CURRENT, CURRENT, RIGHT) == 0.0  # something done where nothing was due
    half = CURRENT.replace("w *", "width *")
    assert 0 < m.delta_chrf(CURRENT, RIGHT, half) < 100
    wrong = CURRENT.replace("w * h", "x + y")
    assert m.delta_chrf(CURRENT, RIGHT, wrong) < m.delta_chrf(CURRENT, RIGHT, half)


def test_delta_chrf_by_hand_on_a_one_character_change():
    # "ab" -> "ac": expected deltas {c, ac, ¬b, ¬ab}; actual "ad" deltas {d, ad, ¬b, ¬ab}: per order
    # precision = recall = 1/2 (the deletions agree, the insertions do not): F = 50.
    assert m.delta_chrf("ab", "ac", "ad", order=2) == pytest.approx(50.0)
    assert m._delta("ab", "ac", 2) == Counter({"ac": 1, "¬ab": 1})


def test_delta_chrf_counts_only_the_change():
    far = "x = 1\n" * 200
    o, e, a = far + CURRENT + far, far + RIGHT + far, far + CURRENT.replace("w *", "width *") + far
    assert m.delta_chrf(o, e, a) == pytest.approx(_full_delta_chrf(o, e, a))  # the cut changes nothing
    wider = far + "y = 2\n" * 50  # nor does more text far from the change
    assert m.delta_chrf(wider + CURRENT + far, wider + RIGHT + far, wider + a[len(far) :]) == pytest.approx(
        m.delta_chrf(o, e, a)
    )


def test_delta_chrf_collapses_whitespace_runs():
    assert m.delta_chrf("f(a)\n", "f(a,  b)\n", "f(a, b)\n") == 100.0


HISTORY_BEFORE = "def f(total):\n    return total\n"
RENAMED = [{"start": 6, "end": 11, "text": "amount"}]  # total -> amount in the signature


def test_reversal_detection():
    current = "def f(amount):\n    return total\n"
    assert m.is_reversal(HISTORY_BEFORE, RENAMED, HISTORY_BEFORE)  # the rename undone
    assert not m.is_reversal(HISTORY_BEFORE, RENAMED, "def f(amount):\n    return amount\n")  # the rename carried on
    assert not m.is_reversal(HISTORY_BEFORE, RENAMED, None)
    assert not m.is_reversal(HISTORY_BEFORE, RENAMED, current)
    # partly undone: the new name loses its tail to letters of the old one
    assert m.is_reversal(HISTORY_BEFORE, RENAMED, "def f(amtal):\n    return total\n")


def test_reversal_of_an_earlier_state_and_of_a_deletion():
    two = [{"start": 6, "end": 11, "text": "amount"}, {"start": 27, "end": 32, "text": "amount"}]
    assert m.is_reversal(HISTORY_BEFORE, two, HISTORY_BEFORE)  # back to before the whole history
    deleted = [{"start": 0, "end": 4, "text": ""}]  # "def " deleted
    assert m.is_reversal("def f(total):\n", deleted, "def f(total):\n")
    assert not m.is_reversal("def f(total):\n", deleted, "f(total):\n    pass\n")


def test_parses_and_percentile():
    assert m.parses(RIGHT) and not m.parses("def f(:\n")
    assert m.percentile([3, 1, 2], 50) == 2 and m.percentile([1, 2, 3, 4], 95) == pytest.approx(3.85)
    assert math.isnan(m.percentile([], 50))


def _case(expected):
    return {"before": HISTORY_BEFORE, "history": RENAMED, "cursor": 12, "expected": expected}


def test_summary_of_an_always_silent_configuration():
    cases = [_case("def f(amount):\n    return amount\n")] * 4 + [_case(None)]
    row = m.summarize([m.case_scores(c, None) for c in cases])
    assert row["exact_all"] == pytest.approx(0.2) and row["exact_edit"] == 0
    assert row["silent_precision"] == pytest.approx(0.2) and row["silent_recall"] == 1
    assert row["delta_chrf"] == 0 and row["suggested"] == 0 and math.isnan(row["reversal_rate"])


def test_summary_and_sign_test_of_a_configuration_that_edits():
    right = "def f(amount):\n    return amount\n"
    cases = [_case(right)] * 8 + [_case(None)] * 2
    good = [m.case_scores(c, right if c["expected"] else None) for c in cases]
    bad = [m.case_scores(c, HISTORY_BEFORE) for c in cases]  # always undoes the rename
    g, b = m.summarize(good, [0.1] * 10), m.summarize(bad)
    assert (
        g["exact_all"] == 1
        and g["silent_precision"] == 1
        and g["parse_kept"] == 1
        and g["p50_ms"] == pytest.approx(100)
    )
    assert b["exact_all"] == 0 and b["reversal_rate"] == 1 and math.isnan(b["silent_precision"])
    only_good, only_bad, p = m.paired_exact(good, bad)
    assert (only_good, only_bad) == (10, 0) and p == pytest.approx(2 / 2**10)
    assert m.sign_test(3, 3) == 1.0
