"""The tokenizer as completion needs it: document text encoded literally (no special tokens from text),
template markup encoded with its special tokens, generated ids decoded up to the first stop id, and the
lookup token healing uses. Training and serving encode through it alike.

Knows token ids and strings; nothing of documents, positions or the LSP.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from .layouts import SpecialIds

# A lone surrogate (legal in a JSON string, common after a bad paste) is no text the tokenizer takes: it
# failed the whole request with a TypeError. JSON decoding joins a valid pair into one character, so a
# surrogate left in a document is lone (or half of a pair the editor sent in two edits: two characters
# to the server's offsets, so it becomes two U+FFFD).
_SURROGATE = re.compile("[\ud800-\udfff]")


def without_surrogates(text: str) -> str:
    """Every lone surrogate as U+FFFD: one character for one, so offsets into `text` stay right."""
    return _SURROGATE.sub("\ufffd", text)


@dataclass(frozen=True)
class TextCodec:
    """The tokenizer as the server needs it. Document text is encoded literally: a document that
    contains the string "<|endoftext|>" must not produce the special token."""

    tokenizer: Any
    special: SpecialIds
    stop_ids: frozenset[int]  # ids that end a generation: every special id but the mask
    # text -> ids of the texts encoded lately: a prompt encodes the lines around the cursor and the
    # window's text on every keystroke, and all but the cursor's line and the window are the same
    # as the last time (emptied whole when full)
    _encoded: dict[str, tuple[int, ...]] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_tokenizer(cls, tokenizer) -> TextCodec:
        special = SpecialIds.from_tokenizer(tokenizer)
        stops = {i for i in tokenizer.all_special_ids if i != special.mask}
        if special.eos is not None:
            stops.add(special.eos)
        return cls(tokenizer, special, frozenset(stops))

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0] if text else []

    ENCODED_CACHE = 4096  # texts remembered

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if not texts:
            return []
        known = self._encoded  # (read into `got` first: another thread may empty it meanwhile)
        got = {t: known.get(t) for t in texts}
        new = [t for t, ids in got.items() if ids is None]
        if new:
            out = self.tokenizer([without_surrogates(t) for t in new], add_special_tokens=False,
                                 split_special_tokens=True)["input_ids"]  # fmt: skip
            got.update(zip(new, map(tuple, out)))
            if len(known) + len(new) > self.ENCODED_CACHE:
                known.clear()
            known.update((t, got[t]) for t in new)
        return [list(got[t]) for t in texts]

    def encode_markup(self, text: str) -> list[int]:
        """Template text, whose special tokens (chat roles) must become special ids."""
        return list(self.tokenizer(without_surrogates(text), add_special_tokens=False)["input_ids"]) if text else []

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    @cached_property
    def token_texts(self) -> list[str]:
        """The text of every id alone (token healing looks for the ids that start with a given text)."""
        return self.tokenizer.batch_decode(
            [[i] for i in range(len(self.tokenizer))], skip_special_tokens=False, clean_up_tokenization_spaces=False
        )

    @cached_property
    def max_token_chars(self) -> int:
        """The most characters one id stands for (its UTF-8 bytes, at least: a character is at least a
        byte): a text of n characters is at least n / max_token_chars ids, known without encoding it."""
        return max((len(t.encode("utf-8", "surrogatepass")) for t in self.token_texts), default=1) + 1

    @cached_property
    def token_index(self) -> tuple[list[str], list[int]]:
        """The texts of the ids a completion may hold (no stop ids), sorted, and their ids: the texts
        that start with a given string are one run of it, found by bisection."""
        pairs = sorted((t, i) for i, t in enumerate(self.token_texts) if i not in self.stop_ids)
        return [t for t, _ in pairs], [i for _, i in pairs]

    def ids_starting_with(self, text: str) -> list[int]:
        texts, ids = self.token_index
        lo = hi = bisect_left(texts, text)
        while hi < len(texts) and texts[hi].startswith(text):
            hi += 1
        return ids[lo:hi]

    def text_of(self, ids: list[int]) -> tuple[str, bool]:
        """Generated ids -> (text up to the first stop id, whether a stop id was found). Bytes that
        decode to no character (a character split across tokens, or byte soup) never reach a buffer."""
        stop = next((i for i, t in enumerate(ids) if t in self.stop_ids), None)
        text = self.decode(ids if stop is None else ids[:stop])
        return text.replace("\ufffd", ""), stop is not None
