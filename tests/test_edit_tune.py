"""The next-edit fine-tune's examples and batches (training/edit_tune.py). The example builder uses the
server side's prompt (completion/next_edit.py) and edit history (server/history.py): where those are
absent (this branch alone) its test is skipped."""

from __future__ import annotations

import random

import pytest
import torch

from llada_lsp.training.edit_tune import EditExample, edit_batch

MASK, EOS = 1, 0


def test_the_batch_starts_the_generated_region_from_the_window_and_labels_it_with_the_target():
    ex = EditExample(prompt=[5, 6, 7], init=[10, 11, 12], target=[10, 13, 12, EOS])
    torch.manual_seed(0)
    for seed in range(20):
        x, noisy, w = edit_batch([ex], 16, 4, MASK, EOS, 0.3, random.Random(seed))
        assert x.shape == noisy.shape == w.shape == (1, 16)
        assert x[0, :7].tolist() == [5, 6, 7, 10, 13, 12, EOS] and set(x[0, 7:].tolist()) == {EOS}
        assert noisy[0, :3].tolist() == [5, 6, 7]  # the prompt as it is
        draft = noisy[0, 3:7].tolist()
        assert all(d in (i, MASK) for d, i in zip(draft, [10, 11, 12, MASK]))  # the window, some masked
        weights = w[0].tolist()
        assert weights[:3] == [0, 0, 0] and set(weights[7:]) == {0}  # only the generated region counts
        assert weights[4] == 1 and weights[6] == 1  # 11 -> 13 to change; the grown position to fill
        assert weights[3] == pytest.approx(0.3) or weights[3] == 1  # kept (0.3) unless masked on top (1)


def test_a_served_example_is_the_servers_prompt_and_the_revised_window():
    pytest.importorskip("llada_lsp.completion.next_edit")
    pytest.importorskip("llada_lsp.server.history")
    from transformers import AutoTokenizer

    from llada_lsp.completion.codec import TextCodec
    from llada_lsp.model import EMBEDDED_MODEL
    from llada_lsp.training.edit_tune import served_example

    if not (EMBEDDED_MODEL / "tokenizer.json").is_file():
        pytest.skip("no embedded model")
    codec = TextCodec.from_tokenizer(AutoTokenizer.from_pretrained(str(EMBEDDED_MODEL), local_files_only=True))
    before = "def f(total):\n    x = total + 1\n    return total\n"
    rename = [{"start": 6, "end": 11, "text": "amount"}]
    current = before.replace("total", "amount", 1)
    expected = current.replace("x = total", "x = amount")
    case = {"before": before, "history": rename, "cursor": 12, "expected": expected}
    ex = served_example(case, codec, 512, 1024)
    eos = codec.special.eos
    assert codec.decode([t for t in ex.init if t != eos]) == current  # the whole small file is the window
    assert len(ex.init) == len(ex.target) and ex.init[-1] == eos  # then end-of-text, the room to grow
    assert codec.decode([t for t in ex.target if t != codec.special.eos]) == expected
    assert "amount" in codec.decode(ex.prompt)  # the history's diff is in the prompt
    assert codec.special.eos in ex.target and len(ex.target) >= len(ex.init)
    silent = served_example({**case, "expected": None}, codec, 512, 1024)
    assert codec.decode([t for t in silent.target if t != codec.special.eos]) == current
    plain = served_example(case, codec, 512, 1024, history=False)
    assert len(plain.prompt) < len(ex.prompt)
