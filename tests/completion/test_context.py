"""Context beyond the file, its pure parts: which snippets are chosen and from where (open documents,
imported workspace files, recent edits, client chunks), never from outside the workspace or above
the size bound; the set kept while the user types on one line; a closed document forgotten; the
prompt's budget with snippets, huge files included; the wire's `context` field."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import msgpack
import pytest

from llada_lsp import wire
from llada_lsp.completion import next_edit, python_names, ranking, snippets
from llada_lsp.completion.history import History
from llada_lsp.completion.jobs import Infill, Rewrite, from_wire, to_wire
from llada_lsp.completion.next_edit import NextEdit, next_edit_prompt
from llada_lsp.completion.prompt import TextCodec, infill_prompt, rewrite_prompt
from llada_lsp.completion.prompt import context_ids as ctx_ids
from llada_lsp.completion.python_names import python_imports
from llada_lsp.completion.ranking import choose, windows
from llada_lsp.completion.snippets import Snippet, render_snippets
from llada_lsp.model import EMBEDDED_MODEL, load_tokenizer
from llada_lsp.server.context_files import PAUSE_SECONDS, ContextFiles
from llada_lsp.server.documents import Document
from llada_lsp.server.workspace_files import MAX_FILE_BYTES

GEOMETRY = "def rectangle_area(width, height):\n    return width * height\n\n\ndef triangle_area(base, height):\n" \
           "    return base * height / 2\n"  # fmt: skip
NETWORK = "import socket\n\n\ndef open_connection(host, port):\n    return socket.create_connection((host, port))\n"
MAIN = "from pkg.geometry import rectangle_area\n\n\ndef total(width, height):\n    return rectangle_area("


@pytest.fixture(scope="module")
def codec() -> TextCodec:
    if not (EMBEDDED_MODEL / "tokenizer.json").is_file():
        pytest.skip("the embedded model is not in llada_lsp/data/tiny")
    return TextCodec.from_tokenizer(load_tokenizer())


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def uri(path: Path) -> str:
    return path.as_uri()


# --- choosing --------------------------------------------------------------------------------------
def test_the_most_alike_snippet_comes_first_and_unrelated_code_is_left_out():
    candidates = windows(NETWORK, "net.py") + windows(GEOMETRY, "geometry.py")
    chosen = choose(candidates, "area = rectangle_area(width, height)", "", 10_000)
    assert [s.path for s in chosen] == ["geometry.py"]
    # nothing in common with the cursor's code: nothing chosen
    assert choose(windows(NETWORK, "net.py"), "area = rectangle_area(width, height)", "", 10_000) == ()


def test_snippets_the_window_holds_already_are_left_out_and_the_budget_holds():
    text = "".join(f"def area_{i}(width, height):\n    return width * height + {i}\n\n" for i in range(60))
    candidates = windows(text, "shapes.py")
    assert all(s.text.count("\n") <= snippets.SNIPPET_LINES for s in candidates)
    chosen = choose(candidates, "area(width, height)", "", 1_500)
    assert chosen and len(render_snippets(chosen)) <= 1_500
    # no two overlapping windows of one file
    spans = sorted((s.line, s.line + s.text.count("\n")) for s in chosen)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    assert choose(candidates[:1], "area(width, height)", candidates[0].text, 10_000) == ()


def test_render_names_each_snippet_by_its_path_in_a_comment_line():
    text = render_snippets([Snippet("pkg/a.py", "x = 1"), Snippet("pkg/b.py", "y = 2\n")])
    assert text == "# path: pkg/a.py\nx = 1\n# path: pkg/b.py\ny = 2\n"


def test_python_imports_are_read_from_code_that_does_not_parse():
    text = "import os, pkg.util as u\nfrom . import sibling\nfrom ..up import (a,\nfrom pkg.geo import area, shape as s\ndef f(:\n"
    found = python_imports(text)
    assert (0, "pkg.util") in found and (1, "sibling") in found and (2, "up") in found and (2, "up.a") in found
    assert (0, "pkg.geo") in found and (0, "pkg.geo.area") in found and (0, "pkg.geo.shape") in found


# --- definitions of the names the cursor's code uses ---------------------------------------------------
SHOP = (
    '"""Shop models."""\n\n\nclass Basket:\n    def __init__(self, owner):\n        self.owner = owner\n'
    "        self.items = []\n\n    def add_article(self, article, quantity=1):\n"
    "        self.items.append((article, quantity))\n\n\nDEFAULT_PRICES = {\n    'apple': 3,\n}\n"
    + "".join(f"TAX_{i} = {i}\n" for i in range(30))
    + "".join(f"def gift_{i}(owner, basket, article, label):\n    return label\n\n" for i in range(30))
    + "def checkout_total(basket):\n"
    + "".join(f"    step_{i} = {i}\n" for i in range(20))
    + "    return 0\n"
)
CHECKOUT = "from pkg.shop import Basket, checkout_total as total\n\n\ndef checkout(owner, article):  # the customer\n" \
           "    basket = Basket(owner)\n    label = 'gift wrap'\n    basket."  # fmt: skip


def test_the_names_wanted_are_the_nearest_code_names_first_then_the_imported_ones():
    wanted = python_names.python_wanted(CHECKOUT, len(CHECKOUT))
    assert wanted[:4] == ["basket", "label", "owner", "Basket"], "nearest the cursor first"
    assert wanted.index("article") < wanted.index("checkout_total"), "imported names come after the near ones"
    assert "checkout" not in wanted, "the document's own definitions are not looked for"
    assert not {"customer", "gift", "wrap", "the", "self"} & set(wanted), "comments, strings, every file's words"


def test_a_definition_is_its_line_and_its_block_bounded():
    defined = python_names.defined_at(SHOP)
    assert set(defined) >= {"gift_0", "DEFAULT_PRICES", "Basket", "__init__", "add_article", "checkout_total"}
    assert "items" not in defined and "step_0" not in defined, "only module-level assignments define a name"
    source = Snippet("pkg/shop.py", SHOP, "shop")
    basket = python_names.definition(source, defined["Basket"][0])
    assert basket.text.startswith("class Basket:\n") and basket.text.endswith("quantity))\n")
    assert basket.line == SHOP[: SHOP.index("class Basket")].count("\n") and basket.origin == "shop"
    assert (
        python_names.definition(source, defined["DEFAULT_PRICES"][0]).text == "DEFAULT_PRICES = {\n    'apple': 3,\n}\n"
    )
    assert (
        python_names.definition(source, defined["checkout_total"][0]).text.count("\n") == python_names.DEFINITION_LINES
    )
    found = python_names.python_definitions([source], CHECKOUT, len(CHECKOUT))
    assert [s.text.split("\n")[0] for s in found] == ["class Basket:", "def checkout_total(basket):"]


def test_a_definition_ranks_ahead_of_windows_a_little_more_alike_but_not_far_more():
    around = "basket = Basket(owner, article, quantity)"
    definition = Snippet("shop.py", "class Basket:\n    pass\n", "shop", 40)  # shares 1 of 5 names: 0.2
    close = Snippet("other.py", "basket(owner)\n", "other")  # 2 of 5: 0.4, within DEFINITION_BONUS... of 0.2
    far = Snippet("far.py", "basket, Basket, owner, article\n", "far")  # 4 of 5: 0.8
    assert ranking.DEFINITION_BONUS < 0.4 - 0.2 + ranking.DEFINITION_BONUS < 0.8 - 0.2
    assert choose([close], around, "", 10_000, first=[definition]) == (close, definition)
    assert choose([close, far], around, "", 10_000, first=[definition])[0] == far


def test_the_definition_of_an_imported_class_beats_code_that_only_looks_alike(workspace: Path):
    (workspace / "pkg" / "shop.py").write_text(SHOP)
    files = ContextFiles()
    files.set_roots([uri(workspace)])
    doc = Document(uri(workspace / "pkg" / "checkout.py"), 1, CHECKOUT, "python")
    assert [m.path for m in files.modules(doc, [doc])] == ["pkg/shop.py"]
    chosen = files.choose_now(doc, len(CHECKOUT), [doc], History(), 200)
    assert chosen[0].text.startswith("class Basket:\n") and "add_article" in chosen[0].text
    # the windows alone: the functions at the top look more like the cursor's code, and the class is not in them
    alike = ranking.choose_at(files.candidates(doc, [doc], History()), CHECKOUT, len(CHECKOUT), 200)
    assert alike and all("add_article" not in s.text for s in alike)
    # an open module is read as the editor has it; other languages get no definitions
    shop = Document(uri(workspace / "pkg" / "shop.py"), 2, SHOP.replace("class Basket", "class Basket(Base)"), "python")
    assert files.modules(doc, [doc, shop])[0].text == shop.text
    assert files.modules(Document(uri(workspace / "a.js"), 1, CHECKOUT, "javascript"), [shop]) == []


# --- the front's sources ---------------------------------------------------------------------------
@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "__init__.py").write_text("")
    (ws / "pkg" / "geometry.py").write_text(GEOMETRY)
    (tmp_path / "outside.py").write_text("def rectangle_area_outside(width, height):\n    return width\n")
    return ws


def test_imported_workspace_files_are_read_but_nothing_outside_the_workspace(workspace: Path):
    outside = workspace.parent / "outside.py"
    (workspace / "pkg" / "escape.py").symlink_to(outside)  # inside by name, outside in fact
    (workspace / "pkg" / "huge.py").write_text("def rectangle_area_huge(width, height):\n" + "#" * MAX_FILE_BYTES)
    files = ContextFiles()
    files.set_roots([uri(workspace)])
    text = MAIN + "\nfrom pkg import escape, huge\nfrom .. import outside\n"
    doc = Document(uri(workspace / "pkg" / "main.py"), 1, text, "python")
    assert files.imported(doc) == [workspace / "pkg" / "geometry.py", workspace / "pkg" / "__init__.py",
                                   workspace / "pkg" / "huge.py"]  # fmt: skip
    chosen = files.choose_now(doc, len(MAIN), [doc], History(), 400)
    assert [s.path for s in chosen] == ["pkg/geometry.py"]  # huge.py is over the size bound: never read
    assert all("outside" not in s.text and "huge" not in s.text for s in chosen)
    # without a workspace nothing is read from the disk at all
    assert ContextFiles().imported(doc) == []


def test_other_open_documents_and_recent_edits_are_sources(workspace: Path):
    files, history = ContextFiles(), History()
    files.set_roots([uri(workspace)])
    other = Document(uri(workspace / "notes.py"), 1, "def triangle_area_scaled(base, height):\n    pass\n")
    doc = Document(uri(workspace / "main.py"), 1, "x = 1\n" * 200 + "area = triangle_area_scaled(base, ")
    history.record(doc.uri, doc.text, 30, 30, "base_height = 2\n", 5)  # an edit far above the cursor's window
    chosen = files.choose_now(doc, len(doc.text), [doc, other], history, 400)
    assert [s.path for s in chosen] == ["notes.py"]
    edits = [s for s in files.candidates(doc, [doc, other], history) if s.origin == doc.uri]
    assert edits and edits[0].line == 0


def test_client_chunks_are_bounded_and_named(workspace: Path):
    files = ContextFiles()
    files.set_roots([uri(workspace)])
    assert files.receive({"text": "def rectangle_area_chunk(width, height): pass\n",
                          "uri": uri(workspace / "pkg" / "c.py")}) is None  # fmt: skip
    assert files.chunks[-1].path == "pkg/c.py"
    assert "over" in files.receive({"text": "x" * (snippets.MAX_SNIPPET_CHARS + 1)})
    assert "takes" in files.receive({"uri": "file:///a.py"})
    for i in range(40):
        files.receive({"text": f"chunk_{i} = {i}\n"})
    assert len(files.chunks) == 16 and files.chunks[-1].text == "chunk_39 = 39\n"


def test_the_set_stays_while_typing_on_a_line_and_is_chosen_again_on_another(workspace: Path):
    clock, history = Clock(), History()
    files = ContextFiles(clock)
    files.outside_workspace = True  # documents without a workspace folder (the boundaries: test_context_hostile.py)
    geometry = Document("file:///geo.py", 1, GEOMETRY)
    network = Document("file:///net.py", 1, NETWORK)
    doc = Document("file:///main.py", 1, "x = 1\ny = 3\n")
    docs = [doc, geometry, network]
    first = files.snippets(doc, len(doc.text), docs, history, 400)
    assert first == ()  # nothing alike yet
    typed = doc.text
    for word in ("area = ", "rectangle_area(", "open_connection(host, port)"):
        clock.now += 0.3
        typed += word
        doc.text = typed
        assert files.snippets(doc, len(typed), docs, history, 400) == (), "chosen again within a line"
    clock.now += 0.3
    doc.text = typed + "\nhost = open_connection(host, port)\n"
    assert [s.path for s in files.snippets(doc, len(doc.text), docs, history, 400)] == ["net.py", "geo.py"]
    clock.now += PAUSE_SECONDS + 0.1  # a pause: chosen again on the same line
    doc.text += "area = rectangle_area(width, height) + triangle_area(base, height)"
    assert [s.path for s in files.snippets(doc, len(doc.text), docs, history, 400)][0] == "geo.py"


def test_a_closed_documents_text_is_never_used_again():
    clock = Clock()
    files = ContextFiles(clock)
    files.outside_workspace = True
    geometry = Document("file:///geo.py", 1, GEOMETRY)
    doc = Document("file:///main.py", 1, "area = rectangle_area(width, height)")
    assert files.snippets(doc, len(doc.text), [doc, geometry], History(), 400)[0].origin == geometry.uri
    files.forget(geometry.uri)
    assert files.current(doc.uri) is None, "a set holding the closed document's text is dropped"
    assert files.snippets(doc, len(doc.text), [doc], History(), 400) == ()


# --- the prompt ------------------------------------------------------------------------------------
def test_snippets_start_the_prompt_within_their_share_and_the_budget_holds_for_huge_files(codec):
    s = codec.special
    huge = "def rectangle_area(width, height):\n    return width * height\n" * 40_000  # about 2.6 MB
    snippets = choose(windows(huge, "pkg/geometry.py"), "rectangle_area(width, height)", "", 40_000)
    assert snippets
    before = huge + "def total(width, height):\n    return rectangle_area("
    for budget, share in ((480, 25), (480, 75), (448, 0), (96, 25)):
        p = infill_prompt(before[-budget * 16 :], huge[: budget * 16], codec, budget, context=snippets,
                          context_share=share)  # fmt: skip
        assert len(p.ids) <= budget
        start = p.ids.index(s.fim_prefix)
        assert start <= budget * share // 100
        if p.context:
            assert p.ids[:start] == codec.encode(render_snippets(p.context))
            assert codec.decode(p.ids[:start]).startswith("# path: pkg/geometry.py\n")
        else:
            assert start == 0
    assert infill_prompt("a", "b", codec, 480, context=snippets, context_share=25).context, "a share of 120 fits one"


class CountingTokenizer:
    """The embedded tokenizer, counting the texts it is asked to encode."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.texts = tokenizer, 0

    def __call__(self, texts, **kwargs):
        self.texts += len(texts) if isinstance(texts, list) else 1
        return self.tokenizer(texts, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.tokenizer, name)


def test_the_snippets_ids_are_fitted_once_per_set_share_and_layout(codec):
    counting = dataclasses.replace(codec, tokenizer=CountingTokenizer(codec.tokenizer))
    snippets = (Snippet("pkg/geometry.py", GEOMETRY), Snippet("net.py", NETWORK))
    ids, kept = ctx_ids(snippets, counting, 60, True)
    fitted, first = counting.tokenizer.texts, list(ids)
    assert fitted >= 2 and kept and ids == codec.encode(render_snippets(kept))
    ids.append(-1)  # a caller's list is its own: the remembered ids stay as they were
    for _ in range(3):  # typing along the line: the same set, nothing encoded again
        assert ctx_ids(snippets, counting, 60, True) == (first, kept)
    assert counting.tokenizer.texts == fitted
    ctx_ids(snippets, counting, 61, True)  # another cap, or the other layout: fitted anew
    ctx_ids(snippets, counting, 60, False)
    assert counting.tokenizer.texts > fitted + 1


def test_the_prompts_start_is_the_same_while_typing_on_a_line(codec):
    snippets = (Snippet("pkg/geometry.py", GEOMETRY),)
    start = codec.encode(render_snippets(snippets))
    for typed in ("", "rect", "rectangle_area(wid"):
        p = infill_prompt(MAIN + typed, "\n", codec, 480, context=snippets, context_share=25)
        assert p.ids[: len(start)] == start


def test_the_chat_layout_describes_the_snippets_in_words(codec):
    p = infill_prompt("x = ", "\n", codec, 480, "Complete it.", (Snippet("pkg/geometry.py", GEOMETRY),), 50)
    text = codec.decode(p.ids)
    assert (
        p.layout == "chat"
        and "From pkg/geometry.py:" in text
        and text.index("rectangle_area") < text.index("Complete it.")
    )


# --- the wire --------------------------------------------------------------------------------------
def test_the_wire_carries_path_and_text_only_and_refuses_bad_context():
    job = Infill("a", "b", "speed", 8, 256, context=(Snippet("p.py", "x = 1\n", "file:///secret/p.py", 3),),
                 context_share=30, warm=True)  # fmt: skip
    frame = to_wire(job, 1, "k", False)
    assert frame.context == [{"path": "p.py", "text": "x = 1\n"}]
    back = from_wire(wire.decode(wire.encode(frame)[4:]))
    assert back.context == (Snippet("p.py", "x = 1\n"),) and back.context_share == 30 and back.warm
    assert to_wire(Infill("a", "b", "speed", 8, 256), 2, "k", False).to_dict().keys().isdisjoint({"context", "warm"})
    greedy = dataclasses.replace(frame, context_share=99)  # a peer's share past the bound: the window keeps a quarter
    assert from_wire(greedy).context_share == 75
    assert snippets.wire_problem([{"path": "p.py"}]) is not None
    assert snippets.wire_problem([{"path": "p", "text": "x" * (snippets.MAX_SNIPPET_CHARS + 1)}]) is not None
    assert snippets.wire_problem([{"path": "p", "text": "x"}] * (snippets.MAX_WIRE_SNIPPETS + 1)) is not None
    body = msgpack.packb({"type": "infill", "id": 1, "key": "k", "before": "", "after": "", "mode": "speed",
                          "max_tokens": 1, "context_tokens": 1, "context": [{"path": 1}]})  # fmt: skip
    with pytest.raises(wire.WireError):
        wire.decode(body)
    assert wire.VERSION == 4


def test_a_rewrite_carries_the_snippets_too_and_its_prompt_keeps_the_models_positions(codec):
    job = Rewrite.at(MAIN + "rectangle_area(width, height)\n", len(MAIN), len(MAIN) + 29, "quality", 1024)
    job = dataclasses.replace(job, context=snippets.to_wire([Snippet("pkg/geometry.py", GEOMETRY)]), context_share=40)
    back = from_wire(wire.decode(wire.encode(to_wire(job, 3, "r", False))[4:]))
    assert back == job
    chosen = snippets.from_wire(back.context)
    p = rewrite_prompt(back.before, back.selection, back.after, codec, 512, 1024, context=chosen, context_share=40)
    assert len(p.prompt.ids) + p.gen_length <= 512 and p.prompt.context == chosen
    assert p.prompt.ids[: p.prompt.ids.index(codec.special.fim_prefix)] == codec.encode(render_snippets(chosen))
    assert snippets.wire_problem(None) is None


def test_choose_at_is_what_the_front_chooses_with():
    doc = Document("file:///main.py", 1, "x = 1\n" * 300 + "area = rectangle_area(width, ")
    geometry = Document("file:///geo.py", 1, GEOMETRY)
    files = ContextFiles()
    files.outside_workspace = True
    chosen = files.choose_now(doc, len(doc.text), [doc, geometry], History(), 100)
    candidates, modules = files.candidates(doc, [doc, geometry], History()), files.modules(doc, [doc, geometry])
    assert chosen == ranking.choose_at(candidates, doc.text, len(doc.text), 100, modules)
    assert chosen[0].text == GEOMETRY, "the definition's module, whole: it is no longer than one snippet"
    assert snippets.lines_around("a\nb\nc\nd\n", 4, 1, 0) == "b\nc\n"


def test_a_next_edit_carries_the_snippets_first_and_keeps_its_history_and_window(codec):
    window = "    return rectangle_area(width, height)\n"
    history = ("@@ -1 +1 @@\n-def total(w, h):\n+def total(width, height):\n",)
    job = NextEdit(MAIN[:40], window, "\n", history, None, 1024, True, context=(Snippet("pkg/geometry.py", GEOMETRY),),
                   context_share=25)  # fmt: skip
    back = next_edit.from_wire(wire.decode(wire.encode(next_edit.to_wire(job, 4, "n", False))[4:]))
    assert back == job
    plain = next_edit_prompt(back.history, back.before, back.window, back.after, codec, 512, 1024)
    p = next_edit_prompt(back.history, back.before, back.window, back.after, codec, 512, 1024,
                         context=back.context, context_share=back.context_share)  # fmt: skip
    start = codec.encode(render_snippets(p.prompt.context))
    assert p.prompt.context and p.prompt.ids[: len(start)] == start and p.prompt.ids[len(start) :] == plain.prompt.ids
    eos = codec.special.eos  # the draft is the same window; only the room after it rounds to another block end
    assert p.init_ids[: p.init_ids.index(eos)] == plain.init_ids[: plain.init_ids.index(eos)]
    assert len(p.prompt.ids) + p.gen_length <= 512 and p.history == plain.history


class Never:
    def is_set(self) -> bool:
        return False


def test_the_engine_gets_the_snippets_first_and_a_warm_job_stops_after_its_prefill(one_torch_thread):
    from llada_lsp.backends.native import load
    from llada_lsp.completion.generation import ModelSpec
    from llada_lsp.completion.pipeline import InfillPlan

    model = load(ModelSpec(None, threads=1), lambda *_: None)
    snippets = (Snippet("pkg/geometry.py", GEOMETRY),)
    job = dataclasses.replace(Infill.at(MAIN, len(MAIN), "speed"), context=snippets, context_share=25)
    plan = InfillPlan(model, job, Never())
    start = model.codec.encode(render_snippets(snippets))
    assert plan.request.prompt_ids[: len(start)] == start
    assert len(plan.request.prompt_ids) + plan.request.gen_length <= model.max_positions
    warm = InfillPlan(model, dataclasses.replace(job, warm=True), Never())
    assert warm.request.prompt_ids == plan.request.prompt_ids and warm.request.priority > plan.request.priority
    outcome = warm.run(model, lambda *_: None)
    assert outcome.steps == 1 and outcome.stopped == "unit"
