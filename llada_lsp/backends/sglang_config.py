"""Where the engine service's model runs when it is not this process: the SGLang servers named by
`--backend`, the modes they serve, and the failure a request to them ends with.

The command line's half of the SGLang backend (sglang.py is the HTTP half): stdlib only, so that
`llada-lsp engine status` and --help pay for no HTTP client.
"""

from __future__ import annotations

import argparse
import json
import shlex
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from ..address import read_token
from ..model.family import EDIT_KEYS, Family

MODES = ("speed", "quality")  # the modes editors ask for (engine.policy.PRESETS has these and more): a server each
DEFAULT_TIMEOUT = 30.0  # seconds a server may send nothing in the middle of an answer
# (threshold, edit_threshold) of each mode: engine/policy.py's PRESETS (tests/backends/test_sglang.py keeps them equal)
THRESHOLDS = {"speed": (0.5, 0.0), "quality": (0.7, 0.5)}
MAX_POST_EDIT_STEPS = 16
BLOCK_SIZE = 32  # LLaDA2.1's block: SGLang's default for LLaDA2MoeModelLM (srt/dllm/config.py)
SGLANG_VERSION = "0.5.23"  # the version whose flags plan --sglang and docs/sglang.md give (and the tests run)
SGLANG_MASK_ID = 156895  # SGLang's fixed mask id for LLaDA2MoeModelLM (srt/dllm/config.py); config.json's is ignored


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


# --- launching SGLang for a checkpoint ---------------------------------------------------------------------
def sglang_algorithm_config(family: Family, mode: str) -> str:
    """The --dllm-algorithm-config file of a server of `mode` for a checkpoint of `family`: the
    native presets' thresholds, and the checkpoint's block (LLaDA2.2's block_size: SGLang refuses
    another when the checkpoint routes per block)."""
    threshold, edit_threshold = THRESHOLDS[mode]
    return (f"threshold: {threshold}\nedit_threshold: {edit_threshold}\nmax_post_edit_steps: {MAX_POST_EDIT_STEPS}\n"
            f"penalty_lambda: 0\nblock_size: {family.block_size or BLOCK_SIZE}\n")  # fmt: skip


def sglang_launch(model: str, family: Family, mode: str, port: int = 30000) -> list[str]:
    """The command that starts an SGLang server decoding `model` (a checkpoint of `family`) in `mode`,
    its algorithm config in `sglang-{mode}.yaml` (sglang_algorithm_config). LLaDA2.2 decodes with
    SGLang's JointThresholdInDel; edit ids the checkpoint's config does not declare (the flash
    defaults, or --edit-ids) are passed as a model override, as SGLang asks for them."""
    argv = ["python", "-m", "sglang.launch_server", "--model-path", model,
            "--dllm-algorithm", family.decoding_rule, "--dllm-algorithm-config", f"sglang-{mode}.yaml"]  # fmt: skip
    if family.edit_ids is not None and family.edit_ids_from != "config":
        argv += ["--json-model-override-args", json.dumps(dict(zip(EDIT_KEYS, family.edit_ids)))]
    return argv + ["--host", "0.0.0.0", "--port", str(port), "--trust-remote-code"]


def sglang_instructions(model: str, family: Family) -> str:
    """Both modes' files and commands, as `llada-lsp plan --sglang` prints them (docs/sglang.md), for
    SGLANG_VERSION, with what that version does that changes answers."""
    lines = [f"# SGLang {SGLANG_VERSION} (another version's flags may differ: see its launch_server --help)",
             "# First-done-first-out is on by default (--dllm-fdfo; --no-dllm-fdfo turns it off): the service "
             "reads both streams.",
             "# Several editors: add --max-running-requests 4 (or more); a dLLM server runs 1 request at a time.",
             f"# SGLang takes the mask id as {SGLANG_MASK_ID} whatever config.json says; its CPU MoE "
             "(--device cpu) skips routed_scaling_factor.",
             ""]  # fmt: skip
    for port, mode in enumerate(MODES, 30000):
        lines += [f"# sglang-{mode}.yaml", sglang_algorithm_config(family, mode).rstrip("\n"),
                  f"# the {mode} server", shlex.join(sglang_launch(model, family, mode, port)), ""]  # fmt: skip
    return "\n".join(lines).rstrip("\n")
