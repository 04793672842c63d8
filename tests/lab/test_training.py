"""The training recipe: the objective's layout and noise, FIM holes, and a few real steps that learn."""

from __future__ import annotations

import json
import random

import pytest
import torch
from conftest import TINY_NETWORK

from llada_lab.commands.train import train_main
from llada_lab.training.corpus import is_held_out, iter_files
from llada_lab.training.objective import cut_hole, noise_batch, training_mask


def test_training_mask_hides_the_noisy_copy_from_later_blocks():
    allow = training_mask(64, 32)  # [clean 0..63 | noisy 64..127]
    assert allow[40, 10] and not allow[10, 40]  # clean: block-causal
    assert not allow[10, 64 + 10]  # clean never sees noisy
    assert allow[64 + 40, 10] and not allow[64 + 40, 40]  # noisy block 1 sees clean block 0, not clean block 1
    assert allow[64 + 40, 64 + 33] and not allow[64 + 40, 64 + 5]  # noisy attends only its own noisy block


def test_noise_masks_and_replaces_with_labels_kept():
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(5, 100, (8, 64), generator=gen)
    noisy, weights = noise_batch(x, 32, mask_id=1, edit_ratio=0.5, keep_weight=0.1, gen=gen)
    masked, replaced = noisy == 1, (noisy != 1) & (noisy != x)
    assert masked.any() and replaced.any()
    assert (weights[masked | replaced] == 1).all() and (weights[~masked & ~replaced] == 0.1).all()


def test_holes_rebuild_the_text():
    text = "def f(x):\n    if x:\n        return 1\n    return 2\n\nprint(f(3))\n"
    rng = random.Random(0)
    for kind in ("rest_of_line", "whole_line", "block_body", "span"):
        for _ in range(20):
            hole = cut_hole(text, kind, rng)
            assert hole is not None and "".join(hole) == text
            if kind == "rest_of_line":
                assert "\n" not in hole[1] and hole[0][-1] != "\n"


def test_split_is_deterministic_and_disjoint():
    held = iter_files("heldout")
    assert held and all(is_held_out(f.path) for f in held)
    assert not any(is_held_out(f.path) for f in iter_files("train")[:200])


@pytest.mark.slow
def test_a_few_steps_lower_the_loss(tmp_path, restore_threads):
    config = TINY_NETWORK
    argv = [
        "--out",
        str(tmp_path),
        "--steps",
        "40",
        "--batch",
        "4",
        "--seq-len",
        "64",
        "--corpus-limit",
        "12",
        "--vocab-size",
        "600",
        "--warmup",
        "5",
        "--lr",
        "1e-2",
        "--save-every",
        "1000",
        "--threads",
        "1",
        "--config",
        json.dumps(config),
        "--export",
        str(tmp_path / "export"),
    ]
    assert train_main(argv) == 0
    state = torch.load(tmp_path / "state.pt", weights_only=False)
    losses = state["losses"]
    assert state["step"] == 40 and len(losses) == 40
    assert sum(losses[-8:]) / 8 < sum(losses[:8]) / 8 - 0.5, losses
    assert (tmp_path / "export" / "model.safetensors").is_file() and (tmp_path / "export" / "tokenizer.json").is_file()
    assert train_main([*argv[:3], "45", *argv[4:]]) == 0  # resumes from step 40
    assert torch.load(tmp_path / "state.pt", weights_only=False)["step"] == 45


def test_fim_samples_end_with_a_run_of_end_of_text():
    from llada_lab.training.objective import SampleStream
    from llada_lsp.completion.layouts import SpecialIds
    from llada_lsp.model import load_tokenizer

    tok = load_tokenizer(None)
    special = SpecialIds.from_tokenizer(tok)
    stream = SampleStream([f.text for f in iter_files("train")[:20]], tok, seed=0)
    samples = [stream.sample() for _ in range(200)]
    fim = [s for s in samples if s[0] == special.fim_prefix]
    assert len(fim) > 100
    for s in fim:
        tail = s[s.index(special.fim_middle) + 1 :]
        first_eos = tail.index(special.eos)
        assert all(t == special.eos for t in tail[first_eos:])
    assert max(len(s) - s.index(special.eos) for s in fim) > 10  # runs, not a single end-of-text


def test_hole_weights_set_the_sample_mix():
    from llada_lab.training.objective import HOLE_KINDS, SampleStream, parse_hole_weights
    from llada_lsp.model import load_tokenizer

    assert parse_hole_weights("rest_of_line=0.6")[0] == 0.6
    assert parse_hole_weights("plain=0,span=0")[HOLE_KINDS.index("span")] == 0
    for bad in ("foo=1", "plain", "plain=-1", ",".join(f"{k}=0" for k in HOLE_KINDS)):
        with pytest.raises(ValueError):
            parse_hole_weights(bad)
    tok = load_tokenizer(None)
    only_plain = parse_hole_weights(",".join(f"{k}={int(k == 'plain')}" for k in HOLE_KINDS))
    stream = SampleStream([f.text for f in iter_files("train")[:20]], tok, seed=0, hole_weights=only_plain)
    assert all(tok.convert_ids_to_tokens(stream.sample()[0]) != "<|fim_prefix|>" for _ in range(50))


def test_confidence_loss_sharpens_only_correct_predictions():
    """--confidence-weight adds w x the entropy at masked positions whose argmax is already right, and
    its gradient touches only those positions."""
    from llada_lab.training.objective import block_diffusion_loss

    B, L, V, mask_id = 2, 64, 50, 1
    x = torch.randint(5, V, (B, L), generator=torch.Generator().manual_seed(0))

    class Logits(torch.nn.Module):  # a "model" whose logits are its parameters: argmax right on even positions
        def __init__(self):
            super().__init__()
            start = torch.randn(B, L, V, generator=torch.Generator().manual_seed(1))
            start[:, ::2].scatter_(-1, x[:, ::2, None], 4.0)
            self.logits = torch.nn.Parameter(start)

        def forward(self, ids, positions, allow, last_n):
            return self.logits

    model, allow = Logits(), training_mask(L, 32)

    def loss(weight: float):
        return block_diffusion_loss(model, x, mask_id, 32, 0.0, 0.1, allow, torch.Generator().manual_seed(2), weight)

    plain, plain_stats = loss(0.0)
    sharp, stats = loss(1.0)
    assert "entropy" not in plain_stats and stats["entropy"] > 0
    assert torch.isclose(sharp, plain + stats["entropy"])
    (grad,) = torch.autograd.grad(sharp - plain, model.logits)
    touched = grad.abs().sum(-1) > 0
    right = model.logits.detach().argmax(-1) == x
    assert touched.any() and not (touched & ~right).any()  # wrong predictions are left alone
    with torch.no_grad():
        model.logits -= 10 * grad
    assert loss(1.0)[1]["entropy"] < stats["entropy"]


def test_self_fill_writes_the_models_confident_guesses_into_masks():
    """--self-fill: a chosen block's masks get the model's argmax where it is confident (never a mask);
    a wrong guess is labelled with the original at full weight, a right one at the keep weight."""
    from llada_lab.training.objective import self_fill

    B, L, V, mask_id = 2, 64, 50, 1
    x = torch.randint(5, V, (B, L), generator=torch.Generator().manual_seed(0))
    noisy = torch.where(torch.arange(L) % 4 == 0, x, mask_id).expand(B, L).clone()  # every 4th visible
    weights = torch.where(noisy == mask_id, 1.0, 0.1)
    logits = torch.zeros(B, L, V)
    pos = torch.arange(L)
    sure_right, sure_wrong, mask_top = pos % 4 == 1, pos % 4 == 2, pos % 4 == 3
    logits[:, sure_right] = logits[:, sure_right].scatter(-1, x[:, sure_right, None], 20.0)
    logits[:, sure_wrong] = logits[:, sure_wrong].scatter(-1, (x[:, sure_wrong, None] + 1) % V, 20.0)
    logits[:, mask_top] = logits[:, mask_top].scatter(-1, x[:, mask_top, None], 25.0)
    logits[:, mask_top, mask_id] = 30.0  # a step never writes a mask: the best real token goes in
    gen = torch.Generator().manual_seed(3)
    new, new_w = self_fill(logits, x, noisy, weights, mask_id, 32, 1.0, 0.1, gen)
    assert (new[:, sure_right] == x[:, sure_right]).all() and (new_w[:, sure_right] == 0.1).all()
    assert (new[:, sure_wrong] != x[:, sure_wrong]).all() and (new_w[:, sure_wrong] == 1.0).all()
    assert (new[:, mask_top] == x[:, mask_top]).all()
    flat = torch.zeros(B, L, V)  # nowhere confident: nothing is written
    assert torch.equal(self_fill(flat, x, noisy, weights, mask_id, 32, 1.0, 0.1, gen)[0], noisy)
    assert torch.equal(new[:, pos % 4 == 0], x[:, pos % 4 == 0])  # visible tokens untouched
    unchanged = self_fill(logits, x, noisy, weights, mask_id, 32, 0.0, 0.1, gen)
    assert torch.equal(unchanged[0], noisy) and torch.equal(unchanged[1], weights)

    from llada_lab.training.objective import block_diffusion_loss

    seen = []

    def model(ids, positions, allow, last_n):  # the same confident logits; records what each forward saw
        seen.append(ids[:, last_n:].clone())
        return logits.clone().requires_grad_()

    loss, stats = block_diffusion_loss(model, x, mask_id, 32, 0.0, 0.1, training_mask(L, 32), gen, 0.0, 1.0)
    assert len(seen) == 2 and 0 < stats["self_fill_wrong"] < 1  # a guessing pass, then the trained one
    assert ((seen[1] != mask_id) & (seen[0] == mask_id)).any()  # the second saw the guesses in the masks


@pytest.mark.slow
def test_eval_infill_scores_modes_and_compares_them_in_pairs(capsys, restore_threads, tmp_path):
    from llada_lab.commands.eval_infill import eval_infill_main
    from llada_lab.training import eval_infill

    argv = ["--n", "2", "--kinds", "rest_of_line", "--modes", "speed,no-edit", "--threads", "1"]
    assert eval_infill_main([*argv, "--markdown", str(tmp_path / "infill.md")]) == 0
    out = capsys.readouterr().out
    assert out.count("rest_of_line") >= 3 and "previous-line" in out
    assert "speed vs no-edit, rest_of_line: first line right only in speed" in out
    published = (tmp_path / "infill.md").read_text()
    assert "| speed | rest_of_line |" in published and "| no-edit | rest_of_line |" in published
    assert "Commit: `" in published and "speed vs no-edit, rest_of_line" in published
    task = eval_infill.Task("rest_of_line", "f.py", "x = ", "1", "\n")
    assert eval_infill.paired([task] * 3, ["1", "1", "2"], ["1", "2", "2"]) == (1, 0, 1.0)
    only_a = eval_infill.paired([task] * 8, ["1"] * 8, ["2"] * 8)
    assert only_a[:2] == (8, 0) and abs(only_a[2] - 2 / 2**8) < 1e-12
