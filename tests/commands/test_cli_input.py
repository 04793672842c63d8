"""The command line on a new user's first tries: it starts fast (no torch for `--help`, `--version` or
the headless client), bad input gets one line in the user's own numbering and a non-zero exit, and
the server started by hand stops on Ctrl-C and exits at once on `exit`."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llada_lsp", *args], capture_output=True, text=True, timeout=timeout)


def no_torch_after(code: str) -> None:
    p = subprocess.run([sys.executable, "-c", f"import sys\n{code}\nassert 'torch' not in sys.modules, 'torch'\n"
                        "assert 'transformers' not in sys.modules, 'transformers'"],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stderr


def test_the_package_face_imports_no_torch():
    no_torch_after("import llada_lsp")
    no_torch_after("import llada_lsp; llada_lsp.__version__; dir(llada_lsp)")


def test_help_version_and_the_thin_modules_import_no_torch():
    no_torch_after("from llada_lsp.cli import main; main(['--help']); main(['--version'])")
    # The headless client, the LSP front and the pure-text parts: torch comes with the model only.
    no_torch_after("import llada_lsp.commands.complete, llada_lsp.commands.serve, llada_lsp.server.handlers, llada_lsp.completion.postprocess, "
                   "llada_lsp.completion.syntax")  # fmt: skip


def test_lazy_names_resolve():
    import llada_lsp

    assert callable(llada_lsp.load_model) and callable(llada_lsp.generate)
    assert llada_lsp.CheckpointError is __import__("llada_lsp.model", fromlist=["x"]).CheckpointError
    with pytest.raises(AttributeError):
        llada_lsp.no_such_name


def test_version_and_unknown_subcommand():
    p = run("--version")
    assert p.returncode == 0 and p.stdout.startswith("llada-lsp ") and p.stdout.strip() != "llada-lsp"
    p = run("complet", "x.py:1:1")
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    assert "unknown subcommand 'complet'" in p.stderr and "'complete'" in p.stderr


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "a.py"
    path.write_text("def f(x):\n    return x + 1\n")  # 2 lines, as an editor and `wc -l` count them
    return path


@pytest.mark.parametrize(
    "args, expected",
    [
        (["complete", "{f}:0:0"], "{f}:0:0: lines and columns count from 1"),
        (["complete", "{f}:4:1"], "{f}:4:1: line 4 is past the end (the file has 2 lines)"),
        (["complete", "{f}:3:1"], "{f}:3:1: line 3 is past the end (the file has 2 lines)"),
        (["complete", "{f}:2:40"], "column 40 is past the end of line 2 (16 characters: the last column is 17)"),
        (["complete", "{f}:2"], "expected FILE:LINE:COL"),
        (["complete", "{missing}:1:1"], "no such file"),
        (["complete", "{binary}:1:1"], "not UTF-8 text"),
        (["complete", "{nul}:1:1"], "a binary file"),
        (["complete", "{folder}:1:1"], "{folder}: a directory, not a file"),
        (["complete", "/dev/null:1:1"], "/dev/null: a character device, not a file"),
        (["rewrite", "{f}:2:5-2:5"], "{f}:2:5-2:5: the range is empty"),
        (["rewrite", "{f}:1:1-4:1"], "{f}:4:1: line 4 is past the end (the file has 2 lines)"),
        (["rewrite", "{f}:2:5-1:1"], "{f}:2:5-1:1: the range ends (1:1) before it starts (2:5)"),
        (["rewrite", "{f}:1:1-9:1"], "{f}:9:1: line 9 is past the end (the file has 2 lines)"),
        (["rewrite", "{f}:1:1"], "expected FILE:L1:C1-L2:C2"),
    ],
)
def test_bad_input_is_one_line_in_the_users_numbering(args, expected, source, tmp_path):
    binary, nul = tmp_path / "b.py", tmp_path / "n.py"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    nul.write_bytes(b"x = 1\n\x00\x00")
    names = {"f": source, "missing": tmp_path / "nope.py", "binary": binary, "nul": nul, "folder": tmp_path}
    p = run(*[a.format(**names) for a in args])
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
    assert expected.format(**names) in p.stderr
    assert p.stdout == ""


def message(obj: dict) -> bytes:
    body = json.dumps(obj).encode()
    return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


def read_until(stream, needle: bytes, timeout: float = 120) -> bytes:
    os.set_blocking(stream.fileno(), False)
    out, deadline = b"", time.monotonic() + timeout
    while needle not in out:
        assert time.monotonic() < deadline, f"no {needle!r} in {out[-500:]!r}"
        chunk = stream.read()
        out += chunk or b""
        if not chunk:
            time.sleep(0.01)
    return out


@pytest.mark.slow
def test_exit_is_at_once_even_with_a_step_in_flight(tmp_path):
    """Emacs gives a server ~0.1 s after `exit` before it kills it. A step that sleeps 5 s (the test
    hook) is in flight: neither `shutdown` nor `exit` may wait for it. On the way, an unknown command
    is answered with an error and logged without a traceback."""
    env = {**os.environ, "LLADA_LSP_TEST_STEP_DELAY_MS": "5000"}
    stderr = (tmp_path / "stderr").open("w+")
    p = subprocess.Popen([sys.executable, "-m", "llada_lsp", "--log-level", "info"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=stderr, env=env)  # fmt: skip
    try:
        uri = (tmp_path / "a.py").as_uri()
        p.stdin.write(message({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"capabilities": {}}}))
        p.stdin.write(message({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {
            "uri": uri, "languageId": "python", "version": 1, "text": "def f(x):\n    return x\n"}}}))  # fmt: skip
        p.stdin.write(message({"jsonrpc": "2.0", "id": 2, "method": "textDocument/completion", "params": {
            "textDocument": {"uri": uri}, "position": {"line": 1, "character": 10}}}))  # fmt: skip
        p.stdin.write(message({"jsonrpc": "2.0", "id": 4, "method": "workspace/executeCommand",
                               "params": {"command": "llada.nope"}}))  # fmt: skip
        p.stdin.flush()
        read_until(p.stdout, b"unknown command 'llada.nope'")
        time.sleep(8)  # the model loads, then the completion's first step sleeps
        started = time.monotonic()
        p.stdin.write(message({"jsonrpc": "2.0", "id": 3, "method": "shutdown"}))
        p.stdin.flush()
        read_until(p.stdout, b'"id": 3')
        p.stdin.write(message({"jsonrpc": "2.0", "method": "exit"}))
        p.stdin.flush()
        assert p.wait(timeout=30) == 0
        assert time.monotonic() - started < 2.0  # a step takes 5 s: nothing waited for it
        stderr.seek(0)
        log = stderr.read()
        assert "unknown command 'llada.nope'" in log and "Traceback" not in log
    finally:
        p.kill()
        stderr.close()


def as_in_a_terminal() -> None:
    """A shell started the server, so Ctrl-C is not ignored, even when this test runs under something that
    ignores it (a script's `pytest &`): Python keeps an inherited SIG_IGN and the server would never see it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def test_ctrl_c_in_a_terminal_stops_the_server():
    """Started by hand, stdin is a terminal: Ctrl-C stops it without waiting for more input."""
    controller, terminal = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "llada_lsp"], stdin=terminal, stdout=terminal,
                         stderr=subprocess.PIPE, start_new_session=True, preexec_fn=as_in_a_terminal)  # fmt: skip
    try:
        # Started and reading once it says so: waited for, not slept for (3 s were too few on a busy machine).
        said = p.stderr.readline().decode()
        waiting = "llada-lsp: waiting for an LSP client on stdin; see --help\n"
        assert said == waiting, "started by hand: says why it waits"
        os.kill(p.pid, signal.SIGINT)
        assert p.wait(timeout=20) != 0
        err = p.stderr.read().decode()
        assert "interrupted" in err and "Traceback" not in err
    finally:
        p.kill()
        os.close(controller)
        os.close(terminal)


@pytest.mark.parametrize("seconds", [0.6, 1.2, 2.0])
def test_ctrl_c_while_it_starts_prints_no_traceback(seconds):
    """Ctrl-C in the first seconds (the modules still importing) printed a KeyboardInterrupt
    traceback. (In its first ~0.1 s it lands in the interpreter's own start, before any of our code.)"""
    controller, terminal = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "llada_lsp"], stdin=terminal, stdout=terminal,
                         stderr=subprocess.PIPE, start_new_session=True, preexec_fn=as_in_a_terminal)  # fmt: skip
    try:
        time.sleep(seconds)
        os.kill(p.pid, signal.SIGINT)
        assert p.wait(timeout=20) != 0
        err = p.stderr.read().decode()
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    finally:
        p.kill()
        os.close(controller)
        os.close(terminal)


def test_a_slow_load_is_said_once_while_it_waits(monkeypatch, capsys):
    """`complete` waits while the server loads its model; a load longer than SLOW_LOAD (a first start on
    a machine compiles the CPU kernels) is said once on stderr, a quick one not at all. The waiting loop
    against a stand-in for the server's client (the whole command runs the real server elsewhere)."""
    import asyncio
    from types import SimpleNamespace

    from llada_lsp.commands import complete

    monkeypatch.setattr(complete, "SLOW_LOAD", 0.05)
    monkeypatch.setattr(complete, "at_terminal", lambda: True)

    async def wait(delay: float) -> None:
        loop = asyncio.get_running_loop()
        editor = complete.HeadlessEditor.__new__(complete.HeadlessEditor)
        editor.state, editor._state_changed = {}, asyncio.Event()
        editor.client = SimpleNamespace(exited=loop.create_future())
        loop.call_later(delay, editor._on_status, {"state": "ready"})
        await editor.loaded()

    asyncio.run(wait(0.3))
    assert capsys.readouterr().err.count(complete.LOADING) == 1
    asyncio.run(wait(0.0))
    assert complete.LOADING not in capsys.readouterr().err
    monkeypatch.setattr(complete, "at_terminal", lambda: False)  # a script's stderr: the same however slow
    asyncio.run(wait(0.3))
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "options, said",
    [
        (["--model", "/nonexistent/model"], "--model: /nonexistent/model: no such model folder"),
        (["--model", "/"], "--model: /: no config.json (not a model folder)"),
        (["--threads", "0"], "--threads must be at least 1, not 0"),
        (["--dtype", "f32"], "--dtype f32: choose one of float32, fp32, float64, fp64, bfloat16, bf16, float16, fp16"),
        (["--device", "gpu"], "--device gpu: expected cpu, cuda or cuda:N"),
        (["--engine", "nowhere"], "--engine nowhere: 'nowhere': want unix:PATH or tcp://HOST:PORT"),
        (["--token-file", "/nonexistent/token"], "--token-file /nonexistent/token: No such file or directory"),
    ],
)
def test_bad_options_are_refused_before_a_server_starts(monkeypatch, capsys, options, said):
    """`complete --model /nope` started a server, waited for its load to fail, and exited 1; the help
    says bad options exit 2 before a server starts."""
    from llada_lsp.commands import complete

    async def no_server(*args, **kwargs):
        raise AssertionError("a server was started")

    monkeypatch.setattr(complete.LspClient, "start", no_server)
    file = ROOT / "examples" / "hello.py"
    assert complete.complete_main([f"{file}:1:1", *options]) == 2
    assert capsys.readouterr().err == f"llada-lsp complete: {said}\n"
    assert complete.rewrite_main([f"{file}:1:1-2:1", *options]) == 2
    assert capsys.readouterr().err == f"llada-lsp rewrite: {said}\n"


def test_the_dtypes_checked_are_the_loaders():
    from llada_lsp.commands import complete
    from llada_lsp.model.loader import DTYPES

    assert set(complete.DTYPES) == set(DTYPES)
