"""The HTTP dialogue with one SGLang server (its native API: /health, /get_model_info, streamed
/generate, /abort_request), its failures in words mapped onto the wire's failure kinds, and the
contents of its stream.

httpx only; knows nothing of plans, the service or the LSP.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import httpx

from .sglang_config import BackendFailure

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5.0  # seconds to open a connection to a server
ABORT_TIMEOUT = 5.0


# --- one server ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Health:
    state: str = "unknown"  # "unknown" | "unreachable" | "loading" | "refused" | "broken" | "ready"
    detail: str = "was not asked yet"  # in words, after "SGLang at URL", for status and errors
    model: str | None = None  # what it serves (/get_model_info's model_path)


class SGLangServer:
    """One SGLang server's native HTTP API as this backend uses it: /health (never needs the key),
    /get_model_info (checks the key), streamed /generate and /abort_request. Request failures raise
    BackendFailure; `health` is what the last exchange said about the server."""

    def __init__(self, url: str, http: httpx.AsyncClient, api_key: str | None, timeout: float):
        self.url, self.http, self.has_key = url, http, api_key is not None
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # read: the longest silence inside an answer (between two blocks); the other phases are short
        self.timeout = httpx.Timeout(timeout, connect=CONNECT_TIMEOUT)
        self.health = Health()

    async def probe(self) -> Health:
        """Asks /health, then (if up) /get_model_info, which needs the key: `health` afterwards."""
        try:
            answer = await self.http.get(f"{self.url}/health", timeout=CONNECT_TIMEOUT)
            if answer.status_code == 200:
                info = await self.http.get(f"{self.url}/get_model_info", headers=self.headers, timeout=CONNECT_TIMEOUT)
                if info.status_code in (401, 403):
                    raise _status_failure(self.url, info.status_code, info.content, self.has_key)
                served = _json_field(info.content, "model_path") if info.status_code == 200 else None
                self.health = Health("ready", "is ready", served)
            elif answer.status_code == 503:
                self.health = Health("loading", "is loading (its /health answers 503: warming up, or shutting down)")
            else:
                self.health = Health("broken", f"answers /health with {answer.status_code}: is it an SGLang server?")
        except BackendFailure as err:
            self._learn(err)
        except httpx.HTTPError as err:
            self._learn(_exception_failure(self.url, err, self.timeout.read))
        return self.health

    async def generate(self, payload: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """The objects of a streamed /generate, in order, up to `data: [DONE]` (an `error` object
        raises). Closing the iterator early closes the stream."""
        try:
            async with self.http.stream("POST", f"{self.url}/generate", json=payload, headers=self.headers,
                                        timeout=self.timeout) as answer:  # fmt: skip
                if answer.status_code != 200:
                    raise _status_failure(self.url, answer.status_code, await answer.aread(), self.has_key)
                self.health = replace(self.health, state="ready", detail="is ready")
                async for line in answer.aiter_lines():
                    if not line.startswith("data:"):
                        continue  # the blank line after each event
                    data = line.removeprefix("data:").strip()
                    if data == "[DONE]":
                        return
                    chunk = _json_object(self.url, data)
                    if "error" in chunk:
                        raise error_failure(self.url, _message_of(chunk))
                    yield chunk
        except BackendFailure as err:
            self._learn(err)
            raise
        except httpx.HTTPError as err:
            failure = _exception_failure(self.url, err, self.timeout.read)
            self._learn(failure)
            raise failure from None

    async def abort(self, rid: str) -> None:
        """Asks the server to stop request `rid`. A failure is logged, never raised: the stream is
        closed anyway, which SGLang also takes as an abort once it notices."""
        try:
            answer = await self.http.post(f"{self.url}/abort_request", json={"rid": rid}, headers=self.headers,
                                          timeout=ABORT_TIMEOUT)  # fmt: skip
        except httpx.HTTPError as err:
            logger.warning("could not ask SGLang at %s to abort %s: %s", self.url, rid, err or type(err).__name__)
            return
        if answer.status_code != 200:
            logger.warning("SGLang at %s answered the abort of %s with %d: %s", self.url, rid, answer.status_code,
                           _message_of(_json_or_text(answer.content)))  # fmt: skip

    def _learn(self, failure: BackendFailure) -> None:
        """What a failure says about the server (a request's own failure says nothing)."""
        state = {"no_model": "unreachable", "auth": "refused"}.get(failure.kind)
        if state == "unreachable" and "503" in failure.message:
            state = "loading"
        if state is not None:
            self.health = Health(state, failure.message.removeprefix(f"SGLang at {self.url} "), self.health.model)


# --- failures in words ------------------------------------------------------------------------------
def _status_failure(url: str, status: int, body: bytes, has_key: bool) -> BackendFailure:
    message = _message_of(_json_or_text(body))
    if status == 401 and has_key:
        return BackendFailure(
            "auth",
            f"SGLang at {url} refused the API key (401 Unauthorized): the file of "
            "--backend-token-file must hold the key the server got with --api-key",
        )
    if status == 401:
        return BackendFailure(
            "auth",
            f"SGLang at {url} wants an API key (401 Unauthorized): put the key of its "
            "--api-key in a file of mode 0600 and pass it with --backend-token-file",
        )
    if status == 403:
        return BackendFailure("auth", f"SGLang at {url} forbids this request (403 Forbidden): {message}")
    if status == 503:
        return BackendFailure("no_model", f"SGLang at {url} is not ready (503): still loading, or shutting down")
    if status == 404:
        return BackendFailure("internal", f"SGLang at {url} has no such endpoint (404): is it an SGLang server?")
    if status in (400, 422):
        return error_failure(url, f"refused the request ({status}): {message}")
    return BackendFailure("internal", f"SGLang at {url} failed ({status}): {message}")


def error_failure(url: str, message: str) -> BackendFailure:
    """An error SGLang reported about a request: too long for its context, or anything else."""
    lowered = message.lower()
    kind = "too_long" if "context length" in lowered or "longer than" in lowered else "internal"
    return BackendFailure(kind, f"SGLang at {url}: {message}")


def _exception_failure(url: str, err: httpx.HTTPError, read_timeout: float | None) -> BackendFailure:
    said = str(err) or type(err).__name__
    if isinstance(err, httpx.ConnectTimeout):
        return BackendFailure("no_model", f"SGLang at {url} did not accept a connection within {CONNECT_TIMEOUT:.0f} s")
    if isinstance(err, httpx.ConnectError):
        return BackendFailure("no_model", f"SGLang at {url} cannot be reached ({said}): it is not started, or still "
                                          "loading its weights (it opens its port once they are loaded)")  # fmt: skip
    if isinstance(err, httpx.TimeoutException):
        return BackendFailure("busy", f"SGLang at {url} sent nothing for {read_timeout:g} s (--backend-timeout): it "
                                      "is busy with other requests (a dLLM server runs --max-running-requests at once, "
                                      "1 by default) or stuck")  # fmt: skip
    if isinstance(err, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
        return BackendFailure("no_model", f"SGLang at {url} cut the connection: {said}")
    return BackendFailure("internal", f"talking to SGLang at {url} failed: {said}")


def _json_or_text(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")


def _json_object(url: str, data: str) -> dict[str, Any]:
    try:
        chunk = json.loads(data)
    except ValueError:
        chunk = None
    if not isinstance(chunk, dict):
        raise BackendFailure("internal", f"SGLang at {url} streamed something that is no JSON object: {data[:120]!r}")
    return chunk


def _json_field(body: bytes, name: str) -> str | None:
    value = _json_or_text(body)
    return str(value[name]) if isinstance(value, dict) and value.get(name) is not None else None


def _message_of(value: Any) -> str:
    """The words of SGLang's error bodies: {"error": {"message"}}, {"error": "Unauthorized"},
    {"message": ...} (its ErrorResponse) or plain text; at most 300 characters."""
    if isinstance(value, dict):
        inner = value.get("error", value)
        if isinstance(inner, dict):
            inner = inner.get("message", inner.get("detail", inner))
        value = inner
    text = value if isinstance(value, str) else json.dumps(value)
    return text.strip()[:300] or "no details"


# --- the stream's contents -----------------------------------------------------------------------------
def merge_output(ids: list[int], chunk: dict[str, Any]) -> list[int]:
    """The output ids so far after one streamed object. SGLang sends every id so far by default and
    only the new ones with --incremental-streaming-output; meta_info.completion_tokens (the total so far)
    tells them apart."""
    new = chunk.get("output_ids") or []
    if not isinstance(new, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in new):
        raise ValueError(f"output_ids must be a list of ids, not {str(new)[:80]}")
    total = (chunk.get("meta_info") or {}).get("completion_tokens")
    if total == len(new) or (total is None and new[: len(ids)] == ids):
        return list(new)
    return ids + new


def finish_of(chunk: dict[str, Any]) -> dict[str, Any] | None:
    """meta_info.finish_reason: None while generating, else {"type": "stop" | "length" | "abort", ...}."""
    finish = (chunk.get("meta_info") or {}).get("finish_reason")
    if finish is None or isinstance(finish, dict):
        return finish
    return {"type": str(finish)}
