"""The next-edit fine-tune's examples and batches (training/edit_tune.py). The example builder uses the
server side's prompt (completion/next_edit.py) and edit history (completion/history.py)."""

from __future__ import annotations

import random

import pytest
import torch

from llada_lab.training.edit_tune import EditExample, edit_batch

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
    from transformers import AutoTokenizer

    from llada_lab.training.edit_tune import served_example
    from llada_lsp.completion.codec import TextCodec
    from llada_lsp.model import EMBEDDED_MODEL

    if not (EMBEDDED_MODEL / "tokenizer.json").is_file():
        pytest.skip("no embedded model")
    codec = TextCodec.from_tokenizer(AutoTokenizer.from_pretrained(str(EMBEDDED_MODEL), local_files_only=True))
    before = "def f(total):\n    x = total + 1\n    return total\n"
    rename = [{"start": 6, "end": 11, "text": "amount"}]
    current = before.replace("total", "amount", 1)
    expected = current.replace("x = total", "x = amount")
    case = {"before": before, "history": rename, "cursor": 12, "expected": expected}
    ex = served_example(case, codec, 512, 1024)
    eos, mask = codec.special.eos, codec.special.mask

    def text(ids):
        return codec.decode([t for t in ids if t not in (eos, mask)])

    assert text(ex.init) == current  # the whole small file is the window
    assert ex.init.count(mask) == 8 and ex.init[len(codec.encode(current[:12])) :][:8] == [mask] * 8
    assert len(ex.init) == len(ex.target) and ex.init[-1] == eos  # then end-of-text, the room to grow
    assert text(ex.target) == expected
    assert "amount" in codec.decode(ex.prompt)  # the history's diff is in the prompt
    assert codec.special.eos in ex.target and len(ex.target) >= len(ex.init)
    silent = served_example({**case, "expected": None}, codec, 512, 1024)
    assert [eos if t == mask else t for t in silent.init] == silent.target  # no edit: the gap left empty
    plain = served_example(case, codec, 512, 1024, history=False)
    assert len(plain.prompt) < len(ex.prompt)


def test_the_target_fills_the_gap_only_with_an_insertion_at_the_cursor():
    from llada_lab.training.edit_tune import aligned, gapped
    from llada_lsp.completion.codec import TextCodec
    from llada_lsp.model import load_tokenizer

    window = "x = 1\ny = \nz = 3\n"
    cursor = window.index("y = ") + 4
    assert aligned(window, cursor, cursor, cursor, "2") == ("x = 1\ny = ", "2", "\nz = 3\n")
    assert aligned(window, cursor, 4, 5, "7") == ("x = 7\ny = ", "", "\nz = 3\n")  # above: its own side
    assert aligned(window, cursor, 15, 16, "9") == ("x = 1\ny = ", "", "\nz = 9\n")  # below
    assert aligned(window, cursor, 2, cursor + 1, "= 0\n") == ("x = 0\n", "", "z = 3\n")  # across the cursor
    codec = TextCodec.from_tokenizer(load_tokenizer(None))
    gap, two = codec.special.eos, codec.encode("2")
    ids = gapped(("x = ", "2", "\n"), codec)
    assert ids == codec.encode("x = ") + two + [gap] * (8 - len(two)) + codec.encode("\n")
    long = "".join(f"v{i} + " for i in range(12))
    assert gap not in gapped(("x = ", long, "\n"), codec)  # longer than the gap: the rest shifts


@pytest.mark.slow
def test_a_tuned_model_says_it_fills_the_gap_and_the_server_gives_it_one(tmp_path, one_torch_thread):
    """`llada-lab tune-next-edit` for one step: its candidate's config carries `next_edit_gap`, which the
    native backend reads into `LoadedModel.edit_gap` (the shipped model has none: its drafts get no gap)."""
    from llada_lab.commands.tune_next_edit import tune_next_edit_main
    from llada_lab.training import edit_pairs as ep
    from llada_lsp.backends import native
    from llada_lsp.completion.generation import ModelSpec

    source = "def total(items, rate):\n    subtotal = sum(items)\n    return subtotal * rate\n"
    cases = [c for seed in range(40) if (c := ep.synthetic_case("m.py", source, random.Random(seed)))]
    ep.write_jsonl_gz(tmp_path / "cases.jsonl.gz", cases)
    argv = ["--cases", str(tmp_path / "cases.jsonl.gz"), "--out", str(tmp_path / "run"), "--minutes", "0.01",
            "--edit-batch", "2", "--infill-batch", "0", "--threads", "1"]  # fmt: skip
    assert tune_next_edit_main(argv) == 0
    tuned = native.load(ModelSpec(str(tmp_path / "run" / "model"), threads=1), lambda *_: None)
    assert tuned.edit_gap
    assert not native.load(ModelSpec(None, threads=1), lambda *_: None).edit_gap
