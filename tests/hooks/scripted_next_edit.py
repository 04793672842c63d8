"""A scripted next-edit "model", for tests only: it reads what a next-edit request carries (the prompt's
ids and the window as `init_ids`) and does what a model that learnt renames would: when the newest
edit in the prompt's history renamed one identifier, it renames the window's other uses. Nothing else
(no history, or an edit that is no rename: the window comes back unchanged).

`install()` makes the native backend answer next-edit requests (priority 2) this way, in the same
batched steps as the real model's other sequences: the pipeline around the model (prompt, plan,
gates, server, wire, editors) runs for real. sitecustomize.py installs it under
LLADA_LSP_TEST_SCRIPTED_NEXT_EDIT=1. `LLADA_LSP_TEST_SCRIPTED_NEXT_EDIT_ANSWER`, if set, is the
window's text to answer instead (to test the gates end to end).
"""

from __future__ import annotations

import os
import re

_HUNK = re.compile(r"@@ line \d+(?: \(accepted suggestion\))? @@\n((?:-.*\n)*)((?:\+.*\n)*)")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def renamed(history_text: str) -> tuple[str, str] | None:
    """(old name, new name) when the last hunk of the prompt's history changed exactly one identifier."""
    hunks = _HUNK.findall(history_text)
    if not hunks:
        return None
    old = "\n".join(line[1:] for line in hunks[-1][0].splitlines())
    new = "\n".join(line[1:] for line in hunks[-1][1].splitlines())
    a, b = _WORD.findall(old), _WORD.findall(new)
    if len(a) != len(b):
        return None
    pairs = {(x, y) for x, y in zip(a, b) if x != y}
    return pairs.pop() if len(pairs) == 1 else None


def window_of(codec, init_ids: list[int]) -> str:
    """The window a next-edit draft holds (its gap of masks at the cursor and its room of end-of-text left out)."""
    return codec.decode([t for t in init_ids if t not in (codec.special.eos, codec.special.mask)])


def answer(prompt_text: str, window: str) -> str:
    """The window as the scripted model revises it, given the decoded prompt."""
    fixed = os.environ.get("LLADA_LSP_TEST_SCRIPTED_NEXT_EDIT_ANSWER")
    if fixed is not None:
        return fixed
    rename = renamed(prompt_text)
    if rename is None:
        return window
    old, new = rename
    return re.sub(rf"\b{re.escape(old)}\b", new, window)


def install() -> None:
    from llada_lsp.backends import native
    from llada_lsp.completion.generation import Draft, Result

    add, step = native.NativeBatch.add, native.NativeBatch.step
    scripted: dict[int, object] = {}

    def scripted_add(self, request):
        if request.priority != 2 or request.init_ids is None:
            return add(self, request)
        codec = self._scripted_codec
        prompt = codec.decode(request.prompt_ids)
        window = window_of(codec, request.init_ids)
        ids = codec.encode(answer(prompt, window))[: request.gen_length]
        eos = [codec.special.eos] if len(ids) < request.gen_length else []  # the room's end (no stop id is sent)
        seq_id = -(len(scripted) + 1)
        scripted[seq_id] = (ids + eos, request)
        return seq_id

    def scripted_step(self):
        events = step(self) if not self.scheduler.idle() else []
        for seq_id, (ids, request) in list(scripted.items()):
            del scripted[seq_id]
            cancelled = request.cancel is not None and request.cancel.is_set()
            events.append((seq_id, Draft(1, ids), None, None))
            events.append((seq_id, None, Result(ids, 2, 0.0, cancelled), None))
        return events

    native.NativeBatch.add, native.NativeBatch.step = scripted_add, scripted_step
    load = native.load

    def scripted_load(spec, report, cancelled=None):
        model = load(spec, report, cancelled)
        model.batch._scripted_codec = model.codec
        return model

    native.load = scripted_load  # native.start reads the module's `load` when it starts the worker
