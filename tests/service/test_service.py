"""The engine service and its client, in three layers: the wire protocol's frames (pure, milliseconds);
the service in this process over a worker whose model cannot load (hello, auth, refusals, bad frames,
the socket's lifetime); and the real service process with the embedded model, driven by clients as
editors' fronts would drive it (slow). Waits are on answers; the only polling is for a process's
socket to appear and for its log lines."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import msgpack
import pytest

from llada_lsp import wire
from llada_lsp.address import Address, default_socket_path, parse_address, private_folder, read_token
from llada_lsp.commands import engine
from llada_lsp.completion.generation import ModelSpec
from llada_lsp.completion.jobs import Infill, Rewrite
from llada_lsp.errors import CheckpointError
from llada_lsp.model import EMBEDDED_MODEL
from llada_lsp.runtime.worker import ModelWorker
from llada_lsp.server.completers import CompletionFailed, RemoteCompleter
from llada_lsp.service.client import EngineClient, EngineFailure
from llada_lsp.service.listener import AlreadyServing, Listener
from llada_lsp.service.sessions import EngineService

TIMEOUT = float(os.environ.get("LLADA_TEST_TIMEOUT", "120"))
MODES = ("speed", "quality")

# --- the wire -----------------------------------------------------------------------------------------
SAMPLES = [
    wire.Hello(wire.VERSION, "nvim", "s3cret"),
    wire.Welcome(wire.VERSION, "embedded", "ready", ["speed", "quality"], {"max_frame": wire.MAX_FRAME}),
    wire.Infill(1, "file:///a.py", "def f():\n    return ", "\n", "speed", 64, 1024, drafts=True),
    wire.Rewrite("x = ", "1 + 1", "\n", "quality", 512, "simplify", True, True, id=2, key="rewrite:file:///a.py"),
    wire.NextEdit(
        3,
        "next-edit:file:///a.py",
        "",
        "x = 1\n",
        "",
        ["@@ line 1 @@\n-y = 1\n+x = 1\n"],
        "quality",
        512,
        True,
        0,
        "y",
        "x",
    ),
    wire.Cancel(1),
    wire.Draft(1, 3, "x + 1"),
    wire.Done(1, 7, "x + 1", 0.25, "unit", tokens=3),
    wire.Failed(None, "version", "this engine speaks protocol version 1"),
    wire.Failed(2, "too_long", "the selection is too long"),
    wire.Status("loading", "embedded", 70, "reading the tokenizer", None, 2, 1),
    wire.Status(
        "ready",
        "embedded",
        None,
        None,
        None,
        3,
        2,
        running=2,
        queued=0,
        steps=40,
        batch_mean=1.5,
        batch_max=2,
        cache_blocks_used=9,
        cache_blocks_free=2038,
        cache_hit_rate=0.75,
    ),
    wire.Status(),
]


def test_the_samples_cover_every_message():
    assert {type(m) for m in SAMPLES} == set(wire.MESSAGES.values())


@pytest.mark.parametrize("message", SAMPLES, ids=lambda m: m.type)
def test_every_message_survives_a_round_trip(message):
    frame = wire.encode(message)
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    assert wire.decode(frame[4:]) == message


async def test_a_stream_of_frames_reads_back_in_order_then_ends():
    reader = asyncio.StreamReader()
    reader.feed_data(b"".join(wire.encode(m) for m in SAMPLES))
    reader.feed_eof()
    assert [await wire.read(reader) for _ in SAMPLES] == SAMPLES
    assert await wire.read(reader) is None


@pytest.mark.parametrize(
    "data, says",
    [
        (b"\xc1\xc1", "not a msgpack frame"),
        (msgpack.packb([1, 2]), "must be a map"),
        (msgpack.packb({"type": "launch"}), "unknown message type"),
        (msgpack.packb({"type": "cancel"}), "missing"),
        (msgpack.packb({"type": "cancel", "id": "7"}), "id must be"),
        (msgpack.packb({"type": "cancel", "id": True}), "id must be"),
        (msgpack.packb({"type": "cancel", "id": 1, "force": True}), "unknown fields"),
        (
            msgpack.packb({"type": "cancel", "id": 1, **{f"f{i}": 1 for i in range(50)}}),
            r"'f0', 'f1', 'f2' and 47 more$",
        ),
        (msgpack.packb({"type": "cancel", "id": 1, **{f"f{i}": 1 for i in range(10_000)}}), "exceeds max_map_len"),
        (msgpack.packb({"type": "welcome", "version": 1, "model": "m", "state": "ready", "modes": ["a", 2]}), "modes"),
    ],
    ids=[
        "garbage",
        "not-a-map",
        "unknown-type",
        "missing-field",
        "wrong-type",
        "bool-for-int",
        "unknown-field",
        "unknown-fields-named-and-counted",
        "a-map-of-thousands",
        "bad-list",
    ],  # fmt: skip
)
def test_a_bad_frame_is_a_wire_error(data, says):
    with pytest.raises(wire.WireError, match=says):
        wire.decode(data)


def test_a_hello_from_a_newer_client_still_decodes_so_it_can_be_told_its_version():
    body = msgpack.packb({"type": "hello", "version": wire.VERSION + 1, "client": "vscode", "compression": "zstd"})
    assert wire.decode(body) == wire.Hello(wire.VERSION + 1, "vscode")


async def test_an_oversized_frame_is_refused_before_its_body_is_read():
    reader = asyncio.StreamReader()
    reader.feed_data((wire.MAX_FRAME + 1).to_bytes(4, "big"))  # no body and no end: a read of it would hang
    with pytest.raises(wire.WireError, match="over the"):
        await asyncio.wait_for(wire.read(reader), 5)


def test_an_oversized_message_is_not_sent():
    with pytest.raises(wire.WireError, match="over the"):
        wire.encode(wire.Infill(1, "k", "x" * wire.MAX_FRAME, "", "speed", 64, 1024))


async def test_a_stream_cut_inside_a_frame_is_not_a_clean_end():
    reader = asyncio.StreamReader()
    reader.feed_data(wire.encode(wire.Cancel(1))[:-1])
    reader.feed_eof()
    with pytest.raises(asyncio.IncompleteReadError):
        await wire.read(reader)


# --- addresses and secrets ------------------------------------------------------------------------------
def test_addresses_parse_and_default_to_a_per_user_socket(monkeypatch):
    assert parse_address("unix:/run/e.sock") == Address("unix", "/run/e.sock")
    assert parse_address("tcp://:7411") == Address("tcp", host="127.0.0.1", port=7411)
    assert parse_address("tcp://[::1]:7411") == Address("tcp", host="::1", port=7411)
    for bad in ("tcp://localhost", "http://x:1", "unix:/" + "x" * 120):
        with pytest.raises(ValueError):
            parse_address(bad)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    assert parse_address(None) == Address("unix", "/run/user/1000/llada-lsp/engine.sock")
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert default_socket_path() == Path(tempfile.gettempdir()) / f"llada-lsp-{os.getuid()}" / "engine.sock"


def test_a_token_file_must_be_private_and_not_empty(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o644)
    with pytest.raises(ValueError, match="0600"):
        read_token(str(token))
    token.chmod(0o600)
    assert read_token(str(token)) == "s3cret"
    token.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        read_token(str(token))


def test_a_socket_folder_open_to_others_is_refused(tmp_path):
    folder = tmp_path / "engine"
    private_folder(folder, create=True)
    assert folder.stat().st_mode & 0o777 == 0o700
    folder.chmod(0o755)
    with pytest.raises(ValueError, match="chmod 700"):
        private_folder(folder, create=True)


def test_tcp_without_a_token_file_does_not_start(capsys):
    with pytest.raises(SystemExit) as exited:
        engine.engine_main(["--listen", "tcp://:0"])
    assert exited.value.code == 2 and "needs --token-file" in capsys.readouterr().err


# --- the service in this process, without a model ----------------------------------------------------------
@pytest.fixture
def short_dir():
    """A socket folder under /tmp: AF_UNIX paths end at ~107 bytes, which pytest's tmp_path can pass."""
    folder = tempfile.mkdtemp(prefix="ll", dir="/tmp")
    yield Path(folder)
    shutil.rmtree(folder, ignore_errors=True)


def _no_weights(spec: ModelSpec, report, cancelled) -> None:
    report(f"reading {spec.name}", 10)
    raise CheckpointError(f"{spec.name}: no weights here")


@contextlib.asynccontextmanager
async def in_process(address: Address, token: str | None = None):
    """A service whose model fails to load: it answers everything that needs no model."""
    worker = ModelWorker(asyncio.get_running_loop(), lambda line: None, loader=_no_weights)
    service = EngineService(worker, MODES, token)
    listener = Listener.claim(address)
    try:
        await listener.bind(service.handle)
        service.load(ModelSpec("nowhere"))
        yield listener.address, service
    finally:
        listener.close()
        await service.close()
        assert worker.stop()


async def raw(address: Address, hello: wire.Message | None = None):
    """A connection without the client's manners; says `hello` (if given) and reads the welcome."""
    if address.kind == "unix":
        reader, writer = await asyncio.open_unix_connection(address.path)
    else:
        reader, writer = await asyncio.open_connection(address.host, address.port)
    if hello is not None:
        wire.write(writer, hello)
        assert isinstance(await wire.read(reader), wire.Welcome)
    return reader, writer


async def last_words(reader: asyncio.StreamReader) -> list[wire.Message]:
    """What the service sends until it closes the connection (a test fails if it never does)."""
    messages = []
    while (message := await asyncio.wait_for(wire.read(reader), 5)) is not None:
        messages.append(message)
    return messages


def infill(client: EngineClient, before: str = "def add(a, b):\n    return a +", after: str = "\n", key: str = "a.py",
           max_tokens: int = 64, mode: str = "speed") -> wire.Infill:  # fmt: skip
    return wire.Infill(client.next_id(), key, before, after, mode, max_tokens, 1024, drafts=True)


HELLO = wire.Hello(wire.VERSION, "raw")


async def test_without_a_model_requests_fail_no_model_and_status_says_why(short_dir):
    async with in_process(Address("unix", str(short_dir / "e.sock"))) as (address, _):
        async with await EngineClient.connect(address, "editor") as client:
            assert client.welcome.modes == list(MODES) and client.welcome.limits["max_frame"] == wire.MAX_FRAME
            with pytest.raises(EngineFailure) as failure:
                await client.request(infill(client))  # queued behind the load, answered when it fails
            assert failure.value.kind == "no_model" and "no weights here" in failure.value.message
            status = await client.status()
            assert (status.state, status.clients, status.queue) == ("error", 1, 0)
            assert "no weights here" in status.error


async def test_a_document_with_a_lone_surrogate_reaches_the_service(short_dir):
    """msgpack carries UTF-8, which has no lone surrogates: the front sends them as U+FFFD (as the
    tokenizer takes them) instead of failing every request about the document before it leaves."""
    async with in_process(Address("unix", str(short_dir / "e.sock"))) as (address, _):
        completer = await RemoteCompleter.connect(str(address), None, lambda line: None)
        text = 'x = "\ud800"\nprint(x'
        with pytest.raises(CompletionFailed, match="no weights here"):  # the service's answer: it got there
            await completer.run("doc", "inline", Infill.at(text, len(text), "speed", 8, 1024), None)
        with pytest.raises(CompletionFailed, match="no weights here"):
            await completer.run("doc", "rewrite", Rewrite.at(text, 5, 6, "speed", 1024), None)
        assert completer.client.gone is None
        await completer.client.close()


async def test_a_bad_request_is_answered_and_the_connection_stays(short_dir):
    async with in_process(Address("unix", str(short_dir / "e.sock"))) as (address, _):
        async with await EngineClient.connect(address, "editor") as client:
            with pytest.raises(EngineFailure) as failure:
                await client.request(infill(client, mode="fastest"))
            assert failure.value.kind == "bad_request" and "speed, quality" in failure.value.message
            assert (await client.status()).model == "nowhere"


@pytest.mark.parametrize(
    "first, then, kind",
    [
        (HELLO, b"\x00\x00\x00\x03\xc1\xc1\xc1", "bad_request"),  # garbage
        (HELLO, (2**31).to_bytes(4, "big"), "bad_request"),  # an oversized length, no body
        (HELLO, wire.encode(wire.Hello(wire.VERSION, "again")), "bad_request"),  # a second hello
        (None, wire.encode(wire.Hello(wire.VERSION + 1, "future")), "version"),
        (None, wire.encode(wire.Cancel(1)), "bad_request"),  # no hello
    ],
    ids=["garbage", "oversized", "hello-twice", "version", "no-hello"],
)
async def test_a_broken_peer_is_closed_and_only_it(short_dir, first, then, kind):
    async with in_process(Address("unix", str(short_dir / "e.sock"))) as (address, _):
        async with await EngineClient.connect(address, "editor") as bystander:
            reader, writer = await raw(address, first)
            writer.write(then)
            words = await last_words(reader)
            assert [(w.type, w.id, w.kind) for w in words if isinstance(w, wire.Failed)] == [("failed", None, kind)]
            writer.close()
            assert (await bystander.status()).clients == 1  # the broken peer is gone, the bystander served
            assert bystander.gone is None


async def test_tcp_needs_the_token(short_dir):
    async with in_process(Address("tcp", host="127.0.0.1", port=0), token="s3cret") as (address, _):
        for token in (None, "s3cre", "s3cret!"):
            with pytest.raises(EngineFailure) as failure:
                await EngineClient.connect(address, "editor", token)
            assert failure.value.kind == "auth"
        async with await EngineClient.connect(address, "editor", "s3cret") as client:
            assert client.welcome.model == "nowhere"


@pytest.mark.parametrize("kind", ["unix", "tcp"])
async def test_connect_and_close_is_harmless_and_a_frame_before_the_token_is_not_read(short_dir, kind):
    """Issue 14 on the service's socket: bare connect-and-close (and a cut-off frame) leave it serving;
    over TCP nothing but a hello with the token is read before the token is checked."""
    where = Address("unix", str(short_dir / "e.sock")) if kind == "unix" else Address("tcp", host="127.0.0.1", port=0)
    async with in_process(where, token="s3cret" if kind == "tcp" else None) as (address, _):
        for _ in range(3):
            reader, writer = await raw(address)
            writer.close()
        reader, writer = await raw(address)
        writer.write(b"\x00\x00\x01")  # a header cut short
        writer.close()
        if kind == "tcp":  # a request before the hello is refused, never served
            reader, writer = await raw(address)
            wire.write(writer, wire.Status())
            words = await last_words(reader)
            assert [w.kind for w in words if isinstance(w, wire.Failed)] == ["bad_request"]
            assert not any(isinstance(w, wire.Status) for w in words)
            writer.close()
        async with await EngineClient.connect(address, "editor", "s3cret" if kind == "tcp" else None) as client:
            assert (await client.status()).model == "nowhere"


async def test_one_engine_per_socket_and_a_stale_socket_is_replaced(short_dir):
    path = short_dir / "e.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))  # what a killed engine leaves behind: a socket file nobody answers on
    stale.close()
    async with in_process(Address("unix", str(path))) as (address, _):
        assert path.stat().st_mode & 0o777 == 0o600
        with pytest.raises(AlreadyServing):
            Listener.claim(address)
        async with await EngineClient.connect(address, "editor") as client:
            assert client.welcome.model == "nowhere"
    assert not path.exists()
    path.write_text("not a socket")
    with pytest.raises(ValueError, match="not a socket"):
        Listener.claim(Address("unix", str(path)))


async def test_the_status_command_reports_or_says_nothing_answers(short_dir, capsys):
    async with in_process(Address("unix", str(short_dir / "e.sock"))) as (address, _):
        async with await EngineClient.connect(address, "editor") as client:
            with pytest.raises(EngineFailure):
                await client.request(infill(client))  # the load has failed by now
            assert await asyncio.to_thread(engine.engine_main, ["status", "--listen", str(address)]) == 0
    out = capsys.readouterr().out
    assert "model: nowhere" in out and "state: error" in out and "clients: 1" in out and "queue: 0" in out
    assert await asyncio.to_thread(engine.engine_main, ["status", "--listen", str(address)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("llada-lsp engine: nothing answers on") and "\n" not in err


async def test_status_asks_close_cleanly_and_a_starting_engine_is_said(short_dir, capsys, caplog):
    """`engine status` closes as a client should (its sending side first, then it reads to the end): the
    service logs "closed by the client", never `dropped: Connection lost` (a Unix socket closed with
    frames unread resets its peer, and status pushes come at any time). Between taking the socket's
    lock and listening (torch importing: seconds), status says the engine is starting."""
    caplog.set_level(logging.INFO, logger="llada_lsp.service.sessions")
    address = Address("unix", str(short_dir / "e.sock"))
    async with in_process(address):
        async with await EngineClient.connect(address, "editor"):
            for _ in range(6):
                assert await asyncio.to_thread(engine.engine_main, ["status", "--listen", str(address)]) == 0
                await asyncio.sleep(0.1)  # the service logs the close once it has read it
            await asyncio.sleep(0.5)
    closes = [r.getMessage() for r in caplog.records if "llada-lsp engine status" in r.getMessage()]
    assert len([c for c in closes if c.endswith(": closed by the client")]) == 6, closes
    assert not [c for c in closes if "dropped" in c], closes
    capsys.readouterr()
    listener = Listener.claim(address)  # what the engine holds while torch imports: the lock, no socket yet
    try:
        assert await asyncio.to_thread(engine.engine_main, ["status", "--listen", str(address)]) == 0
        out = capsys.readouterr().out
        assert out == f"address: {address}\nstate: starting (pid {os.getpid()}: not listening yet)\n"
    finally:
        listener.close()
    assert not Path(f"{address.path}.lock").exists()  # a stopped engine leaves neither socket nor lock
    assert await asyncio.to_thread(engine.engine_main, ["status", "--listen", str(address)]) == 1


# --- the real service process, with the embedded model -----------------------------------------------------
needs_model = pytest.mark.skipif(not (EMBEDDED_MODEL / "config.json").is_file(), reason="no embedded model")
STEP_DELAY_MS = 40  # slow enough that a request is still running when its cancel or its client's close lands


class EngineProcess:
    """`python -m llada_lsp.commands.engine` on a socket in `folder`, its log in a file."""

    def __init__(self, folder: Path):
        self.folder, self.address = folder, Address("unix", str(folder / "e.sock"))
        self.log = folder / "engine.log"
        env = {**os.environ, "LLADA_LSP_TEST_STEP_DELAY_MS": str(STEP_DELAY_MS)}
        command = [sys.executable, "-m", "llada_lsp.commands.engine", "--listen", str(self.address), "--threads", "1"]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(command, env=env, stderr=log, stdout=subprocess.DEVNULL)

    async def connect(self, name: str, totals: bool = False) -> EngineClient:
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                return await EngineClient.connect(self.address, name, totals=totals)
            except EngineFailure:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.05)  # the process is importing: nothing to await but its socket

    async def log_line(self, pattern: str) -> re.Match:
        """The first log line matching `pattern`, once the service has written it."""
        deadline = time.monotonic() + TIMEOUT
        while not (found := re.search(pattern, self.log.read_text(), re.MULTILINE)):
            assert time.monotonic() < deadline, f"no log line {pattern!r} in:\n{self.log.read_text()}"
            await asyncio.sleep(0.05)
        return found

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def service():
    folder = Path(tempfile.mkdtemp(prefix="ll", dir="/tmp"))
    process = EngineProcess(folder)
    yield process
    process.stop()
    shutil.rmtree(folder, ignore_errors=True)


slow = [pytest.mark.slow, needs_model, pytest.mark.asyncio(loop_scope="module")]


class Drafts(list):
    """A draft callback that keeps the drafts and says when the first arrived."""

    def __init__(self):
        super().__init__()
        self.first = asyncio.Event()

    def __call__(self, step: int, text: str) -> None:
        self.append((step, text))
        self.first.set()


def cancelled_line(client: str, request_id: int) -> str:
    """The worker's log line of a cancelled infill; group 1: the steps it ran after the cancel."""
    return rf"infill {client}#\d+:{request_id}: .*cancelled \((\d+) steps after the cancel\)"


async def first_draft_then(client: EngineClient, request: wire.Infill) -> tuple[asyncio.Task, Drafts]:
    """Starts a request and waits for its first draft (step 1): the request is then running."""
    drafts = Drafts()
    task = asyncio.create_task(client.request(request, drafts))
    await asyncio.wait_for(drafts.first.wait(), TIMEOUT)
    return task, drafts


class TestTheEngineProcess:
    """One engine process serves every test here, as it would serve a day of editing."""

    pytestmark = slow

    async def test_two_clients_share_one_model(self, service):
        async with await service.connect("nvim") as a, await service.connect("vscode") as b:
            drafts_a, drafts_b = Drafts(), Drafts()
            # The same key on two connections: neither supersedes the other.
            done_a, done_b = await asyncio.wait_for(
                asyncio.gather(a.request(infill(a), drafts_a), b.request(infill(b), drafts_b)), TIMEOUT
            )  # fmt: skip
            for done, drafts in ((done_a, drafts_a), (done_b, drafts_b)):
                assert done.text == " b" and done.stopped in ("unit", "done")
                assert drafts[0][0] == 1 and drafts[-1][1] == done.text
            rewrite = wire.Rewrite(
                "def add(a, b):\n    ", "return a + b", "\n", "quality", 1024, id=b.next_id(), key="rw"
            )
            done = await asyncio.wait_for(b.request(rewrite), TIMEOUT)
            assert done.stopped in ("done", "unchanged", "refused") and done.text.strip()
            status = await a.status()
            assert (status.state, status.model, status.clients) == ("ready", "embedded", 2)
        assert len(re.findall(r"load embedded: done", service.log.read_text())) == 1

    async def test_concurrent_requests_are_decoded_in_one_batch_as_they_would_be_alone(self, service):
        """Four editors ask at once (speed and quality side by side); the answers are those each gets
        alone, the status shows batches of more than one row and the prefix cache's hits."""
        header = '"""Small helpers for numbers and points."""\n\nimport math\nimport os\nimport sys\n\n\n' * 3
        before = [header + text for text in ("def add(a, b):\n    return a +", "def sub(a, b):\n    return a -",
                  "print(os.", "class Point:\n    def __init__(self, x, y):\n        self.x = ")]  # fmt: skip
        clients = [
            await service.connect(f"editor{i}", totals=i == 0) for i in range(4)
        ]  # the first: its owner's totals
        try:
            requests = [infill(c, text, mode=MODES[i % 2]) for i, (c, text) in enumerate(zip(clients, before))]
            together = await asyncio.wait_for(
                asyncio.gather(*(c.request(r) for c, r in zip(clients, requests))), TIMEOUT
            )
            alone = [await asyncio.wait_for(c.request(replace(r, id=c.next_id())), TIMEOUT)
                     for c, r in zip(clients, requests)]  # fmt: skip
            assert [d.text for d in together] == [d.text for d in alone]
            assert all(d.tokens > 0 for d in together)
            status = await clients[0].status()
            assert status.batch_max >= 2 and status.steps > 0 and status.running == 0
            assert status.cache_hit_rate is not None and status.cache_hit_rate > 0  # the second round's prompts
            assert status.cache_blocks_used > 0 and status.cache_blocks_free > 0
        finally:
            for client in clients:
                await client.close()

    async def test_cancel_stops_the_request_within_a_step(self, service):
        async with await service.connect("cancel") as client:
            request = infill(client, "def sub(a, b):\n    ", max_tokens=128)
            task, _drafts = await first_draft_then(client, request)
            client.cancel(request.id)
            with pytest.raises(EngineFailure) as failure:
                await asyncio.wait_for(task, TIMEOUT)
            assert failure.value.kind == "cancelled"
            line = await service.log_line(cancelled_line("cancel", request.id))
            assert int(line.group(1)) <= 1
            # Cancelling the awaiting task sends the cancel too.
            request = infill(client, "def sub(a, b):\n    ", max_tokens=128)
            task, _drafts = await first_draft_then(client, request)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            line = await service.log_line(cancelled_line("cancel", request.id))
            assert int(line.group(1)) <= 1

    async def test_a_newer_request_with_the_same_key_supersedes(self, service):
        async with await service.connect("typist") as client:
            older = infill(client, "def sub(a, b):\n    ", max_tokens=128)
            task, _drafts = await first_draft_then(client, older)
            newer = await asyncio.wait_for(client.request(infill(client)), TIMEOUT)
            assert newer.text == " b"
            with pytest.raises(EngineFailure) as failure:
                await task
            assert failure.value.kind == "cancelled"

    async def test_a_client_gone_mid_request_has_its_work_cancelled(self, service):
        async with await service.connect("stays") as stays:
            leaver = await service.connect("leaver")
            request = infill(leaver, "def sub(a, b):\n    ", max_tokens=128)
            task, _drafts = await first_draft_then(leaver, request)
            await leaver.close()
            with pytest.raises(EngineFailure) as failure:
                await task
            assert failure.value.kind == "engine_gone"
            await service.log_line(r"leaver#\d+: closed by the client; 1 requests cancelled")
            line = await service.log_line(cancelled_line("leaver", request.id))
            assert int(line.group(1)) <= 1
            assert (await asyncio.wait_for(stays.request(infill(stays)), TIMEOUT)).text == " b"

    async def test_broken_peers_are_closed_while_a_request_runs_on(self, service):
        async with await service.connect("busy") as busy:
            task, _drafts = await first_draft_then(busy, infill(busy, "def sub(a, b):\n    ", max_tokens=96))
            for first, then in [
                (HELLO, b"\x00\x00\x00\x04garb"),
                (HELLO, (2**31).to_bytes(4, "big")),
                (None, wire.encode(wire.Hello(wire.VERSION + 1, "future"))),
            ]:
                reader, writer = await raw(service.address, first)
                writer.write(then)
                kinds = [w.kind for w in await last_words(reader) if isinstance(w, wire.Failed)]
                assert kinds in (["bad_request"], ["version"])
                writer.close()
            done = await asyncio.wait_for(task, TIMEOUT)  # the work in flight went on undisturbed
            assert done.stopped in ("unit", "done")
        assert service.proc.poll() is None

    async def test_a_second_engine_on_the_socket_refuses_to_start(self, service):
        async with await service.connect("first"):  # listening (run alone, this test came before it did)
            pass
        second = subprocess.run([sys.executable, "-m", "llada_lsp.commands.engine", "--listen", str(service.address)],
                                capture_output=True, text=True, timeout=TIMEOUT)  # fmt: skip
        # The refusal names who holds the socket (issue 25: a service orphaned by its deleted socket was unnamed).
        assert second.returncode == 1 and f"another engine (pid {service.proc.pid}) is serving" in second.stderr
        assert Path(service.address.path).exists()


@pytest.mark.slow
@needs_model
async def test_a_killed_engine_fails_pending_requests_and_its_socket_is_reused():
    folder = Path(tempfile.mkdtemp(prefix="ll", dir="/tmp"))
    first = EngineProcess(folder)
    try:
        client = await first.connect("orphan")
        task, _drafts = await first_draft_then(client, infill(client, "def sub(a, b):\n    ", max_tokens=128))
        first.proc.send_signal(signal.SIGKILL)
        with pytest.raises(EngineFailure) as failure:
            await asyncio.wait_for(task, 5)
        assert failure.value.kind == "engine_gone"
        with pytest.raises(EngineFailure):
            await client.status()  # the connection is known to be gone: no waiting
        # The killed engine left its socket file; the next one replaces it, and removes it on SIGTERM.
        second = EngineProcess(folder)
        async with await second.connect("next") as client:
            assert (await asyncio.wait_for(client.request(infill(client)), TIMEOUT)).text == " b"
        second.proc.send_signal(signal.SIGTERM)
        assert second.proc.wait(TIMEOUT) == 0
        assert not Path(second.address.path).exists()
        assert not Path(f"{second.address.path}.lock").exists()  # it was left behind
        assert "Traceback" not in second.log.read_text()
    finally:
        first.stop()
        shutil.rmtree(folder, ignore_errors=True)
