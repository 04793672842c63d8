"""A byte-level BPE tokenizer for code, trained with `tokenizers`, saved so AutoTokenizer loads it.

Special tokens come first (ids 0..4); the engine finds the mask and end ids by name.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from llada_lsp.completion.layouts import SPECIAL_TOKENS


def train_tokenizer(texts: Iterable[str], vocab_size: int = 8192):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        mask_token="<|mask|>",
        additional_special_tokens=SPECIAL_TOKENS[2:],
        clean_up_tokenization_spaces=False,
    )


def save_tokenizer(tokenizer, folder: str | Path) -> None:
    tokenizer.save_pretrained(str(folder))
