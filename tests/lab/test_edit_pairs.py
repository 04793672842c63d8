"""Next-edit cases (issue 27): the cutting in training/edit_pairs.py on small texts and a throwaway git
repository, and the shipped evaluation set against its manifest. No network: the set is read from disk."""

from __future__ import annotations

import collections
import json
import random
import re
import subprocess
from pathlib import Path

import pytest

from llada_lab.commands.edit_pairs import EVAL_SET, MANIFEST
from llada_lab.training import edit_pairs as ep

BEFORE = 'def f(a):\n    """Doc."""\n    x = a + 1\n    return x\n\n\ndef g(b):\n    y = f(b)\n    return y\n'
AFTER = 'def f(a, k):\n    """Doc."""\n    x = a + k\n    return x\n\n\ndef g(b):\n    y = f(b, 2)\n    return y\n'


def test_hunks_are_the_changed_spans_and_replay_to_the_after_text():
    hs = ep.hunks(BEFORE, AFTER)
    assert [BEFORE[h.start : h.end] for h in hs] == ["", "1", ""]
    assert [h.text for h in hs] == [", k", "k", ", 2"]
    history, text = ep._replay(BEFORE, hs, [2, 0, 1])  # any chronological order ends at the same text
    assert text == AFTER == ep.apply(BEFORE, history)


def test_apply_rejects_an_edit_outside_the_text():
    with pytest.raises(ValueError):
        ep.apply("abc", [{"start": 2, "end": 9, "text": ""}])


def test_every_kind_of_case_keeps_the_contract():
    change = ep.FileChange("o/r", "c0", "m.py", BEFORE, AFTER)
    kinds = collections.Counter()
    for seed in range(200):
        for case in ep.cut_cases(change, "MIT", random.Random(seed)):
            ep.check(case)
            kinds[case["kind"]] += 1
            current = ep.apply(case["before"], case["history"])
            if case["expected"] is None:
                assert current == AFTER  # the whole diff replayed: nothing is left to do
            else:
                assert case["expected"] != current
                # the expected text is on the way to the commit: every line it has is in before or after
                assert set(case["expected"].splitlines()) <= set(BEFORE.splitlines()) | set(AFTER.splitlines()) | set(
                    current.splitlines()
                )
    assert set(kinds) == {"no-edit", "complete", "below", "above"}
    assert 0.1 < kinds["no-edit"] / sum(kinds.values()) < 0.3


def test_a_complete_case_types_part_of_a_hunk():
    change = ep.FileChange("o/r", "c0", "m.py", "x = 1\n", "x = compute(1, 2)\n")
    case = ep._complete_case(change, ep.hunks(change.before, change.after), {}, random.Random(1))[0]
    current = ep.apply(case["before"], case["history"])
    assert case["expected"] == change.after and current != change.after
    assert case["expected"].startswith(current[: case["cursor"]])


def test_whitespace_only_and_large_hunks_are_not_used():
    assert not ep.usable("a  = 1\n", ep.hunks("a  = 1\n", "a = 1\n")[0])
    big = "".join(f"v{i} = {i}\n" for i in range(20))
    assert not ep.usable("", ep.hunks("", big)[0])


def _git(repo: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "GIT_AUTHOR_DATE": "2020-01-01T00:00:00",
        "GIT_COMMITTER_DATE": "2020-01-01T00:00:00",
        "HOME": str(repo),
    }
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout


def test_mining_a_repository_reads_its_python_commits(tmp_path):
    _git(tmp_path, "init", "-q", "-b", "main")
    (tmp_path / "m.py").write_text(BEFORE)
    (tmp_path / "README").write_text("x\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "root")
    (tmp_path / "m.py").write_text(AFTER)
    _git(tmp_path, "commit", "-qam", "k")
    (tmp_path / "README").write_text("y\n")
    _git(tmp_path, "commit", "-qam", "docs only")
    commits = ep.python_commits(tmp_path / ".git")
    assert len(commits) == 1  # the root has no parent to diff against, the docs commit no .py file
    cases = ep.mine(tmp_path / ".git", "o/r", "MIT", commits, seed=5)
    assert cases == ep.mine(tmp_path / ".git", "o/r", "MIT", commits, seed=5)  # reproducible
    assert all(c["before"] == BEFORE and c["commit"] == commits[0] for c in cases)


# --- the shipped evaluation set ---------------------------------------------------------------------


def _shipped() -> list[dict]:
    return list(ep.read_jsonl_gz(EVAL_SET))


def test_the_shipped_set_is_large_enough_held_out_and_licensed():
    manifest = json.loads(MANIFEST.read_text())
    cases = _shipped()
    assert len(cases) >= 300
    split = {e["repo"]: e for e in manifest["repos"]}
    held_out = {r for r, e in split.items() if e["split"] == "eval"}
    assert len(held_out) >= 2 and {c["repo"] for c in cases} == held_out
    assert not held_out & {r for r, e in split.items() if e["split"] == "train"}
    for c in cases:
        entry = split[c["repo"]]
        assert c["licence"] == entry["licence"] and {"commit": c["commit"], "path": c["path"]} in entry["cases"]
    licences = EVAL_SET.parent / "licenses"
    for repo in held_out:
        assert (licences / (repo.replace("/", "+") + ".txt")).read_text().strip()
    assert EVAL_SET.stat().st_size < 3_000_000


def test_the_shipped_cases_keep_the_contract_and_a_fifth_are_no_edit():
    cases = _shipped()
    for c in cases:
        ep.check(c)
    share = sum(c["expected"] is None for c in cases) / len(cases)
    assert 0.15 <= share <= 0.3
    assert {c["kind"] for c in cases} >= {"no-edit", "complete", "below", "above"}


SOURCE = (
    "def total(items, rate):\n    subtotal = sum(items)\n    taxed = subtotal * rate\n    return subtotal + taxed\n"
)


def test_synthetic_cases_keep_the_contract_and_replay_to_the_file():
    kinds = collections.Counter()
    for seed in range(300):
        case = ep.synthetic_case("m.py", SOURCE, random.Random(seed))
        if case is None:
            continue
        ep.check(case)
        kinds[case["kind"]] += 1
        current = ep.apply(case["before"], case["history"])
        if case["kind"] == "complete":  # typing on from the cursor gives the file back
            assert case["expected"] == SOURCE and SOURCE.startswith(current[: case["cursor"]])
            assert SOURCE.endswith(current[case["cursor"] :])
        elif case["kind"] == "no-edit" and case["before"] != SOURCE:  # a line's end typed in full
            assert current == SOURCE
        elif case["kind"] == "below":  # the next use renamed as the first was
            ((old, new),) = {(case["before"][e["start"] : e["end"]], e["text"]) for e in case["history"]}
            uses = re.compile(rf"\b{re.escape(new)}\b")
            assert len(uses.findall(case["expected"])) == len(uses.findall(current)) + 1 and old in current
    assert set(kinds) == {"complete", "no-edit", "below"}


def test_synthetic_cases_are_as_many_as_asked_where_the_files_allow():
    cases = ep.synthetic_cases([("m.py", SOURCE)], 25, seed=1)
    assert len(cases) == 25 and cases == ep.synthetic_cases([("m.py", SOURCE)], 25, seed=1)
    assert ep.synthetic_cases([("e.py", "\n\n")], 5, seed=1) == [] == ep.synthetic_cases([], 5, seed=1)


def test_a_file_too_large_or_empty_gives_no_synthetic_case():
    assert ep.synthetic_case("m.py", "", random.Random(0)) is None
    assert ep.synthetic_case("m.py", "x = 1\n" * (ep.MAX_FILE_CHARS // 6 + 1), random.Random(0)) is None
