"""Where the LSP front's completions come from: the model in this process (`LocalCompleter`, on the
model thread) or an engine service over a socket (`RemoteCompleter`), behind one small interface
(`Completer`): the server asks it and never which one it is.

Knows jobs as plain values (completion/jobs.py) and the wire protocol; nothing of pygls. A remote
completer imports no torch: a front connected to a service never loads the model's libraries.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from .. import wire
from ..address import parse_address
from ..completion import next_edit
from ..completion.generation import ModelSpec
from ..completion.jobs import Job, Outcome, outcome_of, to_wire
from ..completion.pipeline import make_plan
from ..errors import Refused
from ..runtime.worker import Loader, ModelUnavailable, ModelWorker, Ticket
from ..service.client import EngineClient, EngineFailure

DraftCallback = Callable[[int, Any], None]

logger = logging.getLogger(__name__)


def next_edit_key(uri: str) -> str:
    """The key of a document's next-edit jobs. A newer job of a key supersedes the older one; inline
    completions are keyed by the document's URI alone, so a next edit and a completion never cancel
    each other."""
    return f"next-edit:{uri}"


def warm_key(uri: str) -> str:
    """The key of a document's idle prefills (see `next_edit_key`): a completion does not cancel one."""
    return f"warm:{uri}"


def rewrite_key(uri: str) -> str:
    """The key of a document's rewrites (see `next_edit_key`)."""
    return f"rewrite:{uri}"


class CompletionFailed(Exception):
    """A request the completer could not serve; the message is for the user."""


class Completer(Protocol):
    """What the server asks of where its completions come from."""

    address: str  # "local", or where the engine service is: for messages and status

    @property
    def revises(self) -> bool:
        """Whether a generation can start from a draft (typing through a suggestion revises it)."""

    @property
    def leaves_machine(self) -> bool:
        """Whether what is sent to it may leave this machine (a service over TCP, or SGLang's)."""

    @property
    def embedded(self) -> bool:
        """Whether it runs the embedded model, known before the model has loaded (it follows no
        instruction)."""

    def load(self, spec: ModelSpec, report: Callable[[str, int], None]) -> Ticket | None:
        """Loads `spec` here; None where the model is not this process's to choose (a service's)."""

    async def run(self, key: str, label: str, job: Job, on_draft: DraftCallback | None) -> Outcome:
        """`job`'s outcome; it supersedes the running job of `key`. Raises CompletionFailed, or
        CancelledError when superseded or cancelled."""

    def cancel_key(self, key: str) -> None: ...

    async def refresh(self) -> None:
        """Reaches the engine again if it went away (a service); nothing for the model here."""

    def status(self) -> dict[str, Any]: ...

    def stop(self) -> bool:
        """Stops without waiting; True when nothing of it still runs."""


class LocalCompleter:
    """The model in this process, on a ModelWorker thread."""

    address = "local"
    revises = True  # the native engine starts from a draft
    leaves_machine = False

    def __init__(self, worker: ModelWorker):
        self.worker = worker

    @property
    def embedded(self) -> bool:
        return self.worker.spec.path is None

    def load(self, spec: ModelSpec, report: Callable[[str, int], None]) -> Ticket:
        return self.worker.load(spec, report)

    async def run(self, key: str, label: str, job: Job, on_draft: DraftCallback | None) -> Outcome:
        plan = next_edit.NextEditPlan if isinstance(job, next_edit.NextEdit) else make_plan
        ticket = self.worker.submit(key, label, lambda model, t: plan(model, job, t), on_draft)
        try:
            return await asyncio.wrap_future(ticket.future)
        except asyncio.CancelledError:  # $/cancelRequest, a newer request, or shutdown
            ticket.cancel()
            raise
        except ModelUnavailable as err:
            raise CompletionFailed(f"no model: {err}") from None
        except Refused as err:  # SelectionTooLong, InstructionUnsupported, Busy: said to the user as they are
            raise CompletionFailed(str(err)) from None

    def cancel_key(self, key: str) -> None:
        self.worker.cancel_key(key)

    async def refresh(self) -> None:
        pass

    def status(self) -> dict[str, Any]:
        out = {"engine": "local", "model": self.worker.spec.name, "state": self.worker.state}
        if self.worker.error:
            out["error"] = self.worker.error
        if self.worker.state == "ready" and self.worker.model is not None:
            fields = self.worker.model.family_fields()
            out.update({key: fields[key] for key in ("family", "decoding", "kernels") if key in fields})
        return out

    def stop(self) -> bool:
        return self.worker.stop(timeout=0)


class RemoteCompleter:
    """An engine service: requests go over the socket as text windows; supersede and cancel are keyed
    per connection by the service. A dropped connection fails what was in flight and is made again
    on the next request (at most once a second). An engine silent for SILENCE_SECONDS (a stopped
    process) is "not responding" in `status()`, said once in the log, until its next frame."""

    RETRY_SECONDS = 1.0
    SILENCE_SECONDS = 5.0

    def __init__(self, client: EngineClient, target: str | None, token: str | None, log: Callable[[str], None]):
        """`target`: the address asked for (None: the default socket)."""
        self.client, self.target, self.token, self.log = client, target, token, log
        self.address = str(parse_address(target))  # where it is, for messages and status
        self._last: wire.Status | None = None
        self._tried = 0.0
        self._keys: dict[str, asyncio.Task] = {}
        self._adopt(client)

    def _adopt(self, client: EngineClient) -> None:
        self.client, client.on_status, client.on_responding = client, self._on_status, self._on_responding

    def _on_responding(self, responding: bool) -> None:
        self.log(f"the engine service at {self.address} " + ("answers again" if responding else
                 f"is not responding (nothing from it for {self.SILENCE_SECONDS:.0f} s)"))  # fmt: skip

    @classmethod
    async def connect(cls, address: str | None, token: str | None, log: Callable[[str], None]) -> RemoteCompleter:
        """Raises EngineFailure when nothing answers or the service refuses the hello."""
        client = await EngineClient.connect(address, "llada-lsp", token, silence=cls.SILENCE_SECONDS)
        return cls(client, address, token, log)

    def _on_status(self, status: wire.Status) -> None:
        self._last = status

    embedded = False  # the service refuses an instruction itself when its model cannot follow one

    @property
    def revises(self) -> bool:
        """Whether the service's backend starts from a draft (its welcome says False for SGLang)."""
        return self.client.welcome.revise is not False

    @property
    def leaves_machine(self) -> bool:
        """A service over TCP, or one whose backend is SGLang (its server may be anywhere)."""
        return self.address.startswith("tcp") or not self.revises

    def load(self, spec: ModelSpec, report: Callable[[str, int], None]) -> None:
        return None  # the model is the service's

    async def _connected(self) -> EngineClient:
        if self.client.gone is None:
            return self.client
        if time.monotonic() - self._tried < self.RETRY_SECONDS:
            raise CompletionFailed(f"the engine service at {self.address} is unavailable: {self.client.gone.message}")
        self._tried = time.monotonic()
        try:
            client = await EngineClient.connect(self.target, "llada-lsp", self.token, silence=self.SILENCE_SECONDS)
        except EngineFailure as err:
            raise CompletionFailed(f"the engine service at {self.address} is unavailable: {err.message}") from None
        self.log(f"reconnected to the engine service at {self.address}")
        self._adopt(client)
        self._last = None
        return client

    async def refresh(self) -> None:
        """Connects again if the service went away and the last try is a second old (for status)."""
        try:
            await self._connected()
        except CompletionFailed:
            pass

    async def run(self, key: str, label: str, job: Job, on_draft: DraftCallback | None) -> Outcome:
        client = await self._connected()
        self._keys[key] = asyncio.current_task()  # the service supersedes the older request of the key
        try:
            frame = next_edit.to_wire if isinstance(job, next_edit.NextEdit) else to_wire
            done = await client.request(frame(job, client.next_id(), key, on_draft is not None), on_draft)
        except EngineFailure as err:
            if err.kind == "cancelled":  # superseded by a newer request with the same key
                raise asyncio.CancelledError() from None
            raise CompletionFailed(err.message if err.kind != "engine_gone" else
                                   f"the engine service at {self.address} is gone: {err.message}") from None  # fmt: skip
        finally:
            if self._keys.get(key) is asyncio.current_task():
                del self._keys[key]
        return outcome_of(done)

    def cancel_key(self, key: str) -> None:
        task = self._keys.pop(key, None)
        if task is not None:
            task.cancel()  # the client sends `cancel` for the request the task awaits

    def status(self) -> dict[str, Any]:
        welcome, last = self.client.welcome, self._last
        state = "unavailable" if self.client.gone else "not responding" if not self.client.responding else (
            (last and last.state) or welcome.state)  # fmt: skip
        out = {"engine": self.address, "model": (last and last.model) or welcome.model, "state": state}
        error = (last and last.error) or (self.client.gone and self.client.gone.message)
        if error:
            out["error"] = error
        if state == "ready" and last is not None and last.family is not None:
            out.update(
                family=last.family, decoding=last.decoding, **({"kernels": last.kernels} if last.kernels else {})
            )
        return out

    def stop(self) -> bool:
        for task in self._keys.values():
            task.cancel()
        asyncio.ensure_future(self.client.close())
        return True


async def choose(choice: str, token: str | None, loader: Loader | None,
                 log: Callable[[str], None]) -> tuple[Completer | None, str | None]:  # fmt: skip
    """The completer for the engine setting `choice` ("local", "auto" or a service's address): the
    engine service if one is asked for (or, with `auto`, answers at the default socket), else the model
    in this process (not loaded yet); or None and why not (the named service did not answer, or this
    server has no model of its own)."""
    if choice != "local":
        try:
            remote = await RemoteCompleter.connect(None if choice == "auto" else choice, token, log)
        except EngineFailure as err:
            if choice != "auto":
                return None, f"cannot use the engine service at {choice}: {err.message}"
            logger.info("no engine service at the default socket (%s): the model runs in this process", err.message)
        else:
            logger.info("using the engine service at %s (model %s)", remote.address, remote.status()["model"])
            return remote, None
    if loader is None:
        return None, "this server was started without a model of its own: set engine to a service's address"
    return LocalCompleter(ModelWorker(asyncio.get_running_loop(), log, loader)), None
