"""A checkpoint's tokenizer read with the `tokenizers` library alone: `tokenizer.json` and the special
tokens `tokenizer_config.json` names. Importing transformers to read the same file costs 0.8 s of every
start (`llada-lsp complete` runs whole in about 2 s); the ids, the texts and the special ids are the
same (tests/model/test_tokenizer.py compares them with transformers' on every shipped tokenizer).

A tokenizer this does not read the same way (no tokenizer.json, another tokenizer class, remote code)
is loaded through transformers' AutoTokenizer, as before. Knows files and tokens; nothing of prompts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# The tokenizer classes whose whole behaviour is tokenizer.json (transformers 4's fast class, 5's backend)
PLAIN_CLASSES = (None, "PreTrainedTokenizerFast", "TokenizersBackend")
# transformers' named special tokens (tokenization_utils_base.SPECIAL_TOKENS_ATTRIBUTES), in its order
NAMED = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
EXTRA = ("extra_special_tokens", "additional_special_tokens")  # transformers 5's name, then 4's
# Keys of tokenizer_config.json that change what transformers does with tokenizer.json: not read here
CHANGES_ENCODING = ("auto_map", "add_prefix_space", "add_bos_token", "add_eos_token", "do_lower_case",
                    "chat_template_kwargs", "legacy", "from_slow")  # fmt: skip


class CheckpointTokenizer:
    """The part of transformers' tokenizer interface this project calls: `tok(texts, ...)["input_ids"]`,
    `decode`, `batch_decode`, `len`, `get_vocab`, `convert_tokens_to_ids`, the special ids."""

    def __init__(self, backend: Any, special: dict[str, str], extra: list[str]):
        self.backend = backend  # tokenizers.Tokenizer: special tokens' texts become their ids
        # The same tokenizer with `encode_special_tokens` set (20 ms at load): a flag switched on one shared
        # tokenizer for each call would be seen by another thread's encoding meanwhile.
        self.literal = type(backend).from_str(backend.to_str())
        self.literal.encode_special_tokens = True
        self.special_tokens = special  # "eos_token" -> "<|endoftext|>", as tokenizer_config.json names them
        self.all_special_tokens = list(dict.fromkeys([*special.values(), *extra]))  # unique, as transformers
        self.all_special_ids = [self.convert_tokens_to_ids(t) for t in self.all_special_tokens]

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def __call__(self, text: str | list[str], add_special_tokens: bool = True,
                 split_special_tokens: bool = False) -> dict[str, Any]:  # fmt: skip
        """{"input_ids": ids} for one text, or a list of them for a list of texts. `split_special_tokens`:
        a special token's text in `text` is encoded as text, never as the special id."""
        texts = [text] if isinstance(text, str) else list(text)
        backend = self.literal if split_special_tokens else self.backend
        ids = [e.ids for e in backend.encode_batch(texts, add_special_tokens=add_special_tokens)]
        return {"input_ids": ids[0] if isinstance(text, str) else ids}

    def decode(self, ids: list[int], skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: bool = False) -> str:  # fmt: skip
        return self.batch_decode([ids], skip_special_tokens, clean_up_tokenization_spaces)[0]

    def batch_decode(self, batch: list[list[int]], skip_special_tokens: bool = False,
                     clean_up_tokenization_spaces: bool = False) -> list[str]:  # fmt: skip
        if clean_up_tokenization_spaces:
            raise ValueError("clean_up_tokenization_spaces is not supported: the text is decoded as it was")
        return self.backend.decode_batch([list(ids) for ids in batch], skip_special_tokens=skip_special_tokens)

    def get_vocab(self) -> dict[str, int]:
        return self.backend.get_vocab(with_added_tokens=True)

    def convert_tokens_to_ids(self, token: str) -> int | None:
        found = self.backend.token_to_id(token)
        return found if found is not None else self.unk_token_id

    @property
    def unk_token_id(self) -> int | None:
        token = self.special_tokens.get("unk_token")
        return None if token is None else self.backend.token_to_id(token)

    @property
    def eos_token_id(self) -> int | None:
        return self._id_of("eos_token")

    @property
    def mask_token_id(self) -> int | None:
        return self._id_of("mask_token")

    def _id_of(self, name: str) -> int | None:
        token = self.special_tokens.get(name)
        return None if token is None else self.convert_tokens_to_ids(token)


def read_tokenizer(folder: Path) -> CheckpointTokenizer | None:
    """`folder`'s tokenizer read with the tokenizers library, or None when it is not a plain
    tokenizer.json whose special tokens tokenizer_config.json names (the caller uses transformers)."""
    file, config_file = folder / "tokenizer.json", folder / "tokenizer_config.json"
    if not file.is_file():
        return None
    try:
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    except (OSError, ValueError):
        return None  # transformers says what is wrong with it
    if not isinstance(config, dict) or config.get("tokenizer_class") not in PLAIN_CLASSES:
        return None
    if any(config.get(key) not in (None, False) for key in CHANGES_ENCODING):
        return None
    if config.get("clean_up_tokenization_spaces"):  # transformers would clean decoded text up
        return None
    special = {name: _content(config[name]) for name in NAMED if config.get(name) is not None}
    extra_key = next((key for key in EXTRA if config.get(key)), None)
    extra_value = config.get(extra_key) if extra_key else []
    extra = list(extra_value.values()) if isinstance(extra_value, dict) else extra_value
    if not isinstance(extra, list) or None in special.values():
        return None
    extra = [_content(token) for token in extra]
    if None in extra:
        return None
    from tokenizers import Tokenizer

    return CheckpointTokenizer(Tokenizer.from_file(str(file)), special, extra)


def _content(token: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: its text, or {"content": text, ...}."""
    if isinstance(token, str):
        return token
    if isinstance(token, dict) and isinstance(token.get("content"), str):
        return token["content"]
    return None
