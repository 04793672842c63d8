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

from .documents import Document
from .positions import UTF16, to_character

SPOT = re.compile(r"^(?P<file>.+):(?P<line>\d+):(?P<col>\d+)$")
SPAN = re.compile(r"^(?P<file>.+):(?P<l1>\d+):(?P<c1>\d+)-(?P<l2>\d+):(?P<c2>\d+)$")


class Session:
    """One server process, one open document, as an editor holds them."""

    def __init__(self, path: Path, args: argparse.Namespace, options: dict[str, Any]):
        self.path, self.args, self.options = path, args, options
        self.doc = Document(path.resolve().as_uri(), 1, path.read_text(encoding="utf-8"))
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
        for flag in ("model", "device", "dtype"):
            if getattr(self.args, flag):
                server += [f"--{flag}", getattr(self.args, flag)]
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
    ap.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"],
                    help="the server's log level on stderr")  # fmt: skip
    return ap


def _match(ap: argparse.ArgumentParser, pattern: re.Pattern, value: str, form: str) -> re.Match:
    m = pattern.match(value)
    if not m or not Path(m["file"]).is_file():
        ap.error(f"expected {form} with an existing file, got {value!r}")
    return m


def _fail(session: Session | None, message: str) -> int:
    for shown in session.messages if session else []:
        print(shown, file=sys.stderr)
    print(f"llada-lsp: {message}", file=sys.stderr)
    return 1


def complete_main(argv: list[str] | None = None) -> int:
    ap = _common(argparse.ArgumentParser(
        prog="llada-lsp complete",
        description="Print the inline completion at FILE:LINE:COL (1-based line and column, the column in "
        "characters), asked of a llada-lsp server started over stdio as an editor would.",
    ))  # fmt: skip
    ap.add_argument("spot", metavar="FILE:LINE:COL")
    ap.add_argument("--max-tokens", type=int, help="maxCompletionTokens (the server's default: 64)")
    ap.add_argument("--drafts", action="store_true", help="also print each live draft on stderr as it arrives")
    args = ap.parse_args(argv)
    m = _match(ap, SPOT, args.spot, "FILE:LINE:COL")
    options = _options(args, inlineMode=args.mode, maxCompletionTokens=args.max_tokens)
    return asyncio.run(_complete(Path(m["file"]), int(m["line"]), int(m["col"]), args, options))


async def _complete(path: Path, line: int, col: int, args, options) -> int:
    async with Session(path, args, options) as session:
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
    ap = _common(argparse.ArgumentParser(
        prog="llada-lsp rewrite",
        description="Rewrite the span FILE:L1:C1-L2:C2 (1-based, columns in characters, end exclusive) with "
        "llada.rewriteSelection through a llada-lsp server started over stdio, and print the new text.",
    ))  # fmt: skip
    ap.add_argument("span", metavar="FILE:L1:C1-L2:C2")
    ap.add_argument("--instruction", help="what to change (followed by chat-template models; FIM models ignore it)")
    ap.add_argument("--write", action="store_true", help="also write the rewritten file back")
    args = ap.parse_args(argv)
    m = _match(ap, SPAN, args.span, "FILE:L1:C1-L2:C2")
    options = _options(args, rewriteMode=args.mode)
    span = (int(m["l1"]), int(m["c1"]), int(m["l2"]), int(m["c2"]))
    return asyncio.run(_rewrite(Path(m["file"]), span, args, options))


async def _rewrite(path: Path, span: tuple[int, int, int, int], args, options) -> int:
    async with Session(path, args, options) as session:
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
    if not result.get("applied"):
        return _fail(session, f"not applied: {result.get('reason')}")
    if args.write:
        path.write_text(session.doc.text, encoding="utf-8")
    print(result["text"])
    return 0


def _options(args, **settings) -> dict[str, Any]:
    settings["contextTokens"] = args.context_tokens
    return {key: value for key, value in settings.items() if value is not None}


def _plain(position: types.Position) -> dict[str, int]:
    return {"line": position.line, "character": position.character}


