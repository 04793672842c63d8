"""Revising a suggestion while the user types through it (issue 26): which keystrokes warm-start
(the front's memory of the last suggestion, pure), and what a warm start computes on the embedded model
(the canvas starts from the rest of the suggestion, the answer follows the typed text, and a
suggestion the model still agrees with costs one forward instead of a cold start's many)."""

from __future__ import annotations

import inspect
import random

import pytest

from llada_lsp import wire
from llada_lsp.backends.native import load
from llada_lsp.completion import pipeline
from llada_lsp.completion.generation import Draft, ModelSpec, Result
from llada_lsp.completion.jobs import Infill, from_wire, to_wire
from llada_lsp.completion.pipeline import InfillPlan, run_infill
from llada_lsp.server.suggestions import Revision, Suggestions

DOC = "def area(r):\n    return \n"
CURSOR = DOC.index("return ") + len("return ")


def shown(suggestion: str = "3.14 * r * r") -> Suggestions:
    memory = Suggestions()
    memory.remember("file:///a.py", DOC, CURSOR, None, suggestion)
    return memory


def typed(text: str) -> str:
    return DOC[:CURSOR] + text + DOC[CURSOR:]


def test_typing_through_a_suggestion_revises_the_rest_of_it():
    memory = shown()
    assert memory.revision("file:///a.py", DOC, CURSOR) == Revision("3.14 * r * r", 0)
    assert memory.revision("file:///a.py", typed("3."), CURSOR + 2) == Revision("14 * r * r", 2)
    # The revised answer is remembered from where the suggestion began: typing on keeps counting.
    memory.remember("file:///a.py", typed("3."), CURSOR + 2, Revision("14 * r * r", 2), "1416 * r ** 2")
    assert memory.revision("file:///a.py", typed("3.14"), CURSOR + 4) == Revision("16 * r ** 2", 4)


@pytest.mark.parametrize(("text", "cursor", "why"), [
    (typed("4"), CURSOR + 1, "a keystroke the suggestion does not begin with"),
    (typed("3"), CURSOR, "the cursor is not after what was typed"),
    (DOC, CURSOR - 3, "the cursor jumped"),
    ("# edited\n" + typed("3"), CURSOR + 10, "an edit elsewhere in the document"),
    (typed("3.14 * r * r"), CURSOR + 12, "the whole suggestion was typed (or accepted)"),
    (typed("3.14 * r * r\n"), CURSOR + 13, "typed past its end"),
])  # fmt: skip
def test_anything_but_typing_through_starts_cold(text, cursor, why):
    assert shown().revision("file:///a.py", text, cursor) is None, why


def test_other_documents_and_empty_answers_start_cold():
    memory = shown()
    assert memory.revision("file:///b.py", typed("3"), CURSOR + 1) is None
    memory.remember("file:///a.py", typed("3"), CURSOR + 1, Revision(".14 * r * r", 1), "")
    assert memory.revision("file:///a.py", typed("3"), CURSOR + 1) is None, "nothing is shown: nothing to revise"
    memory = shown()
    memory.forget("file:///a.py")
    assert memory.revision("file:///a.py", typed("3"), CURSOR + 1) is None


def test_the_infill_frame_carries_the_revision_and_leaves_it_out_for_a_cold_start():
    warm = Infill.at(typed("3."), CURSOR + 2, "speed", draft="14 * r * r", typed=2)
    frame = to_wire(warm, 7, "k", False)
    assert (frame.draft, frame.typed) == ("14 * r * r", 2)
    assert from_wire(wire.decode(wire.encode(frame)[4:])) == warm
    cold = to_wire(Infill.at(typed("3."), CURSOR + 2, "speed"), 8, "k", False)
    assert "draft" not in cold.to_dict() and "typed" not in cold.to_dict(), "a cold frame is today's frame"
    bad = wire.Infill(9, "k", "x", "", "speed", 8, 64, draft="y", typed=5)  # typed past the window's start
    assert from_wire(bad).draft is None


# --- on the embedded model ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model(one_thread_per_module):
    return load(ModelSpec(None), lambda *_: None)


class Never:
    def is_set(self) -> bool:
        return False


def complete(model, job: Infill):
    return run_infill(model, job, Never(), lambda *_: None)


def test_a_warm_start_begins_from_the_suggestion_and_its_answer_follows_the_typed_text(model):
    """The canvas is the rest of the suggestion (and the end of its line); the typed text is in the
    prompt only. Over many spots of a held-out file, typing a third of each suggestion: warm starts
    take a fraction of the forwards of cold ones, and mostly confirm the suggestion in one forward."""
    import copy  # held out of training (tests/model/test_embedded_model.py)

    source, rng = inspect.getsource(copy), random.Random(26)
    warm_steps = cold_steps = confirmed = spots = 0
    while spots < 12:
        at = rng.randrange(len(source) // 4, len(source))
        text = source[:at] + source[source.index("\n", at) :]
        first = complete(model, Infill.at(text, at, "speed"))
        if len(first.text) < 3 or "\n" in first.text:
            continue
        spots += 1
        k = len(first.text) // 3
        now, cursor, rest = text[:at] + first.text[:k] + text[at:], at + k, first.text[k:]
        job = Infill.at(now, cursor, "speed", draft=rest, typed=k)
        plan = InfillPlan(model, job, Never())
        codec = model.codec
        canvas = codec.decode(plan.request.init_ids)
        assert canvas == plan.heal_text + rest + "\n", "the canvas starts from the rest of the suggestion"
        assert not now[:cursor].endswith(canvas), "the typed text is not in the canvas"
        warm, cold = complete(model, job), complete(model, Infill.at(now, cursor, "speed"))
        warm_steps, cold_steps = warm_steps + warm.steps, cold_steps + cold.steps
        assert warm.steps == 1, "a revision is one denoising step"
        if warm.text == rest and warm.steps == 1:
            confirmed += 1
        assert not warm.text.startswith(first.text[:k]) or not first.text[:k].strip(), "never repeats the typed text"
    assert warm_steps * 3 <= cold_steps, (warm_steps, cold_steps)
    assert confirmed >= spots // 2, confirmed


@pytest.mark.parametrize(("step", "answer"), [
    ("14 * r * r\n", "14 * r * r"),  # confirmed
    ("14 * r ** 2\n", "14 * r ** 2"),  # revised, complete: the revision
    ("14 * r * r +", "14 * r * r"),  # grown past the suggestion's end: the part it kept
    ("15 + r", "1"),  # revised and grown: the part it kept
])  # fmt: skip
def test_a_revision_answers_after_one_step(model, step, answer):
    """The first step ends a revision (the keystrokes after it are its next steps): its complete unit,
    or, where it grew the unit past the suggestion, the common part of the two (nothing new, unconfirmed)."""
    plan = InfillPlan(model, Infill.at(typed("3."), CURSOR + 2, "speed", draft="14 * r * r", typed=2), Never())
    codec = model.codec
    ids = codec.encode(plan.heal_text + step)
    ids += [codec.special.mask] * (plan.gen_length - len(ids))
    assert plan.on_draft(Draft(1, ids)) == (1, answer)
    assert plan.stop.is_set(), "no second step"
    assert plan.finish(Result(ids, 1, 0.01, cancelled=True)).text == answer


@pytest.mark.parametrize("sure", [True, False])
def test_a_block_stays_a_block_while_its_first_line_is_typed_where_the_model_is_sure(model, monkeypatch, sure):
    """On an empty line the suggestion is a block; typed through its first characters, the cursor
    follows code, yet the revision still answers the rest of the block, not only of the line, while the
    model gives every id of the later lines REGION_CONFIDENCE; where it does not, the revision answers
    the rest of the first line (the later lines are cut, never shown unsure)."""
    text = "def add(a, b):\n    return a + \n\n\ndef sub(a, b):\n    \n\nprint(add(1, 2))\n"
    at = text.index("b):\n    \n") + 8
    first = complete(model, Infill.at(text, at, "speed", 64))
    assert "\n" in first.text, f"the embedded model answers a block here: {first.text!r}"
    k = 3
    now = text[:at] + first.text[:k] + text[at:]
    monkeypatch.setattr(pipeline, "REGION_CONFIDENCE", 0.0 if sure else 1.01)
    warm = complete(model, Infill.at(now, at + k, "speed", 64, draft=first.text[k:], typed=k))
    assert warm.steps * 4 <= first.steps, (first, warm)
    if sure:
        assert "\n" in warm.text, (first, warm)
    else:
        assert warm.text and "\n" not in warm.text and first.text[k:].startswith(warm.text + "\n"), (first, warm)
    cold = complete(model, Infill.at(now, at + k, "speed", 64))
    assert "\n" not in cold.text, "a cold start there completes the line only"


def test_a_cold_job_is_todays_job(model):
    """No draft: the same request (no init_ids), hence the same answer, as before revisions existed."""
    text, at = "def average(values):\n    return sum\n", 35
    plan = InfillPlan(model, Infill.at(text, at, "speed"), Never())
    assert plan.request.init_ids is None and plan.shown is None


def test_the_status_says_when_the_engine_cannot_revise():
    """A front on a service whose backend starts from masks (SGLang's welcome says so) revises nothing
    and its llada.status says why; the setting off says revise false without a note."""
    from llada_lsp.server.language_server import Launch, LladaServer
    from llada_lsp.server.settings import Settings

    class ColdEngine:
        revises = False

        def status(self) -> dict:
            return {"engine": "unix:/tmp/e.sock", "model": "sglang+http://gpu:30000", "state": "ready"}

    ls = LladaServer(Launch())
    ls.completer = ColdEngine()
    status = ls.status()
    assert ls.revising is False and status["revise"] is False and "SGLang" in status["reviseNote"]
    ls.completer.revises = True
    assert ls.revising is True and ls.status()["revise"] is True and "reviseNote" not in ls.status()
    ls.settings = Settings(revise=False)
    assert ls.revising is False and "reviseNote" not in ls.status()
