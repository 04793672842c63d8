"""The embedded model's edit tokens (training/edit_tokens.py): the LCS labels and their rounds on hand
cases and on random edits, the model with DELETE and INSERT added (its tokenizer, its LLaDA2.2 config,
and what its routing is), the batch and loss, and the candidate through the real server over stdio.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from pathlib import Path

import pytest
import torch

from llada_lab.training.edit_tokens import (
    DELETE_TOKEN,
    INSERT_TOKEN,
    EditIds,
    RowBoost,
    apply_labels,
    block_sizes,
    edit_labels,
    edit_token_batch,
    edit_token_loss,
    lcs_pairs,
    make_example,
    rounds,
    with_edit_tokens,
)

IDS = EditIds(delete=100, insert=101, mask=1)
D, I, M, EOS = IDS.delete, IDS.insert, IDS.mask, 0


# --- labels ----------------------------------------------------------------------------------------


def _lcs_length(a: list[int], b: list[int]) -> int:
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a)):
        for j in range(len(b)):
            table[i + 1][j + 1] = table[i][j] + 1 if a[i] == b[j] else max(table[i][j + 1], table[i + 1][j])
    return table[-1][-1]


def test_lcs_pairs_is_a_longest_common_subsequence():
    rng = random.Random(0)
    for _ in range(200):
        a = [rng.randrange(5) for _ in range(rng.randrange(12))]
        b = [rng.randrange(5) for _ in range(rng.randrange(12))]
        pairs = lcs_pairs(a, b)
        assert all(a[i] == b[j] for i, j in pairs)
        assert all(i1 < i2 and j1 < j2 for (i1, j1), (i2, j2) in zip(pairs, pairs[1:]))
        assert len(pairs) == _lcs_length(a, b)


def test_labels_keep_substitute_delete_and_insert_once_per_round():
    assert edit_labels([10, 11, 12], [10, 11, 12], IDS) == [10, 11, 12]  # all kept
    assert edit_labels([10, 11, 12], [10, 30, 12], IDS) == [10, 30, 12]  # aligned mismatch: substituted
    assert edit_labels([10, 11, 12, 13], [10, 12, 13], IDS) == [10, D, 12, 13]  # surplus: deleted
    assert edit_labels([10, 11, 12], [10, 11, 20, 21, 12], IDS) == [10, 11, I]  # missing span: one INSERT on its anchor
    assert edit_labels([10, 40, 12], [10, 20, 21, 12], IDS) == [10, 20, I]  # substitute, then insert the rest
    assert edit_labels([10, M, 12], [10, 20, 12], IDS) == [10, 20, 12]  # an introduced mask takes the missing id


def test_apply_labels_deletes_and_inserts_a_mask_before_the_anchor():
    assert apply_labels([10, 11, 12], [10, D, I], IDS) == [10, M, 12]
    assert apply_labels([10, 11], [30, 11], IDS) == [30, 11]


def test_rounds_insert_one_token_a_round_and_carry_across_blocks():
    draft = [10, 11, 12, 13, EOS, EOS, EOS, EOS]
    target = [10, 11, 20, 21, 12, 13, EOS, EOS]
    states, committed = rounds(draft, target, [4, 4], IDS, EOS)
    assert committed == target
    first = [(s.content, s.labels) for s in states[0]]
    assert first == [
        ([10, 11, 12, 13], [10, 11, I, 13]),
        ([10, 11, M, 12], [10, 11, 20, I]),  # 13 pushed into the next block
        ([10, 11, 20, M], [10, 11, 20, 21]),
        ([10, 11, 20, 21], [10, 11, 20, 21]),  # the last round keeps everything: the block is final
    ]
    assert [(s.content, s.labels) for s in states[1]] == [([12, 13, EOS, EOS], [12, 13, EOS, EOS])]


def test_rounds_delete_pulls_the_next_ids_in_and_pads_the_end_with_masks():
    draft = [10, 11, 12, 13, 14, 15, EOS, EOS]
    target = [10, 13, 14, 15, EOS, EOS, EOS, EOS]
    states, committed = rounds(draft, target, [3, 5], IDS, EOS)
    assert committed == target
    assert states[0][0].labels == [10, D, D]
    assert states[1][0].content == [15, EOS, EOS, M, M]  # the region shrank: introduced masks at its end
    assert states[1][0].labels == [15, EOS, EOS, EOS, EOS]


def test_rounds_reach_the_target_for_random_small_edits():
    rng = random.Random(1)
    for _ in range(300):
        G = rng.choice([8, 13, 20])
        body = [rng.randrange(10, 40) for _ in range(G - 4)]
        edited = list(body)
        for _ in range(rng.randrange(1, 4)):
            op, at = rng.choice("isd"), rng.randrange(len(edited) + 1)
            if op == "i":
                edited.insert(at, rng.randrange(10, 40))
            elif edited and at < len(edited):
                if op == "d":
                    del edited[at]
                else:
                    edited[at] = rng.randrange(10, 40)
        if len(edited) > G:
            continue
        draft, target = body + [EOS] * 4, edited + [EOS] * (G - len(edited))
        prompt_len = rng.randrange(1, 40)
        sizes = block_sizes(prompt_len, G, 8)
        assert sum(sizes) == G and (prompt_len + sizes[0]) % 8 in (0, (prompt_len + G) % 8)
        states, committed = rounds(draft, target, sizes, IDS, EOS)
        assert committed == target, (draft, target, sizes)
        for block in states:  # every state's labels are what the rule applies to reach the next
            for s in block:
                assert len(s.content) == len(s.labels)


# --- the model -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedded():
    from transformers import AutoTokenizer

    from llada_lsp.model import EMBEDDED_MODEL, load_model

    tok = AutoTokenizer.from_pretrained(str(EMBEDDED_MODEL), local_files_only=True)
    return load_model(EMBEDDED_MODEL, device="cpu", dtype=torch.float32), tok


@pytest.fixture(scope="module")
def with_tokens(embedded):
    from transformers import AutoTokenizer

    from llada_lsp.model import EMBEDDED_MODEL

    model, _ = embedded
    tok = AutoTokenizer.from_pretrained(str(EMBEDDED_MODEL), local_files_only=True)  # a copy: tokens are added to it
    return with_edit_tokens(model, tok)


def test_the_tokens_are_new_special_ids_and_text_never_spells_them(with_tokens):
    from llada_lsp.completion.codec import TextCodec

    model, tok, ids = with_tokens
    assert (ids.delete, ids.insert, len(tok)) == (8192, 8193, 8194)
    assert model.config.vocab_size == 8194
    codec = TextCodec.from_tokenizer(tok)
    assert not {ids.delete, ids.insert} & set(codec.encode(f"x = '{DELETE_TOKEN}{INSERT_TOKEN}'"))
    assert codec.special.mask == ids.mask == 1 and codec.special.has_fim


def test_the_config_is_a_coherent_llada22_one(with_tokens, tmp_path):
    from llada_lsp.model import load_model

    model, tok, ids = with_tokens
    family = model.config.family
    assert (family.name, family.block_size, family.expert_capacity, family.edit_ids) == (
        "LLaDA2.2", 32, model.config.num_experts, (ids.delete, ids.insert))  # fmt: skip
    from llada_lab.training.train import export

    export(model, tok, tmp_path / "model")
    written = json.loads((tmp_path / "model" / "config.json").read_text())
    assert {k: written[k] for k in ("block_size", "expert_capacity", "delete_token_id", "split_token_id",
                                    "vocab_size")} == {"block_size": 32, "expert_capacity": 8, "delete_token_id": 8192,
                                                       "split_token_id": 8193, "vocab_size": 8194}  # fmt: skip
    loaded = load_model(tmp_path / "model", device="cpu", dtype=torch.float32)
    assert loaded.config.edit_ids == (8192, 8193)


def test_full_capacity_block_routing_is_ungrouped_top_k_not_the_shipped_grouped_routing(embedded, with_tokens):
    """expert_capacity = num_experts admits every expert to every block, so block routing is plain
    top-k over all experts, whatever the blocks. The shipped model's routing is not that: it limits
    each token to its best topk_group of n_group groups (config n_group 4, topk_group 2), so some
    tokens route differently; the fine-tune trains under the routing the exported config has."""
    from llada_lsp.model import LLaDA2

    shipped, tok = embedded
    model, _, _ = with_tokens
    ids = torch.tensor([tok("def area(width, height):\n    return width * height\n" * 8)["input_ids"][:96]])
    ungrouped_config = shipped.config.__class__(**{**shipped.config.to_dict(), "n_group": 1, "topk_group": 1})
    ungrouped = LLaDA2(ungrouped_config)
    ungrouped.load_state_dict(shipped.state_dict())
    with torch.no_grad():
        edit_logits = model(ids)[..., :8192]
        plain_logits = ungrouped(ids)
        shipped_logits = shipped(ids)
    assert torch.equal(edit_logits, plain_logits)
    # For any block layout: padding, offsets (the router alone, on the same hidden states).
    from llada_lsp.model.llada2 import RoutingBlocks

    gate = next(layer.mlp.gate for layer in model.model.layers if hasattr(layer.mlp, "gate"))
    plain_gate = next(layer.mlp.gate for layer in ungrouped.model.layers if hasattr(layer.mlp, "gate"))
    x = torch.randn(2 * 40, model.config.hidden_size)
    real = torch.rand(2, 40) > 0.2
    for offset in (0, 5, 31):
        blocks = RoutingBlocks.of(torch.arange(offset, offset + 40), real, 2, 32)
        a, wa = gate(x, blocks)
        b, wb = plain_gate(x)
        assert torch.equal(a.sort(-1).values, b.sort(-1).values)
        assert torch.allclose(wa.sort(-1).values, wb.sort(-1).values)
    assert not torch.equal(shipped_logits, plain_logits)  # the group limit does change the shipped model's routing


def test_new_rows_start_at_the_mean_and_the_old_vocabulary_is_unchanged(embedded, with_tokens):
    shipped, _ = embedded
    model, _, ids = with_tokens
    old, new = shipped.lm_head.weight, model.lm_head.weight
    assert torch.equal(new[:8192], old)
    assert torch.allclose(new[ids.delete], old.mean(0)) and torch.allclose(new[ids.insert], old.mean(0))


def test_row_boost_scales_only_the_chosen_rows_update():
    w = torch.nn.Parameter(torch.zeros(4, 3))
    opt = torch.optim.SGD([w], lr=0.1)
    with RowBoost([w], [2, 3], 10.0):
        w.grad = torch.ones(4, 3)
        opt.step()
    assert torch.allclose(w[:2], torch.full((2, 3), -0.1)) and torch.allclose(w[2:], torch.full((2, 3), -1.0))


# --- batch and loss ----------------------------------------------------------------------------------


def test_the_batch_puts_each_blocks_state_after_the_prompt_and_labels_it():
    prompt = [5, 6, 7]
    draft = [10, 11, 12, 13, EOS]
    target = [10, 20, 11, 12, 13]
    ex = make_example(prompt, draft, target, IDS, EOS, block=4)
    assert [len(b[0].content) for b in ex.states] == [1, 4]  # P + G = 8: the first block shares the prompt's
    assert ex.committed == target and ex.edits > 0
    x, noisy, labels, weights = edit_token_batch([ex], 12, 0.5, EOS, random.Random(0))
    assert x[0].tolist() == prompt + target + [EOS] * 4
    assert weights[0, :3].tolist() == [0.0] * 3 and weights[0, 8:].tolist() == [0.0] * 4
    written = [(n, y) for n, y, w in zip(noisy[0].tolist(), labels[0].tolist(), weights[0].tolist()) if w == 1.0]
    assert all(n != y for n, y in written)


def test_the_loss_weighs_writes_apart_from_keeps(with_tokens):
    from llada_lab.training.objective import training_mask

    model, _, ids = with_tokens
    L = 64
    x = torch.randint(5, 8000, (1, L))
    noisy = x.clone()
    labels = x.clone()
    labels[0, 40] = ids.insert  # one write among many keeps
    weights = torch.zeros(1, L)
    weights[0, 32:] = 1.0
    loss, stats = edit_token_loss(model, x, noisy, labels, weights, training_mask(L, 32), ids)
    with torch.no_grad():
        logits = model(torch.cat([x, noisy], 1), positions=torch.arange(L).repeat(2), allow=training_mask(L, 32),
                       last_n=L)  # fmt: skip
    nll = torch.nn.functional.cross_entropy(logits[0], labels[0], reduction="none")
    keeps = [i for i in range(32, L) if i != 40]
    assert torch.allclose(loss, nll[40] + nll[keeps].mean(), atol=1e-4)
    assert stats["edit_acc"] == 0.0  # untrained: the mean row is never the argmax


# --- through the real server ----------------------------------------------------------------------


@pytest.mark.slow
def test_a_model_that_writes_edit_tokens_never_shows_them(with_tokens, tmp_path):
    """The embedded model with its edit rows raised (so DELETE and INSERT are often the argmax), or the
    candidate named by LLADA_EDIT_TOKENS_MODEL, through `python -m llada_lsp serve` as an editor
    speaks to it: an inline completion, a rewrite and a next edit, none holding an edit token's text."""
    import os

    from llada_lab.training.train import export
    from llada_lsp.lsp_client import LspClient, edited, position

    source = "def area(width, height):\n    return width * height\n\n\ndef volume(width, height, depth):\n    return \n"
    folder = os.environ.get("LLADA_EDIT_TOKENS_MODEL")
    if folder is None:
        model, tok, ids = with_tokens
        model = model.__class__(model.config)
        model.load_state_dict(with_tokens[0].state_dict())
        x = torch.tensor([tok(source)["input_ids"]])
        hidden: list[torch.Tensor] = []
        hook = model.lm_head.register_forward_hook(lambda module, args, out: hidden.append(args[0][0]))
        with torch.no_grad():  # each edit row along the mean hidden state of half the text: a logit of about 15
            model(x)
            hook.remove()
            half = len(hidden[0]) // 2
            for rows, token in ((hidden[0][:half], ids.delete), (hidden[0][half:], ids.insert)):
                mean = rows.mean(0)
                model.lm_head.weight[token] = mean / mean.norm() ** 2 * 15
            written = model(x).argmax(-1)
        assert (written == ids.delete).any() and (written == ids.insert).any(), "the edit rows must win somewhere"
        export(model, tok, tmp_path / "model")
        folder = str(tmp_path / "model")

    async def session():
        client = await LspClient.start([sys.executable, "-m", "llada_lsp", "serve", "--engine", "local",
                                        "--threads", "1", "--model", folder])  # fmt: skip
        try:
            await client.initialize(options={"inlineMode": "speed", "rewriteMode": "speed"}, timeout=120)
            doc = client.did_open("file:///shapes.py", source)
            inline = await client.request("textDocument/inlineCompletion", {
                "textDocument": {"uri": doc.uri}, "position": position(doc, len(source) - 1, client.encoding),
                "context": {"triggerKind": 1}}, 120)  # fmt: skip
            start = source.index("    return width")
            selection = {"start": position(doc, start, client.encoding),
                         "end": position(doc, source.index("\n\n\n"), client.encoding)}  # fmt: skip
            rewrite = await client.request("workspace/executeCommand", {"command": "llada.rewriteSelection",
                "arguments": [{"textDocument": {"uri": doc.uri, "version": doc.version}, "range": selection}]}, 120)  # fmt: skip
            at = source.index("width * height")
            client.did_change(doc, at, at + len("width"), "w")
            next_edit = await client.request("llada/nextEdit", {"textDocument": {"uri": doc.uri, "version": doc.version},
                                                                "position": position(doc, at + 1, client.encoding)}, 120)  # fmt: skip
            after = edited(doc, next_edit["edits"], client.encoding) if next_edit["edits"] else doc.text
        finally:
            code = await client.shutdown(120)
        return inline, rewrite, after, code

    inline, rewrite, after, code = asyncio.run(session())
    assert code == 0
    answers = [json.dumps(inline), json.dumps(rewrite), after]
    for text in answers:
        assert DELETE_TOKEN not in text and INSERT_TOKEN not in text
    assert Path(folder, "config.json").is_file()
