"""The engine service: one long-lived process owns the model and serves many LSP fronts over a socket
in the llada_lsp.wire protocol (hello; infill, rewrite, cancel, status; drafts, done, failed back).

Knows nothing of the LSP, documents or positions: text windows in, texts out. Model work runs on the
worker's thread, never on the loop; a connection's requests are keyed to it, so fronts never
supersede or cancel each other, and a bad frame closes only the connection that sent it.

Supersede: a newer request with the same key on the same connection cancels the older one, which
answers `failed{kind: "cancelled"}` at once (as does a `cancel`); its job stops within one step.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import hmac
import itertools
import logging
import os
import signal
import socket
import stat
import sys
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Awaitable, Callable, Sequence

from .. import wire
from ..completion.pipeline import (Infill, InfillPlan, InstructionUnsupported, LoadedModel, ModelSpec, Outcome, Plan,
                                   Rewrite, RewritePlan, add_model_arguments)  # fmt: skip
from ..completion.prompt import SelectionTooLong
from ..errors import Busy, TooLong
from .loop import run
from .worker import ModelUnavailable, ModelWorker, Ticket, step_delay_from_env
from .address import Address, default_socket_path, parse_address, private_folder, read_token
from .client import EngineClient, EngineFailure
from .backend import MODES as SGLANG_MODES, BackendFailure, backend_argument

logger = logging.getLogger("llada_lsp.engine")

HELLO_TIMEOUT = 10.0  # seconds a new connection has to say hello before it is closed
DRAFT_BACKLOG = 2**20  # unsent bytes past which a connection's drafts are dropped (a front that is not reading)
FAILURES = ((ModelUnavailable, "no_model"), (SelectionTooLong, "too_long"), (InstructionUnsupported, "unsupported"),
            (TooLong, "too_long"), (Busy, "busy"))  # fmt: skip
Job = Callable[[LoadedModel, Ticket], Plan]
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Rejected(Exception):
    """Ends a connection: sent as `failed{id: None, kind, message}` before it closes."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind, self.message = kind, message


class AlreadyServing(RuntimeError):
    """Another engine holds the socket path."""


@dataclass(eq=False)
class Session:
    """One connection that said hello: who it is, and its requests in flight (wire id -> ticket)."""

    id: int
    client: str
    writer: asyncio.StreamWriter
    pending: dict[int, Ticket] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.client}#{self.id}"

    def send(self, message: wire.Message) -> None:
        if not self.writer.is_closing():
            wire.write(self.writer, message)

    def backlogged(self) -> bool:
        return self.writer.transport.get_write_buffer_size() > DRAFT_BACKLOG


class EngineService:
    """The connections and their requests over one ModelWorker. `handle` is the stream server's
    callback; all of this runs on the loop, the jobs on the worker's thread. Knows nothing of sockets
    or files (see Listener)."""

    def __init__(self, worker: ModelWorker, modes: Sequence[str], token: str | None = None):
        """`modes`: the decoding presets requests may name; `token`: the secret every hello must carry
        (None: no check, for a socket only its owner can open)."""
        self.worker, self.modes, self.token = worker, tuple(modes), token
        self.sessions: dict[int, Session] = {}
        self._ids = itertools.count(1)
        self._load_report: tuple[str, int] | None = None
        self._connections: set[asyncio.Task] = set()

    # --- the model and its status ---------------------------------------------------------------
    def load(self, spec: ModelSpec) -> Ticket:
        """Loads the model on the worker; every connection is told how it goes (status frames)."""
        ticket = self.worker.load(spec, self._on_load_report)
        ticket.when_done(lambda _: self._on_loaded(spec))
        return ticket

    def _on_load_report(self, message: str, percent: int) -> None:
        self._load_report = (message, percent)
        self.push_status()

    def _on_loaded(self, spec: ModelSpec) -> None:
        self._load_report = None
        if self.worker.error:
            logger.error("cannot load the model %s: %s", spec.name, self.worker.error)
        self.push_status()

    def status(self) -> wire.Status:
        worker = self.worker
        message, progress = self._load_report if worker.state == "loading" and self._load_report else (None, None)
        queue = sum(len(s.pending) for s in self.sessions.values())
        return wire.Status(worker.state, worker.spec.name, progress, message, worker.error, len(self.sessions), queue,
                           **worker.stats())  # fmt: skip

    def push_status(self) -> None:
        status = self.status()
        for session in self.sessions.values():
            session.send(status)

    def limits(self) -> dict[str, int]:
        limits = {"max_frame": wire.MAX_FRAME}
        model = self.worker.model
        if model is not None:
            limits |= {"max_positions": model.max_positions, "block_size": model.engine.block_size}
        return limits

    # --- connections ----------------------------------------------------------------------------
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection from hello to close. Whatever goes wrong here closes this one only."""
        task = asyncio.current_task()
        self._connections.add(task)
        session, name, reason, level = None, "a connection", "closed by the client", logging.INFO
        try:
            session = await self._greet(reader, writer)
            name = session.name
            while (message := await wire.read(reader)) is not None:
                self._dispatch(session, message)
        except (Rejected, wire.WireError) as err:
            kind = err.kind if isinstance(err, Rejected) else "bad_request"
            reason, level = f"refused ({kind}): {err}", logging.WARNING
            if not writer.is_closing():
                wire.write(writer, wire.Failed(None, kind, str(err)))
        except TimeoutError:
            reason = f"no hello within {HELLO_TIMEOUT:.0f} s"
        except (asyncio.IncompleteReadError, ConnectionError) as err:
            reason = f"dropped: {err or type(err).__name__}"
        except asyncio.CancelledError:
            reason = "the engine is stopping"
        finally:
            self._connections.discard(task)
            cancelled = self._drop(session) if session is not None else 0
            writer.close()
            more = f"; {cancelled} requests cancelled" if cancelled else ""
            logger.log(level, "%s: %s%s", name, reason, more)

    async def _greet(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Session:
        hello = await asyncio.wait_for(wire.read(reader), HELLO_TIMEOUT)
        if hello is None:
            raise ConnectionResetError("closed before hello")
        if not isinstance(hello, wire.Hello):
            raise Rejected("bad_request", f"the first frame must be hello, not {hello.type}")
        # The token first, in constant time: a peer without it learns nothing, not even the version.
        if self.token is not None and not hmac.compare_digest((hello.token or "").encode(), self.token.encode()):
            raise Rejected("auth", "wrong or missing token")
        if hello.version != wire.VERSION:
            raise Rejected("version", f"this engine speaks protocol version {wire.VERSION}, the client {hello.version}")
        session = Session(next(self._ids), hello.client[:80] or "client", writer)
        self.sessions[session.id] = session
        worker = self.worker
        session.send(wire.Welcome(wire.VERSION, worker.spec.name, worker.state, list(self.modes), self.limits()))
        logger.info("%s: connected", session.name)
        return session

    def _dispatch(self, session: Session, message: wire.Message) -> None:
        if isinstance(message, (wire.Infill, wire.Rewrite)):
            self._submit(session, message)
        elif isinstance(message, wire.Cancel):
            ticket = session.pending.get(message.id)
            if ticket is not None:
                ticket.cancel()  # answered by _answer, on the loop's next turn
        elif isinstance(message, wire.Status):
            session.send(self.status())
        else:
            raise wire.WireError(f"a client does not send {message.type}")

    def _drop(self, session: Session) -> int:
        """Forgets a closed connection and cancels its requests; how many there were."""
        self.sessions.pop(session.id, None)
        tickets = list(session.pending.values())
        session.pending.clear()  # before the cancels: their answers have nowhere to go
        for ticket in tickets:
            ticket.cancel()
        return len(tickets)

    async def close(self) -> None:
        """Closes every connection (their requests are cancelled)."""
        tasks = list(self._connections)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- requests -------------------------------------------------------------------------------
    def _submit(self, session: Session, request: wire.Infill | wire.Rewrite) -> None:
        problem = self._problem(session, request)
        if problem is not None:
            session.send(wire.Failed(request.id, "bad_request", problem))
            return
        def send_draft(step: int, text: str) -> None:
            if not session.backlogged():  # a later draft or the done says it all anyway
                session.send(wire.Draft(request.id, step, text))

        job, on_draft = _job(request), send_draft if request.drafts else None
        label = f"{request.type} {session.name}:{request.id}"
        ticket = self.worker.submit(f"{session.id}:{request.key}", label, job, on_draft)
        session.pending[request.id] = ticket
        ticket.when_done(lambda _: self._answer(session, request.id, ticket))  # after its drafts

    def _problem(self, session: Session, request: wire.Infill | wire.Rewrite) -> str | None:
        if request.id in session.pending:
            return f"request {request.id} is already in flight"
        if request.mode not in self.modes:
            return f"unknown mode {request.mode!r}; this engine has {', '.join(self.modes)}"
        if request.context_tokens < 1 or (isinstance(request, wire.Infill) and request.max_tokens < 1):
            return "max_tokens and context_tokens must be positive"
        return None

    def _answer(self, session: Session, request_id: int, ticket: Ticket) -> None:
        if session.pending.get(request_id) is not ticket:  # the connection closed: nobody to tell
            return
        del session.pending[request_id]
        session.send(_answer_of(request_id, ticket.future))


def _job(request: wire.Infill | wire.Rewrite) -> Job:
    """The worker job of a request: the window becomes the job's whole text."""
    if isinstance(request, wire.Infill):
        infill = Infill(request.before + request.after, len(request.before), request.mode, request.max_tokens,
                        request.context_tokens)  # fmt: skip
        return lambda model, ticket: InfillPlan(model, infill, ticket)
    start = len(request.before)
    rewrite = Rewrite(request.before + request.selection + request.after, start, start + len(request.selection),
                      request.mode, request.context_tokens, request.instruction, request.python)  # fmt: skip
    return lambda model, ticket: RewritePlan(model, rewrite, ticket)


def _answer_of(request_id: int, future: Future) -> wire.Message:
    if future.cancelled():
        return wire.Failed(request_id, "cancelled", "cancelled, or superseded by a newer request with the same key")
    error = future.exception()
    if error is None:
        outcome: Outcome = future.result()
        return wire.Done(request_id, outcome.text, outcome.steps, outcome.seconds, outcome.stopped, outcome.reason,
                         outcome.tokens)  # fmt: skip
    kind = error.kind if isinstance(error, BackendFailure) else next(
        (kind for cls, kind in FAILURES if isinstance(error, cls)), "internal")
    return wire.Failed(request_id, kind, str(error) or type(error).__name__)


# --- the socket -------------------------------------------------------------------------------------
class Listener:
    """Where the service listens. For a Unix path: a folder closed to others, a lock held while the
    service lives (a second service on the path refuses to start, even while the first still loads),
    a stale socket file replaced, the socket made 0600, and removed at exit. For TCP: the port."""

    def __init__(self, address: Address, lock: int | None):
        self.address, self.lock = address, lock
        self.server: asyncio.AbstractServer | None = None

    @classmethod
    def claim(cls, address: Address) -> Listener:
        """Takes the path (AlreadyServing if another engine has it; ValueError for an unsafe folder or
        a path that is not a socket); binds nothing yet. Cheap: run before the model is imported."""
        if address.kind == "tcp":
            return cls(address, None)
        path = Path(address.path)
        if path == default_socket_path():  # in a shared temporary folder: it must be ours alone
            private_folder(path.parent, create=True)
        else:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _remove_stale(path)
        except BlockingIOError:
            os.close(lock)
            raise AlreadyServing(f"another engine is serving on {path}") from None
        except BaseException:
            os.close(lock)
            raise
        return cls(address, lock)

    async def bind(self, handle: Handler) -> None:
        if self.address.kind == "tcp":
            self.server = await asyncio.start_server(handle, self.address.host, self.address.port)
            self.address = replace(self.address, port=self.server.sockets[0].getsockname()[1])
            return
        umask = os.umask(0o177)  # the socket is born 0600: no moment when others could connect
        try:
            self.server = await asyncio.start_unix_server(handle, path=self.address.path)
        finally:
            os.umask(umask)

    def close(self) -> None:
        """Stops accepting; removes the socket file, then lets the path go."""
        if self.server is not None:
            self.server.close()
        if self.lock is not None:
            if self.server is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.address.path)
            os.close(self.lock)  # the lock file stays: removing it would race with a new service's lock
            self.lock = None


def _remove_stale(path: Path) -> None:
    """Removes a socket file nobody answers on (its engine died); refuses to touch anything else."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise ValueError(f"{path} exists and is not a socket")
    with socket.socket(socket.AF_UNIX) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()
            return
    raise AlreadyServing(f"something already answers on {path}")


# --- the process ------------------------------------------------------------------------------------
async def serve(args: argparse.Namespace, address: Address, token: str | None, step_delay: float) -> int:
    """Runs the service until SIGTERM or SIGINT; 1 if it cannot listen."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        listener = Listener.claim(address)
    except (AlreadyServing, ValueError, OSError) as err:
        print(f"llada-lsp engine: {err}", file=sys.stderr)
        return 1
    def log(line: str) -> None:
        logger.info("%s", line)

    if args.backend is None:
        from ..engine.policy import PRESETS  # torch: paid by the service, not by `engine status` or --help

        worker, modes = ModelWorker(loop, log, step_delay), list(PRESETS)
    else:  # the tokenizer is ours, the model runs on SGLang servers (llada_lsp/service/sglang.py)
        from .sglang import SGLangWorker  # httpx: paid by an SGLang service only

        worker, modes = SGLangWorker(loop, log, args.backend), list(SGLANG_MODES)
    service = EngineService(worker, modes, token)
    try:
        await listener.bind(service.handle)
    except OSError as err:  # a TCP port in use
        print(f"llada-lsp engine: cannot listen on {address}: {err}", file=sys.stderr)
        return 1
    else:
        service.load(ModelSpec(args.model, args.device, args.dtype, max(1, args.threads), args.max_batch,
                               args.cache_mb, args.prefix_cache, args.max_queue, args.quantize, args.devices))  # fmt: skip
        logger.info("listening on %s", listener.address)
        await stop.wait()
        logger.info("stopping")
    finally:
        listener.close()  # first: no new connection while the others close
        await service.close()
        if not worker.stop(timeout=5):
            logger.warning("the model thread did not stop in time (a step is stuck, or a load is still reading a "
                           "tensor: it stops at the next one)")  # fmt: skip
        if args.backend is not None:  # SGLangWorker
            await worker.aclose()  # after the aborts of the requests it was serving
    return 0


async def ask_status(address: Address, token: str | None) -> wire.Status:
    async with await EngineClient.connect(address, "llada-lsp engine status", token, timeout=5) as client:
        return await asyncio.wait_for(client.status(), 5)


def status_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="llada-lsp engine status",
        description="Ask a running engine service what it serves: model, state, connected clients and "
        "requests in flight. Exits 1 if nothing answers.",
    )
    _address_arguments(ap)
    args = ap.parse_args(argv)
    address, token = _address_of(ap, args, need_token=False)
    try:
        status = asyncio.run(ask_status(address, token))
    except (EngineFailure, TimeoutError) as err:
        print(f"llada-lsp engine: {getattr(err, 'message', None) or f'no answer from {address}'}", file=sys.stderr)
        return 1
    lines = {"address": str(address), "model": status.model, "state": status.state, "error": status.error,
             "loading": f"{status.message} ({status.progress}%)" if status.progress is not None else None,
             "clients": max(0, (status.clients or 0) - 1), "queue": status.queue,
             "decoding": f"{status.running} running, {status.queued} waiting" if status.running is not None else None,
             "batches": f"{status.steps} forwards, {status.batch_mean:.2f} rows each on average, at most "
                        f"{status.batch_max}" if status.steps else None,
             "kv blocks": f"{status.cache_blocks_used} used, {status.cache_blocks_free} free"
                          if status.cache_blocks_used is not None else None,
             "prefix cache hits": f"{status.cache_hit_rate:.0%} of whole prompt blocks"
                                  if status.cache_hit_rate is not None else None}  # fmt: skip
    for name, value in lines.items():  # clients: this command's own connection is not counted
        if value is not None:
            print(f"{name}: {value}")
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="llada-lsp engine",
        description="The llada-lsp engine service: loads the model once and serves completions and "
        "rewrites to many language-server fronts (one per editor) over a socket, in the protocol of "
        "llada_lsp/wire.py. Stops on SIGTERM or Ctrl-C, removing its socket. "
        "`llada-lsp engine status [--listen ADDRESS]` asks a running one what it serves.",
    )
    add_model_arguments(ap)
    big = ap.add_argument_group("large models (see `llada-lsp plan`)")
    big.add_argument("--quantize", choices=["fp8"],
                     help="fp8: the routed experts in FP8 with 128x128 block scales, quantized at load from a "
                     "bf16 checkpoint (one already in FP8 loads as is)")  # fmt: skip
    big.add_argument("--devices", type=_devices, metavar="DEV,DEV,...",
                     help="split the layers over several devices, e.g. cuda:0,cuda:1 (instead of --device): "
                     "contiguous layer ranges balanced by bytes, each layer's K/V beside it")  # fmt: skip
    batching = ap.add_argument_group("batching and the K/V cache")
    batching.add_argument("--max-batch", type=_positive, default=8, metavar="N",
                          help="requests decoded together in one forward (default: 8; 1 decodes one at a "
                          "time, in arrival order)")  # fmt: skip
    batching.add_argument("--max-queue", type=_positive, default=64, metavar="N",
                          help="requests that may wait for a place in the batch; more are answered `busy` "
                          "(default: 64)")  # fmt: skip
    batching.add_argument("--cache-mb", type=float, metavar="MB",
                          help="memory for keys and values, in 32-token blocks, shared by the running requests "
                          "and the prefix cache (default: 256 on the CPU, a quarter of the free memory on a "
                          "GPU; never less than one request of the model's full length)")  # fmt: skip
    batching.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_false",
                          help="never reuse the keys and values of prompt blocks an earlier request computed")
    remote = ap.add_argument_group("where the model runs")
    remote.add_argument("--backend", type=backend_argument, metavar="native|sglang+URL[,quality=URL]",
                        help="native (default): this process loads the model; sglang+http://HOST:PORT"
                        "[,quality=http://HOST2:PORT2]: SGLang servers generate (speed requests to the first, "
                        "quality to the second, else to the first), the prompts are tokenized here with --model's "
                        "tokenizer (docs/sglang.md)")  # fmt: skip
    remote.add_argument("--backend-token-file", metavar="PATH",
                        help="a file of yours with mode 0600 holding the --api-key of the SGLang servers")
    remote.add_argument("--backend-timeout", type=float, default=30.0, metavar="SECONDS",
                        help="how long an SGLang server may send nothing in the middle of an answer before the "
                        "request fails (default: 30)")  # fmt: skip
    _address_arguments(ap)
    ap.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                    help="what the service logs on stderr: info is a line per connection and per request "
                    "(default: info)")  # fmt: skip
    return ap


def _devices(text: str) -> tuple[str, ...]:
    devices = tuple(d.strip() for d in text.split(",") if d.strip())
    if len(devices) < 2:
        raise argparse.ArgumentTypeError("name at least two devices, e.g. cuda:0,cuda:1 (one: use --device)")
    return devices


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _address_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--listen", metavar="ADDRESS",
                    help="unix:PATH, or tcp://HOST:PORT (tcp://:PORT is loopback; needs --token-file); default: "
                    f"unix:{default_socket_path()} ($XDG_RUNTIME_DIR/llada-lsp/engine.sock where "
                    "XDG_RUNTIME_DIR is set, else llada-lsp-<uid>/engine.sock in the temporary folder)")  # fmt: skip
    ap.add_argument("--token-file", metavar="PATH",
                    help="a file of yours with mode 0600 holding the secret every client must present "
                    "(required with tcp://; the token travels unencrypted: keep TCP on loopback or a "
                    "trusted network)")  # fmt: skip


def _address_of(ap: argparse.ArgumentParser, args: argparse.Namespace, need_token: bool) -> tuple[Address, str | None]:
    try:
        address = parse_address(args.listen)
        token = read_token(args.token_file) if args.token_file else None
    except (ValueError, OSError) as err:
        ap.error(str(err))
    if need_token and address.kind == "tcp" and token is None:
        ap.error("listening on TCP needs --token-file: anyone who can reach the port could use the engine")
    return address, token


def engine_main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["status"]:
        return status_main(argv[1:])
    ap = parser()
    args = ap.parse_args(argv)
    address, token = _address_of(ap, args, need_token=True)
    if args.devices and args.device:
        ap.error("--device and --devices: give one")
    if args.backend is None and args.backend_token_file:
        ap.error("--backend-token-file is for --backend sglang+URL")
    if args.backend is not None:
        try:
            args.backend = args.backend.configured(args.backend_token_file, args.backend_timeout)
        except (ValueError, OSError) as err:
            ap.error(str(err))
    log_format = "llada-lsp engine %(levelname)s: %(message)s"
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(), format=log_format)
    return run(serve(args, address, token, step_delay_from_env()))


if __name__ == "__main__":
    raise SystemExit(engine_main())
