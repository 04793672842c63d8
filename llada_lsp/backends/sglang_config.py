"""Where the engine service's model runs when it is not this process: the SGLang servers named by
`--backend`, the modes they serve, and the failure a request to them ends with.

The command line's half of the SGLang backend (sglang.py is the HTTP half): stdlib only, so that
`llada-lsp engine status` and --help pay for no HTTP client.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from ..address import read_token

MODES = ("speed", "quality")  # the modes editors ask for (engine.policy.PRESETS has these and more): a server each
DEFAULT_TIMEOUT = 30.0  # seconds a server may send nothing in the middle of an answer


class BackendFailure(Exception):
    """A request SGLang did not serve, with the wire's failure kind that says why ("no_model": not
    reachable or still loading; "busy": no answer in time; "auth": the API key; "too_long"; "internal")."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind, self.message = kind, message


@dataclass(frozen=True)
class SGLangBackend:
    """One SGLang server per decoding mode: its thresholds are the server's (no per-request override),
    so quality needs a server of its own; without one, quality requests go to speed's server."""

    speed: str  # base URL: http://HOST:PORT
    quality: str | None = None
    api_key: str | None = field(default=None, repr=False)  # sent as `Authorization: Bearer KEY`
    timeout: float = DEFAULT_TIMEOUT

    def url(self, mode: str) -> str:
        return self.quality if mode == "quality" and self.quality else self.speed

    @property
    def urls(self) -> dict[str, str]:
        """Each server's URL -> which modes it serves, in words."""
        if self.quality is None or self.quality == self.speed:
            return {self.speed: "speed and quality"}
        return {self.speed: "speed", self.quality: "quality"}

    def __str__(self) -> str:
        return f"sglang+{self.speed}" + (f",quality={self.quality}" if self.quality else "")

    def configured(self, token_file: str | None, timeout: float) -> SGLangBackend:
        """With the API key from `token_file` (a file of yours with mode 0600) and the timeout;
        ValueError or OSError for a bad file or timeout."""
        if timeout <= 0:
            raise ValueError(f"--backend-timeout must be positive, not {timeout}")
        return replace(self, api_key=read_token(token_file) if token_file else None, timeout=timeout)


def parse_backend(text: str) -> SGLangBackend | None:
    """`native` -> None; `sglang+http://HOST:PORT[,quality=http://HOST2:PORT2]` -> the servers.
    ValueError says what is wrong."""
    if text == "native":
        return None
    if not text.startswith("sglang+"):
        raise ValueError(f"{text!r}: the backend is native or sglang+http://HOST:PORT[,quality=http://HOST2:PORT2]")
    first, *rest = text.removeprefix("sglang+").split(",")
    urls = {"speed": _base_url(first.removeprefix("speed="))}
    for item in rest:
        mode, sep, url = item.partition("=")
        if not sep or mode not in MODES or mode in urls:
            raise ValueError(f"{item!r}: after the first URL only quality=URL may follow")
        urls[mode] = _base_url(url)
    return SGLangBackend(urls["speed"], urls.get("quality"))


def backend_argument(text: str) -> SGLangBackend | None:
    """parse_backend as an argparse `type`."""
    try:
        return parse_backend(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _base_url(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path.strip("/") or parts.query:
        raise ValueError(f"{text!r} is not a server's address (http://HOST:PORT)")
    try:
        parts.port  # noqa: B018 - validates the port
    except ValueError as err:
        raise ValueError(f"{text!r}: {err}") from None
    return f"{parts.scheme}://{parts.netloc}"
