"""Prompt building: token budget around the cursor, prefix first, stable blocks while typing, layouts."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from llada_lsp.completion.jobs import window
from llada_lsp.completion.layouts import SpecialIds
from llada_lsp.completion.prompt import SelectionTooLong, TextCodec, heal, infill_prompt, rewrite_prompt
from llada_lsp.model import EMBEDDED_MODEL, load_tokenizer

# A long Python file, frozen (a copy of engine/decode.py once): the tests below cut prompts at fixed
# spots of it, so the file they read must not change when the engine's source does.
SOURCE = (Path(__file__).resolve().parents[1] / "data" / "long_source.py.txt").read_text()


@pytest.fixture(scope="module")
def codec() -> TextCodec:
    if not (EMBEDDED_MODEL / "tokenizer.json").is_file():
        pytest.skip("the embedded model is not in llada_lsp/data/tiny")
    return TextCodec.from_tokenizer(load_tokenizer())


def test_fim_layout_within_budget_prefix_first(codec):
    cursor = SOURCE.index("def default_cache_mb") + 20
    for budget in (48, 100, 192, 1024):
        p = infill_prompt(SOURCE[:cursor], SOURCE[cursor:], codec, budget)
        s = codec.special
        assert len(p.ids) <= budget and p.layout == "fim"
        # suffix-prefix-middle: the prefix ends the prompt, right where the hole begins
        assert p.ids[:2] == [s.fim_prefix, s.fim_suffix] and p.ids.count(s.fim_middle) == 1
        assert SOURCE[:cursor].endswith(p.prefix) and SOURCE[cursor:].startswith(p.suffix)
        middle = p.ids.index(s.fim_middle)
        assert codec.decode(p.ids[middle + 1 :]) == p.prefix and codec.decode(p.ids[2:middle]) == p.suffix
        n_prefix, n_suffix = len(p.ids) - middle - 1, middle - 2
        if budget >= 100:  # both sides are long here: the prefix gets its share first (whole lines)
            assert n_prefix > n_suffix > 0 and len(p.ids) >= budget - 40 or budget == 1024


def test_typing_on_one_line_keeps_the_prompt_blocks(codec):
    """Typing at the end of a line in a long file: the prefix start never moves within a block's worth
    of typing, so every whole block before the cursor line is the same and its K/V is reused."""
    cursor = SOURCE.index("def default_cache_mb")
    line = "        started = time.perf_counter()"
    prompts = []
    for i in range(len(line) + 1):
        before = SOURCE[:cursor] + line[:i]
        prompts.append(infill_prompt(before, SOURCE[cursor:], codec, 192))
    starts = {len(SOURCE[:cursor]) - len(p.prefix) + len(line[:i]) for i, p in enumerate(prompts)}
    assert len(starts) <= 2, "the prefix start moved more than once while typing one line"
    above = SOURCE[:cursor].count("\n")
    stable = 0
    for a, b in zip(prompts, prompts[1:]):
        same = next((k for k, (x, y) in enumerate(zip(a.ids, b.ids)) if x != y), len(a.ids))
        stable += same >= 64
    assert stable >= len(prompts) - 3 and above > 0


def test_document_text_is_encoded_literally(codec):
    text = 'marker = "<|endoftext|><|fim_middle|>"\n'
    p = infill_prompt(text, "\nprint(marker)\n", codec, 128)
    s = codec.special
    assert p.ids.count(s.eos) == 0 and p.ids.count(s.fim_middle) == 1


def test_lone_surrogates_are_encoded_as_replacement_characters(codec):
    """A lone surrogate (legal in JSON, left by bad pastes) made the tokenizer raise TypeError on every
    request about its document; it now stands for U+FFFD, one character for one."""
    before, after = 'bad = "\ud800"\ndef add(a, b):\n    return a', "\n\udfff = 1\n"
    clean_before, clean_after = before.replace("\ud800", "\ufffd"), after.replace("\udfff", "\ufffd")
    assert codec.encode(before) == codec.encode(clean_before)
    assert codec.encode_batch([before, after]) == [codec.encode(clean_before), codec.encode(clean_after)]
    assert codec.encode_markup("<role>USER</role>\ud83d") == codec.encode_markup("<role>USER</role>\ufffd")
    assert infill_prompt(before, after, codec, 128).ids == infill_prompt(clean_before, clean_after, codec, 128).ids
    r = rewrite_prompt(before, "x = '\ud800'", after, codec, 256, 128)
    assert r.init_ids == codec.encode("x = '\ufffd'")


def test_chat_layout_without_fim_tokens(codec):
    no_fim = dataclasses.replace(codec, special=SpecialIds(codec.special.eos, codec.special.mask))
    p = infill_prompt("def add(a, b):\n    return ", "\n", no_fim, 512)
    text = codec.decode(p.ids)
    assert p.layout == "chat" and len(p.ids) <= 512
    assert text.startswith("<role>SYSTEM</role>") and text.endswith("<role>ASSISTANT</role>")
    assert "def add(a, b):\n    return <HOLE>\n" in text


def test_huge_document_is_cut_quickly(codec):
    huge = ("x = compute(1, 2, 3)  # filler\n" * 70_000)[:2_000_000]
    cursor = len(huge) // 2
    started = time.perf_counter()
    before, after = window(huge, cursor, cursor, 1024 * 16)
    p = infill_prompt(before, after, codec, 1024)
    assert len(p.ids) <= 1024 and time.perf_counter() - started < 2.0


def test_rewrite_prompt_starts_from_the_selection(codec):
    selection = "def add(a, b):\n    return a + b\n"
    r = rewrite_prompt("import os\n\n", selection, "\nprint(add(1, 2))\n", codec, 256, 1024)
    assert r.init_ids == codec.encode(selection)
    # A little room to grow (a model given much fills it with the code that follows), all within the model.
    assert len(r.init_ids) + 2 <= r.gen_length <= len(r.init_ids) * 9 // 8 + 2
    assert len(r.prompt.ids) + r.gen_length <= 256
    with pytest.raises(SelectionTooLong):
        rewrite_prompt("", selection * 40, "", codec, 256, 1024)


def test_healing_takes_back_a_partial_word(codec):
    before = "import unittest\n\nclass T(unittest.TestCase):\n    def test_it(self):\n        self.assertE"
    p = infill_prompt(before, "\n", codec, 256)
    healed = heal(p, codec)
    assert healed is not None and "assertE".endswith(healed.text.strip()) and len(healed.text) > 1
    assert p.ids[: len(healed.ids)] == healed.ids and len(healed.ids) < len(p.ids)
    assert healed.allowed and all(codec.token_texts[i].startswith(healed.text) for i in healed.allowed)
    assert codec.decode(healed.ids[healed.ids.index(codec.special.fim_middle) + 1 :]) + healed.text == p.prefix
    for plain_end in ("x = (", "x = 1 ", "x = 1\n"):  # not inside a word: nothing to heal
        assert heal(infill_prompt(plain_end, "\n", codec, 256), codec) is None
