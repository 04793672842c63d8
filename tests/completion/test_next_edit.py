"""Next-edit suggestions: the edit history (coalesced, bounded, marked, per document), the prompt and
window, the diff cut to the smallest ranges, and the pipeline's gates, driven by a scripted model that
reads only what the request carries (tests/hooks/scripted_next_edit.py); and the real embedded model's
answer, which must be well formed."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from llada_lsp.completion.generation import Draft, LoadedModel, ModelSpec, Result
from llada_lsp.completion.history import MAX_EDITS, History
from llada_lsp.completion.next_edit import (
    GAP_TOKENS,
    MAX_MEAN_REWRITES,
    NextEdit,
    NextEditPlan,
    apply_changes,
    changes,
    draft_ids,
    edit_diff,
    edit_window,
    next_edit_prompt,
)  # fmt: skip
from llada_lsp.completion.prompt import TextCodec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hooks"))
import scripted_next_edit  # noqa: E402  (the test hook, not part of the package)

SOURCE = "def total(values):\n    count = 0\n    for v in values:\n        count += v\n    return count\n"


@pytest.fixture(scope="module")
def codec() -> TextCodec:
    from llada_lsp.model import load_tokenizer

    return TextCodec.from_tokenizer(load_tokenizer(None))


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Doc:
    """A document and its history, edited as an editor would send the changes."""

    def __init__(self, text: str, history: History, uri: str = "file:///a.py"):
        self.text, self.history, self.uri = text, history, uri

    def change(self, a: int, b: int, new: str) -> None:
        self.history.record(self.uri, self.text, a, b, new, self.text.count("\n", 0, a))
        self.text = self.text[:a] + new + self.text[b:]

    def type(self, at: int, word: str) -> None:
        for i, ch in enumerate(word):
            self.change(at + i, at + i, ch)


# --- the history ------------------------------------------------------------------------------------
def test_a_word_typed_is_one_edit_and_a_pause_starts_another():
    clock = Clock()
    doc = Doc(SOURCE, History(clock))
    at = SOURCE.index("count = 0")
    doc.change(at, at + 5, "")  # the name deleted, then a new one typed letter by letter
    doc.type(at, "acc")
    edits = doc.history.edits(doc.uri)
    assert [(e.old, e.new) for e in edits] == [("count", "acc")]
    assert edits[0].diff() == "@@ line 2 @@\n-    count = 0\n+    acc = 0\n"
    clock.now += 5  # a pause: the next keystrokes are a new edit, even next to the last
    doc.type(at + 3, "um")
    assert [(e.old, e.new) for e in doc.history.edits(doc.uri)] == [("count", "acc"), ("", "um")]


def test_typed_then_taken_back_is_no_edit_and_a_jump_is_a_new_one():
    doc = Doc(SOURCE, History(Clock()))
    at = SOURCE.index("values:")
    doc.type(at, "xy")
    doc.change(at + 1, at + 2, "")
    doc.change(at, at + 1, "")
    assert doc.history.edits(doc.uri) == []
    doc.type(at, "z")
    far = doc.text.index("return") + 6
    doc.type(far, "!")
    assert [e.new for e in doc.history.edits(doc.uri)] == ["z", "!"]


def test_the_history_is_bounded_and_cleared_on_close():
    clock, history = Clock(), History(Clock())
    history.clock = clock
    doc = Doc(SOURCE, history)
    for i in range(MAX_EDITS + 5):
        clock.now += 10
        doc.change(0, 0, f"# {i}\n")
    edits = history.edits(doc.uri)
    assert len(edits) == MAX_EDITS and edits[-1].new == f"# {MAX_EDITS + 4}\n"
    # The older edits moved with the text inserted before them.
    assert all(doc.text[e.start : e.end] == e.new for e in edits)
    other = Doc("x = 1\n", history, "file:///b.py")
    other.change(0, 1, "y")
    history.close(doc.uri)
    assert history.edits(doc.uri) == [] and [e.new for e in history.edits(other.uri)] == ["y"]


def test_each_client_has_its_own_history():
    """A server per client, a History per server: one client's edits never reach another's prompt."""
    a, b = History(Clock()), History(Clock())
    Doc(SOURCE, a).change(0, 3, "async def")
    assert a.diffs("file:///a.py") and b.diffs("file:///a.py") == ()


def test_an_edit_taken_from_a_suggestion_is_marked():
    clock = Clock()
    doc = Doc(SOURCE, History(clock))
    second, third = doc.text.index("count +="), doc.text.index("count\n", doc.text.index("return"))
    doc.history.offer(doc.uri, [(second, second + 5, "acc"), (third, third + 5, "acc")])
    doc.change(third, third + 5, "acc")  # clients apply a suggestion's edits last to first
    doc.change(second, second + 5, "acc")
    edits = doc.history.edits(doc.uri)
    assert [e.accepted for e in edits] == [True, True]
    assert "(accepted suggestion)" in edits[0].diff()
    doc.type(0, "#")  # the user's own typing afterwards is not
    assert doc.history.edits(doc.uri)[-1].accepted is False


# --- the window, the prompt, the diff -----------------------------------------------------------------
def test_the_window_is_whole_lines_around_the_cursor_widened_to_close_brackets():
    text = "".join(f"x{i} = {i}\n" for i in range(40))
    start, end = edit_window(text, text.index("x20"))
    window = text[start:end]
    assert window.startswith("x10 = 10\n") and window.endswith("x30 = 30\n") and window.count("\n") == 21
    call = "f(\n" + "".join(f"    {i},\n" for i in range(12)) + ")\n"
    start, end = edit_window(call, call.index("5,"), lines=5)
    assert call[start:end] == call, "the call's brackets close inside the window"


def test_the_prompt_carries_the_recent_edits_and_the_window_is_the_draft(codec):
    at = SOURCE.index("count = 0")
    diff = edit_diff("    count = 0", "    acc = 0", 1)
    start, end = edit_window(SOURCE, at)
    p = next_edit_prompt([diff], SOURCE[:start], SOURCE[start:end], SOURCE[end:], codec, 512, 1024)
    assert p.prompt.layout == "fim" and p.history == (diff,)
    window = codec.encode(SOURCE[start:end])
    assert p.init_ids[: len(window)] == window and p.gen_length == len(p.init_ids) > len(window)
    assert set(p.init_ids[len(window) :]) == {codec.special.eos}, "the room to grow is end-of-text, not masks"
    assert (len(p.prompt.ids) + p.gen_length) % 32 == 0, "the region ends with its block: no mask left after it"
    assert codec.decode(p.prompt.ids).endswith(diff + SOURCE[:start])
    bare = next_edit_prompt([], SOURCE[:start], SOURCE[start:end], SOURCE[end:], codec, 512, 1024)
    assert "@@" not in codec.decode(bare.prompt.ids)
    # The newest edits are kept when they do not all fit in a quarter of the budget.
    many = [edit_diff(f"a{i} = {i}", f"b{i} = {i}", i) for i in range(60)]
    cut = next_edit_prompt(many, "", SOURCE, "", codec, 512, 256)
    assert cut.history and cut.history == tuple(many[-len(cut.history) :]) and len(cut.history) < 60


def test_changes_are_the_smallest_ranges():
    window = "a = count + count\nb = count\n"
    revised = "a = acc + acc\nb = acc\n"
    found = changes(window, revised)
    assert [(window[c.start : c.end], c.text) for c in found] == [("count", "acc")] * 3
    assert apply_changes(window, 0, found) == revised and changes(window, window) == []


# --- the pipeline, with a scripted model -------------------------------------------------------------
def scripted(codec: TextCodec, answer=None, drafts: list[list[int]] | None = None) -> LoadedModel:
    """The embedded tokenizer with a backend that answers as tests/hooks/scripted_next_edit.py does
    (from the request's prompt and init_ids only), or `answer`; `drafts`: ids before the last."""
    eos = codec.special.eos

    class Batch:
        def generate(self, request):
            window = scripted_next_edit.window_of(codec, request.init_ids)
            text = scripted_next_edit.answer(codec.decode(request.prompt_ids), window) if answer is None else answer
            ids = codec.encode(text)[: request.gen_length]
            for i, d in enumerate(drafts or []):
                yield Draft(i + 1, d)
            yield Draft(len(drafts or []) + 1, ids)
            return Result(ids + [eos] * (request.gen_length - len(ids)), 3, 0.0)

    return LoadedModel(ModelSpec(None), codec, 512, 32, Batch(), edit_gap=True)


def run(model: LoadedModel, text: str, cursor: int, history: History, uri: str = "file:///a.py", python=True):
    last = history.last(uri)
    job, start = NextEdit.at(text, cursor, history.diffs(uri), (last.start, last.old, last.new) if last else None,
                             1024, python)  # fmt: skip
    plan = NextEditPlan(model, job, threading.Event())
    return job, start, plan, plan.run(model, lambda *_: None)


def renamed_source(codec):
    doc = Doc(SOURCE, History(Clock()))
    at = SOURCE.index("count = 0")
    doc.change(at, at + 5, "")
    doc.type(at, "acc")
    return doc, at + 3


def test_a_rename_gets_the_other_uses_suggested(codec):
    doc, cursor = renamed_source(codec)
    job, start, _, out = run(scripted(codec), doc.text, cursor, doc.history)
    assert out.stopped == "done"
    found = changes(job.window, out.text)
    assert [(doc.text[start + c.start : start + c.end], c.text) for c in found] == [("count", "acc")] * 2
    assert apply_changes(doc.text, start, found) == SOURCE.replace("count", "acc")


def test_without_the_history_the_same_model_has_nothing_to_suggest(codec):
    doc, cursor = renamed_source(codec)
    model = scripted(codec)
    job, start = NextEdit.at(doc.text, cursor, (), None, 1024, True)
    out = NextEditPlan(model, job, threading.Event()).run(model, lambda *_: None)
    assert out.stopped == "unchanged"


def test_a_suggestion_never_reverts_the_last_edit(codec):
    doc, cursor = renamed_source(codec)
    window_start, window_end = edit_window(doc.text, cursor)
    undo = doc.text[window_start:window_end].replace("acc = 0", "count = 0")
    out = run(scripted(codec, undo), doc.text, cursor, doc.history)[3]
    assert out.stopped == "refused" and "undo" in out.reason
    # Deleting what the user just typed is undoing it too.
    doc2 = Doc(SOURCE, History(Clock()))
    at = SOURCE.index("    return")
    doc2.type(at, "    # sum\n")
    s, e = edit_window(doc2.text, at)
    out = run(scripted(codec, doc2.text[s:e].replace("    # sum\n", "")), doc2.text, at, doc2.history)[3]
    assert out.stopped == "refused" and "undo" in out.reason


def test_an_edit_that_breaks_parsing_is_never_suggested(codec):
    doc, cursor = renamed_source(codec)
    s, e = edit_window(doc.text, cursor)
    broken = doc.text[s:e].replace("for v in values:", "for v in values")
    out = run(scripted(codec, broken), doc.text, cursor, doc.history)[3]
    assert out.stopped == "refused" and "unparsable" in out.reason


def test_a_suggestion_that_deletes_most_of_the_window_is_dropped(codec):
    doc, cursor = renamed_source(codec)
    out = run(scripted(codec, "def total(values):\n    return 0\n"), doc.text, cursor, doc.history)[3]
    assert out.stopped == "refused" and "delete" in out.reason


def test_a_model_that_keeps_changing_its_mind_stays_silent(codec):
    doc, cursor = renamed_source(codec)
    s, e = edit_window(doc.text, cursor)
    window = doc.text[s:e]
    final = window.replace("count", "acc")
    flips = [codec.encode(w) for w in (final, window, final, window)] * 2
    out = run(scripted(codec, final, drafts=flips), doc.text, cursor, doc.history)[3]
    assert out.stopped == "refused" and "unsure" in out.reason
    steady = run(scripted(codec, final, drafts=[codec.encode(final)]), doc.text, cursor, doc.history)
    assert steady[2].mean_rewrites(codec.encode(final)) <= MAX_MEAN_REWRITES and steady[3].stopped == "done"


@pytest.mark.slow
def test_the_embedded_model_answer_is_well_formed(codec, one_torch_thread):
    """The real tiny model (not trained on edits): whatever it answers is one of the outcomes, and a
    suggestion is changes inside the window that keep the file parsing."""
    from llada_lsp.backends import native
    from llada_lsp.completion.syntax import python_error

    model = native.load(ModelSpec(None, threads=1), lambda *_: None)
    doc, cursor = renamed_source(codec)
    job, start, plan, out = run(model, doc.text, cursor, doc.history)
    draft = draft_ids(job.window, None, codec)  # not tuned to fill a gap at the cursor: its draft has none
    assert not model.edit_gap and plan.request.init_ids[: len(draft)] == draft
    assert codec.special.mask not in plan.request.init_ids and plan.request.priority == 2
    assert out.stopped in ("done", "unchanged", "refused") and out.steps >= 1
    if out.stopped == "done":
        found = changes(job.window, out.text)
        assert found and all(0 <= c.start <= c.end <= len(job.window) for c in found)
        assert python_error(apply_changes(doc.text, start, found)) is None
    elif out.stopped == "refused":
        assert out.reason


async def test_the_sglang_backend_says_next_edits_are_not_supported(tmp_path):
    """SGLang starts generated blocks from masks: a next edit is refused as `unsupported`, saying why,
    and nothing is sent to the server."""
    import tempfile

    from test_sglang import RETURN, FakeSGLang, Stream, ask, service_on

    from llada_lsp import wire
    from llada_lsp.backends.sglang_config import SGLangBackend
    from llada_lsp.service.client import EngineClient, EngineFailure

    folder = Path(tempfile.mkdtemp(prefix="ll", dir="/tmp"))
    with FakeSGLang(lambda body: Stream([[5]], {"type": "stop"})) as fake:
        async with service_on(SGLangBackend(fake.url), folder) as (address, _):
            async with await EngineClient.connect(address, "editor") as client:
                request = wire.NextEdit(client.next_id(), "k", "", RETURN + " b\n", "", [], "quality", 1024, True)
                with pytest.raises(EngineFailure) as failure:
                    await ask(client, request)
    assert failure.value.kind == "unsupported" and "SGLang" in failure.value.message
    assert fake.generated == []


def test_a_long_window_is_cut_to_its_middle_lines_and_the_rest_kept_as_is(codec):
    from llada_lsp.completion.next_edit import fit_window

    window = "".join(f"value_{i} = compute({i}, {i + 1}, {i + 2})\n" for i in range(21))
    head, inner, tail = fit_window(window, codec, 60)
    assert head + inner + tail == window and len(codec.encode(inner)) <= 60 and "value_10 " in inner
    assert abs(head.count("\n") - tail.count("\n")) <= 1
    assert fit_window(window, codec, 10_000) == ("", window, "")
    # The model revises only the middle; the suggestion is still against the whole window.
    model = scripted(codec)
    model.max_positions = 200
    doc = Doc(window, History(Clock()))
    at = window.index("value_10 ")
    doc.change(at, at + 8, "v10")
    job, start, plan, out = run(model, doc.text, at, doc.history)
    special = (codec.special.eos, codec.special.mask)
    assert len([t for t in plan.request.init_ids if t not in special]) <= 200 // 3 and plan.head and plan.tail
    assert out.stopped == "unchanged"  # the scripted model saw a rename to nothing else in the middle lines


def test_a_chat_model_reads_the_edits_and_the_window_in_words(codec):
    """LLaDA2.1 has no FIM tokens: the edits and the window go into the chat prompt, the window stays
    the generated blocks' draft."""
    from llada_lsp.completion.layouts import SpecialIds

    chat = TextCodec(codec.tokenizer, SpecialIds(codec.special.eos, codec.special.mask), codec.stop_ids)
    diff = edit_diff("    count = 0", "    acc = 0", 1)
    start, end = edit_window(SOURCE, SOURCE.index("count += v"), lines=3)
    p = next_edit_prompt([diff], SOURCE[:start], SOURCE[start:end], SOURCE[end:], chat, 4096, 1024)
    text = chat.decode(p.prompt.ids)
    assert p.prompt.layout == "chat" and "```diff\n" + diff + "```" in text
    assert "The code at <HOLE> is now:\n```\n" + SOURCE[start:end] in text and "<role>ASSISTANT</role>" in text
    assert SOURCE[:start] + "<HOLE>" + SOURCE[end:] in text
    window = chat.encode(SOURCE[start:end])
    assert p.init_ids[: len(window)] == window and set(p.init_ids[len(window) :]) == {chat.special.eos}


def test_the_next_edit_settings_parse_with_their_defaults():
    from llada_lsp.server.settings import Settings, parse_settings

    s, errors = parse_settings(
        {"nextEdit": False, "nextEditDelayMs": 250, "nextEditHistory": False}, Settings(), Settings()
    )
    assert (s.next_edit, s.next_edit_delay_ms, s.next_edit_history, errors) == (False, 250, False, [])
    s, errors = parse_settings({"nextEdit": "yes", "nextEditDelayMs": -1}, Settings(), Settings())
    assert (s.next_edit, s.next_edit_delay_ms) == (True, 400) and len(errors) == 2 and "true or false" in errors[0]


def test_changes_of_blanks_alone_are_never_suggested(codec):
    doc, cursor = renamed_source(codec)
    s, e = edit_window(doc.text, cursor)
    window = doc.text[s:e]
    squeezed = window.replace("for v in values:", "for v in  values:").replace("(values)", "( values)")
    assert run(scripted(codec, squeezed), doc.text, cursor, doc.history)[3].stopped == "unchanged"
    both = squeezed.replace("count", "acc")
    job, start, _, out = run(scripted(codec, both), doc.text, cursor, doc.history)
    assert out.stopped == "done" and out.text == window.replace("count", "acc")
    assert [c.text for c in changes(job.window, out.text)] == ["acc", "acc"]


def test_the_draft_leaves_a_gap_at_the_cursor_and_an_insertion_there_is_suggested(codec):
    """Positions of a draft are fixed: an insertion at the cursor (the rest of what the user started
    typing) fills the gap there instead of shifting every token after it; the gap's masks the model
    leaves empty (end-of-text, or masks) are nothing, while an end-of-text elsewhere still ends the window."""
    text = "def area(w, h):\n    return w * \n\n\nprint(area(2, 3))\n"
    cursor = text.index("w * ") + 4
    job, start = NextEdit.at(text, cursor, (), None, 1024, True)
    assert job.window[job.cursor :].startswith("\n\n\nprint")
    draft = draft_ids(job.window, job.cursor, codec)
    mask, eos = codec.special.mask, codec.special.eos
    at = len(codec.encode(job.window[: job.cursor]))
    assert draft[at : at + GAP_TOKENS] == [mask] * GAP_TOKENS and mask not in draft[at + GAP_TOKENS :]

    class Filling:
        def generate(self, request):  # "h" then end-of-text in the gap, the rest of the draft kept
            assert request.eos_id not in request.init_ids, "no stop id: the canvas is read whole"
            ids = list(request.init_ids)
            at = ids.index(mask)
            ids[at : at + GAP_TOKENS] = codec.encode("h") + [eos] * (GAP_TOKENS - 1)
            yield Draft(1, ids)
            return Result(ids, 1, 0.0)

    model = LoadedModel(ModelSpec(None), codec, 512, 32, Filling(), edit_gap=True)
    out = NextEditPlan(model, job, threading.Event()).run(model, lambda *_: None)
    assert out.stopped == "done" and out.text == job.window[: job.cursor] + "h" + job.window[job.cursor :]

    class Keeping:
        def generate(self, request):  # the draft as it is, the gap's masks included
            yield Draft(1, list(request.init_ids))
            return Result(list(request.init_ids), 1, 0.0)

    kept = LoadedModel(ModelSpec(None), codec, 512, 32, Keeping(), edit_gap=True)
    assert NextEditPlan(kept, job, threading.Event()).run(kept, lambda *_: None).stopped == "unchanged"

    class Ending:
        def generate(self, request):  # end-of-text right after the gap: the window's rest is cut off
            ids = list(request.init_ids)
            at = ids.index(mask) + GAP_TOKENS
            ids[at] = eos
            yield Draft(1, ids)
            return Result(ids, 1, 0.0)

    cut = LoadedModel(ModelSpec(None), codec, 512, 32, Ending(), edit_gap=True)
    out = NextEditPlan(cut, job, threading.Event()).run(cut, lambda *_: None)
    assert out.stopped == "refused" and "delete" in out.reason


def test_only_a_model_tuned_to_fill_the_gap_gets_one(codec):
    """Masks at the cursor are a prompt format: a model that never learnt it fills them with guesses."""
    text = "def area(w, h):\n    return w * \n"
    job, _ = NextEdit.at(text, text.index("w * ") + 4, (), None, 1024, True)
    for tuned in (True, False):
        model = LoadedModel(ModelSpec(None), codec, 512, 32, None, edit_gap=tuned)
        ids = NextEditPlan(model, job, threading.Event()).request.init_ids
        assert ids.count(codec.special.mask) == (GAP_TOKENS if tuned else 0)


def test_a_suggestion_the_model_is_unsure_of_stays_silent(codec, monkeypatch):
    """The confidence gate: the mean confidence of the changed tokens, as the drafts carry it."""
    from llada_lsp.completion import next_edit

    monkeypatch.setattr(next_edit, "MIN_EDIT_CONFIDENCE", 0.6)
    doc, cursor = renamed_source(codec)
    job, _ = NextEdit.at(doc.text, cursor, doc.history.diffs("file:///a.py"), None, 1024, True)
    init = next_edit_prompt(job.history, job.before, job.window, job.after, codec, 512, 1024, 32, job.cursor).init_ids
    final = list(init)
    renamed = codec.encode("acc")[0]
    changed = [i for i, t in enumerate(init) if codec.decode([t]).strip() == "count"]
    assert changed
    for i in changed:
        final[i] = renamed

    def answering(sure: float) -> LoadedModel:
        class Batch:
            def generate(self, request):
                assert request.init_ids == init
                confidence = [0.99] * len(final)
                for i in changed:
                    confidence[i] = sure
                yield Draft(1, final, confidence=confidence)
                return Result(final, 2, 0.0)

        return LoadedModel(ModelSpec(None), codec, 512, 32, Batch(), edit_gap=True)

    for sure, stopped in ((0.55, "refused"), (0.65, "done")):
        model = answering(sure)
        plan = NextEditPlan(model, job, threading.Event())
        out = plan.run(model, lambda *_: None)
        assert out.stopped == stopped and plan.confidence == pytest.approx(sure)
        assert stopped == "done" or "unsure of its change (mean confidence 0.55)" in out.reason


def test_a_cursor_off_the_revised_lines_gets_no_gap(codec):
    """A peer's cursor off the window (the engine service takes it from the wire) and a cursor in the
    lines of a long window left as they are: the draft has no gap, and the request still runs."""
    from llada_lsp.completion.next_edit import fit_window, from_wire, to_wire

    doc, cursor = renamed_source(codec)
    job, _ = NextEdit.at(doc.text, cursor, (), None, 1024, True)
    assert from_wire(to_wire(job, 1, "k", False)) == job  # the cursor travels as it is
    for bad in (-5, len(job.window) + 1, 10**9):
        frame = to_wire(job, 1, "k", False)
        odd = from_wire(type(frame)(**{**frame.__dict__, "cursor": bad}))
        plan = NextEditPlan(scripted(codec), odd, threading.Event())
        assert codec.special.mask not in plan.request.init_ids
        assert plan.run(scripted(codec), lambda *_: None).stopped == "unchanged"
    window = "".join(f"value_{i} = compute({i}, {i + 1}, {i + 2})\n" for i in range(21))
    model = scripted(codec)
    model.max_positions = 200
    job, _ = NextEdit.at(window, 3, (), None, 1024, True)  # on the first line: left as it is
    head, _, _ = fit_window(job.window, codec, 200 // 3)
    assert head and job.cursor < len(head)
    assert codec.special.mask not in NextEditPlan(model, job, threading.Event()).request.init_ids
