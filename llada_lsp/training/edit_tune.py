"""Fine-tuning the embedded model on next edits (issue 27), mixed with its usual infill objective.

An example is a mined case (training/edit_pairs.py) turned into exactly what the server builds for it:
the case's history replayed through the server's edit history (server/history.py: coalesced as the
server coalesces them), the window and prompt of completion/next_edit.py (`NextEdit.at`,
`next_edit_prompt`), and as the target the window after the expected edit (the window itself for a
no-edit case). Examples whose expected edit falls outside the window, or whose target does not fit the
generated region, are left out.

The objective is the one decoding meets: the generated region starts from the window's own tokens
(then end-of-text, the room to grow), as the engine's draft does, half the time with some steps' worth
of masks on top; every generated position is labelled with the target (weight 1 where the input differs from it,
`keep_weight` where it already matches: an unchanged window is the "no edit" answer), earlier blocks
clean as committed. The infill half of each step is the shipped model's objective (objective.py).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from ..completion.codec import TextCodec
from .edit_pairs import apply
from .eval_next_edit import changed_region


@dataclass(frozen=True)
class EditExample:
    prompt: list[int]
    init: list[int]  # the draft decoding starts from: the window's ids, then end-of-text (next_edit_prompt)
    target: list[int]  # the revised window's ids, then end-of-text to the generated region's length


def served_example(
    case: dict, codec: TextCodec, max_positions: int, context_tokens: int, history: bool = True, block_size: int = 32
) -> EditExample | None:
    """The case as the server would prompt for it (None: it cannot be one, see the module's doc)."""
    from ..completion.next_edit import (  # the server side's, so both agree
        NextEdit,
        next_edit_prompt,
    )
    from ..completion.prompt import SelectionTooLong
    from ..server.history import History

    h = History(clock=lambda: 0.0)  # the benchmark replays a history at once: edits that touch coalesce
    text = case["before"]
    for e in case["history"]:
        h.record("case", text, e["start"], e["end"], e["text"], text.count("\n", 0, e["start"]))
        text = apply(text, [e])
    last = h.last("case")
    job, start = NextEdit.at(
        text,
        case["cursor"],
        h.diffs("case") if history else (),
        (last.start, last.old, last.new) if last else None,
        context_tokens,
        True,
    )
    end = start + len(job.window)
    if case["expected"] is None:
        revised = job.window
    else:
        p, q, new = changed_region(text, case["expected"])
        if p < start or q > end:
            return None
        revised = text[start:p] + new + text[q:end]
    try:
        prompt = next_edit_prompt(
            job.history, job.before, job.window, job.after, codec, max_positions, context_tokens, block_size
        )
    except SelectionTooLong:
        return None
    target = codec.encode(revised)
    if len(target) > prompt.gen_length or len(prompt.prompt.ids) + prompt.gen_length > max_positions:
        return None
    eos = codec.special.eos
    return EditExample(
        list(prompt.prompt.ids), list(prompt.init_ids), target + [eos] * (prompt.gen_length - len(target))
    )


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
