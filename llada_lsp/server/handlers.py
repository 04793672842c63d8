"""The LSP handlers, each a few lines: fetch the document, start a model job or call a pure function,
convert to lsprotocol types; and `create_server`, which registers them with those of inline
completions (inline.py) and next edits (next_edit_requests.py).

Knows pygls and lsprotocol, and jobs as plain values; the server's state is language_server.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import cattrs
from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.protocol import default_converter

from ..completion import snippets
from ..completion.jobs import Rewrite
from ..completion.syntax import is_python
from . import inline, next_edit_requests
from .actions import REWRITE, apply_rewrite, code_action, not_applied, tell_unapplied
from .ale import is_ale
from .completers import rewrite_key
from .context_files import CLIENT as CONTEXT
from .language_server import Launch, LladaServer
from .open_documents import span
from .protocol import REQUEST_FAILED, why
from .settings import settings_section

STATUS = "llada.status"
_CONVERTER = default_converter()  # stateless: structures command arguments


async def initialize(ls: LladaServer, params: types.InitializeParams) -> None:
    experimental = params.capabilities.experimental
    ls.drafts = isinstance(experimental, dict) and experimental.get("lladaDrafts") is True
    ls.ale = is_ale(params)
    ls.configure(params.initialization_options)
    ls.workspace_changed()
    await ls.start_engine()


async def initialized(ls: LladaServer, params: types.InitializedParams) -> None:
    ls.flush_told()
    ls.background(ls.watch_status())
    await ls.loading.show()


def context_chunk(ls: LladaServer, params: Any) -> None:
    """`llada/context`: a chunk of code the client wants completions to see (docs/protocol.md)."""
    fields = params if isinstance(params, dict) else {k: getattr(params, k, None) for k in ("text", "uri")}
    problem = ls.context.receive({k: v for k, v in fields.items() if v is not None})
    if problem is not None:
        ls.log(problem, types.MessageType.Warning)
    else:
        ls.cross_file.warm_later()


def did_change_workspace_folders(ls: LladaServer, params: types.DidChangeWorkspaceFoldersParams) -> None:
    ls.workspace_changed()  # pygls has applied the change to its workspace already


def did_change_configuration(ls: LladaServer, params: types.DidChangeConfigurationParams) -> None:
    if ls.configure(settings_section(params.settings)):
        ls.background(ls.loading.show())


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
    result = await _rewrite_selection(ls, params)
    tell_unapplied(ls, result)
    return result


async def _rewrite_selection(ls: LladaServer, params: types.ExecuteCommandParams) -> dict[str, Any]:
    arg = RewriteArgument.parse(params.arguments)
    doc = ls.documents.get(arg.uri)
    if doc is None or doc.version != arg.version:
        return not_applied(ls, arg.uri, arg.version)
    start, end, target = span(doc, arg.range, ls.encoding)
    if arg.instruction and ls.completer is not None and ls.completer.embedded:
        # Known before the model has loaded (12-27 s on a busy machine): refused at once.
        raise JsonRpcException("embedded is a fill-in-the-middle model and cannot follow an instruction; rewrite "
                               "without one, or load a chat model (LLaDA2.1) to use instructions",
                               code=REQUEST_FAILED)  # fmt: skip
    job = Rewrite.at(doc.text, start, end, ls.settings.rewrite_mode, ls.settings.context_tokens, arg.instruction,
                     is_python(doc.language, doc.uri))  # fmt: skip
    context = snippets.to_wire(await ls.cross_file.snippets_for(doc, start))
    if context:  # as a completion's prompt: the other files' snippets first, within their share
        job = dataclasses.replace(job, context=context, context_share=ls.settings.context_files_share)
    with WorkDone(ls, params.work_done_token, "llada: rewriting the selection") as progress:
        outcome = await ls.run_job(rewrite_key(arg.uri), f"rewrite {ls.protocol.msg_id}", job, progress.step)
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
    return code_action(ls, params) + await next_edit_requests.code_actions(ls, params)


def create_server(launch: Launch, server: type[LladaServer] = LladaServer) -> LladaServer:
    ls = server(launch)
    ls.feature(types.INITIALIZE)(initialize)
    ls.feature(types.INITIALIZED)(initialized)
    ls.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)(did_change_configuration)
    ls.feature(types.WORKSPACE_DID_CHANGE_WORKSPACE_FOLDERS)(did_change_workspace_folders)
    inline.register(ls)
    kinds = [types.CodeActionKind.RefactorRewrite, types.CodeActionKind.QuickFix]
    ls.feature(types.TEXT_DOCUMENT_CODE_ACTION, types.CodeActionOptions(code_action_kinds=kinds))(code_actions)
    ls.feature(types.SHUTDOWN)(shutdown)
    ls.feature(types.EXIT)(exit_)
    ls.command(REWRITE)(rewrite_selection)
    ls.command(STATUS)(status)
    ls.feature(CONTEXT)(context_chunk)
    next_edit_requests.register(ls)
    return ls
