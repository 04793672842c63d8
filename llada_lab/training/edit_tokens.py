"""The embedded model's edit tokens (issue 43): DELETE and INSERT added to its tokenizer and vocabulary,
its config made a coherent LLaDA2.2 one, and the LLaDA2.2 report's LCS labels that teach it to use them.

Labels (report): the draft is aligned with the target by a longest common subsequence; matched tokens
are kept, aligned mismatches substituted, surplus draft tokens deleted, and a missing span gets one
INSERT on the anchor that follows it per round; the labels are recomputed on the draft each round
leaves, as the JointThresholdInDel rule applies them (engine/sequence.py: DELETE drops a position,
INSERT makes it [MASK, its token], a block keeps its length). Training sees every round's block.
Pure functions of ids; the model and the tokenizer are touched only by `with_edit_tokens`.
"""

from __future__ import annotations

import difflib
import random
from dataclasses import dataclass

import torch

DELETE_TOKEN, INSERT_TOKEN = "<|delete|>", "<|insert|>"
MAX_ROUNDS = 16  # the rule's post-edit budget (max_post_steps): a block edits for at most this many steps
DP_CELLS = 250_000  # an exact LCS table up to this size; beyond it difflib's matching blocks


@dataclass(frozen=True)
class EditIds:
    delete: int
    insert: int  # SGLang's and the config's "split"
    mask: int


# --- the model -------------------------------------------------------------------------------------


def with_edit_tokens(model, tokenizer, block_size: int = 32):
    """(model, tokenizer, EditIds): the tokenizer with DELETE and INSERT as two new special tokens (the
    last ids), a new model whose vocabulary has their two rows and whose config is LLaDA2.2's: block
    routing (`block_size`, and `expert_capacity` = `num_experts`, which admits every expert to every
    block) and the edit ids. The new rows start from the mean of the old ones: an unremarkable input,
    and an output logit at the mean, far below a trained argmax, so nothing writes an edit token
    before training asks for it."""
    from tokenizers import AddedToken

    from llada_lsp.model import LLaDA2
    from llada_lsp.model.config import LLaDA2Config

    old_vocab = model.config.vocab_size
    if len(tokenizer) != old_vocab:
        raise ValueError(f"the tokenizer has {len(tokenizer)} ids and the model {old_vocab}: add edit tokens to a "
                         "model whose vocabulary is its tokenizer's")  # fmt: skip
    tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in (DELETE_TOKEN, INSERT_TOKEN)],
                         special_tokens=True)  # fmt: skip
    vocab = tokenizer.get_vocab()
    ids = EditIds(vocab[DELETE_TOKEN], vocab[INSERT_TOKEN], model.config.mask_token_id)
    if (ids.delete, ids.insert) != (old_vocab, old_vocab + 1):
        raise ValueError(f"the edit tokens got ids {ids.delete}, {ids.insert}; expected {old_vocab}, {old_vocab + 1}")
    values = model.config.to_dict()
    values.update(vocab_size=old_vocab + 2, block_size=block_size, expert_capacity=model.config.num_experts,
                  delete_token_id=ids.delete, split_token_id=ids.insert)  # fmt: skip
    config = LLaDA2Config(**{k: v for k, v in values.items() if k not in ("architectures", "model_type")})
    config.validate_llada()
    new = LLaDA2(config)
    state = model.state_dict()
    for name in ("model.word_embeddings.weight", "lm_head.weight"):
        rows = state[name]  # [V, C]
        state[name] = torch.cat([rows, rows.mean(0, keepdim=True).expand(2, -1)])
    new.load_state_dict(state)
    return new, tokenizer, ids


# --- labels ----------------------------------------------------------------------------------------


def lcs_pairs(a: list[int], b: list[int]) -> list[tuple[int, int]]:
    """Matched (i, j) of a longest common subsequence of a and b, in order. The common prefix and
    suffix are matched first (some LCS always matches them), the middle by the exact table when it has
    at most DP_CELLS cells, else by difflib's matching blocks (a long common subsequence, not always
    the longest)."""
    n, m = len(a), len(b)
    p = 0
    while p < min(n, m) and a[p] == b[p]:
        p += 1
    s = 0
    while s < min(n, m) - p and a[n - 1 - s] == b[m - 1 - s]:
        s += 1
    x, y = a[p : n - s], b[p : m - s]
    if len(x) * len(y) <= DP_CELLS:
        middle = _lcs_table(x, y)
    else:
        blocks = difflib.SequenceMatcher(None, x, y, autojunk=False).get_matching_blocks()
        middle = [(i + k, j + k) for i, j, size in blocks for k in range(size)]
    return ([(i, i) for i in range(p)] + [(i + p, j + p) for i, j in middle]
            + [(n - s + k, m - s + k) for k in range(s)])  # fmt: skip


def _lcs_table(x: list[int], y: list[int]) -> list[tuple[int, int]]:
    if not x or not y:
        return []
    n, m = len(x), len(y)
    table = [[0] * (m + 1) for _ in range(n + 1)]  # table[i][j]: LCS of x[i:], y[j:]
    for i in range(n - 1, -1, -1):
        row, below = table[i], table[i + 1]
        for j in range(m - 1, -1, -1):
            row[j] = below[j + 1] + 1 if x[i] == y[j] else max(below[j], row[j + 1])
    out, i, j = [], 0, 0
    while i < n and j < m:
        if x[i] == y[j]:
            out.append((i, j))
            i, j = i + 1, j + 1
        elif table[i + 1][j] >= table[i][j + 1]:
            i += 1
        else:
            j += 1
    return out


def edit_labels(draft: list[int], target: list[int], ids: EditIds) -> list[int]:
    """One round's label of every draft position: its own id (keep), the target's id (substitute, a
    mask's fill), DELETE, or INSERT (a missing span before this anchor: one INSERT a round). Between two
    anchors the draft's tokens take the target's in order, the surplus is deleted; after the last
    anchor likewise (the caller pads the target with end-of-text, so a shorter window ends in kept
    end-of-text)."""
    labels = list(draft)
    prev_i = prev_j = -1
    for i, j in [*lcs_pairs(draft, target), (len(draft), len(target))]:
        gap_draft, gap_target = range(prev_i + 1, i), range(prev_j + 1, j)
        for k, d in enumerate(gap_draft):
            labels[d] = target[gap_target[k]] if k < len(gap_target) else ids.delete
        if len(gap_target) > len(gap_draft) and i < len(draft):
            labels[i] = ids.insert
        prev_i, prev_j = i, j
    return labels


def apply_labels(content: list[int], labels: list[int], ids: EditIds) -> list[int]:
    """The rule's writes, then its edits: DELETE drops a position, INSERT makes it [MASK, its token]."""
    out: list[int] = []
    for token, label in zip(content, labels):
        if label == ids.delete:
            continue
        out.extend((ids.mask, token) if label == ids.insert else (label,))
    return out


@dataclass(frozen=True)
class BlockState:
    content: list[int]  # the block's generated positions as a round starts
    labels: list[int]  # what the round should write at each


def block_sizes(prompt_len: int, gen_length: int, block: int) -> list[int]:
    """Generated positions per block: the first shares its block with the prompt's end; P + G ends a block."""
    first = min(gen_length, block - prompt_len % block)
    rest = gen_length - first
    return [first] + [block] * (rest // block) + ([rest % block] if rest % block else [])


def rounds(draft: list[int], target: list[int], sizes: list[int], ids: EditIds, eos: int,
           max_rounds: int = MAX_ROUNDS) -> tuple[list[list[BlockState]], list[int]]:  # fmt: skip
    """Decode `draft` toward `target` (the generated region, equal lengths) block by block, as the rule
    would with a model that always writes the labels: each block's rounds until it keeps every id (or
    `max_rounds`), ids pushed out of a block opening the next, a deleted position taking the next id,
    the region's last ids dropped (masks at its end when it shrinks). Returns each block's states and
    the region as the blocks were committed (the clean copy training conditions later blocks on)."""
    rest, goal = list(draft), list(target)
    states: list[list[BlockState]] = []
    committed: list[int] = []
    for n in sizes:
        block_states = []
        for _ in range(max_rounds + 1):
            extended = goal + [eos] * len(rest)
            labels = edit_labels(rest, extended, ids)
            block_states.append(BlockState(rest[:n], labels[:n]))
            if labels[:n] == rest[:n]:
                break
            total = len(rest)
            rest = (apply_labels(rest[:n], labels[:n], ids) + rest[n:] + [ids.mask] * total)[:total]
        states.append(block_states)
        committed.extend(rest[:n])
        # The target the rest of the region must still reach: past what this block's ids align with.
        extended = goal + [eos] * len(rest)
        inside = [(i, j) for i, j in lcs_pairs(rest, extended) if i < n]
        i_last, j_last = inside[-1] if inside else (-1, -1)
        goal = extended[j_last + 1 + (n - 1 - i_last) :]
        rest = rest[n:]
    return states, committed


# --- examples and the loss -------------------------------------------------------------------------


@dataclass(frozen=True)
class EditTokenExample:
    prompt: list[int]
    committed: list[int]  # the generated region once every block is final (the clean copy)
    states: list[list[BlockState]]  # per block of the generated region, every round's state

    @property
    def edits(self) -> int:
        """Rounds that write something, over all blocks (0: the draft is kept as it is)."""
        return sum(len(s) - 1 for s in self.states)


def make_example(prompt: list[int], draft: list[int], target: list[int], ids: EditIds, eos: int,
                 block: int = 32) -> EditTokenExample:  # fmt: skip
    """The example of one (prompt, draft, target): draft and target over the generated region."""
    if len(draft) != len(target):
        raise ValueError(f"a draft of {len(draft)} ids and a target of {len(target)}: pad the target to the draft")
    states, committed = rounds(draft, target, block_sizes(len(prompt), len(draft), block), ids, eos)
    return EditTokenExample(list(prompt), committed, states)


def edit_token_batch(examples: list[EditTokenExample], seq_len: int, keep_weight: float, eos: int,
                     rng: random.Random) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(clean x, noisy, labels, weights), each [B, seq_len]: x is prompt + committed region; noisy the
    prompt, then per block one round's state drawn at random; labels that round's; weight 1 where the
    label writes, `keep_weight` where it keeps, 0 on the prompt and the padding (end-of-text). The
    loss weighs the writes and the keeps apart (`edit_token_loss`)."""
    xs, noisies, labels, weights = [], [], [], []
    for ex in examples:
        noisy, label, weight = list(ex.prompt), list(ex.prompt), [0.0] * len(ex.prompt)
        for block_states in ex.states:
            state = rng.choice(block_states)
            noisy += state.content
            label += state.labels
            weight += [1.0 if y != c else keep_weight for c, y in zip(state.content, state.labels)]
        pad = seq_len - len(noisy)
        if pad < 0:
            raise ValueError(f"an example of {len(noisy)} positions in sequences of {seq_len}")
        xs.append(ex.prompt + ex.committed + [eos] * pad)
        noisies.append(noisy + [eos] * pad)
        labels.append(label + [eos] * pad)
        weights.append(weight + [0.0] * pad)
    return torch.tensor(xs), torch.tensor(noisies), torch.tensor(labels), torch.tensor(weights)


def edit_token_loss(model, x: torch.Tensor, noisy: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                    allow: torch.Tensor, ids: EditIds) -> tuple[torch.Tensor, dict]:  # fmt: skip
    """The loss of an edit-token batch in objective.block_diffusion_loss's layout ([clean | noisy], the
    noisy half's logits): the mean over the positions that write plus the weighted mean over those that
    keep. Apart, because a draft keeps hundreds of ids for each one it edits: pooled, the few INSERT and
    DELETE labels would weigh next to nothing. Also the accuracy of writes, of keeps and of edit tokens."""
    B, L = x.shape
    positions = torch.arange(L, device=allow.device).repeat(2)
    logits = model(torch.cat([x, noisy], dim=1), positions=positions, allow=allow, last_n=L)  # [B, L, V]
    nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view(B, L)
    writes = (labels != noisy) & (weights > 0)
    keeps = (labels == noisy) & (weights > 0)
    loss = (nll * writes).sum() / writes.sum().clamp(min=1) + (nll * weights * keeps).sum() / keeps.sum().clamp(min=1)
    right = logits.detach().argmax(-1) == labels
    edits = (labels == ids.delete) | (labels == ids.insert)

    def share(where: torch.Tensor) -> float:
        return (right & where).sum().item() / max(where.sum().item(), 1)

    return loss, {"write_acc": share(writes), "keep_acc": share(keeps), "edit_acc": share(edits)}


# --- the served prompts ----------------------------------------------------------------------------


def next_edit_pair(case: dict, codec, max_positions: int, context_tokens: int = 1024,
                   block: int = 32) -> tuple[list[int], list[int], list[int]] | None:  # fmt: skip
    """(prompt, draft, target) of a next-edit case as the server asks a model with edit tokens
    (next_edit_prompt with `edits`: the window's ids then end-of-text, no gap), the target the window
    after the expected edit, padded with end-of-text; None when the edit falls outside the window or
    the target outgrows the generated region."""
    from llada_lsp.completion.next_edit import next_edit_prompt
    from llada_lsp.completion.prompt import SelectionTooLong

    from .edit_tune import served_job
    from .eval_next_edit import changed_region

    job, start, text = served_job(case, context_tokens)
    window = job.window
    revised = window
    if case["expected"] is not None:
        p, q, new = changed_region(text, case["expected"])
        if p < start or q - start > len(window):
            return None
        revised = window[: p - start] + new + window[q - start :]
    try:
        prompt = next_edit_prompt(job.history, job.before, window, job.after, codec, max_positions, context_tokens,
                                  block, job.cursor, edits=True)  # fmt: skip
    except SelectionTooLong:
        return None
    return _padded(list(prompt.prompt.ids), list(prompt.init_ids), codec.encode(revised), codec.special.eos)


def rewrite_pair(case: dict, codec, max_positions: int, context_tokens: int = 1024,
                 block: int = 32) -> tuple[list[int], list[int], list[int]] | None:  # fmt: skip
    """(prompt, draft, target) of a rewrite made from a next-edit case with an expected edit: the whole
    lines the edit touches selected, as the server's rewrite prompt for a model with edit tokens
    (rewrite_prompt with `edits`), the target those lines after the edit; None for a no-edit case or a
    target that outgrows the region."""
    from llada_lsp.completion.prompt import SelectionTooLong, rewrite_prompt

    from .edit_pairs import apply
    from .eval_next_edit import changed_region

    if case["expected"] is None:
        return None
    text = apply(case["before"], case["history"])
    p, q, new = changed_region(text, case["expected"])
    a = text.rfind("\n", 0, p) + 1
    b = text.find("\n", q)
    b = len(text) if b < 0 else b
    selection, revised = text[a:b], text[a:p] + new + text[q:b]
    if not selection.strip():
        return None
    try:
        prompt = rewrite_prompt(text[:a], selection, text[b:], codec, max_positions, context_tokens, None, True, block)
    except SelectionTooLong:
        return None
    return _padded(list(prompt.prompt.ids), list(prompt.init_ids), codec.encode(revised), codec.special.eos)


def _padded(prompt: list[int], draft: list[int], target: list[int], eos: int):
    if len(target) > len(draft):
        return None
    return prompt, draft, target + [eos] * (len(draft) - len(target))


class RowBoost:
    """Multiplies the optimizer's update of some rows (the new tokens' embedding and output rows) by
    `factor`: they start untrained among trained ones, and at the base rate their logit would climb from
    the vocabulary's mean to an argmax in more steps than a CPU fine-tune has. Adam normalises
    gradients, so scaling a gradient would change nothing; the update itself is scaled, after the step."""

    def __init__(self, weights: list[torch.Tensor], rows: list[int], factor: float):
        self.weights, self.rows, self.factor = weights, rows, factor
        self.before: list[torch.Tensor] = []

    def __enter__(self) -> RowBoost:
        self.before = [w.detach()[self.rows].clone() for w in self.weights]
        return self

    def __exit__(self, *exc) -> None:
        with torch.no_grad():
            for w, old in zip(self.weights, self.before):
                w[self.rows] = old + self.factor * (w[self.rows] - old)
