"""Fine-tuning the embedded model on next edits (issue 27), mixed with its usual infill objective.

An example is a mined case (training/edit_pairs.py) turned into exactly what the server builds for it:
the case's history replayed through the server's edit history (completion/history.py: coalesced as
the server coalesces them), the window and prompt of completion/next_edit.py (`NextEdit.at`,
`next_edit_prompt`, the draft with its gap at the cursor), and as the target the window after the
expected edit over the same positions (an insertion at the cursor fills the gap; the window itself
for a no-edit case; the gap's positions the edit leaves empty hold end-of-text). Examples whose expected edit falls outside the window, or whose target does not fit the
generated region, are left out.

The objective is the one decoding meets: the generated region starts from the window's own tokens
(its gap at the cursor masks, then end-of-text, the room to grow), as the engine's draft does, half the time with some steps' worth
of masks on top; every generated position is labelled with the target (weight 1 where the input differs from it,
`keep_weight` where it already matches: an unchanged window is the "no edit" answer), earlier blocks
clean as committed. The infill half of each step is the shipped model's objective (objective.py).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from llada_lsp.completion.codec import TextCodec

from .edit_pairs import apply
from .eval_next_edit import changed_region


@dataclass(frozen=True)
class EditExample:
    prompt: list[int]
    init: list[int]  # the draft decoding starts from: the window's ids, then end-of-text (next_edit_prompt)
    target: list[int]  # the revised window's ids, then end-of-text to the generated region's length


def served_job(case: dict, context_tokens: int, history: bool = True):
    """(job, window start, text) of a case as the server would ask it: its history replayed through the
    server's edit history (coalesced as the server coalesces it), then `NextEdit.at` at its cursor."""
    from llada_lsp.completion.history import History  # the server's own, so both coalesce alike
    from llada_lsp.completion.next_edit import NextEdit

    h = History(clock=lambda: 0.0)  # the benchmark replays a history at once: edits that touch coalesce
    text = case["before"]
    for e in case["history"]:
        h.record("case", text, e["start"], e["end"], e["text"], text.count("\n", 0, e["start"]))
        text = apply(text, [e])
    last = h.last("case")
    job, start = NextEdit.at(text, case["cursor"], h.diffs("case") if history else (),
                             (last.start, last.old, last.new) if last else None, context_tokens, True)  # fmt: skip
    return job, start, text


def served_example(
    case: dict, codec: TextCodec, max_positions: int, context_tokens: int, history: bool = True, block_size: int = 32
) -> EditExample | None:
    """The case as the server would prompt for it (None: it cannot be one, see the module's doc)."""
    from llada_lsp.completion.next_edit import next_edit_prompt
    from llada_lsp.completion.prompt import SelectionTooLong

    job, start, text = served_job(case, context_tokens, history)
    window, cursor = job.window, job.cursor
    if case["expected"] is None:
        parts = (window[:cursor], "", window[cursor:])
    else:
        p, q, new = changed_region(text, case["expected"])
        p, q = p - start, q - start
        if p < 0 or q > len(window):
            return None
        parts = aligned(window, cursor, p, q, new)
    try:
        prompt = next_edit_prompt(job.history, job.before, window, job.after, codec, max_positions, context_tokens,
                                  block_size, cursor)  # fmt: skip
    except SelectionTooLong:
        return None
    target = gapped(parts, codec)
    if len(target) > prompt.gen_length or len(prompt.prompt.ids) + prompt.gen_length > max_positions:
        return None
    eos = codec.special.eos
    return EditExample(
        list(prompt.prompt.ids), list(prompt.init_ids), target + [eos] * (prompt.gen_length - len(target))
    )


def aligned(window: str, cursor: int, p: int, q: int, new: str) -> tuple[str, str, str]:
    """The revised window as (before the gap, what goes into the gap, after it): the expected edit
    replaces [p, q) of the window by `new`; an insertion at the cursor fills the gap, any other edit
    stays on its side of it (one that spans the cursor: the gap is left after the new text)."""
    if p == q == cursor:
        return window[:cursor], new, window[cursor:]
    if q <= cursor:
        return window[:p] + new + window[q:cursor], "", window[cursor:]
    if p >= cursor:
        return window[:cursor], "", window[cursor:p] + new + window[q:]
    return window[:p] + new, "", window[q:]


def gapped(parts: tuple[str, str, str], codec: TextCodec) -> list[int]:
    """The target ids over the draft's positions (next_edit.draft_ids): the text before the gap, the
    insertion, end-of-text (`gap_id`) for the rest of the gap (none when the insertion is longer than it), the text
    after; a layout without a gap: the text's ids."""
    from llada_lsp.completion.next_edit import GAP_TOKENS, gap_id

    head, middle, tail = parts
    gap = gap_id(codec)
    if gap is None:
        return codec.encode(head + middle + tail)
    inserted = codec.encode(middle)
    return codec.encode(head) + inserted + [gap] * max(0, GAP_TOKENS - len(inserted)) + codec.encode(tail)


def edit_batch(
    examples: list[EditExample],
    seq_len: int,
    block: int,
    mask_id: int,
    eos_id: int,
    keep_weight: float,
    rng: random.Random,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(clean x, noisy, weights), each [B, seq_len]: prompt then target in x; prompt then the draft
    (the served draft, half the time with some positions masked) in noisy; weights only on
    the generated region. Sequences are padded with end-of-text (weight 0)."""
    xs, noisies, weights = [], [], []
    for ex in examples:
        P, G = len(ex.prompt), len(ex.target)
        x = ex.prompt + ex.target
        draft = (ex.init + [mask_id] * G)[:G]
        if rng.random() < 0.5:  # a later step: some of the draft already masked or filled
            t = rng.uniform(0.05, 0.5)
            draft = [mask_id if rng.random() < t else tok for tok in draft]
        noisy = ex.prompt + draft
        w = [0.0] * P + [1.0 if d != y else keep_weight for d, y in zip(draft, ex.target)]
        pad = seq_len - len(x)
        xs.append(x + [eos_id] * pad)
        noisies.append(noisy + [eos_id] * pad)
        weights.append(w + [0.0] * pad)
    return torch.tensor(xs), torch.tensor(noisies), torch.tensor(weights)


def edit_loss(
    model, x: torch.Tensor, noisy: torch.Tensor, weights: torch.Tensor, allow: torch.Tensor
) -> tuple[torch.Tensor, dict]:
    """The weighted denoising loss of an edit batch, with the layout of objective.block_diffusion_loss
    ([clean | noisy], the noisy half's logits)."""
    B, L = x.shape
    positions = torch.arange(L, device=allow.device).repeat(2)
    logits = model(torch.cat([x, noisy], dim=1), positions=positions, allow=allow, last_n=L)
    nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x.flatten(), reduction="none").view(B, L)
    loss = (nll * weights).sum() / weights.sum().clamp(min=1e-6)
    changed = (noisy != x) & (weights > 0)
    right = logits.detach().argmax(-1) == x
    stats = {
        "edit_acc": (right & changed).sum().item() / max(changed.sum().item(), 1),
        "keep_acc": (right & ~changed & (weights > 0)).sum().item() / max((~changed & (weights > 0)).sum().item(), 1),
    }
    return loss, stats
