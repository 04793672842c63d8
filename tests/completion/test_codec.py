"""One codec for training and serving: source text that spells a special token ("<|endoftext|>" in a
string literal, a FIM marker in a comment) is encoded as literal text on both paths, identically."""

from __future__ import annotations

import pytest

from llada_lab.training.objective import HOLE_KINDS, SampleStream, parse_hole_weights
from llada_lsp.completion.codec import TextCodec
from llada_lsp.completion.prompt import infill_prompt

SOURCE = (
    'EOS = "<|endoftext|>"  # the end-of-text marker, spelled out\n'
    "def split(text):\n"
    '    return text.split("<|fim_middle|>")  # not a hole: a string <|mask|>\n'
)


@pytest.fixture(scope="module")
def codec() -> TextCodec:
    from llada_lsp.model import load_tokenizer

    return TextCodec.from_tokenizer(load_tokenizer(None))


def only(kind: str) -> tuple[float, ...]:
    return parse_hole_weights(",".join(f"{k}={int(k == kind)}" for k in HOLE_KINDS))


def test_document_text_never_becomes_a_special_token(codec):
    special_ids = set(codec.tokenizer.all_special_ids)
    ids = codec.encode(SOURCE)
    assert not special_ids & set(ids)
    assert codec.decode(ids) == SOURCE
    raw = codec.tokenizer(SOURCE, add_special_tokens=False)["input_ids"]  # what training used to do
    assert special_ids & set(raw), "the tokenizer no longer parses special tokens from text: this test is moot"


def test_a_training_sample_encodes_the_text_as_the_server_does(codec):
    stream = SampleStream([SOURCE], codec.tokenizer, seed=0, hole_weights=only("plain"))
    assert stream.sample() == [*codec.encode(SOURCE), codec.special.eos]


def test_a_fim_sample_starts_with_the_server_prompt_for_the_same_cursor(codec):
    """The training layout of a hole is the prompt the server builds for that cursor, then the middle;
    the only special ids in it are the layout's own."""
    stream = SampleStream([SOURCE], codec.tokenizer, seed=0)
    special = codec.special
    for cursor in (5, SOURCE.index("<|end"), SOURCE.index("endoftext"), SOURCE.index("<|fim"), len(SOURCE) - 8):
        prefix, rest = SOURCE[:cursor], SOURCE[cursor:]
        middle, suffix = rest.split("\n", 1)[0], rest[len(rest.split("\n", 1)[0]) :]
        served = infill_prompt(prefix, suffix, codec, budget=512)
        assert (served.prefix, served.suffix) == (prefix, suffix)  # the whole context fits
        trained = stream.fim(prefix, middle, suffix)
        assert trained == [*served.ids, *codec.encode(middle)]
        assert [t for t in trained if t in codec.tokenizer.all_special_ids] == [
            special.fim_prefix,
            special.fim_suffix,
            special.fim_middle,
        ]


def test_remembered_encodings_are_the_tokenizers(monkeypatch):
    """encode_batch remembers recent texts (a prompt encodes mostly the same lines on every keystroke):
    what it returns is the tokenizer's own ids, for repeated and new texts, across a cache emptied
    when full, and a caller's list changed afterwards leaves the remembered ids alone."""
    from llada_lsp.model import load_tokenizer

    codec = TextCodec.from_tokenizer(load_tokenizer(None))
    monkeypatch.setattr(TextCodec, "ENCODED_CACHE", 5)

    def direct(texts):
        out = codec.tokenizer(texts, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        return [list(ids) for ids in out]

    lines = SOURCE.splitlines(keepends=True) + ["x = 1\n", "    return y\n", "", "\ud800 lone\n"]
    for batch in (lines, lines[::-1], lines[:2] * 3, [SOURCE, *lines], lines):
        got = codec.encode_batch(batch)
        assert got == direct([t.replace("\ud800", "\ufffd") for t in batch])
        got[0].append(-1)
        assert codec.encode_batch(batch[:1]) == direct([batch[0].replace("\ud800", "\ufffd")])
    assert len(codec._encoded) <= 5 + len(lines) + 1
