"""The checkpoint's tokenizer read with the tokenizers library (model/tokenizer.py) gives what
transformers' AutoTokenizer gives for the same files: ids (special tokens split or kept), texts, special
ids. A tokenizer it does not read the same way goes to transformers. And loading a model and its codec,
as the server does, imports no transformers (0.8 s of every start)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from llada_lsp.model import EMBEDDED_MODEL, load_serving_tokenizer
from llada_lsp.model.tokenizer import CheckpointTokenizer, read_tokenizer

ROOT = Path(__file__).resolve().parents[2]
ODD = ["", " ", "\t\n\n  ", "<|endoftext|> x <|mask|>", "a<|endoftext|>b", "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>",
       "héllo 世界 \ufffd 🙂", "<|endoftext", "def f(x):\n\treturn x  # done\r\n", "\x00\x01"]  # fmt: skip


def texts() -> list[str]:
    sources = sorted((ROOT / "llada_lsp").rglob("*.py"))[:60]
    return [p.read_text() for p in sources] + ODD


def reference(folder: Path):
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)


def same(ours, theirs) -> None:
    assert isinstance(ours, CheckpointTokenizer)
    assert ours.all_special_ids == theirs.all_special_ids
    assert (ours.eos_token_id, ours.unk_token_id, ours.mask_token_id) == (
        theirs.eos_token_id, theirs.unk_token_id, theirs.mask_token_id)  # fmt: skip
    assert len(ours) == len(theirs) and ours.get_vocab() == theirs.get_vocab()
    assert ours.convert_tokens_to_ids("<|mask|>") == theirs.convert_tokens_to_ids("<|mask|>")
    batch = texts()
    for split in (True, False):
        for special in (True, False):
            want = theirs(batch, add_special_tokens=special, split_special_tokens=split)["input_ids"]
            assert ours(batch, add_special_tokens=special, split_special_tokens=split)["input_ids"] == want
    assert ours(ODD[3])["input_ids"] == theirs(ODD[3])["input_ids"]  # one text: one list of ids
    every = [[i] for i in range(len(ours))]
    assert ours.batch_decode(every) == theirs.batch_decode(every, clean_up_tokenization_spaces=False)
    ids = theirs(batch, add_special_tokens=False)["input_ids"]
    assert [ours.decode(i) for i in ids] == [theirs.decode(i, clean_up_tokenization_spaces=False) for i in ids]
    assert [ours.decode(i, skip_special_tokens=True) for i in ids] == [
        theirs.decode(i, skip_special_tokens=True, clean_up_tokenization_spaces=False) for i in ids]  # fmt: skip


def test_the_embedded_tokenizer_reads_as_transformers_reads_it():
    same(load_serving_tokenizer(), reference(EMBEDDED_MODEL))


@pytest.fixture()
def tokenizer_with(tmp_path):
    """The embedded tokenizer in a folder whose tokenizer_config.json the test changes."""
    shutil.copy(EMBEDDED_MODEL / "tokenizer.json", tmp_path / "tokenizer.json")
    config = json.loads((EMBEDDED_MODEL / "tokenizer_config.json").read_text())

    def write(drop: tuple[str, ...] = (), **changes) -> Path:
        written = {k: v for k, v in {**config, **changes}.items() if k not in drop}
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(written))
        return tmp_path

    return write


@pytest.mark.parametrize(
    "drop, changes",
    [
        # transformers 4's class and key for the extra special tokens (the real LLaDA2.1's shape)
        (("extra_special_tokens", "backend"), {"tokenizer_class": "PreTrainedTokenizerFast",
         "additional_special_tokens": ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]}),
        # special tokens written as objects, an unk token, no extra tokens
        (("extra_special_tokens",), {"eos_token": {"__type": "AddedToken", "content": "<|endoftext|>", "special": True},
                                     "unk_token": "<|mask|>"}),
        # no mask token named: the FIM tokens alone besides the end
        (("mask_token",), {}),
    ],
    ids=["transformers-4-fast", "token-objects", "no-mask-named"],
)  # fmt: skip
def test_other_shapes_of_tokenizer_config_read_as_transformers_reads_them(tokenizer_with, drop, changes):
    folder = tokenizer_with(drop, **changes)
    same(read_tokenizer(folder), reference(folder))


@pytest.mark.parametrize(
    "changes",
    [{"tokenizer_class": "LlamaTokenizer"}, {"auto_map": {"AutoTokenizer": ["x.Tok", None]}},
     {"add_bos_token": True}, {"clean_up_tokenization_spaces": True}, {"eos_token": 7}],
    ids=["other-class", "remote-code", "adds-bos", "cleans-up", "odd-token"],
)  # fmt: skip
def test_a_tokenizer_it_does_not_read_the_same_way_goes_to_transformers(tokenizer_with, changes):
    assert read_tokenizer(tokenizer_with(**changes)) is None


def test_loading_the_model_and_its_codec_imports_no_transformers():
    code = ("import sys\nfrom llada_lsp.backends.base import load_codec\nfrom llada_lsp.model import load_model\n"
            "load_model(None, device='cpu'); load_codec(None, 'embedded')\n"
            "print(sorted(m for m in ('transformers', 'tokenizers') if m in sys.modules))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["['tokenizers']"], done.stdout
