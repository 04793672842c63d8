"""Drafts that grow and shrink: a next edit and a rewrite handed to a model with edit tokens (LLaDA2.2)
start from the text as it is (no gap of masks at the cursor, end-of-text room instead of masks), so a
word the model inserts costs one INSERT and every other token of the draft comes back as it was.

The model is scripted (logits from a rule over each id and the one before it, as in
tests/engine/test_llada22_edits.py) over the embedded tokenizer's ids, and runs in the real engine under the
real plans (completion/next_edit.py, completion/pipeline.py).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from llada_lsp.backends.base import load_codec
from llada_lsp.backends.native import NativeBatch
from llada_lsp.completion.generation import LoadedModel, ModelSpec
from llada_lsp.completion.jobs import Rewrite
from llada_lsp.completion.next_edit import NextEdit, NextEditPlan, changes
from llada_lsp.completion.pipeline import RewritePlan
from llada_lsp.engine.decode import Engine
from llada_lsp.model.config import LLaDA2Config

CODEC = load_codec(None, "embedded")
EOS, MASK = CODEC.special.eos, CODEC.special.mask
DELETE, INSERT = 8187, 8191
VOCAB = 8192
SOURCE = "def cost(price, tax):\n    return price tax\n\n\nprint(cost(1, 2))\n"
LINE = "    return price tax\n"
WANTED = "    return price + tax\n"  # the word the model inserts: " +" between "price" and " tax"
CE, T, PLUS = CODEC.encode("price")[-1], CODEC.encode(" tax")[0], CODEC.encode(" +")[0]


class Scripted(nn.Module):
    """The engine's interface to a model (`model(ids, kv=view, last_n=n)`, config, device, dtype), its
    logits from `rule(id, id before)`: p ~ 1 on the rule's id, above every threshold."""

    def __init__(self, rule):
        super().__init__()
        self.config = LLaDA2Config(vocab_size=VOCAB, hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
                                   num_key_value_heads=1, head_dim=8, num_experts=4, num_experts_per_tok=2,
                                   n_group=1, topk_group=1, expert_capacity=2, block_size=32, mask_token_id=MASK,
                                   eos_token_id=EOS, pad_token_id=EOS, delete_token_id=DELETE,
                                   split_token_id=INSERT, max_position_embeddings=512)  # fmt: skip
        self.rule, self.hops, self.layer_devices = rule, {}, None
        self.device, self.dtype = torch.device("cpu"), torch.float32

    def forward(self, ids, kv=None, last_n=None, **_):
        if last_n == 0:
            return None
        B, T = ids.shape
        logits = torch.full((B, T, VOCAB), -8.0)
        for b in range(B):
            row = ids[b].tolist()
            for i, token in enumerate(row):
                logits[b, i, self.rule(token, row[i - 1] if i else -1)] = 8.0
        return logits[:, -last_n:] if last_n else logits


def insert_plus(token: int, before: int) -> int:
    """A model that sees " +" missing between "price" and " tax": INSERT at " tax" after "price", " +"
    at the mask after "price", end-of-text at any other mask, every other id kept."""
    if token == T and before == CE:
        return INSERT
    if token == MASK:
        return PLUS if before == CE else EOS
    return token


def edit_model(rule, edit_gap: bool = False) -> LoadedModel:
    network = Scripted(rule)
    engine = Engine(network, cache_mb=1)
    return LoadedModel(ModelSpec("scripted"), CODEC, 512, engine.block_size, NativeBatch(engine), edit_gap,
                       network.config.family)  # fmt: skip


class Never:
    def is_set(self) -> bool:
        return False


def run(plan, model: LoadedModel, shown: list[str] | None = None):
    """The plan's outcome and the engine's final ids; `shown` collects what each draft showed."""
    results = []
    finish = plan.finish
    plan.finish = lambda result: (results.append(result), finish(result))[1]
    outcome = plan.run(model, lambda step, text: shown.append(text) if shown is not None and text else None)
    return outcome, results[0].tokens


def only_insertion(init: list[int], final: list[int], token: int) -> bool:
    """`final`'s text (its ids up to the first end-of-text) is `init`'s with `token` inserted once and
    every other id as it was."""
    a, b = (ids[: ids.index(EOS)] if EOS in ids else ids for ids in (init, final))
    return token in b and b[: b.index(token)] + b[b.index(token) + 1 :] == a


@pytest.mark.parametrize("edit_gap", [False, True], ids=["plain", "gap-tuned"])
def test_a_next_edit_inserts_the_word_at_the_cursor_and_keeps_every_other_token(edit_gap):
    cursor = SOURCE.index(" tax\n")  # after "price", where the user stopped
    job, start = NextEdit.at(SOURCE, cursor, (), None, 1024, True)
    model = edit_model(insert_plus, edit_gap)
    plan = NextEditPlan(model, job, Never())
    init = plan.prompt.init_ids
    assert MASK not in init and not plan.gap, "a model with edit tokens gets no gap of masks at the cursor"
    assert (len(plan.prompt.prompt.ids) + plan.prompt.gen_length) % 32 == 0
    outcome, final = run(plan, model)
    assert outcome.stopped == "done", outcome.reason
    assert outcome.text == job.window.replace(LINE, WANTED)
    assert only_insertion(init, final, PLUS)
    edit = changes(job.window, outcome.text)  # one insertion, nothing replaced
    assert len(edit) == 1 and edit[0].start == edit[0].end and edit[0].text.strip() == "+"
    assert plan.changed(final) == [final.index(PLUS)]  # one changed position, not the tail it moved


def test_a_rewrite_inserts_the_word_and_keeps_every_other_token():
    start = SOURCE.index(LINE)
    job = Rewrite.at(SOURCE, start, start + len(LINE), "quality", python=True)
    model = edit_model(insert_plus)
    plan = RewritePlan(model, job, Never())
    init = plan.request.init_ids
    room = init[len(CODEC.encode(LINE)) :]
    assert MASK not in init and room and set(room) == {EOS}, "the room to grow is end-of-text, not masks"
    assert (len(plan.request.prompt_ids) + plan.request.gen_length) % 32 == 0
    outcome, final = run(plan, model)
    assert (outcome.stopped, outcome.text) == ("done", WANTED)
    assert only_insertion(init, final, PLUS)


def test_without_edit_tokens_the_drafts_keep_their_fixed_positions():
    """The same jobs for a model without edit tokens: the gap at the cursor (for a gap-tuned model) and
    masks as a rewrite's room, as before."""
    from llada_lsp.model.config import LLaDA2Config as Config

    model = LoadedModel(ModelSpec(None), CODEC, 512, 32, None, edit_gap=True, family=Config().family)
    cursor = SOURCE.index(" tax\n")
    job, _ = NextEdit.at(SOURCE, cursor, (), None, 1024, True)
    assert NextEditPlan(model, job, Never()).prompt.init_ids.count(MASK) == 8  # GAP_TOKENS
    start = SOURCE.index(LINE)
    rewrite = RewritePlan(model, Rewrite.at(SOURCE, start, start + len(LINE), "quality", python=True), Never())
    assert rewrite.request.init_ids == CODEC.encode(LINE) and rewrite.request.gen_length > len(CODEC.encode(LINE))


def test_a_revision_waits_for_the_word_it_inserts():
    """Typing through a suggestion ("price tax", "pr" typed) revises it in one step for a model without
    edit tokens; a model that inserts into it leaves a mask there in that step, and the step that fills
    it answers: the suggestion with the word, every other token kept."""
    from llada_lsp.completion.jobs import Infill
    from llada_lsp.completion.pipeline import InfillPlan

    text = "def cost(price, tax):\n    return pr\n"
    cursor = text.index("pr\n") + 2
    model = edit_model(insert_plus)
    plan = InfillPlan(model, Infill.at(text, cursor, "speed", draft="ice tax", typed=2), Never())
    shown = []
    outcome, final = run(plan, model, shown)
    assert outcome.text == "ice + tax" and shown[0] == "ice tax"  # the suggestion stands until the word is in
    assert only_insertion(plan.request.init_ids, final, PLUS)
