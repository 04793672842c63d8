"""The scores of `llada-lab eval-next-edit` (issue 27), as pure functions of texts.

For one case: `current` is the file after the user's history (what the editor holds when it asks),
`expected` the file after the right next edit (None: the right answer is no edit), `predicted` the file
after the suggestion is applied (None: the configuration stayed silent).

- exact match of the changed region: the suggestion makes exactly the expected change (trailing
  whitespace of lines aside); on a no-edit case, silence is the exact answer;
- delta-chrF (Zed's edit-prediction metric, rewritten here): character n-gram F-score (orders 1..6,
  beta 2, whitespace runs collapsed) between the n-grams the expected edit adds and removes and those
  the suggestion adds and removes; texts outside the change cancel out, so only the change counts;
- silent-when-right precision and recall: of the silences, how many were on no-edit cases, and of the
  no-edit cases, how many got silence;
- reversal: a suggestion that undoes the user's last edit (restores what it replaced), or brings the
  file back to its state before any edit of the history;
- parse kept: of the suggestions on files that parse, the share after which the file still parses.
The command (commands/eval_next_edit.py) drives the server and feeds these.
"""

from __future__ import annotations

import ast
import math
import re
from collections import Counter
from collections.abc import Sequence

from .edit_pairs import apply, common_prefix, common_suffix


def changed_region(old: str, new: str) -> tuple[int, int, str]:
    """The smallest (start, end, text) with old[:start] + text + old[end:] == new."""
    p = common_prefix(old, new)
    s = common_suffix(old[p:], new[p:])
    return p, len(old) - s, new[p : len(new) - s]


def _strip_lines(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.split("\n"))


def exact_match(current: str, expected: str | None, predicted: str | None) -> bool:
    """Whether the suggestion (None: silence) makes exactly the expected change (None: no change)."""
    if expected is None or _strip_lines(expected) == _strip_lines(current):
        return predicted is None or _strip_lines(predicted) == _strip_lines(current)
    if predicted is None:
        return False
    return changed_region(_strip_lines(current), _strip_lines(predicted)) == changed_region(
        _strip_lines(current), _strip_lines(expected)
    )


def _collapse(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _delta(old: str, new: str, n: int) -> Counter:
    """The n-grams `new` has more of than `old` (as themselves) and fewer of (as "¬" + n-gram)."""
    a = Counter(old[i : i + n] for i in range(len(old) - n + 1))
    b = Counter(new[i : i + n] for i in range(len(new) - n + 1))
    out = b - a
    for gram, count in (a - b).items():
        out["¬" + gram] = count
    return out


def delta_chrf(original: str, expected: str, actual: str, order: int = 6, beta: float = 2.0) -> float:
    """chrF (0..100) of the actual change against the expected one, both taken from `original`.
    No expected change and none made: 100. One of the two empty: 0."""
    # Only the span where any of the three differ matters (n-grams elsewhere cancel): cut it out with
    # order-1 characters either side so every n-gram touching a change is whole.
    p = min(common_prefix(original, expected), common_prefix(original, actual))
    s = min(common_suffix(original[p:], expected[p:]), common_suffix(original[p:], actual[p:]))
    lo, keep = max(0, p - (order - 1)), max(0, s - (order - 1))
    return _delta_score(*(_collapse(t[lo : len(t) - keep]) for t in (original, expected, actual)), order, beta)


def _delta_score(o: str, e: str, a: str, order: int, beta: float) -> float:
    """delta_chrf's score of collapsed texts, as they are (no span cut out)."""
    precisions, recalls = [], []
    for n in range(1, order + 1):
        de, da = _delta(o, e, n), _delta(o, a, n)
        te, ta = sum(de.values()), sum(da.values())
        if te == 0 and ta == 0:
            continue
        match = sum((de & da).values())
        precisions.append(match / ta if ta else 0.0)
        recalls.append(match / te if te else 0.0)
    if not precisions:
        return 100.0
    prec, rec = sum(precisions) / len(precisions), sum(recalls) / len(recalls)
    if prec == 0 and rec == 0:
        return 0.0
    b2 = beta * beta
    return 100.0 * (1 + b2) * prec * rec / (b2 * prec + rec)


def is_reversal(before: str, history: Sequence[dict], predicted: str | None) -> bool:
    """Whether the suggestion undoes the user's own edits: the file goes back to its text before any
    edit of the history, or the last edit's new text is (partly) replaced by text it had removed."""
    if predicted is None or not history:
        return False
    states = [before]
    for e in history:
        states.append(apply(states[-1], [e]))
    current = states[-1]
    if predicted == current:
        return False
    if predicted in states[:-1]:
        return True
    last, prev = history[-1], states[-2]
    old, new, s = prev[last["start"] : last["end"]], last["text"], last["start"]
    ps, pe, ptext = changed_region(current, predicted)
    touches = ps < s + len(new) and pe > s if new else ps <= s <= pe
    if not touches:
        return False
    lo, hi = min(ps, s), max(pe, s + len(new))
    undone = current[lo:s] + old + current[s + len(new) : hi]
    if current[lo:ps] + ptext + current[pe:hi] == undone:
        return True
    removed = current[ps:pe]  # partly: it takes away only what the edit put in and puts back only what it took out
    return bool(removed) and removed in new and ptext != "" and ptext in old


def parses(text: str) -> bool:
    try:
        ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; nan for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100
    f = math.floor(k)
    c = min(f + 1, len(xs) - 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


def case_scores(case: dict, predicted: str | None) -> dict:
    """One case's scores for one configuration's answer (predicted file text, None: silent)."""
    current = apply(case["before"], case["history"])
    expected = case["expected"]
    out = {"exact": exact_match(current, expected, predicted), "silent": predicted is None, "no_edit": expected is None}
    if expected is not None:
        out["delta_chrf"] = delta_chrf(current, expected, predicted if predicted is not None else current)
    if predicted is not None:
        out["reversal"] = is_reversal(case["before"], case["history"], predicted)
        if parses(current):
            out["parse_kept"] = parses(predicted)
    return out


def summarize(scores: Sequence[dict], seconds: Sequence[float] = ()) -> dict:
    """One configuration's row: the per-case scores of case_scores, and the time each answer took."""
    edits = [s for s in scores if not s["no_edit"]]
    silent = [s for s in scores if s["silent"]]
    no_edit = [s for s in scores if s["no_edit"]]
    suggested = [s for s in scores if not s["silent"]]
    parsed = [s for s in suggested if "parse_kept" in s]

    def share(xs, key):
        return sum(bool(x[key]) for x in xs) / len(xs) if xs else math.nan

    return {
        "cases": len(scores),
        "exact_all": share(scores, "exact"),
        "exact_edit": share(edits, "exact"),
        "delta_chrf": sum(s["delta_chrf"] for s in edits) / len(edits) if edits else math.nan,
        "silent_precision": sum(s["no_edit"] for s in silent) / len(silent) if silent else math.nan,
        "silent_recall": sum(s["silent"] for s in no_edit) / len(no_edit) if no_edit else math.nan,
        "suggested": len(suggested),
        "reversal_rate": share(suggested, "reversal"),
        "parse_kept": share(parsed, "parse_kept"),
        "p50_ms": percentile(seconds, 50) * 1000 if seconds else math.nan,
        "p95_ms": percentile(seconds, 95) * 1000 if seconds else math.nan,
    }


def sign_test(only_a: int, only_b: int) -> float:
    """Two-sided sign-test p of a split of the discordant cases, as eval_infill's (not imported from
    there: that module pulls in the model pipeline, and the benchmark's client process needs no torch)."""
    n = only_a + only_b
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(min(only_a, only_b) + 1)) / 2**n)


def paired_exact(a: Sequence[dict], b: Sequence[dict]) -> tuple[int, int, float]:
    """Cases exact only under a, only under b, and the sign test's two-sided p on those."""
    only_a = sum(x["exact"] and not y["exact"] for x, y in zip(a, b, strict=True))
    only_b = sum(y["exact"] and not x["exact"] for x, y in zip(a, b, strict=True))
    return only_a, only_b, sign_test(only_a, only_b)
