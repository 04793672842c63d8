"""The LSP handlers, each a few lines: fetch the document, start a model job or call a pure function,
convert to lsprotocol types; and `create_server`, which registers them.

Knows pygls and lsprotocol, and jobs as plain values; the server's state is main.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cattrs
from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.protocol import default_converter

from ..completion.jobs import Rewrite
from ..completion.syntax import is_python
from . import next_edit
from .actions import REWRITE, apply_rewrite, code_action, not_applied
from .completers import LocalCompleter
from .main import Launch, LladaServer
from .protocol import REQUEST_FAILED, why
from .settings import settings_section

STATUS = "llada.status"
_CONVERTER = default_converter()  # stateless: structures command arguments


async def initialize(ls: LladaServer, params: types.InitializeParams) -> None:
    experimental = params.capabilities.experimental
    ls.drafts = isinstance(experimental, dict) and experimental.get("lladaDrafts") is True
    ls.configure(params.initialization_options)
    await ls.start_engine()


async def initialized(ls: LladaServer, params: types.InitializedParams) -> None:
    ls.flush_told()
    ls.background(ls.watch_status())
    await ls.show_load_progress()


def did_change_configuration(ls: LladaServer, params: types.DidChangeConfigurationParams) -> None:
    if ls.configure(settings_section(params.settings)):
        ls.background(ls.show_load_progress())


async def inline_completion(ls: LladaServer, params: types.InlineCompletionParams) -> types.InlineCompletionList:
    found = ls.locate(params.text_document.uri, params.position)
    if found is None or _still_loading(ls, "inline"):
        return types.InlineCompletionList(items=[])
    doc, offset, at = found
    text = await ls.complete(doc, offset, at, "inline")
    end = _end_of_word(ls, doc, offset, text)
    items = [types.InlineCompletionItem(insert_text=text, range=types.Range(at, end))] if text and end else []
    return types.InlineCompletionList(items=items)


async def completion(ls: LladaServer, params: types.CompletionParams) -> types.CompletionList:
    found = ls.locate(params.text_document.uri, params.position)
    if found is None or _still_loading(ls, "completion"):
        return types.CompletionList(is_incomplete=True, items=[])
    doc, offset, at = found
    text = await ls.complete(doc, offset, at, "completion")
    end = _end_of_word(ls, doc, offset, text)
    if not text or end is None:
        return types.CompletionList(is_incomplete=True, items=[])
    # The item replaces the word typed so far with that word completed (`val|` -> `values(values):`):
    # clients filter items by the text from the word's start, and insert the edit's range whole.
    word = _word_before(doc.text, offset)
    start = types.Position(*doc.position(offset - len(word), ls.encoding))
    label = (word + text).strip().splitlines()[0]
    item = types.CompletionItem(
        label=label, filter_text=word + text.split("\n", 1)[0], kind=types.CompletionItemKind.Text, detail="llada",
        text_edit=_edit(ls, start, at, end, word + text),
        insert_text_format=types.InsertTextFormat.PlainText, sort_text="0",
    )  # fmt: skip
    return types.CompletionList(is_incomplete=True, items=[item])


def _edit(ls: LladaServer, start: types.Position, at: types.Position, end: types.Position,
          text: str) -> types.TextEdit | types.InsertReplaceEdit:  # fmt: skip
    """The item's edit from the word's start: to `end` (the word's end, where the cursor is inside a
    word). Clients that take an InsertReplaceEdit (lsp-mode) replace to `end` by default, and read a
    plain TextEdit's range as ending at the cursor; the others get the TextEdit."""
    document = ls.client_capabilities.text_document
    item = document and document.completion and document.completion.completion_item
    if end != at and item and item.insert_replace_support:
        return types.InsertReplaceEdit(text, insert=types.Range(start, at), replace=types.Range(start, end))
    return types.TextEdit(types.Range(start, end), text)


def _still_loading(ls: LladaServer, method: str) -> bool:
    """While the model loads, completions answer at once with nothing (`isIncomplete`: the next
    keystroke asks again): lsp-mode waits 10 s for an answer, synchronously, and a load takes longer."""
    if ls.status()["state"] != "loading":
        return False
    ls.log(f"{method} {ls.protocol.msg_id}: the model is loading; answered with nothing")
    return True


def _word_before(text: str, offset: int) -> str:
    """The identifier characters right before `offset` on its line."""
    start = offset
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_"):
        start -= 1
    return text[start:offset]


def _end_of_word(ls: LladaServer, doc, offset: int, text: str) -> types.Position | None:
    """Where the completion's edit ends: the cursor, or, with the cursor inside a word (`re|turn`), the
    word's end, since inserting at the cursor would leave the word's rest behind the completion
    (`return sum(values)turn`). The edit then replaces the rest, so the completion must keep it, at
    its start (`turn sum(values)`) or at its end: else None, and nothing is offered."""
    end = offset
    while end < len(doc.text) and (doc.text[end].isalnum() or doc.text[end] == "_"):
        end += 1
    rest = doc.text[offset:end]
    if rest and not (text.startswith(rest) or text.endswith(rest)):
        return None
    return types.Position(*doc.position(end, ls.encoding))


@dataclass(frozen=True)
class RewriteArgument:
    """The one argument of llada.rewriteSelection (docs/protocol.md)."""

    uri: str
    version: int
    range: types.Range
    instruction: str | None

    @classmethod
    def parse(cls, arguments: Any) -> RewriteArgument:
        usage = f"{REWRITE} takes one argument {{textDocument: {{uri, version}}, range, instruction?}}"
        if not isinstance(arguments, (list, tuple)) or len(arguments) != 1 or not isinstance(arguments[0], dict):
            raise JsonRpcInvalidParams(usage)
        arg = arguments[0]
        doc, instruction = arg.get("textDocument"), arg.get("instruction")
        if not isinstance(doc, dict) or not isinstance(doc.get("uri"), str) or type(doc.get("version")) is not int:
            raise JsonRpcInvalidParams(f"{usage}: textDocument needs a string uri and an integer version")
        if instruction is not None and not isinstance(instruction, str):
            raise JsonRpcInvalidParams(f"{usage}: instruction must be a string")
        try:
            rng = _CONVERTER.structure(arg.get("range"), types.Range)
        except (cattrs.BaseValidationError, TypeError, ValueError) as err:
            raise JsonRpcInvalidParams(f"{usage}: range: {why(err) or err}") from None
        return cls(doc["uri"], doc["version"], rng, instruction or None)


async def rewrite_selection(ls: LladaServer, params: types.ExecuteCommandParams) -> dict[str, Any]:
    arg = RewriteArgument.parse(params.arguments)
    doc = ls.documents.get(arg.uri)
    if doc is None or doc.version != arg.version:
        return not_applied(ls, arg.uri, arg.version)
    start, end, target = ls.span(doc, arg.range)
    if arg.instruction and isinstance(ls.completer, LocalCompleter) and ls.completer.worker.spec.path is None:
        # Known before the model has loaded (12-27 s on a busy machine): refused at once.
        raise JsonRpcException("embedded is a fill-in-the-middle model and cannot follow an instruction; rewrite "
                               "without one, or load a chat model (LLaDA2.1) to use instructions",
                               code=REQUEST_FAILED)  # fmt: skip
    job = Rewrite.at(doc.text, start, end, ls.settings.rewrite_mode, ls.settings.context_tokens, arg.instruction,
                     is_python(doc.language, doc.uri))  # fmt: skip
    with WorkDone(ls, params.work_done_token, "llada: rewriting the selection") as progress:
        outcome = await ls.run_job(f"rewrite:{arg.uri}", f"rewrite {ls.protocol.msg_id}", job, progress.step)
    if outcome.stopped in ("unchanged", "refused"):  # nothing to apply: the client is told why
        ls.log(f"rewrite of {arg.uri} not applied: {outcome.reason}", types.MessageType.Info)
        return {
            "applied": False,
            "changed": outcome.stopped != "unchanged",
            "text": outcome.text,
            "reason": outcome.reason,
        }
    return await apply_rewrite(ls, arg.uri, arg.version, target, outcome.text)


class WorkDone:
    """Work-done progress on a client-given token: begin, one report per denoising step, end."""

    def __init__(self, ls: LladaServer, token, title: str):
        self.ls, self.token, self.title = ls, token, title

    def __enter__(self) -> WorkDone:
        if self.token is not None:
            self.ls.work_done_progress.begin(self.token, types.WorkDoneProgressBegin(title=self.title))
        return self

    def step(self, step: int, _payload: Any) -> None:
        if self.token is not None:
            self.ls.work_done_progress.report(self.token, types.WorkDoneProgressReport(message=f"step {step}"))

    def __exit__(self, *exc) -> None:
        if self.token is not None:
            self.ls.work_done_progress.end(self.token, types.WorkDoneProgressEnd())


async def status(ls: LladaServer, params: types.ExecuteCommandParams) -> dict[str, Any]:
    """Also where a front whose service went away finds it back: clients ask while it is unavailable."""
    await ls.reach_engine()
    return ls.status()


def shutdown(ls: LladaServer, params: None) -> None:
    """Answers at once: a step in flight is cancelled, not waited for."""
    ls.shutdown_requested = True
    if ls.completer is not None:
        ls.completer.stop()


def exit_(ls: LladaServer, params: None) -> None:
    if ls.completer is not None:
        ls.completer.stop()


async def code_actions(ls: LladaServer, params: types.CodeActionParams) -> list[types.CodeAction]:
    """ "Rewrite selection (LLaDA)" for a non-empty range, and "Apply suggested edit" where a next edit
    is suggested at the cursor: one handler, as the LSP has one method for both."""
    return code_action(ls, params) + await next_edit.code_actions(ls, params)


def create_server(launch: Launch, server: type[LladaServer] = LladaServer) -> LladaServer:
    ls = server(launch)
    ls.feature(types.INITIALIZE)(initialize)
    ls.feature(types.INITIALIZED)(initialized)
    ls.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)(did_change_configuration)
    ls.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())(inline_completion)
    # Non-empty options: Vim's ALE reads an empty object as "no completion support".
    options = types.CompletionOptions(trigger_characters=["."], resolve_provider=False)
    ls.feature(types.TEXT_DOCUMENT_COMPLETION, options)(completion)
    kinds = [types.CodeActionKind.RefactorRewrite, types.CodeActionKind.QuickFix]
    ls.feature(types.TEXT_DOCUMENT_CODE_ACTION, types.CodeActionOptions(code_action_kinds=kinds))(code_actions)
    ls.feature(types.SHUTDOWN)(shutdown)
    ls.feature(types.EXIT)(exit_)
    ls.command(REWRITE)(rewrite_selection)
    ls.command(STATUS)(status)
    next_edit.register(ls)
    return ls
