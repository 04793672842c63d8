"""What Levenshtein editing buys a draft: with a scripted LLaDA2.2 model that inserts a missing word,
the engine's answer is the draft with that word in it, every other token kept (shifted, not
rewritten), in a few forwards; and a word the model deletes closes the gap behind it.
"""

from __future__ import annotations

import torch
from torch import nn

from llada_lsp.engine.decode import Engine
from llada_lsp.model.config import LLaDA2Config

# ids: words 1..9, EOS 12, DELETE 13, INSERT 14, MASK 15
A, B, C, D, E, X = 1, 2, 3, 4, 5, 9
EOS, DEL, INS, MASK = 12, 13, 14, 15


class Scripted(nn.Module):
    """Logits from a rule over each query's id and the one before it (the engine's interface to the
    model: `model(ids, kv=view, last_n=n)`, config, device, dtype); the K/V cache is not written."""

    def __init__(self, rule):
        super().__init__()
        self.config = LLaDA2Config(vocab_size=16, hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
                                   num_key_value_heads=1, head_dim=8, num_experts=4, num_experts_per_tok=2,
                                   n_group=1, topk_group=1, expert_capacity=2, block_size=32, mask_token_id=MASK,
                                   eos_token_id=EOS, delete_token_id=DEL, split_token_id=INS)  # fmt: skip
        self.rule, self.hops, self.layer_devices = rule, {}, None
        self.device, self.dtype = torch.device("cpu"), torch.float32
        self.forwards = 0

    def forward(self, ids, kv=None, last_n=None, **_):
        self.forwards += 1
        if last_n == 0:
            return None
        B, T = ids.shape
        logits = torch.full((B, T, 16), -8.0)
        for b in range(B):
            for i in range(T):
                before = int(ids[b, i - 1]) if i else -1
                logits[b, i, self.rule(int(ids[b, i]), before)] = 8.0  # p ~ 1: above every threshold
        return logits[:, -last_n:] if last_n else logits


def insert_c_before_d(token: int, before: int) -> int:
    """The model's view of 'a b d e': c is missing before d. At d right after b: INSERT; at the mask
    after b: c; past the text: EOS; elsewhere the token itself."""
    if token == D and before == B:
        return INS
    if token == MASK:
        return C if before == B else EOS
    return token


def test_an_inserted_word_costs_one_insert_and_keeps_every_other_token():
    model = Scripted(insert_c_before_d)
    prompt, draft = [7, 8, 7, 8], [A, B, D, E, X, EOS]
    gen = Engine(model, cache_mb=1).generation(prompt, 8, "quality", init_ids=draft)
    drafts = list(gen)
    assert gen.result.tokens == [A, B, C, D, E, X, EOS]
    # step 1 writes INSERT at d: [a b MASK d e x EOS ...] (the rest shifted, none rewritten); step 2 fills c
    assert drafts[0].generated[:7] == [A, B, MASK, D, E, X, EOS]
    assert drafts[1].generated[:7] == [A, B, C, D, E, X, EOS]
    assert drafts[0].edited == [] and drafts[1].filled == [len(prompt) + 2]
    assert gen.result.steps == 3  # insert, fill, a step that changes nothing


def test_a_deleted_word_closes_the_gap():
    def drop_x(token: int, before: int) -> int:
        return DEL if token == X else EOS if token == MASK else token

    model = Scripted(drop_x)
    gen = Engine(model, cache_mb=1).generation([7, 8], 6, "speed", init_ids=[A, X, B, C, EOS, EOS])
    drafts = list(gen)
    # x gone, everything after it one place left, the block padded with a mask at its end (past the region)
    assert drafts[0].generated == [A, B, C, EOS, EOS, EOS] and drafts[0].block_tokens[-1] == MASK
    assert gen.result.tokens == [A, B, C, EOS]


def test_a_draft_the_model_confirms_costs_one_forward_for_its_blocks(monkeypatch):
    """A draft over three blocks that the model keeps as it is: one forward decides its two mask-free
    blocks and the first step of the third (whose tail is masks, filled then), one more confirms the
    third; one block per forward takes four. Same tokens either way."""
    from llada_lsp.engine import sequence

    def keep(token: int, before: int) -> int:
        return EOS if token == MASK else token

    prompt, draft = [7, 8, 7, 8], [1 + i % 9 for i in range(70)]
    results, blocks = {}, sequence.DRAFT_LOOKAHEAD
    for lookahead in (blocks, 1):
        monkeypatch.setattr(sequence, "DRAFT_LOOKAHEAD", lookahead)
        for use_cache in (True, False):
            gen = Engine(Scripted(keep), cache_mb=1, use_cache=use_cache).generation(
                prompt, 72, "speed", init_ids=draft
            )
            gen.run()
            results[lookahead, use_cache] = gen.result
    fast, slow = results[blocks, True], results[1, True]
    assert fast.tokens == slow.tokens == draft + [EOS] and all(r.tokens == fast.tokens for r in results.values())
    assert (fast.steps, slow.steps) == (2, 4)


def test_an_insertion_pushes_the_drafts_next_id_into_the_next_block():
    """A draft across a block boundary: INSERT in the first block pushes its last id out, and that id
    opens the next block (the draft after it moves right) instead of being lost, as SGLang's rule,
    which never starts from a draft, would lose it."""
    model = Scripted(insert_c_before_d)
    prompt, draft = [7] * 28, [A, B, D, E, X, A, EOS, EOS]  # a b d e | x a ...: the block ends after e
    gen = Engine(model, cache_mb=1).generation(prompt, 36, "quality", init_ids=draft)
    gen.run()
    assert gen.result.tokens[:8] == [A, B, C, D, E, X, A, EOS]


def test_a_deletion_pulls_the_drafts_next_id_into_the_block():
    """DELETE in the first block of a draft across a boundary: the block's end takes the draft's next
    id (the rest moves left) instead of a mask the model would fill with its own guess."""

    def drop_x(token: int, before: int) -> int:
        return DEL if token == X else EOS if token == MASK else token

    model = Scripted(drop_x)
    prompt, draft = [7] * 28, [A, X, B, C, D, E, EOS, EOS]  # a x b c | d e ...
    gen = Engine(model, cache_mb=1).generation(prompt, 36, "speed", init_ids=draft)
    gen.run()
    assert gen.result.tokens[:6] == [A, B, C, D, E, EOS]
