"""`llada-lsp complete` and `llada-lsp rewrite`: start the real server over stdio, speak LSP to it as an
editor would, print the result. For scripts, and for trying the server without an editor.

Knows the protocol (docs/protocol.md) and the command line; nothing of the model or the engine.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pygls.lsp.client import LanguageClient

from ..server.documents import Document
from ..server.positions import UTF16, to_character

SPOT = re.compile(r"^(?P<file>.+):(?P<line>\d+):(?P<col>\d+)$")
SPAN = re.compile(r"^(?P<file>.+):(?P<l1>\d+):(?P<c1>\d+)-(?P<l2>\d+):(?P<c2>\d+)$")


class Session:
    """One server process, one open document, as an editor holds them."""

    def __init__(self, doc: Document, path: Path, args: argparse.Namespace, options: dict[str, Any]):
        self.path, self.args, self.options = path, args, options
        self.doc = doc
        self.client = LanguageClient("llada-lsp-headless", "1")
        self.messages: list[str] = []
        self.drafts: list[dict] = []
        self.client.feature(types.WINDOW_SHOW_MESSAGE)(lambda params: self.messages.append(params.message))
        self.client.feature(types.WINDOW_LOG_MESSAGE)(lambda params: None)  # the server's stderr says it too
        # pygls marks handlers with attributes, which bound methods cannot carry: plain functions.
        self.client.feature("llada/draft")(lambda params: self._on_draft(params))
        self.client.feature(types.WORKSPACE_APPLY_EDIT)(lambda params: self._apply_edit(params))

    async def __aenter__(self) -> "Session":
        server = [sys.executable, "-m", "llada_lsp", "serve", "--log-level", self.args.log_level]
        for flag in ("model", "device", "dtype", "engine", "token_file"):
            if getattr(self.args, flag, None):
                server += [f"--{flag.replace('_', '-')}", getattr(self.args, flag)]
        await self.client.start_io(*server)
        self._stderr = asyncio.create_task(_forward(self.client._server.stderr))
        capabilities = types.ClientCapabilities(
            general=types.GeneralClientCapabilities(position_encodings=[UTF16]),
            workspace=types.WorkspaceClientCapabilities(apply_edit=True),
            experimental={"lladaDrafts": bool(getattr(self.args, "drafts", False))},
        )  # fmt: skip
        params = types.InitializeParams(capabilities=capabilities, initialization_options=self.options)
        await self.client.initialize_async(params)
        self.client.initialized(types.InitializedParams())
        language = "python" if self.path.suffix == ".py" else "plaintext"
        item = types.TextDocumentItem(self.doc.uri, language, 1, self.doc.text)
        self.client.text_document_did_open(types.DidOpenTextDocumentParams(item))
        return self

    async def __aexit__(self, *exc) -> None:
        try:
            await asyncio.wait_for(self.client.shutdown_async(None), 30)
            self.client.exit(None)
        finally:
            await self.client.stop()
            await self._stderr

    def position(self, line: int, col: int) -> types.Position:
        """1-based line and column in characters -> an LSP position in UTF-16 code units."""
        text = self.doc.line(line - 1) if 0 < line <= len(self.doc.line_starts) else ""
        return types.Position(line - 1, to_character(text, col - 1, UTF16))

    def _on_draft(self, params) -> None:
        self.drafts.append(params)
        if getattr(self.args, "drafts", False):
            print(f"[draft step {params.step}{' final' if params.final else ''}] {params.text!r}", file=sys.stderr)

    def _apply_edit(self, params: types.ApplyWorkspaceEditParams) -> types.ApplyWorkspaceEditResult:
        for change in params.edit.document_changes or []:
            for edit in reversed(change.edits):
                r = edit.range
                self.doc.edit((r.start.line, r.start.character), (r.end.line, r.end.character), edit.new_text, UTF16)
        return types.ApplyWorkspaceEditResult(applied=True)


async def _forward(stream) -> None:
    while line := await stream.readline():
        sys.stderr.buffer.write(line)
        sys.stderr.flush()


def _common(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    ap.add_argument("--mode", choices=("speed", "quality"), help="decoding preset (default: the server's)")
    ap.add_argument("--model", metavar="PATH|HF-ID", help="model folder or cached Hugging Face id (default: embedded)")
    ap.add_argument("--device", help="cpu, cuda, cuda:N")
    ap.add_argument("--dtype", help="float32, bfloat16, float16, float64")
    ap.add_argument("--context-tokens", type=int, help="prompt budget in tokens (the server's default: 1024)")
    ap.add_argument("--engine", metavar="auto|local|unix:PATH|tcp://HOST:PORT",
                    help="where the model runs (the server's default: auto, a running `llada-lsp engine` at the default "
                    "socket, else in the server's process)")  # fmt: skip
    ap.add_argument("--token-file", metavar="PATH", help="the token of an engine service on TCP")
    ap.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"],
                    help="the server's log level on stderr")  # fmt: skip
    return ap


class InputError(ValueError):
    """Bad input on the command line: one line for the user, exit code 2."""


def _open(value: str, pattern: re.Pattern, form: str) -> tuple[Document, Path, re.Match]:
    """The document named by FILE:... and the match; InputError for a malformed spot or a file that is
    missing, unreadable or not UTF-8 text."""
    m = pattern.match(value)
    if not m:
        raise InputError(f"expected {form} (1-based line and column), got {value!r}")
    path = Path(m["file"])
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        text = path.read_bytes().decode("utf-8")  # as it is: CRLF files stay CRLF
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not UTF-8 text (byte {err.start} cannot be decoded)") from None
    except OSError as err:
        raise InputError(f"{path}: {err.strerror or err}") from None
    if "\0" in text:
        raise InputError(f"{path}: a binary file (it contains NUL bytes)")
    return Document(path.resolve().as_uri(), 1, text), path, m


def _check(doc: Document, path: Path, line: int, col: int) -> None:
    """A 1-based line and column (in characters) inside the document, or InputError in those terms."""
    lines = len(doc.line_starts)
    if line < 1 or col < 1:
        raise InputError(f"{path}:{line}:{col}: lines and columns count from 1")
    if line > lines:
        raise InputError(f"{path}:{line}:{col}: line {line} is past the end (the file has {lines} lines)")
    length = len(doc.line(line - 1))
    if col > length + 1:
        raise InputError(f"{path}:{line}:{col}: column {col} is past the end of line {line} "
                         f"({length} characters: the last column is {length + 1})")  # fmt: skip


def _fail(session: Session | None, message: str) -> int:
    for shown in session.messages if session else []:
        print(shown, file=sys.stderr)
    print(f"llada-lsp: {message}", file=sys.stderr)
    return 1


def _parser(command: str, description: str) -> argparse.ArgumentParser:
    return _common(argparse.ArgumentParser(prog=f"llada-lsp {command}", description=description))


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
    except InputError as err:
        return _usage_error("complete", err)
    options = _options(args, inlineMode=args.mode, maxCompletionTokens=args.max_tokens)
    return _run(_complete(doc, path, *spot, args, options))


async def _complete(doc: Document, path: Path, line: int, col: int, args, options) -> int:
    async with Session(doc, path, args, options) as session:
        params = types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(session.doc.uri), position=session.position(line, col),
            context=types.InlineCompletionContext(types.InlineCompletionTriggerKind.Invoked),
        )  # fmt: skip
        try:
            result = await session.client.text_document_inline_completion_async(params)
        except JsonRpcException as err:
            return _fail(session, err.message)
    items = getattr(result, "items", result) or []
    print(items[0].insert_text if items else "")
    return 0


def rewrite_main(argv: list[str] | None = None) -> int:
    ap = _parser("rewrite", "Rewrite the span FILE:L1:C1-L2:C2 (1-based, columns in characters, end exclusive) "
                 "with llada.rewriteSelection through a llada-lsp server started over stdio, and print the new "
                 "text.")  # fmt: skip
    ap.add_argument("span", metavar="FILE:L1:C1-L2:C2")
    ap.add_argument("--instruction", help="what to change; used by chat-template models (LLaDA2.1), refused "
                    "with a message by fill-in-the-middle models such as the embedded one")  # fmt: skip
    ap.add_argument("--write", action="store_true", help="also write the rewritten file back")
    args = ap.parse_args(argv)
    try:
        doc, path, m = _open(args.span, SPAN, "FILE:L1:C1-L2:C2")
        span = (int(m["l1"]), int(m["c1"]), int(m["l2"]), int(m["c2"]))
        _check(doc, path, *span[:2])
        _check(doc, path, *span[2:])
        if span[2:] < span[:2]:
            raise InputError(f"{args.span}: the range ends ({span[2]}:{span[3]}) before it starts ({span[0]}:{span[1]})")
    except InputError as err:
        return _usage_error("rewrite", err)
    options = _options(args, rewriteMode=args.mode)
    return _run(_rewrite(doc, path, span, args, options))


async def _rewrite(doc: Document, path: Path, span: tuple[int, int, int, int], args, options) -> int:
    async with Session(doc, path, args, options) as session:
        l1, c1, l2, c2 = span
        argument = {
            "textDocument": {"uri": session.doc.uri, "version": session.doc.version},
            "range": {"start": _plain(session.position(l1, c1)), "end": _plain(session.position(l2, c2))},
        }
        if args.instruction:
            argument["instruction"] = args.instruction
        params = types.ExecuteCommandParams(command="llada.rewriteSelection", arguments=[argument])
        try:
            result = await session.client.workspace_execute_command_async(params)
        except JsonRpcException as err:
            return _fail(session, err.message)
    if result.get("changed") is False:  # kept as it was: the selection is the answer, nothing to write
        print(f"llada-lsp rewrite: {result.get('reason')}", file=sys.stderr)
        print(result["text"])
        return 0
    if not result.get("applied"):
        if result.get("text"):
            print(f"llada-lsp rewrite: the model proposed (not applied):\n{result['text']}", file=sys.stderr)
        return _fail(session, f"not applied: {result.get('reason')}")
    if args.write:
        path.write_bytes(session.doc.text.encode("utf-8"))
    print(result["text"])
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


def _plain(position: types.Position) -> dict[str, int]:
    return {"line": position.line, "character": position.character}


