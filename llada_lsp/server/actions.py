"""Rewrite selection as clients reach it and receive it: the code action that offers it (for clients
whose UI knows code actions, not our command) and the `workspace/applyEdit` of its result, in the form
the client said it can apply, or none, with an answer bounded in time; to a client that cannot apply
one, the outcome as `window/showMessage`.

Knows pygls and lsprotocol and the server's state (language_server.py); nothing of models or jobs.
"""

from __future__ import annotations

import asyncio
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pygls.protocol import default_converter

from .language_server import LladaServer
from .open_documents import span

REWRITE = "llada.rewriteSelection"
REWRITE_TITLE = "Rewrite selection (LLaDA)"
_CONVERTER = default_converter()  # stateless: the edit, as plain JSON, for a command's result


def code_action(ls: LladaServer, params: types.CodeActionParams) -> list[types.CodeAction]:
    """ "Rewrite selection (LLaDA)" for a non-empty range of an open document, as the command
    llada.rewriteSelection with the document's version now: a client runs it as it runs any command."""
    doc = ls.documents.get(params.text_document.uri)
    kind = types.CodeActionKind.RefactorRewrite
    only = params.context.only
    if doc is None or params.range.start == params.range.end:
        return []
    if only and not any(kind == k or kind.startswith(f"{k}.") for k in only):
        return []
    try:
        _, _, target = span(doc, params.range, ls.encoding)
    except JsonRpcException:  # a range outside the document: nothing to offer, not an error
        return []
    argument = {"textDocument": {"uri": doc.uri, "version": doc.version}, "range": _CONVERTER.unstructure(target)}
    command = types.Command(title=REWRITE_TITLE, command=REWRITE, arguments=[argument])
    return [types.CodeAction(title=REWRITE_TITLE, kind=kind, command=command)]


async def apply_rewrite(ls: LladaServer, uri: str, version: int, target: types.Range, text: str) -> dict[str, Any]:
    """workspace/applyEdit of the rewrite, versioned where the client takes `documentChanges`: a
    document that moved on is left alone. A client that cannot apply edits (`workspace.applyEdit`
    not true) is sent none; it, and one that does not answer within `applyEditTimeout` seconds or
    answers with an error, gets the edit in the result, `applied: false` and the reason: the command
    is always answered."""
    doc = ls.documents.get(uri)
    if doc is None or doc.version != version:
        return not_applied(ls, uri, version, text)
    edit = types.TextEdit(target, text)
    workspace = ls.client_capabilities.workspace
    if workspace and workspace.workspace_edit and workspace.workspace_edit.document_changes:
        change = types.TextDocumentEdit(types.OptionalVersionedTextDocumentIdentifier(uri, version), [edit])
        workspace_edit = types.WorkspaceEdit(document_changes=[change])
    else:  # `changes` carry no version: checked just above, on the loop, nothing can come between
        workspace_edit = types.WorkspaceEdit(changes={uri: [edit]})
    unapplied = {"applied": False, "changed": True, "text": text, "edit": _CONVERTER.unstructure(workspace_edit)}
    if not (workspace and workspace.apply_edit):
        return {**unapplied, "reason": "the client cannot apply workspace edits (workspace.applyEdit): the edit is "
                "in the result"}  # fmt: skip
    seconds = ls.settings.apply_edit_timeout
    try:
        params = types.ApplyWorkspaceEditParams(workspace_edit, label="llada: rewrite")
        answer = await asyncio.wait_for(ls.workspace_apply_edit_async(params), seconds)
    except TimeoutError:
        ls.log(f"no answer to workspace/applyEdit for {uri} in {seconds} s", types.MessageType.Warning)
        return {**unapplied, "reason": f"the client did not answer workspace/applyEdit within {seconds} s"}
    except JsonRpcException as err:
        return {**unapplied, "reason": f"the client answered workspace/applyEdit with an error: {err.message}"}
    if answer.applied:
        return {"applied": True, "changed": True, "text": text}
    reason = answer.failure_reason or "the client did not apply the edit"
    return {"applied": False, "changed": True, "text": text, "reason": reason}


def not_applied(ls: LladaServer, uri: str, version: int, text: str = "") -> dict[str, Any]:
    doc = ls.documents.get(uri)
    if doc is None:
        reason = f"{uri} is not open"
    else:
        reason = f"the document is at version {doc.version}, the rewrite was asked for version {version}"
    return {"applied": False, "text": text, "reason": reason}


def tell_unapplied(ls: LladaServer, result: dict[str, Any]) -> None:
    """A client that cannot apply workspace edits (Vim's ALE) runs the rewrite from its code-action
    menu and shows nothing of the command's result, nor of `window/logMessage`: what happened goes to
    `window/showMessage`. A rewrite it could not apply is an Error (the type ALE shows by default),
    with the text, for the user to take; no change is Info, a refusal a Warning."""
    workspace = ls.client_capabilities.workspace
    if result.get("applied") or (workspace and workspace.apply_edit):
        return
    if result.get("changed") is False:
        ls.show("rewrite: the model proposed no change", types.MessageType.Info)
    elif "edit" in result:
        ls.show(f"the rewrite was not applied: {result['reason']}. The rewrite:\n{result['text']}")
    else:
        ls.show(f"rewrite not applied: {result.get('reason')}", types.MessageType.Warning)
