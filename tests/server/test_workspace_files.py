"""The workspace reader's boundaries in-process (server/workspace_files.py, server/uris.py): URIs that
name no local file, secrets, files git ignores, refused roots, the safe open (a FIFO, a device, a folder,
a link swapped in after the check), bounded import resolution, a file unchanged read once, and the rule
that keeps snippets from an engine elsewhere. The same cases through the real server:
test_context_hostile.py."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from llada_lsp.completion.python_names import python_imports
from llada_lsp.server import workspace_files
from llada_lsp.server.context_files import ContextFiles
from llada_lsp.server.documents import Document
from llada_lsp.server.uris import path_of
from llada_lsp.server.workspace_files import (
    MAX_IMPORT_NAMES,
    MAX_IMPORTED,
    WorkspaceFiles,
    gitignore_pattern,
    looks_secret,
    refused_root,
)


def test_uris_that_name_no_local_file_are_none_and_said():
    said = []
    assert path_of("file:///home/u/a.py", said.append) == "/home/u/a.py"
    assert path_of("file://localhost/a%20b.py") == "/a b.py"
    for uri in ("file:///a%00b.py", "file:///a\x00b.py", "file:///bad%zz.py", "file:///%ff%fe.py", "file:relative.py",
                "file:///a/../b.py", "file:///a/./b.py", "file://host/a.py", "file:///" + "a" * 5000):  # fmt: skip
        assert path_of(uri, said.append) is None, uri
    assert len(said) == 9
    assert path_of("untitled:Untitled-1", said.append) is None and path_of("https://x/a.py") is None
    assert len(said) == 9, "another scheme is not a file: nothing to say"


def test_secret_names_and_refused_roots():
    for name in (".env", ".env.local", "prod.env", "credentials", "aws_credentials.ini", "id_rsa", "id_ed25519.pub",
                 "server.key", "cert.pem", "secrets.yaml", ".ssh/config", ".git/config", "a/.aws/config"):  # fmt: skip
        assert looks_secret(Path(name)), name
    for name in ("main.py", "keys.py", "environment.py", "docs/secretary.md"):
        assert not looks_secret(Path(name)), name
    home = Path("/home/u")
    assert refused_root(Path("/"), home) and refused_root(home, home) and refused_root(Path("/home"), home)
    assert refused_root(Path("/home/u/project"), home) is None


@pytest.mark.parametrize(
    ("pattern", "yes", "no"),
    [
        ("build/", ["build"], ["src/build.py"]),
        ("*.log", ["a.log", "x/y/b.log"], ["a.log.py"]),
        ("/top.py", ["top.py"], ["x/top.py"]),
        ("docs/*.md", ["docs/a.md"], ["docs/x/a.md", "a.md"]),
        ("**/gen/*.py", ["gen/a.py", "x/gen/a.py"], ["gen/x/a.py"]),
        ("out/**", ["out/a", "out/x/y"], ["out"]),
        ("file[0-9].py", ["file1.py"], ["filex.py"]),
    ],
)
def test_gitignore_patterns_match_as_git_reads_them(pattern: str, yes: list[str], no: list[str]):
    regex, negated, _ = gitignore_pattern(pattern)
    assert not negated
    assert all(regex.fullmatch(p) for p in yes) and not any(regex.fullmatch(p) for p in no)
    assert gitignore_pattern("# comment") is None and gitignore_pattern("   ") is None
    assert gitignore_pattern("!keep.py")[1]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "good.py").write_text("def good(): pass\n")
    (tmp_path / "outside.py").write_text("OUTSIDE = 1\n")
    return Path(os.path.realpath(root))


def reader(ws: Path) -> WorkspaceFiles:
    files = WorkspaceFiles()
    files.set_roots([ws])
    return files


def test_git_ignored_files_and_folders_are_out_and_a_negation_brings_a_file_back(ws: Path):
    (ws / ".gitignore").write_text("build/\n*.log\n!keep.log\n")
    (ws / "pkg" / ".gitignore").write_text("local_*.py\n")
    (ws / ".git" / "info").mkdir(parents=True)
    (ws / ".git" / "info" / "exclude").write_text("private.py\n")
    files = reader(ws)
    for rel, out in [("pkg/good.py", False), ("build/x/gen.py", True), ("a.log", True), ("keep.log", False),
                     ("pkg/local_dev.py", True), ("local_dev.py", False), ("private.py", True)]:  # fmt: skip
        assert files.ignored(ws, ws / rel) is out, rel
        assert files.allowed(ws / rel) is not out, rel
    assert not files.allowed(ws / ".env") and not files.allowed(ws.parent / "outside.py")


def test_the_safe_open_refuses_fifos_devices_folders_links_out_and_huge_files(ws: Path):
    pkg = ws / "pkg"
    os.mkfifo(pkg / "fifo.py")
    (pkg / "zero.py").symlink_to("/dev/zero")
    (pkg / "folder.py").mkdir()
    (pkg / "out.py").symlink_to(ws.parent / "outside.py")
    (pkg / "in.py").symlink_to(pkg / "good.py")
    with open(pkg / "huge.py", "wb") as f:
        f.truncate(50 * 2**20)
    (pkg / "binary.py").write_bytes(b"\xff\xfe\x00\x80")
    files = reader(ws)
    start = time.monotonic()
    for name in ("fifo.py", "zero.py", "folder.py", "out.py", "huge.py", "binary.py", "missing.py"):
        assert files.read(pkg / name) is None, name
    assert time.monotonic() - start < 5, "nothing blocks"
    assert files.read(pkg / "in.py") == "def good(): pass\n", "a link inside the workspace is followed"


@pytest.mark.parametrize("swap", ["fifo", "link", "folder"])
def test_a_file_swapped_after_its_check_is_not_read(ws: Path, monkeypatch, swap: str):
    """The race, deterministic: the path is resolved (and checked), then swapped before the open."""
    victim = ws / "pkg" / "good.py"

    def resolve_then_swap(path):
        real = os.path.realpath(path)
        if real == str(victim) and victim.is_file():
            victim.unlink()
            if swap == "fifo":
                os.mkfifo(victim)
            elif swap == "link":
                victim.symlink_to(ws.parent / "outside.py")
            else:
                victim.mkdir()
        return real

    monkeypatch.setattr(workspace_files, "_resolve", resolve_then_swap)
    files = reader(ws)
    start = time.monotonic()
    assert files.read(victim) is None
    assert time.monotonic() - start < 5


def test_resolution_is_bounded_and_linear_and_an_unchanged_file_is_read_once(ws: Path, monkeypatch):
    for i in range(300):
        (ws / "pkg" / f"m{i}.py").write_text(f"value_{i} = {i}\n")
    text = "".join(f"import pkg.m{i}\n" for i in range(5000)) + "import " + ", ".join(f"q{i}" for i in range(30000))
    imports = python_imports(text, MAX_IMPORT_NAMES)
    assert len(imports) == MAX_IMPORT_NAMES
    probes = []
    real_isfile = os.path.isfile
    monkeypatch.setattr(os.path, "isfile", lambda p: probes.append(p) or real_isfile(p))
    files = reader(ws)
    found = files.resolve(ws / "main.py", imports)
    assert len(found) == MAX_IMPORTED and len(probes) <= MAX_IMPORTED * 2
    probes.clear()
    assert files.resolve(ws / "main.py", imports) == found and not probes, "asked again: answered from memory"
    for path in found:
        files.read(path)
    reads = files.reads
    for path in found:
        files.read(path)
    assert files.reads == reads, "an unchanged file is not read again"
    found[0].write_text("changed = 1\n")
    assert files.read(found[0]) == "changed = 1\n" and files.reads == reads + 1


def test_a_deep_relative_import_is_skipped_and_an_outside_document_is_not_a_source(ws: Path):
    files = ContextFiles()
    files.set_roots([ws.as_uri()])
    doc = Document(
        (ws / "pkg" / "main.py").as_uri(), 1, "from " + "." * 40 + " import zz\nfrom . import good\n", "python"
    )
    assert [p.name for p in files.imported(doc)] == ["good.py"]
    outside = Document((ws.parent / "outside.py").as_uri(), 1, "OUTSIDE = 1\n", "python")
    secret = Document((ws / ".env").as_uri(), 1, "TOKEN = 1\n", "dotenv")
    inside = Document((ws / "notes.py").as_uri(), 1, "NOTES = 1\n", "python")
    found = files.gather_now(doc, [doc, outside, secret, inside])
    assert found.allowed == {doc.uri, inside.uri}
    files.outside_workspace = True
    assert files.usable(outside, found) and files.usable(secret, found)


def test_a_workspace_folder_of_the_root_or_home_is_refused_with_a_log_line(tmp_path: Path, monkeypatch):
    said = []
    monkeypatch.setenv("HOME", str(tmp_path))
    files = ContextFiles(log=said.append)
    files.set_roots(["file:///", tmp_path.as_uri(), "file:///a%00b", (tmp_path / "project").as_uri()])
    assert files.roots == [Path(os.path.realpath(tmp_path / "project"))]
    assert sum("not read from" in line for line in said) == 3, said


async def test_gather_waits_at_most_its_budget_and_the_answer_serves_the_next_choice(ws: Path, monkeypatch):
    files = ContextFiles()
    files.set_roots([ws.as_uri()])
    slow = files._work

    def slow_work(key):
        time.sleep(0.5)
        return slow(key)

    monkeypatch.setattr(files, "_work", slow_work)
    doc = Document((ws / "main.py").as_uri(), 1, "from pkg import good\n", "python")
    start = time.monotonic()
    found = await files.gather(doc, [doc], budget=0.05)
    assert time.monotonic() - start < 0.4 and found.imported == ()
    await asyncio.sleep(0.8)
    found = await files.gather(doc, [doc], budget=0.05)
    assert [p.name for p in found.imported] == ["__init__.py", "good.py"]
    files.close()


def test_snippets_go_to_an_engine_elsewhere_only_when_allowed():
    from llada_lsp.server.completers import LocalCompleter, RemoteCompleter

    def remote(address: str, revise) -> RemoteCompleter:
        c = object.__new__(RemoteCompleter)
        c.address, c.client = address, SimpleNamespace(welcome=SimpleNamespace(revise=revise))
        return c

    assert LocalCompleter.leaves_machine is False
    for completer, leaves in [(remote("unix:/tmp/s", None), False), (remote("tcp://h:1", None), True),
                              (remote("unix:/tmp/s", False), True)]:  # fmt: skip
        assert completer.leaves_machine is leaves


async def test_no_snippets_for_an_engine_elsewhere_without_context_remote(ws: Path):
    from llada_lsp.server.cross_file import CrossFile
    from llada_lsp.server.open_documents import OpenDocuments
    from llada_lsp.server.settings import Settings

    said = []
    elsewhere = SimpleNamespace(leaves_machine=True)
    cross_file = CrossFile(ContextFiles(), OpenDocuments(), Settings, lambda: elsewhere, said.append)
    doc = Document((ws / "main.py").as_uri(), 1, "from pkg import good\ngood(", "python")
    assert await cross_file.snippets_for(doc, len(doc.text)) == ()
    assert await cross_file.snippets_for(doc, len(doc.text)) == ()
    assert len(said) == 1 and "contextRemote" in said[0]
