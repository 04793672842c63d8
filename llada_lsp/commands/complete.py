"""`llada-lsp complete` and `llada-lsp rewrite`: start the real server over stdio, speak LSP to it as an
editor would, print the result. For scripts, and for trying the server without an editor.

Knows the protocol (docs/protocol.md) and the command line; nothing of the model or the engine. The
server it starts computes one answer: it runs the model's torch path, its CPU kernels not loaded
(LLADA_LSP_KERNELS=0 unless set), which would cost more than they save on one answer.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

from ..address import parse_address, read_token
from ..errors import CheckpointError
from ..lsp_client import LspClient, LspError, edited, position
from ..server.documents import Document
from ..server.transport import MAX_CONTENT_LENGTH

EXIT_CODES = """exit codes: 0 done (complete: the completion is printed; rewrite: the new text or the diff);
1 nothing to show or the server could not serve it ("no completion", a rewrite not applied, or with
--diff or --write one that changes nothing, a model that does not load, no engine), said on stderr; 2 bad input (the file, the position, the options), refused before a
server starts; 130 interrupted (Ctrl-C)."""

SLOW_LOAD = 3.0  # seconds of loading before the command says it is waiting for the model (at a terminal)
LOADING = "waiting for the model to load"
# The dtypes the loader takes (model/loader.DTYPES, which imports torch): checked before a server starts.
DTYPES = ("float32", "fp32", "float64", "fp64", "bfloat16", "bf16", "float16", "fp16")
DEVICE = re.compile(r"cpu|cuda(:\d+)?")

SPOT = re.compile(r"^(?P<file>.+):(?P<line>\d+):(?P<col>\d+)$")
SPAN = re.compile(r"^(?P<file>.+):(?P<l1>\d+):(?P<c1>\d+)-(?P<l2>\d+):(?P<c2>\d+)$")


class HeadlessEditor:
    """One server process, one open document, as an editor holds them (lsp_client.py speaks for it)."""

    def __init__(self, doc: Document, path: Path, args: argparse.Namespace, options: dict[str, Any]):
        self.path, self.args, self.options = path, args, options
        self.doc = doc
        self.messages: list[str] = []
        self.drafts: list[dict] = []
        self.state: dict[str, Any] = {}
        self._state_changed = asyncio.Event()

    async def __aenter__(self) -> HeadlessEditor:
        server = [sys.executable, "-m", "llada_lsp", "serve", "--log-level", self.args.log_level or "warning"]
        for flag in ("model", "device", "dtype", "threads", "engine", "token_file"):
            if getattr(self.args, flag, None):
                server += [f"--{flag.replace('_', '-')}", str(getattr(self.args, flag))]
        # The server's log goes to stderr as it comes when asked for (--log-level); otherwise it is
        # kept, and shown only if the server ends without an answer: a failure is said in one line.
        # One answer: loading the CPU kernels (numba's import and its cache, ~0.7 s of CPU; on a machine's
        # first start a compile, 15-60 s) costs more than they save on it (~0.3 s of a 70-step answer), so
        # the server runs the model's torch path, unless LLADA_LSP_KERNELS is set (benchmarks/bench_first_minute.py).
        env = {**os.environ, "LLADA_LSP_KERNELS": os.environ.get("LLADA_LSP_KERNELS", "0")}
        stderr = "forward" if self.args.log_level else "keep"
        self.client = client = await LspClient.start(server, stderr=stderr, env=env)
        client.on("window/showMessage", lambda params: self.messages.append(params["message"]))
        client.on("llada/draft", self._on_draft)
        client.on("llada/status", self._on_status)
        client.answer("workspace/applyEdit", self._apply_edit)
        capabilities = {"workspace": {"applyEdit": True, "workspaceEdit": {"documentChanges": True}},
                        "experimental": {"lladaDrafts": bool(getattr(self.args, "drafts", False))}}  # fmt: skip
        await client.initialize(capabilities, self.options)
        language = "python" if self.path.suffix == ".py" else "plaintext"
        self.doc = client.did_open(self.doc.uri, self.doc.text, language)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.client.shutdown(30)

    def position(self, line: int, col: int) -> dict[str, int]:
        """1-based line and column in characters (checked by `_check`) -> an LSP position."""
        return position(self.doc, self.doc.line_starts[line - 1] + col - 1, self.client.encoding)

    def _on_status(self, params: dict) -> None:
        self.state = {"state": params["state"], "error": params.get("error")}
        self._state_changed.set()

    async def loaded(self) -> None:
        """Waits while the model loads (completions answer nothing meanwhile); SessionFailed if it
        cannot load or the engine is unreachable. A slow load is said once, to a person: at a terminal
        (`at_terminal`); a script's stderr stays the same however fast the machine loads."""
        exited, said = self.client.exited, not at_terminal()
        while self.state.get("state") in (None, "loading"):
            self._state_changed.clear()
            changed = asyncio.ensure_future(self._state_changed.wait())
            timeout = None if said else SLOW_LOAD
            done, _ = await asyncio.wait([changed, exited], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if not done:  # a slow load is said once (a first start on a machine compiles the CPU kernels)
                print(f"llada-lsp: {LOADING}", file=sys.stderr, flush=True)
                said = True
                await asyncio.wait([changed, exited], return_when=asyncio.FIRST_COMPLETED)
            changed.cancel()
            if exited.done():
                await self.client.wait()  # reads what is left of its stderr
                sys.stderr.buffer.write(self.client.stderr)
                raise SessionFailed(f"the server ended (exit code {exited.result()}) before the model loaded")
        if self.state["state"] != "ready":
            raise SessionFailed(self.state.get("error") or f"the model is {self.state['state']}")

    def _on_draft(self, params: dict) -> None:
        self.drafts.append(params)
        # The first step's draft may hold no text yet (docs/protocol.md, "Live drafts"): nothing to print.
        if getattr(self.args, "drafts", False) and params.get("text"):
            final = " final" if params.get("final") else ""
            print(f"[draft step {params['step']}{final}] {params['text']!r}", file=sys.stderr)

    def _apply_edit(self, params: dict) -> dict:
        edit = params["edit"]
        changes = [change.get("edits", []) for change in edit.get("documentChanges") or []]
        changes += list((edit.get("changes") or {}).values())
        for edits in changes:
            self.doc.replace(edited(self.doc, edits, self.client.encoding))
        return {"applied": True}


def at_terminal() -> bool:
    """Whether stderr is a terminal: notices and progress are for a person waiting there."""
    return sys.stderr.isatty()


class SessionFailed(Exception):
    """The server cannot serve (no model, no engine): one line for the user, exit code 1."""


def _common(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    ap.add_argument("--mode", choices=("speed", "quality"), help="decoding preset (default: the server's)")
    ap.add_argument("--model", metavar="PATH|HF-ID", help="model folder or cached Hugging Face id (default: embedded)")
    ap.add_argument("--device", help="cpu, cuda, cuda:N")
    ap.add_argument("--dtype", help="float32, bfloat16, float16, float64")
    ap.add_argument("--threads", type=int, metavar="N", help="CPU threads of the model (the server's default: half "
                    "the cores)")  # fmt: skip
    ap.add_argument("--context-tokens", type=int, help="prompt budget in tokens (the server's default: 1024)")
    ap.add_argument("--engine", metavar="auto|local|unix:PATH|tcp://HOST:PORT",
                    help="where the model runs (the server's default: auto, a running `llada-lsp engine` at the default "
                    "socket, else in the server's process)")  # fmt: skip
    ap.add_argument("--token-file", metavar="PATH", help="the token of an engine service on TCP")
    ap.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                    help="show the server's log on stderr from this level (default: shown only if the server "
                    "fails without an answer)")  # fmt: skip
    return ap


class InputError(ValueError):
    """Bad input on the command line: one line for the user, exit code 2."""


def _check_options(args: argparse.Namespace) -> None:
    """InputError for an option the server would refuse or fail on: said here, before one starts (a
    missing model was said after a server had started and waited for it)."""
    if args.threads is not None and args.threads < 1:
        raise InputError(f"--threads must be at least 1, not {args.threads}")
    if args.dtype is not None and args.dtype not in DTYPES:
        raise InputError(f"--dtype {args.dtype}: choose one of {', '.join(DTYPES)}")
    if args.device is not None and not DEVICE.fullmatch(args.device):
        raise InputError(f"--device {args.device}: expected cpu, cuda or cuda:N")
    if args.engine not in (None, "auto", "local"):
        try:
            parse_address(args.engine)
        except ValueError as err:
            raise InputError(f"--engine {args.engine}: {err}") from None
    if args.token_file:
        try:
            read_token(args.token_file)
        except OSError as err:
            raise InputError(f"--token-file {args.token_file}: {err.strerror or err}") from None
        except ValueError as err:
            raise InputError(f"--token-file: {err}") from None
    if args.model is not None:
        from ..model.files import resolve_path, weight_files  # no torch: the folder and its files only

        try:
            folder = resolve_path(args.model)
            if not (folder / "config.json").is_file():
                raise InputError(f"--model: {folder}: no config.json (not a model folder)")
            weight_files(folder)
        except CheckpointError as err:
            raise InputError(f"--model: {err}") from None


def _open(value: str, pattern: re.Pattern, form: str) -> tuple[Document, Path, re.Match]:
    """The document named by FILE:... and the match; InputError for a malformed spot or a file that is
    missing, unreadable or not UTF-8 text."""
    m = pattern.match(value)
    if not m:
        raise InputError(f"expected {form} (1-based line and column), got {value!r}")
    path = Path(m["file"])
    _check_file(path)
    try:
        text = path.read_bytes().decode("utf-8")  # as it is: CRLF files stay CRLF
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not UTF-8 text (byte {err.start} cannot be decoded)") from None
    except OSError as err:
        raise InputError(f"{path}: {err.strerror or err}") from None
    if "\0" in text:
        raise InputError(f"{path}: a binary file (it contains NUL bytes)")
    doc = Document(path.resolve().as_uri(), 1, text)
    if len(json.dumps(text)) + len(doc.uri) + 200 > MAX_CONTENT_LENGTH:  # as the client sends it (escapes)
        raise InputError(_too_big(path, len(text.encode("utf-8")), "as one LSP message, escaped"))
    return doc, path, m


def _check_file(path: Path) -> None:
    """InputError saying what `path` is when it is no regular file, or one too big to send."""
    try:
        mode = path.stat()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as err:
        raise InputError(f"{path}: {err.strerror or err}") from None
    kinds = {stat.S_ISDIR: "a directory", stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device",
             stat.S_ISFIFO: "a named pipe", stat.S_ISSOCK: "a socket"}  # fmt: skip
    for test, kind in kinds.items():
        if test(mode.st_mode):
            raise InputError(f"{path}: {kind}, not a file")
    if mode.st_size > MAX_CONTENT_LENGTH:  # refused by the server's reader: said here, before one starts
        raise InputError(_too_big(path, mode.st_size))


def _too_big(path: Path, size: int, how: str = "") -> str:
    limit = f"the limit is {MAX_CONTENT_LENGTH // 2**20} MiB{f' ({how})' if how else ''}"
    return f"{path} is {size / 2**20:.0f} MiB; {limit}"


def _lines(doc: Document) -> int:
    """Lines as an editor shows them and `wc -l` counts them: a line end at the end of the file ends
    the last line, it does not start another."""
    starts = doc.line_starts
    return max(1, len(starts) - 1) if len(starts) > 1 and starts[-1] == len(doc.text) else len(starts)


def _check(doc: Document, path: Path, line: int, col: int, end: bool = False) -> None:
    """A 1-based line and column (in characters) inside the document, or InputError in those terms.
    The `end` of a span may also be the file's very end, column 1 of the line after the last."""
    lines = _lines(doc)
    if line < 1 or col < 1:
        raise InputError(f"{path}:{line}:{col}: lines and columns count from 1")
    if end and (line, col) == (lines + 1, 1) and len(doc.line_starts) > lines:
        return
    if line > lines:
        raise InputError(f"{path}:{line}:{col}: line {line} is past the end (the file has {lines} lines)")
    length = len(doc.line(line - 1))
    if col > length + 1:
        raise InputError(f"{path}:{line}:{col}: column {col} is past the end of line {line} "
                         f"({length} characters: the last column is {length + 1})")  # fmt: skip


def _fail(command: str, message: str) -> int:
    """One line: the server's messages say the same (a model that cannot load is shown, logged and
    answered), and the server names no source of its own."""
    print(f"llada-lsp {command}: {message.removeprefix('llada: ')}", file=sys.stderr)
    return 1


def _parser(command: str, description: str) -> argparse.ArgumentParser:
    return _common(argparse.ArgumentParser(prog=f"llada-lsp {command}", description=description, epilog=EXIT_CODES))


def complete_main(argv: list[str] | None = None) -> int:
    ap = _parser("complete", "Print the inline completion at FILE:LINE:COL (1-based line and column, the column "
                 "in characters), asked of a llada-lsp server started over stdio as an editor would.")  # fmt: skip
    ap.add_argument("spot", metavar="FILE:LINE:COL")
    ap.add_argument("--max-tokens", type=int, help="maxCompletionTokens (the server's default: 64)")
    ap.add_argument("--drafts", action="store_true", help="also print each live draft on stderr as it arrives")
    args = ap.parse_args(argv)
    try:
        doc, path, m = _open(args.spot, SPOT, "FILE:LINE:COL")
        spot = (int(m["line"]), int(m["col"]))
        _check(doc, path, *spot)
        _check_options(args)
    except InputError as err:
        return _usage_error("complete", err)
    options = _options(args, inlineMode=args.mode, maxCompletionTokens=args.max_tokens)
    return _run(_complete(doc, path, *spot, args, options))


async def _complete(doc: Document, path: Path, line: int, col: int, args, options) -> int:
    async with HeadlessEditor(doc, path, args, options) as session:
        params = {
            "textDocument": {"uri": session.doc.uri},
            "position": session.position(line, col),
            "context": {"triggerKind": 1},  # Invoked
        }
        try:
            await session.loaded()  # the load first: a model that fails to load is said as such
            result = await session.client.request("textDocument/inlineCompletion", params)
        except LspError as err:
            return _fail("complete", err.message)
        except SessionFailed as err:
            return _fail("complete", str(err))
    items = (result.get("items") if isinstance(result, dict) else result) or []
    if not items:  # an empty line on stdout would read as a whitespace answer
        print("llada-lsp complete: no completion", file=sys.stderr)
        return 1
    print(items[0]["insertText"])
    return 0


def rewrite_main(argv: list[str] | None = None) -> int:
    ap = _parser("rewrite", "Rewrite the span FILE:L1:C1-L2:C2 (1-based, columns in characters, end exclusive) "
                 "with llada.rewriteSelection through a llada-lsp server started over stdio, and print the new "
                 "text.")  # fmt: skip
    ap.add_argument("span", metavar="FILE:L1:C1-L2:C2")
    ap.add_argument("--instruction", help="what to change; used by chat-template models (LLaDA2.1), refused "
                    "with a message by fill-in-the-middle models such as the embedded one")  # fmt: skip
    shown = ap.add_mutually_exclusive_group()
    shown.add_argument("--write", action="store_true", help="write the rewritten file back, and print the change as "
                       "a unified diff")  # fmt: skip
    shown.add_argument("--diff", action="store_true", help="print the change as a unified diff (the file is left "
                       "as it is)")  # fmt: skip
    args = ap.parse_args(argv)
    try:
        doc, path, m = _open(args.span, SPAN, "FILE:L1:C1-L2:C2")
        span = (int(m["l1"]), int(m["c1"]), int(m["l2"]), int(m["c2"]))
        _check(doc, path, *span[:2])
        _check(doc, path, *span[2:], end=True)
        if span[2:] < span[:2]:
            raise InputError(
                f"{args.span}: the range ends ({span[2]}:{span[3]}) before it starts ({span[0]}:{span[1]})"
            )
        if span[2:] == span[:2]:
            raise InputError(f"{args.span}: the range is empty (the end column is exclusive): nothing to rewrite")
        _check_options(args)
    except InputError as err:
        return _usage_error("rewrite", err)
    options = _options(args, rewriteMode=args.mode)
    return _run(_rewrite(doc, path, span, args, options))


async def _rewrite(doc: Document, path: Path, span: tuple[int, int, int, int], args, options) -> int:
    original = doc.text  # the session applies the edit to `doc`
    async with HeadlessEditor(doc, path, args, options) as session:
        l1, c1, l2, c2 = span
        argument = {
            "textDocument": {"uri": session.doc.uri, "version": session.doc.version},
            "range": {"start": session.position(l1, c1), "end": session.position(l2, c2)},
        }
        if args.instruction:
            argument["instruction"] = args.instruction
        params = {"command": "llada.rewriteSelection", "arguments": [argument]}
        try:
            result = await session.client.request("workspace/executeCommand", params)
        except LspError as err:
            return _fail("rewrite", err.message)
    if result.get("changed") is False:  # kept as it was: the selection is the answer, nothing to write
        if args.write or args.diff:  # no diff, nothing written: no answer (it printed nothing with code 0)
            return _fail("rewrite", f"{result.get('reason')}: no diff to print, {path} is left as it is")
        print(f"llada-lsp rewrite: {result.get('reason')}", file=sys.stderr)
        print(result["text"])
        return 0
    if not result.get("applied"):
        if result.get("text"):
            print(f"llada-lsp rewrite: the model proposed (not applied):\n{result['text']}", file=sys.stderr)
        return _fail("rewrite", f"not applied: {result.get('reason')}")
    if not (args.write or args.diff):
        print(result["text"])
        return 0
    # stdout is a patch (`patch -p0` takes it); what was done goes to stderr.
    before, after = original.splitlines(keepends=True), session.doc.text.splitlines(keepends=True)
    for line in difflib.unified_diff(before, after, str(path), str(path)):  # a last line without its line end:
        sys.stdout.write(line if line.endswith("\n") else f"{line}\n\\ No newline at end of file\n")  # as diff(1)
    if args.write:
        path.write_bytes(session.doc.text.encode("utf-8"))
        print(f"llada-lsp rewrite: wrote {path}", file=sys.stderr)
    return 0


def _usage_error(command: str, err: InputError) -> int:
    print(f"llada-lsp {command}: {err}", file=sys.stderr)
    return 2


def _run(coroutine) -> int:
    """Runs a session; Ctrl-C ends it with the shell's usual code and no traceback."""
    try:
        return asyncio.run(coroutine)
    except KeyboardInterrupt:
        print("llada-lsp: interrupted", file=sys.stderr)
        return 130


def _options(args, **settings) -> dict[str, Any]:
    settings["contextTokens"] = args.context_tokens
    return {key: value for key, value in settings.items() if value is not None}
