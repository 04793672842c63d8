"""The workspace's files as context may read them: which paths are inside the boundaries (a workspace
folder, not a secret, not ignored by git), the imports of a Python file resolved to such files (a bounded
number of names and of probes), and a file's text read without following a link or blocking on a
special file, checked on the open descriptor (docs/context.md, "Boundaries").

Runs in the context's worker thread (server/context_files.py), never in the event loop: everything here may
touch the disk. Its caches are the worker's alone. Knows paths and texts; nothing of the LSP or prompts.
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat
import time
from collections.abc import Callable, Iterable
from pathlib import Path

MAX_FILE_BYTES = 256 * 1024  # a file larger than this is not read
MAX_IGNORE_BYTES = 64 * 1024  # a .gitignore larger than this is not read (its folder's files stay out)
MAX_IMPORT_NAMES = 256  # imported names resolved per document, the first in its order: the rest never touch the disk
MAX_PROBES = 2048  # existence checks per resolution, all workspace folders together
MAX_IMPORTED = 16  # imported workspace files kept per document
MAX_READ_CACHE = 256  # files (and .gitignore files) whose text is kept, by their identity on disk
FRESH_SECONDS = 5.0  # a resolution or a boundary decision is trusted this long before it is made again

# Files that look like secrets: never read, even inside a workspace folder, open or not (matched on the
# lower-cased file name; a folder of these names puts everything under it out).
SECRET_NAMES = (
    ".env", ".env.*", "*.env", ".envrc", ".netrc", "_netrc", ".pgpass", ".npmrc", ".pypirc", ".yarnrc",
    ".git-credentials", ".htpasswd", ".dockercfg", "credentials", "credentials.*", "*credentials*",
    "secret", "secrets", "secret.*", "secrets.*", "*.secret", "*.secrets", "*.pem", "*.key", "*.p12", "*.pfx",
    "*.jks", "*.keystore", "*.kdbx", "*.gpg", "*.asc", "*.ovpn", "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*",
    "*.tfvars", "*.tfstate", "service-account*.json",
)  # fmt: skip
SECRET_FOLDERS = (".ssh", ".gnupg", ".aws", ".azure", ".kube", ".docker", ".git", ".password-store")

_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_OPEN_FLAGS |= getattr(os, "O_NOCTTY", 0)


def looks_secret(path: Path) -> bool:
    """The file's name or one of its folders' is in SECRET_NAMES / SECRET_FOLDERS."""
    if any(part.lower() in SECRET_FOLDERS for part in path.parts[:-1]):
        return True
    name = path.name.lower()
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in SECRET_NAMES)


def refused_root(real: Path, home: Path | None) -> str | None:
    """Why a workspace folder (a real path) is not read from, else None: the file system's root or a
    folder that holds the home folder (any symbolic link in a cloned repository would reach every file)."""
    if real == Path(real.anchor):
        return "the file system's root"
    if home is not None and (home == real or home.is_relative_to(real)):
        return "the home folder" if home == real else "a folder that holds the home folder"
    return None


class WorkspaceFiles:
    """The workspace folders (real paths) and what the worker learned of their files. `log(message)`
    says what was refused and why (once per path and reason)."""

    def __init__(self, log: Callable[[str], None] = lambda message: None, clock: Callable[[], float] = time.monotonic):
        self.log, self.clock = log, clock
        self.roots: tuple[Path, ...] = ()
        self._texts: dict[tuple[int, int, int, int], str] = {}  # (dev, ino, mtime_ns, size) -> text
        self._ignores: dict[Path, tuple[float, list[tuple[re.Pattern, bool, bool]]]] = {}
        self._allowed: dict[Path, tuple[float, bool]] = {}
        self._resolved: dict[tuple, tuple[float, list[Path]]] = {}
        self._said: set[str] = set()
        self.reads = 0  # files whose bytes were read (tests count them)

    def say(self, message: str) -> None:
        if message not in self._said:
            if len(self._said) > 1000:
                self._said.clear()
            self._said.add(message)
            self.log(message)

    def set_roots(self, roots: Iterable[Path]) -> None:
        """Real paths (already checked by `refused_root`); the caches made for other folders go."""
        roots = tuple(dict.fromkeys(roots))
        if roots != self.roots:
            self.roots = roots
            self._allowed.clear()
            self._resolved.clear()

    def root_of(self, real: Path) -> Path | None:
        return next((root for root in self.roots if real.is_relative_to(root)), None)

    # --- boundaries ---------------------------------------------------------------------------
    def allowed(self, real: Path) -> bool:
        """Whether context may use the file at `real` (a real path): inside a workspace folder, not a
        secret by its name, not ignored by git. Decided again after FRESH_SECONDS."""
        now = self.clock()
        known = self._allowed.get(real)
        if known is not None and now - known[0] < FRESH_SECONDS:
            return known[1]
        root = self.root_of(real)
        if root is None:
            ok = False
        elif looks_secret(real.relative_to(root)):
            self.say(f"context: {real} looks like a secret: never read")
            ok = False
        elif self.ignored(root, real):
            self.say(f"context: {real} is ignored by git: never read")
            ok = False
        else:
            ok = True
        if len(self._allowed) > 4096:
            self._allowed.clear()
        self._allowed[real] = (now, ok)
        return ok

    def ignored(self, root: Path, real: Path) -> bool:
        """Whether git ignores `real` (or a folder above it) by the .gitignore files from `root` down and
        `root`/.git/info/exclude (the global excludes file is not read). A folder excluded cannot have a
        file re-included, as in git."""
        rel = real.relative_to(root).parts
        for depth in range(1, len(rel) + 1):
            is_dir = depth < len(rel)
            verdict = None
            for base_depth in range(0, depth):
                base = root.joinpath(*rel[:base_depth])
                sub = "/".join(rel[base_depth:depth])
                for pattern, negated, dir_only in self._patterns(base, root if base_depth == 0 else None):
                    if dir_only and not is_dir:
                        continue
                    if pattern.fullmatch(sub):
                        verdict = not negated
            if verdict:
                return True
        return False

    def _patterns(self, folder: Path, root: Path | None) -> list[tuple[re.Pattern, bool, bool]]:
        now = self.clock()
        known = self._ignores.get(folder)
        if known is not None and now - known[0] < FRESH_SECONDS:
            return known[1]
        texts = [self.read(folder / ".gitignore", MAX_IGNORE_BYTES, quiet=True) or ""]
        if root is not None:
            texts.insert(0, self.read(root / ".git" / "info" / "exclude", MAX_IGNORE_BYTES, quiet=True) or "")
        patterns = [p for text in texts for line in text.splitlines() if (p := gitignore_pattern(line))]
        if len(self._ignores) > 1024:
            self._ignores.clear()
        self._ignores[folder] = (now, patterns)
        return patterns

    # --- reading ------------------------------------------------------------------------------
    def read(self, path: Path, limit: int = MAX_FILE_BYTES, quiet: bool = False) -> str | None:
        """The UTF-8 text of the regular file at `path`, else None. Never follows a link at its last
        component, never blocks (a FIFO, a device), checks the open descriptor, not the path: a regular
        file, at most `limit` bytes, its real path (/proc/self/fd, else the identity of the resolved
        path) inside a workspace folder; then reads at most `limit` + 1 bytes. An unchanged file (same
        device, inode, modification time and size) is read once."""
        try:
            real = Path(_resolve(path))
        except (OSError, ValueError):
            return None
        if self.root_of(real) is None:
            return None
        try:
            fd = os.open(real, _OPEN_FLAGS)
        except (OSError, ValueError):
            return None
        try:
            st = os.fstat(fd)
            why = None
            if not stat.S_ISREG(st.st_mode):
                why = "not a regular file"
            elif st.st_size > limit:
                why = f"{st.st_size} bytes, over {limit}"
            else:
                opened = _real_of(fd, real, st)
                if opened is None or self.root_of(opened) is None:
                    why = "its real path is outside the workspace folders"
            if why is not None:
                if not quiet:
                    self.say(f"context: {path} not read: {why}")
                return None
            key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
            if key in self._texts:
                return self._texts[key]
            data = _read_at_most(fd, limit + 1)
        except OSError:
            return None
        finally:
            os.close(fd)
        self.reads += 1
        if len(data) > limit:
            return None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return None
        if len(self._texts) >= MAX_READ_CACHE:
            self._texts.pop(next(iter(self._texts)))
        self._texts[key] = text
        return text

    # --- imports ------------------------------------------------------------------------------
    def resolve(self, here: Path | None, imports: list[tuple[int, str]]) -> list[Path]:
        """The workspace files (real paths, allowed) of `imports` ((level, dotted name), the first
        MAX_IMPORT_NAMES only: the caller caps them) of the document at `here` (a path, None: absolute
        imports only): absolute ones under each workspace folder, relative ones from the document's real
        folder (a level deeper than it goes is skipped). At most MAX_IMPORTED files and MAX_PROBES
        existence checks; the same question within FRESH_SECONDS is answered from the last answer."""
        real_here = None
        if here is not None:
            try:
                real_here = Path(_resolve(here))
            except (OSError, ValueError):
                real_here = None
        key = (real_here, self.roots, tuple(imports[:MAX_IMPORT_NAMES]))
        now = self.clock()
        known = self._resolved.get(key)
        if known is not None and now - known[0] < FRESH_SECONDS:
            return known[1]
        found: list[Path] = []
        seen: set[Path] = set()
        probes = 0
        parents = real_here.parents if real_here is not None else ()
        for level, name in imports[:MAX_IMPORT_NAMES]:
            if level == 0:
                bases: Iterable[Path] = self.roots
            elif level <= len(parents):
                bases = (parents[level - 1],)
            else:
                continue
            for base in bases:
                stem = base.joinpath(*name.split("."))
                for path in (stem.with_name(stem.name + ".py"), stem / "__init__.py"):
                    probes += 1
                    if probes > MAX_PROBES:
                        self.say(
                            f"context: more than {MAX_PROBES} candidate paths for {here}'s imports; the rest left out"
                        )
                        return self._keep(key, now, found)
                    try:
                        if not os.path.isfile(path):
                            continue
                        real = Path(_resolve(path))
                    except (OSError, ValueError):
                        continue
                    if real not in seen and self.allowed(real):
                        seen.add(real)
                        found.append(real)
                        if len(found) == MAX_IMPORTED:
                            return self._keep(key, now, found)
        return self._keep(key, now, found)

    def _keep(self, key: tuple, now: float, found: list[Path]) -> list[Path]:
        if len(self._resolved) > 256:
            self._resolved.clear()
        self._resolved[key] = (now, found)
        return found


def _resolve(path: Path | str) -> str:
    """The real path (symbolic links resolved). The one place a path is resolved before an open: a
    test hook swaps the file here, between the check and the open (tests/hooks/sitecustomize.py)."""
    return os.path.realpath(path)


def _real_of(fd: int, expected: Path, st: os.stat_result) -> Path | None:
    """The real path of an open descriptor: /proc/self/fd's link where there is one, else `expected`
    when it is the same file (device and inode) as the descriptor."""
    try:
        return Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        pass
    try:
        there = os.stat(expected, follow_symlinks=False)
    except OSError:
        return None
    return expected if (there.st_dev, there.st_ino) == (st.st_dev, st.st_ino) else None


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks, size = [], 0
    while size < limit:
        chunk = os.read(fd, min(65536, limit - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def gitignore_pattern(line: str) -> tuple[re.Pattern, bool, bool] | None:
    """One .gitignore line as (a regex over the path relative to the .gitignore's folder, negated,
    folders only), None for a blank line or a comment. A pattern without a slash but at its end matches
    a name at any depth; `**`, `*`, `?` and `[...]` as git reads them."""
    line = line.rstrip("\n\r")
    if not line.endswith("\\ "):
        line = line.rstrip(" ")
    if not line or line.startswith("#"):
        return None
    negated = line.startswith("!")
    if negated or line.startswith("\\!") or line.startswith("\\#"):
        line = line[1:]
    dir_only = line.endswith("/")
    line = line.rstrip("/")
    if not line:
        return None
    anchored = "/" in line
    line = line.lstrip("/")
    out, i = [], 0
    while i < len(line):
        c = line[i]
        if line.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if line.startswith("/**", i) and i + 3 == len(line):
            out.append("/.*")
            i += 3
            continue
        if line.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = line.find("]", i + 2)
            if end < 0:
                out.append(re.escape(c))
            else:
                body = line[i + 1 : end].replace("\\", "\\\\")
                out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
                i = end
        elif c == "\\" and i + 1 < len(line):
            i += 1
            out.append(re.escape(line[i]))
        else:
            out.append(re.escape(c))
        i += 1
    body = "".join(out)
    regex = body if anchored else f"(?:.*/)?{body}"
    try:
        return re.compile(regex, re.DOTALL), negated, dir_only
    except re.error:
        return None
