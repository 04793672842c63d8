"""Next-edit cases mined from a repository's commit history (issue 27), cut the way Zed's
`split-commit` cuts them: take one commit's diff of one Python file, replay part of it as the user's
edit history, and the expected next edit is one of the hunks left (the one nearest the cursor); about
one case in five replays the whole diff, after which the right answer is "no edit".

A case (the contract with the server side and `llada-lab eval-next-edit`):
    {repo, commit, path, licence, kind,
     before:   the file text before the history,
     history:  [{start, end, text}]  str offsets into the text as it is when that edit is made, in order,
     cursor:   str offset into the text after the history,
     expected: the file text after the next edit, or null for "no edit"}
`kind` says where the expected edit lies from the cursor: "below", "above", "at" (it touches the
cursor's line), "complete" (the last history edit is a hunk typed part way, the rest is expected) or
"no-edit".

Pure library: git is read (never written) through `git` on a local clone or bare mirror; everything
else is a function of texts and a seed. The command that rebuilds the shipped set from
training/edit_manifest.json is commands/edit_pairs.py.
"""

from __future__ import annotations

import difflib
import gzip
import json
import keyword
import random
import re
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

# The repository's copies (a checkout or an editable install reads them; the wheel carries neither).
MANIFEST = Path(__file__).with_name("edit_manifest.json")
EVAL_SET = Path(__file__).resolve().parent.parent / "data" / "next_edit" / "cases.jsonl.gz"

# What a usable hunk and file look like: small edits in files a window can hold a part of.
MAX_HUNK_LINES = 6  # lines on either side of one hunk
MAX_HUNK_CHARS = 400
MIN_HUNKS, MAX_HUNKS = 1, 8  # hunks of one file in one commit
MAX_FILE_CHARS = 40_000
MAX_FILES_PER_COMMIT = 8  # more is a sweep (reformat, rename across the tree), not a person's next edit
NEAR_LINES = 12  # the expected hunk starts within this many lines of the cursor: inside a ~20-line window
NO_EDIT_SHARE = 0.2
COMPLETE_SHARE = 0.2  # of edit cases: the last history edit is typed part way


@dataclass(frozen=True)
class Hunk:
    """One change of a file's diff, as str offsets into the old text: old[start:end] -> text."""

    start: int
    end: int
    text: str


@dataclass(frozen=True)
class FileChange:
    repo: str
    commit: str
    path: str
    before: str
    after: str


# --- git ------------------------------------------------------------------------------------------


def _git(git_dir: str | Path, *args: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", str(git_dir), *args],
        check=True,
        capture_output=True,
        text=True,
        encoding="utf-8",
        errors="surrogateescape",
    ).stdout


def python_commits(git_dir: str | Path, rev: str = "HEAD") -> list[str]:
    """Non-merge, non-root commits of `rev`'s history that modify .py files, oldest first."""
    out = _git(git_dir, "log", "--no-merges", "--reverse", "--format=%H %P", rev, "--", "*.py")
    return [row[0] for row in (line.split() for line in out.splitlines()) if len(row) == 2]


def file_changes(git_dir: str | Path, repo: str, commit: str) -> list[FileChange]:
    """The .py files `commit` modifies (not added, deleted or renamed), with their text before and after;
    nothing for a commit that touches too many files, and files that are not clean UTF-8 with \\n lines."""
    out = _git(git_dir, "diff-tree", "--no-commit-id", "-r", "--no-renames", "--name-status", f"{commit}^", commit)
    rows = [line.split("\t") for line in out.splitlines() if line]
    if len(rows) > MAX_FILES_PER_COMMIT * 4:
        return []
    paths = [row[1] for row in rows if row[0] == "M" and row[1].endswith(".py")]
    if not paths or len(paths) > MAX_FILES_PER_COMMIT:
        return []
    changes = []
    for path in paths:
        try:
            before, after = _show(git_dir, f"{commit}^", path), _show(git_dir, commit, path)
        except (subprocess.CalledProcessError, UnicodeDecodeError):
            continue
        if before is None or after is None or "\r" in before or "\r" in after:
            continue
        if max(len(before), len(after)) <= MAX_FILE_CHARS:
            changes.append(FileChange(repo, commit, path, before, after))
    return changes


def _show(git_dir, rev: str, path: str) -> str | None:
    data = subprocess.run(
        ["git", "--git-dir", str(git_dir), "show", f"{rev}:{path}"], check=True, capture_output=True
    ).stdout
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


# --- hunks ----------------------------------------------------------------------------------------


def hunks(before: str, after: str) -> list[Hunk]:
    """The line diff of before -> after as hunks (str offsets into `before`), top to bottom; within a
    hunk the common leading/trailing characters are trimmed off, so a hunk is the changed span only."""
    a, b = before.splitlines(keepends=True), after.splitlines(keepends=True)
    starts = [0]
    for line in a:
        starts.append(starts[-1] + len(line))
    out = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        old, new = "".join(a[i1:i2]), "".join(b[j1:j2])
        p = common_prefix(old, new)
        s = common_suffix(old[p:], new[p:])
        out.append(Hunk(starts[i1] + p, starts[i2] - s, new[p : len(new) - s]))
    return out


def common_prefix(x: str, y: str) -> int:
    """How many characters x and y share at their start."""
    n = min(len(x), len(y))
    i = 0
    while i < n and x[i] == y[i]:
        i += 1
    return i


def common_suffix(x: str, y: str) -> int:
    """How many characters x and y share at their end."""
    n = min(len(x), len(y))
    i = 0
    while i < n and x[-1 - i] == y[-1 - i]:
        i += 1
    return i


def usable(before: str, hunk: Hunk) -> bool:
    """Small, and not only whitespace: a hunk a person makes as one edit."""
    old = before[hunk.start : hunk.end]
    if max(len(old), len(hunk.text)) > MAX_HUNK_CHARS:
        return False
    if max(old.count("\n"), hunk.text.count("\n")) > MAX_HUNK_LINES:
        return False
    return "".join(old.split()) != "".join(hunk.text.split())


def apply(text: str, edits: Iterable[dict]) -> str:
    """Apply {start, end, text} edits in order, each against the text as the previous ones left it."""
    for e in edits:
        if not 0 <= e["start"] <= e["end"] <= len(text):
            raise ValueError(f"edit {e['start']}..{e['end']} outside a text of {len(text)} characters")
        text = text[: e["start"]] + e["text"] + text[e["end"] :]
    return text


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset)


# Where a person pauses while typing (Zed weighs cursor positions the same way): after these, more likely.
_PAUSE = re.compile(r"[,;(\[{]|[)\]}]|\w(?=\W)|\s(?=\S)")


def _typing_cut(text: str, rng: random.Random) -> int | None:
    """A place part way through `text` where a person typing it might stop, or None."""
    cuts = [m.end() for m in _PAUSE.finditer(text) if 0 < m.end() < len(text)]
    return rng.choice(cuts) if cuts else None


# --- cases ----------------------------------------------------------------------------------------


def cut_cases(change: FileChange, licence: str, rng: random.Random) -> list[dict]:
    """At most one case from one file's change: "no-edit" (the whole diff replayed), "complete" (a hunk
    typed part way) or a next hunk near the cursor after a random chronological order of the others."""
    hs = hunks(change.before, change.after)
    if not MIN_HUNKS <= len(hs) <= MAX_HUNKS or not all(usable(change.before, h) for h in hs):
        return []
    base = {"repo": change.repo, "commit": change.commit, "path": change.path, "licence": licence}
    roll = rng.random()
    if roll < NO_EDIT_SHARE:
        order = list(range(len(hs)))
        rng.shuffle(order)
        history, current = _replay(change.before, hs, order)
        return [
            {
                **base,
                "kind": "no-edit",
                "before": change.before,
                "history": history,
                "cursor": _cursor(history),
                "expected": None,
            }
        ]
    if len(hs) == 1 or roll < NO_EDIT_SHARE + COMPLETE_SHARE * (1 - NO_EDIT_SHARE):  # select() rebalances
        return _complete_case(change, hs, base, rng)
    order = list(range(len(hs)))
    rng.shuffle(order)
    k = rng.randint(1, len(hs) - 1)
    history, current = _replay(change.before, hs, order[:k])
    cursor = _cursor(history)
    shifted = _shift(hs, order[:k])
    rest = [shifted[i] for i in order[k:]]
    cursor_line = _line_of(current, cursor)
    near = min(rest, key=lambda h: abs(_line_of(current, h.start) - cursor_line))
    first, last = _line_of(current, near.start), _line_of(current, near.end)
    if first - cursor_line > NEAR_LINES or cursor_line - last > NEAR_LINES:
        return []
    kind = "at" if first <= cursor_line <= last else ("below" if first > cursor_line else "above")
    expected = current[: near.start] + near.text + current[near.end :]
    return [{**base, "kind": kind, "before": change.before, "history": history, "cursor": cursor, "expected": expected}]


def _complete_case(change: FileChange, hs: list[Hunk], base: dict, rng: random.Random) -> list[dict]:
    """The user is typing a hunk (all others of the file before it, in file order, in the history):
    its old text is replaced by part of its new text; the rest of it is the expected edit."""
    i = rng.randrange(len(hs))
    h = hs[i]
    cut = _typing_cut(h.text, rng)
    if cut is None or not h.text[cut:].strip():  # what is left to type is more than whitespace
        return []
    others = [j for j in range(len(hs)) if j != i and hs[j].end <= h.start and rng.random() < 0.5]
    history, current = _replay(change.before, hs, others)
    shifted = _shift(hs, others)[i]
    partial = {"start": shifted.start, "end": shifted.end, "text": h.text[:cut]}
    history.append(partial)
    current = apply(current, [partial])
    at = shifted.start + cut
    expected = current[:at] + h.text[cut:] + current[at:]
    return [
        {**base, "kind": "complete", "before": change.before, "history": history, "cursor": at, "expected": expected}
    ]


def _shift(hs: list[Hunk], applied: list[int]) -> list[Hunk]:
    """Every hunk's span in the text after the hunks `applied` (indices) were applied."""
    out = []
    for i, h in enumerate(hs):
        delta = sum(len(hs[j].text) - (hs[j].end - hs[j].start) for j in applied if j != i and hs[j].end <= h.start)
        out.append(Hunk(h.start + delta, h.end + delta, h.text))
    return out


def _replay(before: str, hs: list[Hunk], order: list[int]) -> tuple[list[dict], str]:
    """The hunks `order` (indices into hs, in that chronological order) as history edits against the
    text as it is at each, and the text after them."""
    history, done, text = [], [], before
    for i in order:
        h = _shift(hs, done)[i]
        edit = {"start": h.start, "end": h.end, "text": h.text}
        history.append(edit)
        text = apply(text, [edit])
        done.append(i)
    return history, text


def _cursor(history: list[dict]) -> int:
    """After the last edit's new text: where a person's cursor is when they stop."""
    last = history[-1]
    return last["start"] + len(last["text"])


def mine(git_dir: str | Path, repo: str, licence: str, commits: list[str], seed: int) -> list[dict]:
    """Every case the given commits of one repository give, reproducibly for one seed."""
    out = []
    for commit in commits:
        rng = random.Random(f"{seed}:{repo}:{commit}")
        for change in file_changes(git_dir, repo, commit):
            out.extend(cut_cases(change, licence, rng))
    return out


def check(case: dict) -> None:
    """Raise ValueError when a case breaks the contract (offsets in range, cursor after the history)."""
    text = apply(case["before"], case["history"])
    if not case["history"]:
        raise ValueError("a case has at least one history edit")
    if not 0 <= case["cursor"] <= len(text):
        raise ValueError(f"cursor {case['cursor']} outside the text after the history ({len(text)} characters)")
    if case["expected"] is not None and "".join(case["expected"].split()) == "".join(text.split()):
        raise ValueError("an expected edit that changes only whitespace, or nothing: not a next edit")


SHARES = {"no-edit": NO_EDIT_SHARE, "complete": 0.3, "near": 0.5}  # "near": below, above, at


def select(cases: list[dict], n: int, seed: int, per_commit: int = 1) -> list[dict]:
    """About n cases: the repositories balanced, at most `per_commit` per commit, the kinds in SHARES'
    proportions where there are enough (the others top up where not)."""
    rng = random.Random(seed)
    by_repo: dict[str, list[dict]] = {}
    for c in cases:
        by_repo.setdefault(c["repo"], []).append(c)
    out = []
    for repo, cs in sorted(by_repo.items()):
        cs = sorted(cs, key=lambda c: (c["commit"], c["path"]))
        rng.shuffle(cs)
        seen: dict[str, int] = {}
        pool = []
        for c in cs:
            if seen.get(c["commit"], 0) < per_commit:
                seen[c["commit"]] = seen.get(c["commit"], 0) + 1
                pool.append(c)
        want = -(-n // len(by_repo))
        group = {k: [c for c in pool if _group(c) == k] for k in SHARES}
        keep = [c for k, share in SHARES.items() for c in group[k][: round(want * share)]]
        kept = {id(c) for c in keep}
        rest = [c for c in pool if id(c) not in kept]
        out.extend(keep + rest[: max(0, want - len(keep))])
    return sorted(out, key=lambda c: (c["repo"], c["commit"], c["path"]))


def _group(case: dict) -> str:
    return case["kind"] if case["kind"] in ("no-edit", "complete") else "near"


def write_jsonl_gz(path: str | Path, cases: list[dict]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
        for c in cases:  # no name, no time in the header: the same cases give the same bytes
            f.write((json.dumps(c, ensure_ascii=False, sort_keys=True) + "\n").encode("utf-8"))


def read_jsonl_gz(path: str | Path) -> Iterator[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


# --- synthetic cases --------------------------------------------------------------------------------
# Commits give few edits a small model can learn from (of 1,138 mined training cases, about 320 change
# at most 8 of the draft's tokens). Any source file gives more of the two kinds a diffusion draft
# expresses cheaply: the rest of what the user is typing at the cursor, and the same rename again.
_NAME = re.compile(r"\b[A-Za-z_]\w{2,}\b")
_KEYWORDS = frozenset(keyword.kwlist) | {"self", "cls"}
SYNTHETIC_REST_CHARS = 40  # what is left to type: at most this much of the line


def synthetic_case(path: str, text: str, rng: random.Random) -> dict | None:
    """One case cut from a file as it is (no commit): "complete" (a line's end typed part way: the
    rest is expected), "below" (a name renamed at one use, the next use below expected renamed too)
    or "no-edit" (a line's end typed in full, or a name renamed at its every use in reach). None when
    the file gives none at the draw."""
    if not text.strip() or len(text) > MAX_FILE_CHARS or "\r" in text:
        return None
    base = {"repo": "synthetic", "commit": "", "path": path, "licence": ""}
    roll = rng.random()
    if roll < 0.45:
        return _synthetic_complete(text, base, rng, done=False)
    if roll < 0.55:
        return _synthetic_complete(text, base, rng, done=True)
    return _synthetic_rename(text, base, rng, done=roll > 0.9)


def _synthetic_complete(text: str, base: dict, rng: random.Random, done: bool) -> dict | None:
    lines = list(re.finditer(r"[^\n]*\S[^\n]*\n", text))
    if not lines:
        return None
    line = rng.choice(lines)
    body = line.group().rstrip()
    lo = line.start() + len(body) - len(body.lstrip())  # the line's code, after its indentation
    hi = line.start() + len(body)
    cuts = [lo + m.end() for m in _PAUSE.finditer(text[lo:hi]) if 0 < lo + m.end() < hi]
    cuts = [c for c in cuts if hi - c <= SYNTHETIC_REST_CHARS and text[c:hi].strip()]
    if not cuts:
        return None
    cut = rng.choice(cuts)
    start = rng.choice([c for c in cuts if c <= cut] + [lo])  # where the user began typing this part
    before = text[:start] + text[hi:]
    if done:
        history = [{"start": start, "end": start, "text": text[start:hi]}]
        return {**base, "kind": "no-edit", "before": before, "history": history, "cursor": hi, "expected": None}
    history = [{"start": start, "end": start, "text": text[start:cut]}]
    return {**base, "kind": "complete", "before": before, "history": history, "cursor": cut, "expected": text}


def _synthetic_rename(text: str, base: dict, rng: random.Random, done: bool) -> dict | None:
    uses: dict[str, list[re.Match]] = {}
    for m in _NAME.finditer(text):
        if m.group() not in _KEYWORDS:
            uses.setdefault(m.group(), []).append(m)
    pairs = [(a, b) for ms in uses.values() for a, b in zip(ms, ms[1:])
             if 0 < text.count("\n", a.end(), b.start()) <= NEAR_LINES // 2]  # fmt: skip
    if not pairs:
        return None
    first, second = rng.choice(pairs)
    old = first.group()
    new = rng.choice(
        [f"new_{old}", f"{old}s", f"{old}_", f"{old}2", f"_{old}", old.lower() if old != old.lower() else old.upper()]
    )
    edit = {"start": first.start(), "end": first.end(), "text": new}
    current = apply(text, [edit])
    at = second.start() + len(new) - len(old)
    renamed = current[:at] + new + current[at + len(old) :]
    if done:
        edit2 = {"start": at, "end": at + len(old), "text": new}
        return {**base, "kind": "no-edit", "before": text, "history": [edit, edit2],
                "cursor": at + len(new), "expected": None}  # fmt: skip
    return {**base, "kind": "below", "before": text, "history": [edit], "cursor": first.start() + len(new),
            "expected": renamed}  # fmt: skip


def synthetic_cases(files: list[tuple[str, str]], n: int, seed: int) -> list[dict]:
    """`n` synthetic cases from (path, text) files drawn at random, reproducibly for one seed; fewer
    when the files give fewer in 20 draws per case (none at all from files without code)."""
    rng = random.Random(seed)
    out: list[dict] = []
    for _ in range(20 * n if files else 0):
        if len(out) == n:
            break
        path, text = rng.choice(files)
        if (case := synthetic_case(path, text, rng)) is not None:
            out.append(case)
    return out
