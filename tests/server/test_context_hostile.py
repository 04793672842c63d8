"""Context under hostile and unlucky workspaces, through the real server over stdio (issue 54): thousands
of imports, a 200,000-character import line, a file swapped for a FIFO or an outside link between the
check and the open, relative imports deeper than the file's real path, `%00` and other broken URIs,
documents and roots outside the boundaries, a 5.8 MB rewrite, and the cases that held before (links to
/etc/passwd, FIFOs, /dev/zero, a folder named x.py, huge, binary and cyclic files). Each case has a time
limit: a request that hangs fails its test, never the run.

What reached a prompt is read from the test hook's prompt log (tests/hooks/sitecustomize.py,
LLADA_LSP_TEST_PROMPT_LOG: each job's snippets), what the server refused from its log."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llada_lsp.lsp_client import LspClient, LspError, position

pytestmark = pytest.mark.slow

LOAD_TIMEOUT = float(os.environ.get("LLADA_TEST_TIMEOUT", "120"))
ANSWER = 60.0  # a request's limit: far above any answer; a hang (a blocked open, a loop) passes it
OUTSIDE = "def rectangle_area_outside_secret(width, height):\n    return width * 31337\n"
GOOD = "def rectangle_area(width, height):\n    return width * height\n"
CURSOR = "\n\ndef total(width, height):\n    return rectangle_area("


class Editor:
    """One `llada-lsp` over stdio with the prompt log's hook on, and its log."""

    def __init__(self, client: LspClient, prompts: Path):
        self.client, self.prompts, self.logs = client, prompts, []
        client.on("window/logMessage", lambda params: self.logs.append(params["message"]))

    @classmethod
    async def start(cls, tmp: Path, workspace: Path | None, options: dict | None = None,
                    folders: list[str] | None = None, env: dict | None = None) -> Editor:  # fmt: skip
        prompts = tmp / "prompts.jsonl"
        environ = {**os.environ, "LLADA_LSP_TEST_PROMPT_LOG": str(prompts), **(env or {})}
        command = [sys.executable, "-m", "llada_lsp", "--engine", "local", "--threads", "1"]
        editor = cls(await LspClient.start(command, stderr="discard", env=environ), prompts)
        client = editor.client
        root = workspace.as_uri() if workspace is not None else None
        params = {"processId": os.getpid(), "rootUri": root, "initializationOptions": {"maxCompletionTokens": 8,
                  **(options or {})}, "capabilities": {"general": {"positionEncodings": ["utf-16"]}}}  # fmt: skip
        uris = ([root] if root else []) + (folders or [])
        if uris:
            params["workspaceFolders"] = [{"uri": uri, "name": f"f{i}"} for i, uri in enumerate(uris)]
        await client.request("initialize", params, LOAD_TIMEOUT)
        client.notify("initialized", {})
        deadline = time.monotonic() + LOAD_TIMEOUT
        while (await editor.status())["state"] != "ready":
            assert time.monotonic() < deadline, "the model did not load"
            await asyncio.sleep(0.2)
        return editor

    async def status(self, timeout: float = ANSWER) -> dict:
        return await self.client.request("workspace/executeCommand", {"command": "llada.status"}, timeout)

    def send(self, doc, offset: int):
        params = {"textDocument": {"uri": doc.uri}, "position": position(doc, offset, self.client.encoding),
                  "context": {"triggerKind": 1}}  # fmt: skip
        return self.client.send("textDocument/inlineCompletion", params)

    async def complete(self, doc, offset: int | None = None):
        return await self.client.result(self.send(doc, len(doc.text) if offset is None else offset), ANSWER)

    def prompt_texts(self) -> str:
        """Every snippet text any job carried, joined."""
        if not self.prompts.exists():
            return ""
        return "\n".join(t for line in self.prompts.read_text().splitlines() for t in json.loads(line)["texts"])

    def prompt_paths(self) -> list[str]:
        if not self.prompts.exists():
            return []
        return [p for line in self.prompts.read_text().splitlines() for p in json.loads(line)["paths"]]

    async def stop(self) -> None:
        assert await self.client.shutdown(timeout=ANSWER) == 0


async def timed(coroutine) -> tuple[float, object]:
    start = time.perf_counter()
    result = await coroutine
    return time.perf_counter() - start, result


async def completion_and_status(editor: Editor, doc) -> tuple[float, float]:
    """(the completion's seconds, the seconds of a status request sent right after it)."""
    start = time.perf_counter()
    request = editor.send(doc, len(doc.text))
    status_took, _ = await timed(editor.status())
    await editor.client.result(request, ANSWER)
    return time.perf_counter() - start, status_took


async def compare_on_off(editor: Editor, doc, rounds: int) -> dict:
    """Completions with contextFiles on and off, interleaved (a machine's load drifts alike for both),
    each on a new line (so each makes a new choice, the work measured): the medians, and the status
    requests' latencies sent during the ones with context."""
    took: dict[str, list[float]] = {"on": [], "off": []}
    statuses: list[float] = []
    for i in range(rounds):
        for state in ("on", "off"):
            settings = {"llada": {"contextFiles": state == "on"}}
            editor.client.notify("workspace/didChangeConfiguration", {"settings": settings})
            editor.client.did_change(doc, len(doc.text), len(doc.text), f"\n    value_{state}_{i} = rectangle_area(")
            seconds, status = await completion_and_status(editor, doc)
            took[state].append(seconds)
            if state == "on":
                statuses.append(status)
    out = {k: statistics.median(v) for k, v in took.items()}
    # The bound: 50 ms over the same completion without context, plus half of that completion's own time:
    # a loaded machine slows both alike (at load 27 on 2 cores a completion without context took 400 ms
    # against 70 on a quiet one); the old code took seconds more.
    out["bound"] = 0.05 + 0.5 * out["off"]
    out["status_median"], out["status_max"] = statistics.median(statuses), max(statuses)
    print(f"completion medians: {out} (all: {took}, statuses: {statuses})")
    return out


def write_package(root: Path, name: str, count: int) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text("")
    for i in range(count):
        (root / name / f"m{i}.py").write_text(f"def area_{i}(width, height):\n    return width * height + {i}\n")


# --- 1. many imports ------------------------------------------------------------------------------
async def test_five_thousand_imports_cost_a_completion_no_more_than_no_context(tmp_path: Path):
    """Old: every import resolved on disk, in the event loop, quadratically: 2.7-5.1 s a completion and
    a status request waiting as long. Now at most MAX_IMPORT_NAMES names, in the worker, within a budget."""
    ws = tmp_path / "ws"
    write_package(ws, "many", 5000)
    editor = await Editor.start(tmp_path, ws)
    try:
        text = "".join(f"import many.m{i}\n" for i in range(5000)) + GOOD + CURSOR
        doc = editor.client.did_open((ws / "main.py").as_uri(), text)
        await editor.complete(doc)  # the first: the worker's caches are cold
        figures = await compare_on_off(editor, doc, 7)
        assert figures["on"] - figures["off"] <= figures["bound"], figures
        assert figures["status_median"] <= 0.1 and figures["status_max"] <= 1.0, figures
        assert "many/m0.py" in editor.prompt_paths(), "the first imports are still sources"
    finally:
        await editor.stop()


async def test_a_200000_character_import_line_costs_a_completion_no_more_than_no_context(tmp_path: Path):
    """Old: 20-39 s a completion for one `import q0, q1, ...` line of 200,000 characters."""
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(200):
        (ws / f"q{i}.py").write_text(f"q_value_{i} = {i}\n")
    line = "import " + ", ".join(f"q{i}" for i in range(40_000))
    line = line[: line.rfind(",", 0, 200_000)] + "\n"
    editor = await Editor.start(tmp_path, ws)
    try:
        doc = editor.client.did_open((ws / "main.py").as_uri(), line + GOOD + CURSOR)
        await asyncio.wait_for(editor.complete(doc), ANSWER)
        figures = await compare_on_off(editor, doc, 5)
        assert figures["on"] - figures["off"] <= figures["bound"], figures
        assert figures["status_median"] <= 0.1 and figures["status_max"] <= 1.0, figures
    finally:
        await editor.stop()


# --- 2. the race -----------------------------------------------------------------------------------
@pytest.mark.parametrize("swap", ["fifo", "link"])
async def test_a_file_swapped_between_the_check_and_the_open_is_not_read(tmp_path: Path, swap: str):
    """The test hook swaps pkg/victim.py for a FIFO or a link to a file outside the workspace right
    after the server resolved its path (its checks done). Old: open() blocked on the FIFO for good
    (status and shutdown never answered); the link's target went into the prompt."""
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "__init__.py").write_text("")
    (ws / "pkg" / "victim.py").write_text(GOOD)
    outside = tmp_path / "outside.py"
    outside.write_text(OUTSIDE)
    target = os.path.join(os.path.realpath(ws), "pkg", "victim.py")
    kind = "fifo" if swap == "fifo" else f"link:{outside}"
    editor = await Editor.start(tmp_path, ws, env={"LLADA_LSP_TEST_SWAP": f"{target}::{kind}"})
    try:
        doc = editor.client.did_open((ws / "main.py").as_uri(), "from pkg.victim import rectangle_area\n" + CURSOR)
        await editor.complete(doc)
        assert Path(target).is_fifo() if swap == "fifo" else Path(target).is_symlink(), "the hook did not swap"
        took, _ = await timed(editor.status(timeout=10))
        assert took <= 1.0
        assert "31337" not in editor.prompt_texts() and "outside_secret" not in editor.prompt_texts()
    finally:
        await editor.stop()


# --- 3. relative imports deeper than the real path ----------------------------------------------
async def test_a_relative_import_deeper_than_the_real_path_is_skipped(tmp_path: Path):
    """Old: `-32603 internal error (IndexError)` on every completion in such a document (the bound
    counted the URI's parents and indexed the real path's)."""
    ws = tmp_path / "ws"
    (ws / "a" / "b" / "c" / "d").mkdir(parents=True)
    shallow = Path(os.path.realpath(__import__("tempfile").mkdtemp(prefix="sh")))  # /tmp/shXXXX: 2 parents
    try:
        (ws / "a" / "b" / "c" / "d" / "e").symlink_to(shallow, target_is_directory=True)
        editor = await Editor.start(tmp_path, ws)
        try:
            deep = "from ........ import zz\n" + GOOD + CURSOR
            linked = editor.client.did_open((ws / "a" / "b" / "c" / "d" / "e" / "main.py").as_uri(), deep)
            answer = await editor.complete(linked)
            assert isinstance(answer, dict) and "items" in answer
            dotted = ws.as_uri() + "/a/../a/../a/../a/../a/../a/../a/../a/../x.py"
            with_dots = editor.client.did_open(dotted, "from ........... import zz\n" + GOOD + CURSOR)
            answer = await editor.complete(with_dots)
            assert isinstance(answer, dict) and "items" in answer
            assert any("'..'" in line for line in editor.logs), "the '..' URI is said in the log"
        finally:
            await editor.stop()
    finally:
        os.rmdir(shallow)


# --- 4. %00 and other broken URIs -----------------------------------------------------------------
async def test_nul_and_broken_uris_are_ignored_with_a_log_line(tmp_path: Path):
    """Old: a workspace folder with %00 failed `initialize` (the model never loaded, status "loading"
    for good); an open document with %00 made every completion in every document fail -32603."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "geometry.py").write_text(GOOD)
    editor = await Editor.start(tmp_path, ws, folders=[ws.as_uri() + "/sub%00dir", "file:relative/dir", "file:///%zz"])
    try:
        main = editor.client.did_open((ws / "main.py").as_uri(), "from geometry import rectangle_area\n" + CURSOR)
        broken = [ws.as_uri() + "/a%00b.py", ws.as_uri() + "/bad%zz.py", "file:relative.py", "untitled:Untitled-1",
                  ws.as_uri() + "/%ff%fe.py"]  # fmt: skip
        docs = [editor.client.did_open(uri, GOOD + CURSOR) for uri in broken]
        for doc in [main, *docs]:
            answer = await editor.complete(doc)
            assert isinstance(answer, dict) and "items" in answer, doc.uri
        assert any("NUL" in line for line in editor.logs), editor.logs
        assert "geometry.py" in editor.prompt_paths()
    finally:
        await editor.stop()


# --- 5. boundaries ---------------------------------------------------------------------------------
async def test_documents_outside_the_boundaries_never_reach_a_python_prompt(tmp_path: Path):
    """Old: a credentials file open in the editor (as `ini`) went into a Python completion's prompt."""
    ws = tmp_path / "ws"
    (ws / "build").mkdir(parents=True)
    (ws / ".gitignore").write_text("build/\n*.log\n")
    secret_words = "rectangle_area width height total"
    outside = tmp_path / "home" / ".aws"
    outside.mkdir(parents=True)
    editor = await Editor.start(tmp_path, ws)
    try:
        opened = {
            "credentials": ((outside / "credentials.ini").as_uri(), f"[default]\n{secret_words}\nkey = AKIA-OUTSIDE\n"),
            "env": ((ws / ".env").as_uri(), f"{secret_words}\nTOKEN=SECRET-ENV\n"),
            "ignored": ((ws / "build" / "gen.py").as_uri(), f"# {secret_words}\nIGNORED_BY_GIT = 1\n"),
            "log": ((ws / "run.log").as_uri(), f"{secret_words} LOGGED-LINE\n"),
        }
        for uri, text in opened.values():
            editor.client.did_open(uri, text, language="ini")
        notes = editor.client.did_open((ws / "notes.py").as_uri(), "# " + secret_words + "\nINSIDE_NOTE = 1\n")
        main = editor.client.did_open((ws / "main.py").as_uri(), GOOD + CURSOR)
        await editor.complete(main)
        editor.client.did_change(main, len(main.text), len(main.text), "width, height)\n    again = total(")
        await editor.complete(main)
        texts = editor.prompt_texts()
        assert "INSIDE_NOTE" in texts, "an inside document is a source (the trace works)"
        for marker in ("AKIA-OUTSIDE", "SECRET-ENV", "IGNORED_BY_GIT", "LOGGED-LINE"):
            assert marker not in texts, marker
        # a setting lets documents outside the workspace in (not secrets, nor files git ignores)
        editor.client.notify("workspace/didChangeConfiguration", {"settings": {"contextOutsideWorkspace": True}})
        editor.client.did_close(notes)
        editor.client.did_open((tmp_path / "elsewhere.py").as_uri(), "# " + secret_words + "\nELSEWHERE = 1\n")
        editor.client.did_change(main, len(main.text), len(main.text), "width)\n    third = total(")
        await editor.complete(main)
        assert "ELSEWHERE" in editor.prompt_texts()
    finally:
        await editor.stop()


@pytest.mark.parametrize("root", ["/", "home"])
async def test_a_root_of_the_file_system_or_the_home_folder_is_refused(tmp_path: Path, root: str):
    """Old: a workspace root of `/` or `~` made every file an import names readable (and any link in a
    cloned repository a way to read files)."""
    import tempfile

    home = tmp_path / "home"
    home.mkdir()
    leaks = Path(tempfile.mkdtemp(prefix="leakdir_", dir="/tmp"))  # a path whose parts are identifiers
    try:
        (leaks / "leak.py").write_text(OUTSIDE)
        (home / "leak.py").write_text(OUTSIDE)
        env = {"HOME": str(home)} if root == "home" else {}
        editor = await Editor.start(tmp_path, Path("/") if root == "/" else home, env=env)
        try:
            module = f"tmp.{leaks.name}.leak" if root == "/" else "leak"
            doc = editor.client.did_open((home / "main.py").as_uri(), f"import {module}\n" + CURSOR)
            await editor.complete(doc)
            assert "31337" not in editor.prompt_texts()
            assert any("not read from" in line for line in editor.logs), editor.logs
        finally:
            await editor.stop()
    finally:
        (leaks / "leak.py").unlink()
        leaks.rmdir()


# --- 6. a 5.8 MB rewrite --------------------------------------------------------------------------
async def test_a_huge_rewrite_is_refused_at_once_and_status_answers_meanwhile(tmp_path: Path):
    """Old: refused readably, but after 5.2 s of tokenizing, a status request waiting as long."""
    ws = tmp_path / "ws"
    ws.mkdir()
    editor = await Editor.start(tmp_path, ws)
    try:
        text = "def rectangle_area(width, height):\n    return width * height\n\n" * 95_000  # 5.8 MB
        doc = editor.client.did_open((ws / "huge.py").as_uri(), text)
        await editor.status()  # the didOpen is handled
        end = position(doc, len(text), editor.client.encoding)
        arg = {"textDocument": {"uri": doc.uri, "version": doc.version},
               "range": {"start": {"line": 0, "character": 0}, "end": end}}  # fmt: skip
        start = time.perf_counter()
        request = editor.client.send("workspace/executeCommand", {"command": "llada.rewriteSelection",
                                                                  "arguments": [arg]})  # fmt: skip
        status_took, _ = await timed(editor.status())
        with pytest.raises(LspError) as refused:
            await editor.client.result(request, ANSWER)
        took = time.perf_counter() - start
        print(f"5.8 MB rewrite refused in {took * 1000:.0f} ms, a status meanwhile in {status_took * 1000:.0f} ms")
        assert took <= 2.0 and status_took <= 1.0, (took, status_took)
        assert "characters; this model rewrites at most" in str(refused.value), "known from the characters"
    finally:
        await editor.stop()


# --- the cases that held --------------------------------------------------------------------------
async def test_links_fifos_devices_folders_huge_binary_and_cyclic_files_are_skipped(tmp_path: Path):
    ws = tmp_path / "ws"
    pkg = ws / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "good.py").write_text(GOOD)
    (pkg / "passwd.py").symlink_to("/etc/passwd")
    os.mkfifo(pkg / "fifo.py")
    (pkg / "zero.py").symlink_to("/dev/zero")
    (pkg / "folder.py").mkdir()
    with open(pkg / "huge.py", "wb") as f:
        f.truncate(50 * 2**20)  # 50 MB
    (pkg / "binary.py").write_bytes(b"\xff\xfe\x00rectangle_area\x80\x81" * 100)
    (pkg / "cycle_a.py").write_text("from pkg import cycle_b\ncycle_a_value = 1\n")
    (pkg / "cycle_b.py").write_text("from pkg import cycle_a\ncycle_b_value = 2\n")
    (pkg / "loop").symlink_to(pkg, target_is_directory=True)
    (pkg / "dangling.py").symlink_to(tmp_path / "nothing.py")
    editor = await Editor.start(tmp_path, ws)
    try:
        imports = "from pkg import good, passwd, fifo, zero, folder, huge, binary, cycle_a, cycle_b, dangling\n"
        imports += "from pkg.loop.loop.loop import good as again\n"
        doc = editor.client.did_open((pkg / "main.py").as_uri(), imports + CURSOR)
        for _ in range(2):
            answer = await asyncio.wait_for(editor.complete(doc), ANSWER)
            assert isinstance(answer, dict) and "items" in answer
            editor.client.did_change(doc, len(doc.text), len(doc.text), "width, height)\n    x = rectangle_area(")
        took, _ = await timed(editor.status())
        assert took <= 1.0
        texts = editor.prompt_texts()
        assert "return width * height" in texts, "good.py is a source"
        assert "root:" not in texts and "\x00" not in texts
    finally:
        await editor.stop()


# --- 7. generate ------------------------------------------------------------------------------------
BAD_FLAGS = [
    (["--block-length", "0"], "the block length must be"),
    (["--block-length", "-4"], "the block length must be"),
    (["--mask-id", "8192"], "the mask id 8192 is outside the vocabulary"),
    (["--mask-id", "-1"], "the mask id -1 is outside the vocabulary"),
    (["--threshold", "nan"], "the threshold must be a number in 0..1"),
    (["--editing-threshold", "2"], "the editing threshold must be a number"),
    (["--gen-length", "0"], "the gen_length must be at least 1"),
]


@pytest.mark.parametrize(("flags", "words"), BAD_FLAGS)
def test_generate_refuses_a_bad_flag_with_one_line_and_exit_2(flags: list[str], words: str):
    """Old: ZeroDivisionError, IndexError tracebacks; NaN accepted; -4 said only "the pool needs..."."""
    run = subprocess.run([sys.executable, "-m", "llada_lsp", "generate", "--prompt-ids", "1,2,3", "--gen-length", "4",
                          "--device", "cpu", "--threads", "1", *flags], capture_output=True, text=True, timeout=300)  # fmt: skip
    said = [line for line in run.stderr.splitlines() if line.startswith("llada-lsp generate:")]
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert len(said) == 1 and words in said[0], run.stderr


def test_generate_refuses_a_mask_id_that_is_an_edit_id():
    tiny = Path(__file__).resolve().parents[1] / "golden" / "llada22-tiny"
    config = json.loads((tiny / "config.json").read_text())
    from llada_lsp.model import load_model

    edit = load_model(tiny, device="cpu").config.edit_ids[0]
    run = subprocess.run([sys.executable, "-m", "llada_lsp", "generate", "--model", str(tiny), "--prompt-ids", "1,2",
                          "--gen-length", "4", "--block-length", str(config.get("block_size", 32)), "--device", "cpu",
                          "--mask-id", str(edit)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert f"the mask id {edit} is an edit id" in run.stderr


def test_the_python_api_refuses_the_same_values_with_the_same_words():
    import torch

    from llada_lsp.engine import Engine, JointThreshold
    from llada_lsp.model import load_model

    model = load_model(None, device="cpu", dtype=torch.float32)
    for size in (0, -4, 10**6):
        with pytest.raises(ValueError, match="the block length must be"):
            Engine(model, block_size=size)
    engine = Engine(model)
    for mask in (8192, -1):
        with pytest.raises(ValueError, match=f"the mask id {mask} is outside the vocabulary"):
            engine.settings([1, 2], 4, mask_id=mask)
    with pytest.raises(ValueError, match="the threshold must be a number in 0..1"):
        engine.settings([1, 2], 4, JointThreshold(float("nan"), 0.0))
    with pytest.raises(ValueError, match="the editing threshold"):
        engine.settings([1, 2], 4, JointThreshold(0.5, float("nan")))
    assert engine.settings([1, 2], 4, "no-edit").policy.editing_threshold == float("inf")  # never edit: allowed
