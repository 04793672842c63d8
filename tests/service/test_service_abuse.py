"""Issue 25: the engine service under abuse. One client must never stall, bloat or read the others.
Each test drives the real `llada-lsp engine` process (the embedded model, a small batch and queue) the
way a hostile or broken peer would, and checks what a well-behaved one notices: its latency, the
service's memory, what it is told, what the log says. Every loop is bounded in count and time."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import pytest

from llada_lsp import wire
from llada_lsp.address import Address
from llada_lsp.completion.jobs import Infill
from llada_lsp.model import EMBEDDED_MODEL
from llada_lsp.server.completers import RemoteCompleter
from llada_lsp.service.client import EngineClient, EngineFailure
from llada_lsp.service.sessions import HELLO_MAX, MAX_UNGREETED, STATUS_INTERVAL

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module"),
              pytest.mark.skipif(not (EMBEDDED_MODEL / "config.json").is_file(), reason="no embedded model")]  # fmt: skip

TIMEOUT = float(os.environ.get("LLADA_TEST_TIMEOUT", "120"))
MAX_BATCH, MAX_QUEUE = 2, 4
ENGINE = [sys.executable, "-m", "llada_lsp.commands.engine"]
BEFORE = "def add(a, b):\n    return a +"
HELLO = wire.Hello(wire.VERSION, "raw")


class Engine:
    """`python -m llada_lsp.commands.engine` on a socket of its own, its log in a file."""

    def __init__(self, folder: Path, *flags: str):
        self.folder, self.address = folder, Address("unix", str(folder / "e.sock"))
        self.log = folder / "engine.log"
        env = {**os.environ, "LLADA_LSP_TEST_STEP_DELAY_MS": "20"}
        command = [*ENGINE, "--listen", str(self.address), "--threads", "1", *flags]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(command, env=env, stderr=log, stdout=subprocess.DEVNULL)

    async def connect(self, name: str, **kwargs) -> EngineClient:
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                client = await EngineClient.connect(self.address, name, **kwargs)
                if client.welcome.state == "ready" or (await client.status()).state == "ready":
                    return client
                await client.close()
            except EngineFailure:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise
            assert time.monotonic() < deadline, "the engine never became ready"
            await asyncio.sleep(0.1)  # importing or loading: nothing to await but its socket

    def rss_mib(self) -> float:
        text = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+)", text).group(1)) / 1024

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def engine():
    folder = Path(tempfile.mkdtemp(prefix="ll", dir="/tmp"))
    process = Engine(folder, "--max-batch", str(MAX_BATCH), "--max-queue", str(MAX_QUEUE))
    yield process
    process.stop()
    shutil.rmtree(folder, ignore_errors=True)


def infill(client: EngineClient, before: str = BEFORE, key: str = "a.py", max_tokens: int = 64) -> wire.Infill:
    return wire.Infill(client.next_id(), key, before, "\n", "speed", max_tokens, 1024)


async def raw(address: Address, hello: wire.Message | None = HELLO):
    reader, writer = await asyncio.open_unix_connection(address.path)
    if hello is not None:
        wire.write(writer, hello)
        assert isinstance(await asyncio.wait_for(wire.read(reader), 10), wire.Welcome)
    return reader, writer


async def last_words(reader: asyncio.StreamReader, seconds: float = 5) -> list[wire.Message]:
    """What the service sends until it closes the connection, within `seconds` in all."""
    messages, deadline = [], time.monotonic() + seconds
    while (message := await asyncio.wait_for(wire.read(reader), max(0.01, deadline - time.monotonic()))) is not None:
        messages.append(message)
    return messages


async def timed(coro) -> tuple[float, object]:
    start = time.monotonic()
    result = await asyncio.wait_for(coro, TIMEOUT)
    return time.monotonic() - start, result


async def alone(engine: Engine) -> float:
    """A well-behaved editor's completion time with nobody else about (the better of two)."""
    async with await engine.connect("alone") as client:
        return min([(await timed(client.request(infill(client))))[0] for _ in range(2)])


def python_file(chars: int) -> str:
    """Valid Python of about `chars` characters, every function different."""
    one = "def f{0}(a, b):\n    if a > {0}:\n        return a - b\n    return [a, b, {0}]\n\n\n"
    return "".join(one.format(i) for i in range(chars // len(one.format(0)) + 1))


# --- 1. a huge Python rewrite ---------------------------------------------------------------------------------
async def test_a_huge_python_rewrite_does_not_stall_another_client(engine):
    """The guard parses the statements around the selection, not the megabytes the client sent; the
    prompt is cut as a front would. Before: ast over the whole text on the model thread (seconds per MB)."""
    tail = "def add(a, b):\n    "
    selection, after = "return   a+b", "\n\n\ndef sub(a, b):\n    return a - b\n"
    filler = python_file(1_500_000)
    async with await engine.connect("rewriter") as rewriter, await engine.connect("bystander") as bystander:
        # What the model makes of it (the prompt is the same: it reads only the window around the selection):
        # it must change the selection, or the guard never runs.
        probe = wire.Rewrite(filler[-6000:] + tail, selection, after + filler[:6000], "quality", 1024,
                             python=True, id=rewriter.next_id(), key="rw")  # fmt: skip
        assert (await asyncio.wait_for(rewriter.request(probe), TIMEOUT)).stopped != "unchanged"
        usual = await alone(engine)
        huge = wire.Rewrite(filler + tail, selection, after + filler, "quality", 1024, python=True,
                            id=rewriter.next_id(), key="rw")  # fmt: skip
        rewrite = asyncio.create_task(rewriter.request(huge))
        worst = 0.0
        for _ in range(200):  # the bystander types on until the rewrite is answered, guard included
            seconds, done = await timed(bystander.request(infill(bystander)))
            worst = max(worst, seconds)
            assert done.text.strip()
            if rewrite.done():
                break
        answer = await asyncio.wait_for(rewrite, TIMEOUT)
        assert answer.stopped in ("done", "refused")
        assert worst < 2 * usual + 1.5, f"the bystander waited {worst:.1f} s (alone: {usual:.2f} s)"


async def test_huge_rewrites_leave_no_memory_behind(engine):
    """A request's text is freed with its request. Before: the ticket's job and the answer callback
    (which named the request) sat in reference cycles that only a rare full pass of the collector
    frees, so every huge rewrite left its megabytes behind (+7 MiB per 2 x 4.6 MB rewrite, in a row)."""
    filler = python_file(3_000_000)
    async with await engine.connect("rewriter") as rewriter:

        async def rewrite_and_rest() -> float:
            huge = wire.Rewrite(filler + "def add(a, b):\n    ", "return   a+b", "\n\n\n" + filler, "quality", 1024,
                                python=True, id=rewriter.next_id(), key="rw")  # fmt: skip
            assert (await asyncio.wait_for(rewriter.request(huge), TIMEOUT)).stopped in ("done", "refused")
            await asyncio.sleep(2)  # idle: the worker gives freed memory back after 1 s
            return engine.rss_mib()

        first = await rewrite_and_rest()
        last = [await rewrite_and_rest() for _ in range(5)][-1]
    assert last - first < 10, f"five more huge rewrites left {last - first:.0f} MiB behind"


# --- 2. before hello -----------------------------------------------------------------------------------------
async def test_a_large_frame_before_hello_is_refused_without_reading_it(engine):
    reader, writer = await raw(engine.address, hello=None)
    writer.write((HELLO_MAX + 1).to_bytes(4, "big") + b"\x00" * 100)  # the body never comes
    words = await last_words(reader)
    assert [(w.id, w.kind) for w in words if isinstance(w, wire.Failed)] == [(None, "bad_request")]
    assert f"over the {HELLO_MAX}-byte limit" in words[-1].message
    writer.close()


async def test_a_peer_still_sending_a_refused_hello_reads_the_refusal(engine):
    """A peer that announced a large hello and is still sending it when refused reads why: the service
    takes in (and drops) what it is still sending for a moment before it closes, so the peer's writes do
    not fail, and its buffered refusal is not lost to a reset, before it has read it."""
    await (await engine.connect("first")).close()  # listening
    peers = []
    for _ in range(10):
        reader, writer = await raw(engine.address, hello=None)
        writer.write((15 * 2**20).to_bytes(4, "big") + b"\x00" * 2**19)  # more than the socket buffers hold
        peers.append((reader, writer))
    kinds = []
    for reader, writer in peers:
        try:
            kinds.append([w.kind for w in await last_words(reader) if isinstance(w, wire.Failed)])
        except OSError as err:  # the connection reset before the refusal was read
            kinds.append(type(err).__name__)
        writer.close()
    assert kinds == [["bad_request"]] * len(peers), kinds


async def test_connections_waiting_to_say_hello_are_bounded(engine):
    silent = [await raw(engine.address, hello=None) for _ in range(MAX_UNGREETED)]
    try:
        reader, writer = await raw(engine.address, hello=None)  # one too many: told so, at once
        words = await last_words(reader, 3)
        assert [(w.id, w.kind) for w in words if isinstance(w, wire.Failed)] == [(None, "busy")]
        writer.close()
    finally:
        for _, w in silent:
            w.close()
    client = await engine.connect("after")  # the silent ones gone, hello is taken again
    await client.close()


# --- 3. a burst past the queue -------------------------------------------------------------------------------
async def test_a_burst_past_the_queue_is_busy_at_once_and_starves_nobody(engine):
    """400 requests with long windows on one connection: those past the queue are busy before any
    prompt is built, and a bystander's single request is served in its turn (not busy, not late)."""
    usual = await alone(engine)
    window = "".join(f"value_{i} = compute({i}, 'text {i}')\n" for i in range(100)) + BEFORE
    reader, writer = await raw(engine.address)
    count = 400
    frames = b"".join(
        wire.encode(wire.Infill(i, f"k{i}", window, "\n", "speed", 64, 1024)) for i in range(1, count + 1)
    )
    async with await engine.connect("bystander") as bystander:
        writer.write(frames)
        await writer.drain()
        seconds, done = await timed(bystander.request(infill(bystander)))
        assert done.text.strip()
        assert seconds < 2 * usual + 1.5, f"the bystander waited {seconds:.1f} s (alone: {usual:.2f} s)"
        answers: dict[int, str] = {}
        deadline = time.monotonic() + TIMEOUT
        while len(answers) < count and time.monotonic() < deadline:
            message = await asyncio.wait_for(wire.read(reader), TIMEOUT)
            if isinstance(message, (wire.Done, wire.Failed)) and message.id is not None:
                answers[message.id] = message.type if isinstance(message, wire.Done) else message.kind
        assert len(answers) == count  # every one answered
        assert list(answers.values()).count("busy") >= count - MAX_BATCH - MAX_QUEUE - 2
    writer.close()


# --- 4. a peer that sends and never reads ----------------------------------------------------------------------
async def test_a_peer_that_does_not_read_is_not_read_and_does_not_bloat_the_service(engine):
    async with await engine.connect("bystander") as bystander:
        await bystander.status()
        rss = engine.rss_mib()
        _reader, writer = await raw(engine.address)
        writer.write(wire.encode(wire.Status()) * 300_000)  # 300,000 asks, about 40 MB of answers
        worst, peak = 0.0, rss
        for _ in range(10):  # the bystander asks on, and the service's memory is watched, for about 3 s
            seconds, _ = await timed(bystander.status())
            worst, peak = max(worst, seconds), max(peak, engine.rss_mib())
            await asyncio.sleep(0.3)
        writer.transport.abort()
    assert worst < 1.0, f"a status took the bystander {worst:.2f} s"
    assert peak - rss < 12, f"the service grew by {peak - rss:.0f} MiB for a peer that does not read"


async def test_a_flood_of_status_asks_is_answered_once_per_interval(engine):
    """640 status asks at once from a peer that reads: a few answers (one per STATUS_INTERVAL, the
    last one after the flood), not 640 the loop would build and encode while everyone waits; the peer
    is read slowly meanwhile (32 frames per interval), and what it sends after the flood is answered."""
    async with await engine.connect("first"):  # the engine is up and its model loaded
        pass
    reader, writer = await raw(engine.address)
    writer.write(wire.encode(wire.Status()) * 640 + wire.encode(wire.Infill(1, "k", BEFORE, "\n", "speed", 8, 1024)))
    statuses, deadline = 0, time.monotonic() + 640 / 32 * STATUS_INTERVAL + TIMEOUT
    while (message := await asyncio.wait_for(wire.read(reader), deadline - time.monotonic())) is not None:
        statuses += isinstance(message, wire.Status)
        if isinstance(message, (wire.Done, wire.Failed)):
            assert isinstance(message, wire.Done), message
            break
    await asyncio.sleep(3 * STATUS_INTERVAL)  # the asks read last are answered at the interval's end
    while True:
        try:
            statuses += isinstance(await asyncio.wait_for(wire.read(reader), 0.2), wire.Status)
        except TimeoutError:
            break
    writer.close()
    assert 1 <= statuses < 100, f"{statuses} status frames for 640 asks"


# --- 5. a refusal of a huge frame ------------------------------------------------------------------------------
async def test_a_frame_of_many_unknown_fields_gets_a_short_refusal_and_a_short_log_line(engine):
    size = engine.log.stat().st_size
    fields = {"type": "infill", **{f"field{i:06d}": 1 for i in range(200_000)}}
    reader, writer = await raw(engine.address)
    body = msgpack.packb(fields)
    writer.write(len(body).to_bytes(4, "big") + body)
    words = await last_words(reader, 10)
    writer.close()
    refusal = [w for w in words if isinstance(w, wire.Failed)]
    assert [(w.id, w.kind) for w in refusal] == [(None, "bad_request")]
    assert len(refusal[0].message) < 1000
    async with await engine.connect("after") as client:  # the log line is written before the next hello's
        await client.status()
    assert engine.log.stat().st_size - size < 4000


# --- 6. the socket file deleted --------------------------------------------------------------------------------
async def test_a_deleted_socket_is_made_again_and_connections_go_on(engine):
    async with await engine.connect("before") as client:
        os.unlink(engine.address.path)
        deadline = time.monotonic() + 10
        while not os.path.exists(engine.address.path):
            assert time.monotonic() < deadline, "the socket was not made again"
            await asyncio.sleep(0.1)
        assert stat.S_ISSOCK(os.lstat(engine.address.path).st_mode)
        assert os.lstat(engine.address.path).st_mode & 0o777 == 0o600
        async with await engine.connect("after") as newcomer:
            assert (await asyncio.wait_for(newcomer.request(infill(newcomer)), TIMEOUT)).text.strip()
        assert (await asyncio.wait_for(client.request(infill(client)), TIMEOUT)).text.strip()


# --- 7. an unsafe listen folder, a planted lock ----------------------------------------------------------------
async def start_and_expect_refusal(address: str) -> str:
    """The engine's stderr, once it has exited 1 (it must, within a few seconds: it never gets to load)."""
    proc = subprocess.Popen(
        [*ENGINE, "--listen", address], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
    try:
        _, err = await asyncio.to_thread(proc.communicate, timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"the engine started on {address}")
    assert proc.returncode == 1
    return err


async def test_a_listen_folder_others_can_write_is_refused(tmp_path):
    folder = tmp_path / "open"
    folder.mkdir()
    folder.chmod(0o777)
    err = await start_and_expect_refusal(f"unix:{folder}/e.sock")
    assert "closed to others" in err
    assert not (folder / "e.sock").exists()


async def test_a_planted_lock_symlink_is_not_followed(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (folder / "e.sock.lock").symlink_to(victim)
    err = await start_and_expect_refusal(f"unix:{folder}/e.sock")
    assert "symlink" in err
    assert victim.read_text() == "precious\n"


# --- 8. a client name that forges log lines ---------------------------------------------------------------------
async def test_a_client_name_cannot_forge_log_lines_or_send_escapes(engine):
    name = "evil\nllada-lsp engine WARNING: forged\x1b[31m red"
    _reader, writer = await raw(engine.address, wire.Hello(wire.VERSION, name))
    writer.close()
    async with await engine.connect("after") as client:
        await client.status()
    log = engine.log.read_text()
    assert "evil\\nllada-lsp engine WARNING: forged" in log  # the name is there, escaped
    assert not re.search(r"^llada-lsp engine WARNING: forged", log, re.MULTILINE) and "\x1b" not in log


# --- 9. figures that tell of other clients ------------------------------------------------------------------------
async def test_a_client_sees_its_own_figures_and_the_owner_the_totals(engine):
    header = '"""Small helpers for numbers and points."""\n\nimport math\nimport os\nimport sys\n\n\n' * 3
    async with await engine.connect("editor") as client, await engine.connect("other") as other:
        for _ in range(2):  # the second round finds the first's prompt blocks in the prefix cache
            await asyncio.wait_for(asyncio.gather(client.request(infill(client, header + BEFORE)),
                                                  other.request(infill(other, header + BEFORE))), TIMEOUT)  # fmt: skip
        pending = asyncio.create_task(other.request(infill(other, "def sub(a, b):\n    ", max_tokens=128)))
        status = await client.status()
        assert status.queue == 0  # its own requests: the other's one in flight is not counted
        assert all(getattr(status, name) is None for name in ("cache_hit_rate", "steps", "running", "batch_max"))
        owner = await EngineClient.connect(engine.address, "owner", totals=True)
        totals = await owner.status()
        await owner.close()
        assert totals.steps and totals.cache_hit_rate is not None and totals.clients >= 3
        await asyncio.wait_for(pending, TIMEOUT)
    command = await asyncio.to_thread(subprocess.run, [*ENGINE, "status", "--listen", str(engine.address)],
                                      check=False, capture_output=True, text=True, timeout=TIMEOUT)  # fmt: skip
    assert command.returncode == 0 and "prefix cache hits:" in command.stdout and "batches:" in command.stdout


# --- 10. status pushed on every change ------------------------------------------------------------------------------
async def test_status_is_pushed_when_the_clients_or_a_queue_change(engine):
    pushed: list[wire.Status] = []
    async with await engine.connect("watcher") as watcher:
        watcher.on_status = pushed.append

        async def pushed_where(check) -> wire.Status:
            deadline = time.monotonic() + 5
            while not any(check(s) for s in pushed):
                assert time.monotonic() < deadline, f"no such status was pushed: {pushed}"
                await asyncio.sleep(0.05)
            return next(s for s in pushed if check(s))

        clients = (await watcher.status()).clients
        pushed.clear()
        newcomer = await engine.connect("newcomer")
        await pushed_where(lambda s: s.clients == clients + 1 and s.state == "ready")
        await newcomer.close()
        await pushed_where(lambda s: s.clients == clients)
        pushed.clear()
        # A block on an empty line: longer than the push interval, so the change is seen.
        request = asyncio.create_task(watcher.request(infill(watcher, "def sub(a, b):\n    ", max_tokens=128)))
        await pushed_where(lambda s: s.queue == 1)
        await asyncio.wait_for(request, TIMEOUT)
        await pushed_where(lambda s: s.queue == 0)


# --- 11. a half-close --------------------------------------------------------------------------------------------------
async def test_what_was_sent_before_a_half_close_is_answered(engine):
    reader, writer = await raw(engine.address)
    wire.write(writer, wire.Infill(7, "a.py", BEFORE, "\n", "speed", 64, 1024))
    await writer.drain()
    writer.transport.write_eof()  # shutdown(SHUT_WR): "that is all I have to say"
    words = await last_words(reader, TIMEOUT)
    assert [(w.id, w.text.strip() != "") for w in words if isinstance(w, wire.Done)] == [(7, True)]
    writer.close()


# --- 12. a burst of connects --------------------------------------------------------------------------------------------
async def test_a_burst_of_connects_is_not_refused(engine):
    """300 connects at once, faster than any loop accepts: the listen backlog holds every one (with
    asyncio's default of 100, a Unix socket refuses the rest with EAGAIN), and the service answers after."""
    await (await engine.connect("warm-up")).close()  # the engine is listening
    sockets, refused = [], []
    try:
        for _ in range(300):
            s = socket.socket(socket.AF_UNIX)
            s.setblocking(False)
            sockets.append(s)
            try:
                s.connect(engine.address.path)
            except OSError as error:  # BlockingIOError (EAGAIN) past the backlog
                refused.append(error.errno)
    finally:
        for s in sockets:
            s.close()
    assert not refused, f"{len(refused)} of 300 connects refused, errno {sorted(set(refused))}"
    client = await engine.connect("after")
    try:
        assert (await asyncio.wait_for(client.request(infill(client)), TIMEOUT)).text.strip()
    finally:
        await client.close()


# --- 13. a stopped service --------------------------------------------------------------------------------------------
async def test_a_stopped_engine_is_reported_not_responding_and_recovers(engine, monkeypatch):
    monkeypatch.setattr(RemoteCompleter, "SILENCE_SECONDS", 1.0)
    lines: list[str] = []
    await (await engine.connect("warm-up")).close()  # the engine is ready
    completer = await RemoteCompleter.connect(str(engine.address), None, lines.append)
    try:
        assert completer.status()["state"] == "ready"
        job = Infill.at("def sub(a, b):\n    ", 19, "speed", 128, 1024)
        run = asyncio.create_task(completer.run("doc", "inline", job, None))
        engine.proc.send_signal(signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 10
            while completer.status()["state"] != "not responding":
                assert time.monotonic() < deadline, f"still {completer.status()}"
                await asyncio.sleep(0.1)
            assert sum("not responding" in line for line in lines) == 1
        finally:
            engine.proc.send_signal(signal.SIGCONT)
        outcome = await asyncio.wait_for(run, TIMEOUT)  # the request goes on where it was
        assert outcome.steps > 0
        assert completer.status()["state"] == "ready" and any("answers again" in line for line in lines)
    finally:
        await completer.client.close()
