"""The training corpus: the standard library of the running interpreter, plus pinned, permissively
licensed third-party sdists listed in `corpus_manifest.json`; the split of every file by a stable hash.

Knows files, licences and hashes; nothing of tokens, models or training.

A file is held out when the first byte of the SHA-1 of its corpus path is below HELD_OUT_BYTE (about 5%
of files). Standard-library paths are relative to its root (the split v1 was trained on, unchanged);
third-party paths are `pypi/NAME/PATH-IN-SDIST`, without the version, so a version bump keeps the split.
Held-out files are never trained on; the infill evaluation cuts its tasks from them.

`build` rebuilds the corpus from the manifest into a cache folder: it downloads each pinned sdist with
pip (resumable: a verified sdist is never fetched twice), checks its sha256 and its licence, and writes
train.jsonl.gz, heldout.jsonl.gz (standard library) and heldout-thirdparty.jsonl.gz there; `add`
records a package in the manifest. Their command is `llada-lab corpus` (commands/corpus.py).
"""

from __future__ import annotations

import email.parser
import gzip
import hashlib
import json
import re
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

HELD_OUT_BYTE = 13  # 13/256 = 5.1% of files
SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__", "lib2to3/tests/data", "test/tokenizedata"}
MAX_FILE_BYTES = 400_000
MANIFEST = Path(__file__).with_name("corpus_manifest.json")
DEFAULT_CACHE = Path(".corpus")  # relative to where the command runs (the repository root); gitignored
SPLIT_FILES = {
    "train": "train.jsonl.gz",
    "heldout": "heldout.jsonl.gz",
    "heldout-thirdparty": "heldout-thirdparty.jsonl.gz",
}

# Licence families accepted, and how each is recognised: in an SPDX expression, a trove classifier, the
# free-text License field, and the licence file's own words (which must agree with the metadata).
LICENCES = {
    "MIT": (r"MIT(-0)?", r"MIT License", r"MIT( License)?", r"Permission is hereby granted, free of charge"),
    "BSD": (r"BSD-[234]-Clause|0BSD", r"BSD License", r"(new |modified |simplified |3-clause |2-clause )?BSD( License)?",
            r"Redistribution and use in source and binary forms"),
    "Apache-2.0": (r"Apache-2\.0", r"Apache Software License", r"Apache( License)?,?( Version)? ?2(\.0)?|Apache",
                   r"Apache License\s+Version 2\.0"),
    "PSF": (r"PSF-2\.0|Python-2\.0", r"Python Software Foundation License", r"PSF|Python Software Foundation License",
            r"PYTHON SOFTWARE FOUNDATION LICENSE"),
}  # fmt: skip
LICENCE_FILE = re.compile(r"(^|/)(LICEN[CS]E|COPYING)[^/]*$", re.IGNORECASE)
# Code vendored into a package carries its own licence; a file that names a copyleft licence is not ours.
VENDORED = re.compile(r"(^|/)(_?vendor(ed)?|third_party|extern)(/|$)")
OTHER_LICENCE = re.compile(r"GNU (Lesser |Library )?General Public|\bL?GPL(v?[23])?\b|Mozilla Public License|\bMPL\b")


class CorpusError(Exception):
    """The corpus cannot be built as the manifest says: the one-line reason, for the user."""


@dataclass(frozen=True)
class SourceFile:
    path: str  # the corpus path: relative to the stdlib root, or pypi/NAME/..., '/'-separated
    text: str


@dataclass(frozen=True)
class Package:
    """One manifest entry: a pinned sdist and what was read from it when it was recorded."""

    name: str
    version: str
    license: str  # as the sdist's metadata states it (an SPDX expression or a classifier's name)
    license_family: str  # one of LICENCES
    license_file: str  # the licence file found in the sdist, relative to its top folder
    sdist: str  # the file name pip downloads
    sha256: str
    files: int  # .py files kept from it
    bytes: int  # their UTF-8 size


# ---- the standard library ------------------------------------------------------------------------


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_held_out(rel_path: str) -> bool:
    return hashlib.sha1(rel_path.encode()).digest()[0] < HELD_OUT_BYTE


def iter_files(split: str, root: Path | None = None, max_bytes: int = MAX_FILE_BYTES) -> list[SourceFile]:
    """All standard-library `.py` files of one split ('train' or 'heldout'), sorted by path, UTF-8."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    root = root or stdlib_root()
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if any(part in rel for part in SKIP_DIRS) or path.stat().st_size > max_bytes:
            continue
        if is_held_out(rel) != (split == "heldout"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            files.append(SourceFile(rel, text))
    return files


# ---- third-party sdists --------------------------------------------------------------------------


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _members(sdist: Path) -> Iterator[tuple[str, bytes]]:
    """(path without the top folder, content) of every regular file of a .tar.gz or .zip sdist."""
    if sdist.name.endswith(".zip"):
        with zipfile.ZipFile(sdist) as z:
            for info in z.infolist():
                if not info.is_dir() and "/" in info.filename:
                    yield info.filename.split("/", 1)[1], z.read(info)
        return
    with tarfile.open(sdist) as t:
        for member in t:
            if member.isfile() and "/" in member.name:
                f = t.extractfile(member)
                if f is not None:
                    yield member.name.split("/", 1)[1], f.read()


def _matches(pattern: str, text: str) -> bool:
    return re.fullmatch(pattern, text.strip(), re.IGNORECASE) is not None


def licence_of_metadata(pkg_info: str) -> tuple[str, set[str]]:
    """(the licence as stated, the accepted families it allows) from PKG-INFO. An SPDX `OR` allows
    any of its sides; `AND` needs every side accepted. ("", set()): the metadata states none."""
    meta = email.parser.Parser().parsestr(pkg_info)
    if expression := (meta.get("License-Expression") or "").strip():
        sides = [s.strip("() ") for s in re.split(r"\s+(?:OR|AND)\s+", expression)]
        found = [{fam for fam, pats in LICENCES.items() if _matches(pats[0], side)} for side in sides]
        if " AND " in expression and not all(found):
            return expression, set()
        return expression, set().union(*found)
    classifiers = [
        c.rsplit("::", 1)[-1].strip() for c in meta.get_all("Classifier") or [] if c.startswith("License ::")
    ]
    families = {fam for c in classifiers for fam, pats in LICENCES.items() if _matches(pats[1], c)}
    if classifiers:
        return " / ".join(classifiers), families
    stated = (meta.get("License") or "").strip().splitlines()
    first = stated[0].strip() if stated else ""
    families = {fam for fam, pats in LICENCES.items() if first and _matches(pats[2], first)}
    return (first, families) if families else ("", set())  # free text not understood: the file decides


def licence_of_file(text: str) -> set[str]:
    return {fam for fam, pats in LICENCES.items() if re.search(pats[3], text, re.IGNORECASE)}


def read_sdist(sdist: Path, name: str, max_bytes: int = MAX_FILE_BYTES,
               sha256: str | None = None) -> tuple[Package, list[SourceFile], int]:  # fmt: skip
    """What an sdist holds for the corpus: its manifest entry (licence read from its PKG-INFO and
    confirmed by its licence file), its kept `.py` files, and how many were refused for a licence of
    their own. Raises CorpusError when the sdist has no accepted licence or no licence file.
    `sha256`: the sdist's, already verified (else it is computed here)."""
    pkg_info, licence_files, py = None, {}, []
    for rel, data in _members(sdist):
        if rel == "PKG-INFO":
            pkg_info = data.decode("utf-8", "replace")
        elif LICENCE_FILE.search(rel):
            licence_files[rel] = data.decode("utf-8", "replace")
        elif rel.endswith(".py"):
            py.append((rel, data))
    if pkg_info is None:
        raise CorpusError(f"{sdist.name}: no PKG-INFO, so no licence metadata")
    stated, families = licence_of_metadata(pkg_info)
    if not licence_files:
        raise CorpusError(f"{sdist.name}: no licence file (LICENSE*, COPYING*): refused")
    by_file = {
        rel: licence_of_file(text) for rel, text in sorted(licence_files.items(), key=lambda kv: kv[0].count("/"))
    }
    if not stated:  # no licence in the metadata: the top-level licence file decides
        stated, families = "(from the licence file)", next(iter(by_file.values()))
    agreeing = [(rel, fams & families) for rel, fams in by_file.items() if fams & families]
    if not agreeing:
        raise CorpusError(
            f"{sdist.name}: licence {stated!r} is not one of {', '.join(LICENCES)} "
            "(or no licence file says so): refused"
        )
    licence_file, family = agreeing[0][0], min(agreeing[0][1])
    version = email.parser.Parser().parsestr(pkg_info).get("Version", "")
    files, refused = [], 0
    for rel, data in sorted(py):
        if VENDORED.search(rel) or len(data) > max_bytes:
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if not text.strip():
            continue
        if OTHER_LICENCE.search(text[:3000]):
            refused += 1
            continue
        files.append(SourceFile(f"pypi/{name}/{rel}", text))
    package = Package(
        name,
        version,
        stated,
        family,
        licence_file,
        sdist.name,
        sha256 or sha256_of(sdist),
        len(files),
        sum(len(f.text.encode()) for f in files),
    )
    return package, files, refused


def load_manifest(path: Path = MANIFEST) -> list[Package]:
    try:
        entries = json.loads(path.read_text())["packages"]
    except FileNotFoundError:
        raise CorpusError(f"no manifest at {path}") from None
    except (ValueError, KeyError, TypeError) as e:
        raise CorpusError(f"{path}: not a corpus manifest ({e})") from None
    return [Package(**e) for e in entries]


def save_manifest(packages: list[Package], path: Path = MANIFEST) -> None:
    body = {
        "about": "Third-party sources of the embedded model's corpus; `llada-lab corpus` "
                 "rebuilds the corpus from it. files/bytes: the .py files kept from each sdist.",
        "packages": [asdict(p) for p in sorted(packages, key=lambda p: p.name.lower())],
    }  # fmt: skip
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body, indent=1) + "\n")
    tmp.replace(path)


Downloader = Callable[[str, str, Path], Path]


def pip_download(name: str, version: str, folder: Path) -> Path:
    """Fetch the sdist of NAME==VERSION into `folder` with pip (no wheels, no dependencies)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "--disable-pip-version-check",
           "--quiet", "-d", str(folder), f"{name}=={version}"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)  # its failure is told below
    got = sorted(p for p in folder.iterdir() if p.name.endswith((".tar.gz", ".zip")))
    if done.returncode != 0 or not got:
        said = (done.stderr.strip().splitlines() or ["no sdist saved"])[-1]
        raise CorpusError(f"pip could not download {name}=={version} ({said})")
    return got[0]


def fetch(package: Package, cache: Path, download: Downloader | None = pip_download) -> tuple[Path, bool]:
    """The verified sdist in `cache/sdists`, downloaded unless already there; (path, downloaded).
    download=None: offline, a missing sdist is an error."""
    folder = cache / "sdists"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / package.sdist
    if path.is_file() and sha256_of(path) == package.sha256:
        return path, False
    if download is None:
        state = "is damaged (its sha256 differs)" if path.is_file() else "is not"
        raise CorpusError(
            f"{package.sdist} {state} in {folder} (offline: put it there by hand, sha256 {package.sha256})"
        )
    with tempfile.TemporaryDirectory(dir=folder, prefix=".partial-") as tmp:
        try:
            got = download(package.name, package.version, Path(tmp))
        except CorpusError as e:
            raise CorpusError(
                f"{e}; offline? put {package.sdist} (sha256 {package.sha256}) in {folder} and run "
                "again, or check the network"
            ) from None
        if got.name != package.sdist:
            raise CorpusError(
                f"{package.name}=={package.version}: pip saved {got.name}, the manifest says {package.sdist}"
            )
        if (digest := sha256_of(got)) != package.sha256:
            raise CorpusError(f"{package.sdist}: sha256 {digest}, the manifest says {package.sha256}: refused")
        got.replace(path)  # in place only once verified: an interrupted run leaves no half file behind
    return path, True


def package_files(package: Package, sdist: Path) -> list[SourceFile]:
    """The kept files of the sdist `fetch` returned (its sha256 verified there), checked against what
    the manifest recorded."""
    read, files, _ = read_sdist(sdist, package.name, sha256=package.sha256)
    if read.license_family != package.license_family:
        raise CorpusError(f"{package.sdist}: licence read as {read.license!r}, the manifest says {package.license!r}")
    if (read.files, read.bytes) != (package.files, package.bytes):
        raise CorpusError(
            f"{package.sdist}: {read.files} files / {read.bytes} bytes kept, the manifest says "
            f"{package.files} / {package.bytes} (the filter changed? re-run `corpus add`)"
        )
    return files


# ---- the built corpus ----------------------------------------------------------------------------


def dump(files: list[SourceFile], path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        for sf in files:
            f.write(json.dumps({"path": sf.path, "text": sf.text}) + "\n")
    tmp.replace(path)


def load(path: Path) -> list[SourceFile]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [SourceFile(**json.loads(line)) for line in f if line.strip()]


def write(files: list[SourceFile], path: Path, log: Callable[[str], None] = print, label: str = "") -> None:
    """`dump`, then one line on what was written."""
    dump(files, path)
    log(f"{label}{len(files)} files, {sum(len(f.text) for f in files) / 1e6:.1f} M characters -> {path}")


def split_paths(cache: Path) -> dict[str, Path]:
    return {split: cache / name for split, name in SPLIT_FILES.items()}


def build(cache: Path, manifest: Path = MANIFEST, download: Downloader | None = pip_download,
          stdlib: Path | None = None, log: Callable[[str], None] = print) -> dict[str, Path]:  # fmt: skip
    """Fetch and verify every sdist of the manifest, then write the three split files into `cache`."""
    packages = load_manifest(manifest)
    third_party: list[SourceFile] = []
    for i, package in enumerate(packages, 1):
        sdist, downloaded = fetch(package, cache, download)
        files = package_files(package, sdist)
        third_party += files
        log(
            f"[{i}/{len(packages)}] {package.name} {package.version} ({package.license_family}): "
            f"{'downloaded' if downloaded else 'cached'}, {len(files)} files, {package.bytes / 1e6:.2f} MB"
        )
    splits = {
        "train": iter_files("train", stdlib) + [f for f in third_party if not is_held_out(f.path)],
        "heldout": iter_files("heldout", stdlib),
        "heldout-thirdparty": [f for f in third_party if is_held_out(f.path)],
    }
    paths = split_paths(cache)
    for split, files in splits.items():
        write(files, paths[split], log, f"{split}: ")
    return paths


def add(specs: list[str], cache: Path, manifest: Path = MANIFEST, download: Downloader = pip_download,
        log: Callable[[str], None] = print) -> None:  # fmt: skip
    """Record NAME==VERSION packages in the manifest (replacing an entry of the same name)."""
    entries = {p.name.lower(): p for p in (load_manifest(manifest) if manifest.is_file() else [])}
    folder = cache / "sdists"
    folder.mkdir(parents=True, exist_ok=True)
    for spec in specs:
        name, sep, version = spec.partition("==")
        if not sep or not name or not version:
            raise CorpusError(f"{spec!r}: pin it as NAME==VERSION")
        with tempfile.TemporaryDirectory(dir=folder, prefix=".partial-") as tmp:
            got = download(name, version, Path(tmp))
            package, _, refused = read_sdist(got, name)
            got.replace(folder / got.name)
        entries[name.lower()] = package
        log(
            f"{name} {version}: {package.license} ({package.license_family}, {package.license_file}), "
            f"{package.files} files, {package.bytes / 1e6:.2f} MB" + (f", {refused} refused" if refused else "")
        )
    save_manifest(list(entries.values()), manifest)
