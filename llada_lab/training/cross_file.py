"""Cross-file infill tasks: holes in held-out files of a third-party package whose right answer uses a
name that only another module of the same package, one the file imports, defines.

Knows corpus files, Python imports and names; nothing of tokens, models, servers or editors. A task
carries the package's files (the editor's workspace) and which of them hold the name (the documents
the editor has open). The harness that answers them through the real server is
`llada-lab eval-infill --cross-file` (commands/eval_cross_file.py).
"""

from __future__ import annotations

import ast
import builtins
import io
import keyword
import random
import re
import tokenize
from collections import defaultdict
from dataclasses import dataclass

from .corpus import SourceFile

CROSS_FILE_KINDS = ("rest_of_line", "whole_line")
MIN_NAME = 4  # shorter names (`id`, `key`, `obj`) are guessed too easily to show that context is used
MAX_OPEN = 3  # imported modules opened in the editor per task, at most
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_COMMON = frozenset(dir(builtins)) | frozenset(keyword.kwlist) | {"self", "cls", "None", "True", "False"}


@dataclass(frozen=True)
class CrossFileTask:
    kind: str
    path: str  # the current file's corpus path (pypi/NAME/REL)
    prefix: str
    middle: str
    suffix: str
    name: str  # the name of another module the answer's first line uses
    opened: tuple[str, ...]  # corpus paths of the imported modules that define it (open in the editor)


def package_of(path: str) -> str:
    """`pypi/NAME/REL` -> NAME."""
    parts = path.split("/")
    if len(parts) < 3 or parts[0] != "pypi":
        raise ValueError(f"{path!r} is not a third-party corpus path (pypi/NAME/...)")
    return parts[1]


def relative_path(path: str) -> str:
    """`pypi/NAME/REL` -> REL, the file's place in the package's sdist (and in the editor's workspace)."""
    return path.split("/", 2)[2]


def module_name(path: str) -> str | None:
    """The dotted module a file is imported as: its place in the sdist, a leading `src/` dropped,
    `__init__` naming its package. None: not a module name (a dash, a dot in a folder's name)."""
    rel = relative_path(path)
    if rel.startswith("src/"):
        rel = rel[len("src/") :]
    parts = rel[: -len(".py")].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if not parts or not all(p.isidentifier() for p in parts):
        return None
    return ".".join(parts)


def modules_of(files: list[SourceFile]) -> dict[str, SourceFile]:
    """Dotted module name -> its file, for one package's files."""
    found = {}
    for f in sorted(files, key=lambda f: f.path):
        name = module_name(f.path)
        if name is not None:
            found.setdefault(name, f)
    return found


def imported_modules(f: SourceFile, modules: dict[str, SourceFile]) -> list[SourceFile]:
    """The package's modules `f` imports (absolute or relative; `from P import M` where M is a module
    counts as M), in the order of its import statements, each once."""
    here = module_name(f.path)
    try:
        tree = ast.parse(f.text)
    except (SyntaxError, ValueError):
        return []
    package_parts = (here or "").split(".")
    if here is not None and not f.path.endswith("__init__.py"):
        package_parts = package_parts[:-1]
    found: list[SourceFile] = []

    def add(name: str) -> None:
        g = modules.get(name)
        if g is not None and g.path != f.path and g not in found:
            found.append(g)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if here is None or node.level - 1 > len(package_parts):
                    continue
                base = package_parts[: len(package_parts) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                if f"{target}.{alias.name}" in modules:
                    add(f"{target}.{alias.name}")
                else:
                    add(target)
    return found


def defined_names(text: str) -> set[str]:
    """Names a module defines for others to use: functions, classes, methods, their parameters,
    assigned names and attributes (`self.x = ...`)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
    return {n for n in names if len(n) >= MIN_NAME and n not in _COMMON and not n.startswith("__")}


@dataclass(frozen=True)
class _Candidate:
    path: str
    line_start: int  # str offset of the line in the file
    line: str  # without its newline
    name: str
    column: int  # where the name first occurs in the line
    opened: tuple[str, ...]


def code_names(text: str) -> dict[int, dict[str, int]]:
    """Line index -> {identifier: column of its first use there}, for identifiers the tokenizer reads as
    code (names in strings, docstrings and comments left out)."""
    out: dict[int, dict[str, int]] = defaultdict(dict)
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.NAME and not keyword.iskeyword(tok.string):
                out[tok.start[0] - 1].setdefault(tok.string, tok.start[1])
    except (tokenize.TokenError, SyntaxError):
        return {}
    return out


def _candidates(f: SourceFile, imported: list[SourceFile],
                cache: dict[str, set[str]] | None = None) -> list[_Candidate]:  # fmt: skip
    """Every (line, name) of `f` where the line's code uses a name an imported module defines and the
    rest of the file never mentions, not even in a comment (so only the other module can tell it).
    `cache`: path -> defined_names, shared between the files of one package."""
    cache = {} if cache is None else cache
    for g in imported:
        if g.path not in cache:
            cache[g.path] = defined_names(g.text)
    defined = {g.path: cache[g.path] for g in imported}
    mentions: dict[str, int] = defaultdict(int)
    for ident in _IDENT.findall(f.text):
        mentions[ident] += 1
    names_by_line = code_names(f.text)
    out, start = [], 0
    for index, line in enumerate(f.text.splitlines(keepends=True)):
        body = line.rstrip("\r\n")
        if not body.lstrip().startswith(("import ", "from ")):
            counts: dict[str, int] = defaultdict(int)
            for ident in _IDENT.findall(body):
                counts[ident] += 1
            for ident, column in names_by_line.get(index, {}).items():
                if mentions[ident] != counts[ident]:  # mentioned elsewhere in the file: not cross-file
                    continue
                holders = tuple(p for p, names in defined.items() if ident in names)[:MAX_OPEN]
                if holders:
                    out.append(_Candidate(f.path, start, body, ident, column, holders))
        start += len(line)
    return out


def make_cross_file_tasks(current: list[SourceFile], package_files: dict[str, list[SourceFile]], n_per_kind: int,
                          seed: int = 1234, kinds: tuple[str, ...] = CROSS_FILE_KINDS) -> list[CrossFileTask]:  # fmt: skip
    """Deterministic tasks: `n_per_kind` holes of each kind in the files of `current` (held-out files
    that parse), each answer's first line using a name defined only in a module of the same package
    (from `package_files`, package name -> all its files) that the file imports. One hole per
    (file, line) at most per kind; fewer tasks when fewer such lines exist."""
    rng = random.Random(seed)
    candidates: list[_Candidate] = []
    for f in sorted(current, key=lambda f: f.path):
        try:
            ast.parse(f.text)
        except (SyntaxError, ValueError):
            continue
        modules = modules_of(package_files.get(package_of(f.path), []))
        imported = imported_modules(f, modules)
        if imported:
            candidates += _candidates(f, imported)
    by_line: dict[tuple[str, int], list[_Candidate]] = defaultdict(list)
    for c in candidates:
        by_line[(c.path, c.line_start)].append(c)
    lines = sorted(by_line)
    texts = {f.path: f.text for f in current}
    tasks = []
    for kind in kinds:
        order = lines[:]
        rng.shuffle(order)
        made = 0
        for key in order:
            if made >= n_per_kind:
                break
            c = rng.choice(by_line[key])
            indent = len(c.line) - len(c.line.lstrip())
            if kind == "rest_of_line":
                if c.column <= indent + 1:
                    continue  # the cursor goes inside the line's code, before the name
                col = rng.randint(indent + 1, c.column)
            else:
                col = indent
            text, a = texts[c.path], c.line_start + col
            b = c.line_start + len(c.line)
            tasks.append(CrossFileTask(kind, c.path, text[:a], text[a:b], text[b:], c.name, c.opened))
            made += 1
    return tasks


def group_by_package(*corpora: list[SourceFile]) -> dict[str, list[SourceFile]]:
    """Package name -> its files, from corpus files of any split (standard-library files left out)."""
    out: dict[str, list[SourceFile]] = defaultdict(list)
    seen: set[str] = set()
    for files in corpora:
        for f in files:
            if f.path.startswith("pypi/") and f.path not in seen:
                seen.add(f.path)
                out[package_of(f.path)].append(f)
    return dict(out)


# ---- training samples: related files of one package before the hole --------------------------------


class CrossFileSamples:
    """Endless training sequences, one hole each: the package's related files (the modules the file
    imports, sometimes one more file of the package beside them) chosen and rendered into the prompt
    by the server's own functions (completion/ranking.py `windows`, `choose_at` with the modules as its
    `sources`, as the front passes the imported and open ones; completion/prompt.py
    `infill_prompt`), then the middle and end-of-text to the sequence's end, as a generation's room
    ends. Half the holes are cross-file ones (`_candidates`: the answer uses a name only the snippets'
    modules define), half the usual infill kinds, so the model also learns to leave snippets unused.

    `packages`: package name -> its training files only (never a held-out file)."""

    def __init__(self, packages: dict[str, list[SourceFile]], codec, seq_len: int, seed: int,
                 shares: tuple[int, ...] = (25,), cross_share: float = 0.5):  # fmt: skip
        from .objective import HOLE_KINDS, HOLE_WEIGHTS

        self.codec, self.seq_len, self.shares, self.cross_share = codec, seq_len, shares, cross_share
        self.kinds = [(k, w) for k, w in zip(HOLE_KINDS, HOLE_WEIGHTS) if k != "plain"]
        self.rng = random.Random(seed)
        self.files: list[tuple[SourceFile, list[SourceFile], list[_Candidate], list[SourceFile]]] = []
        self.windows: dict[str, list] = {}  # path -> its candidate snippets (completion/ranking.py `windows`)
        for files in packages.values():
            modules, defined = modules_of(files), {}
            for f in files:
                imported = imported_modules(f, modules)
                if imported:
                    self.files.append((f, imported, _candidates(f, imported, defined), files))
        if not self.files:
            raise ValueError("no training file imports another module of its package")

    def hole(self, f: SourceFile, candidates: list[_Candidate]) -> tuple[str, str, str] | None:
        from .objective import cut_hole

        if candidates and self.rng.random() < self.cross_share:
            c = self.rng.choice(candidates)
            indent = len(c.line) - len(c.line.lstrip())
            whole_line = c.column <= indent + 1 or self.rng.random() < 0.5
            col = indent if whole_line else self.rng.randint(indent + 1, c.column)
            a, b = c.line_start + col, c.line_start + len(c.line)
            return f.text[:a], f.text[a:b], f.text[b:]
        kind = self.rng.choices([k for k, _ in self.kinds], weights=[w for _, w in self.kinds])[0]
        return cut_hole(f.text, kind, self.rng)

    def sample(self) -> list[int]:
        from llada_lsp.completion.jobs import CONTEXT_TOKENS
        from llada_lsp.completion.prompt import infill_prompt
        from llada_lsp.completion.ranking import choose_at, windows
        from llada_lsp.completion.snippets import Snippet

        while True:
            f, imported, candidates, package = self.rng.choice(self.files)
            hole = self.hole(f, candidates)
            if hole is None or not hole[1].strip():
                continue
            prefix, middle, suffix = hole
            sources = list(imported)
            if self.rng.random() < 0.3:  # an open file that has nothing to do with the hole
                sources.append(self.rng.choice(package))
            pool = [w for g in sources if g.path != f.path for w in self._windows(g, windows)]
            modules = {g.path: Snippet(relative_path(g.path), g.text, g.path) for g in sources if g.path != f.path}
            share = self.rng.choice(self.shares)  # the chooser's budget, as the front sizes it for the setting
            snippets = choose_at(pool, prefix + suffix, len(prefix), CONTEXT_TOKENS * share // 100, [*modules.values()])
            gen = 64 if not prefix.split("\n")[-1].strip() else 32
            prompt = infill_prompt(prefix, suffix, self.codec, self.seq_len - gen, context=snippets,
                                   context_share=share)  # fmt: skip
            middle_ids = self.codec.encode(middle)[:gen]
            ids = prompt.ids + middle_ids
            return ids + [self.codec.special.eos] * (self.seq_len - len(ids))

    def _windows(self, g: SourceFile, windows) -> list:
        if g.path not in self.windows:
            self.windows[g.path] = windows(g.text, relative_path(g.path), g.path)
        return self.windows[g.path]

    def batches(self, batch: int):
        """Endless [batch, seq_len] lists of ids."""
        while True:
            yield [self.sample() for _ in range(batch)]
