"""The training data and objective of the embedded model.

Samples: windows of source files, most turned into fill-in-the-middle layouts
(`<|fim_prefix|><|fim_suffix|>` suffix `<|fim_middle|>` prefix middle `<|endoftext|>`...) with holes of
the kinds an editor asks for, the middle followed by a run of end-of-text (as in a generation whose
room is larger than the answer), packed into sequences of the full context length.
Text is encoded by the server's codec (`completion/codec.py`): source that spells a special token is
trained on as the literal text the server will send, never as that token.
Objective (block diffusion, as LLaDA2.x): each block of the sequence is noised with its own ratio and
denoised given the clean earlier blocks; the clean copy runs beside the noisy one (clean first, so the
logits of the noisy half are the last rows). Editing noise replaces some visible tokens with tokens drawn
from the batch, labelled with the original, so token-to-token editing is learned. Self-filling (optional)
goes further: some blocks get the model's own confident guesses written into their masks, as a decoding
step writes them, so the model also learns to revise the plausible mistakes it actually makes.
"""

from __future__ import annotations

import random

import torch

from llada_lsp.completion.codec import TextCodec
from llada_lsp.completion.layouts import fim_ids
from llada_lsp.engine.policy import guesses

HOLE_KINDS = ("rest_of_line", "whole_line", "block_body", "span", "plain")
HOLE_WEIGHTS = (0.30, 0.20, 0.20, 0.10, 0.20)


def parse_hole_weights(spec: str) -> tuple[float, ...]:
    """'rest_of_line=0.5,plain=0.1' -> weights in HOLE_KINDS order; kinds not named keep their default."""
    weights = dict(zip(HOLE_KINDS, HOLE_WEIGHTS))
    for part in filter(None, (p.strip() for p in spec.split(","))):
        kind, _, value = part.partition("=")
        if kind not in weights or not value:
            raise ValueError(f"bad hole weight {part!r}: use KIND=WEIGHT with KIND one of {', '.join(HOLE_KINDS)}")
        weights[kind] = float(value)
        if weights[kind] < 0:
            raise ValueError(f"bad hole weight {part!r}: weights are >= 0")
    if not any(weights.values()):
        raise ValueError("at least one hole weight must be positive")
    return tuple(weights[k] for k in HOLE_KINDS)


def find_block_bodies(lines: list[str]) -> list[tuple[int, int]]:
    """(first, end) line ranges of indented bodies that follow a line ending with ':'."""
    bodies = []
    for i, line in enumerate(lines[:-1]):
        if not line.rstrip().endswith(":"):
            continue
        head = len(line) - len(line.lstrip())
        j = i + 1
        while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > head):
            j += 1
        while j > i + 1 and not lines[j - 1].strip():
            j -= 1
        if j > i + 1 and j - i - 1 <= 12:
            bodies.append((i + 1, j))
    return bodies


def cut_hole(text: str, kind: str, rng: random.Random) -> tuple[str, str, str] | None:
    """(prefix, middle, suffix) with prefix + middle + suffix == text, or None if no such hole."""
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    code_lines = [i for i, line in enumerate(lines) if len(line.strip()) >= 2]
    if not code_lines:
        return None
    if kind == "rest_of_line":  # cursor inside the line's code; the newline stays in the suffix
        i = rng.choice(code_lines)
        line = lines[i].rstrip("\r\n")
        indent = len(line) - len(line.lstrip())
        if len(line) - indent < 2:
            return None
        col = rng.randint(indent + 1, len(line) - 1)
        a, b = starts[i] + col, starts[i] + len(line)
    elif kind == "whole_line":  # cursor after the indentation of a line
        i = rng.choice(code_lines)
        line = lines[i].rstrip("\r\n")
        a, b = starts[i] + len(line) - len(line.lstrip()), starts[i] + len(line)
    elif kind == "block_body":
        bodies = find_block_bodies(lines)
        if not bodies:
            return None
        first, end = rng.choice(bodies)
        first_line = lines[first]
        a = starts[first] + len(first_line) - len(first_line.lstrip())
        b = starts[end] - (1 if lines[end - 1].endswith("\n") else 0)
    elif kind == "span":
        a = rng.randrange(len(text))
        b = min(len(text), a + rng.randint(1, 200))
    else:
        return None
    return text[:a], text[a:b], text[b:]


class SampleStream:
    """Endless stream of token ids from the training files, samples separated by EOS."""

    def __init__(
        self,
        texts: list[str],
        tokenizer,
        seed: int,
        window_chars: int = 1400,
        max_eos_run: int = 40,
        hole_weights: tuple[float, ...] = HOLE_WEIGHTS,
    ):
        self.texts, self.window, self.max_eos_run = texts, window_chars, max_eos_run
        self.hole_weights = hole_weights
        self.rng = random.Random(seed)
        # The server's codec: source text that holds "<|endoftext|>" is trained on as the literal text
        # the server will send, never as the special token.
        self.codec = TextCodec.from_tokenizer(tokenizer)
        self.special = self.codec.special
        self.weights = [len(t) for t in texts]

    def encode(self, s: str) -> list[int]:
        return self.codec.encode(s)

    def fim(self, prefix: str, middle: str, suffix: str) -> list[int]:
        """The FIM layout of one hole: the server's prompt for a cursor after `prefix`, then the middle."""
        prefix_ids, suffix_ids, middle_ids = self.codec.encode_batch([prefix, suffix, middle])  # one tokenizer call
        return fim_ids(prefix_ids, suffix_ids, middle_ids, self.special)

    def sample(self) -> list[int]:
        text = self.rng.choices(self.texts, weights=self.weights)[0]
        if len(text) > self.window:
            start = self.rng.randrange(len(text) - self.window)
            start = text.rfind("\n", 0, start) + 1  # windows start at a line start
            text = text[start : start + self.window]
        kind = self.rng.choices(HOLE_KINDS, weights=self.hole_weights)[0]
        hole = cut_hole(text, kind, self.rng) if kind != "plain" else None
        if hole is None:
            return self.encode(text) + [self.special.eos]
        prefix, middle, suffix = hole
        if self.rng.random() < 0.5:  # the editor keeps only some context: train on short sides too
            prefix = prefix[-self.rng.randint(0, len(prefix)) :] if prefix else prefix
            suffix = suffix[: self.rng.randint(0, len(suffix))]
        ids = self.fim(prefix, middle, suffix)
        # An editor's request leaves more room than the middle needs, and the engine expects the
        # positions past its end to fill with end-of-text: show the model such runs (packed data alone
        # would teach it that a new sample follows an end-of-text).
        return ids + [self.special.eos] * self.rng.randint(1, self.max_eos_run)

    def sequences(self, length: int):
        """Packed sequences of exactly `length` ids."""
        buf: list[int] = []
        while True:
            while len(buf) < length:
                buf.extend(self.sample())
            yield buf[:length]
            buf = buf[length:]


def training_mask(length: int, block: int) -> torch.Tensor:
    """[2L, 2L] bool for the layout [clean | noisy]: clean attends clean blocks <= its own; noisy
    attends clean blocks < its own and its own noisy block."""
    b = torch.arange(length) // block
    clean_clean = b[None, :] <= b[:, None]
    noisy_clean = b[None, :] < b[:, None]
    noisy_noisy = b[None, :] == b[:, None]
    top = torch.cat([clean_clean, torch.zeros_like(clean_clean)], dim=1)
    bottom = torch.cat([noisy_clean, noisy_noisy], dim=1)
    return torch.cat([top, bottom], dim=0)


def noise_batch(
    x: torch.Tensor, block: int, mask_id: int, edit_ratio: float, keep_weight: float, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [B, L] -> (noisy [B, L], loss weights [B, L]).

    Per block a ratio t ~ U(0.05, 1): each position is masked with probability t. Of the rest, a share
    `edit_ratio * t` is replaced by tokens drawn from the batch. Masked and replaced positions carry
    weight 1; kept positions carry `keep_weight`, which teaches the model that a correct token stays
    (without it the argmax at visible positions is untrained, and speed mode, which always follows the
    argmax, would rewrite correct tokens).
    """
    B, L = x.shape
    n_blocks = L // block
    t = torch.rand(B, n_blocks, 1, generator=gen).mul(0.95).add(0.05).expand(B, n_blocks, block).reshape(B, L)
    u = torch.rand(B, L, generator=gen)
    masked = u < t
    replaced = ~masked & (torch.rand(B, L, generator=gen) < edit_ratio * t)
    donors = x.flatten()[torch.randint(0, B * L, (B, L), generator=gen)]
    noisy = torch.where(masked, torch.full_like(x, mask_id), torch.where(replaced, donors, x))
    replaced = replaced & (donors != x)
    weights = torch.where(masked | replaced, 1.0, keep_weight)
    return noisy, weights


def self_fill(
    logits: torch.Tensor,
    x: torch.Tensor,
    noisy: torch.Tensor,
    weights: torch.Tensor,
    mask_id: int,
    block: int,
    share: float,
    keep_weight: float,
    gen: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Write the model's own guesses into the masks of a `share` of the blocks, as one decoding step
    writes them: the argmax (never a mask) wherever its probability beats a threshold drawn per block
    from U(0.3, 0.9). A wrong guess is a mistake the model really makes, plausible in its context,
    labelled with the original (weight 1); a right one must be kept (`keep_weight`). The masks left
    beside them learn to fill next to imperfect neighbours, as in a real decode.

    logits [B, L, V] of a no-grad forward on `noisy`; returns the new (noisy, weights)."""
    B, L = x.shape
    n_blocks = L // block
    conf, guess = guesses(logits, mask_id)  # as a decoding step guesses
    chosen = torch.rand(B, n_blocks, 1, generator=gen) < share
    cut = torch.rand(B, n_blocks, 1, generator=gen).mul(0.6).add(0.3)

    def per_position(t: torch.Tensor) -> torch.Tensor:  # [B, n_blocks, 1] -> [B, L]
        return t.expand(B, n_blocks, block).reshape(B, L).to(x.device)

    fill = (noisy == mask_id) & per_position(chosen) & (conf > per_position(cut))
    noisy = torch.where(fill, guess, noisy)
    weights = torch.where(fill, torch.where(guess == x, keep_weight, 1.0), weights)
    return noisy, weights


def block_diffusion_loss(
    model,
    x: torch.Tensor,
    mask_id: int,
    block: int,
    edit_ratio: float,
    keep_weight: float,
    allow: torch.Tensor,
    gen: torch.Generator,
    confidence_weight: float = 0.0,
    self_fill_share: float = 0.0,
) -> tuple[torch.Tensor, dict]:
    """The weighted denoising loss, plus `confidence_weight` x the mean entropy of the predictions at
    masked positions the model already gets right (LLaDA2.0's confidence-aware parallel training:
    it sharpens correct predictions, so more of them pass a decoding threshold in the same step,
    without pushing the wrong ones). With `self_fill_share`, a no-grad forward first writes the
    model's own guesses into that share of the blocks (see `self_fill`)."""
    B, L = x.shape
    noisy, weights = noise_batch(x, block, mask_id, edit_ratio, keep_weight, gen)  # on the CPU: seeded
    x, noisy, weights = (t.to(allow.device, non_blocking=True) for t in (x, noisy, weights))
    positions = torch.arange(L, device=allow.device).repeat(2)
    stats = {}
    if self_fill_share:
        with torch.no_grad():
            guesses = model(torch.cat([x, noisy], dim=1), positions=positions, allow=allow, last_n=L)
        was_masked = noisy == mask_id
        noisy, weights = self_fill(guesses, x, noisy, weights, mask_id, block, self_fill_share, keep_weight, gen)
        written = was_masked & (noisy != mask_id)
        stats["self_fill_wrong"] = ((noisy != x) & written).sum().item() / max(written.sum().item(), 1)
    logits = model(torch.cat([x, noisy], dim=1), positions=positions, allow=allow, last_n=L)  # [B, L, V]
    nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x.flatten(), reduction="none").view(B, L)
    loss = (nll * weights).sum() / weights.sum()
    is_mask = noisy == mask_id
    right = (logits.detach().argmax(-1) == x) & is_mask
    stats["mask_loss"] = nll.detach()[is_mask].mean().item() if is_mask.any() else 0.0
    stats["mask_acc"] = (right.sum() / is_mask.sum().clamp(min=1)).item()
    if confidence_weight and right.any():
        logp = logits[right].float().log_softmax(-1)  # [n_right, V]
        entropy = -(logp.exp() * logp).sum(-1).mean()
        loss = loss + confidence_weight * entropy
        stats["entropy"] = entropy.item()
    return loss, stats
