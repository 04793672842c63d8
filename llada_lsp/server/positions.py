"""Position conversion: an LSP `character` (UTF-8, UTF-16 or UTF-32 code units, as negotiated) <-> an
index into a Python str line. One function each way; everything that reads or writes a position uses them.

Knows nothing of pygls, documents or lines beyond the one line it is given.
"""

from __future__ import annotations

UTF8, UTF16, UTF32 = "utf-8", "utf-16", "utf-32"
ENCODINGS = (UTF8, UTF16, UTF32)
_CODECS = {UTF8: ("utf-8", 1), UTF16: ("utf-16-le", 2)}


def to_index(line: str, character: int, encoding: str) -> int:
    """Code units from the line start -> str index. Past the end clamps to the line's length (as the
    LSP specifies); a position inside a character (half a surrogate pair, part of a UTF-8 sequence)
    rounds down to that character's start."""
    if character <= 0:
        return 0
    if encoding == UTF32:
        return min(character, len(line))
    codec, width = _CODECS[encoding]
    data = line.encode(codec, errors="surrogatepass")
    if character * width >= len(data):
        return len(line)
    # A cut inside a character leaves an incomplete sequence at the end, which "ignore" drops.
    return len(data[: character * width].decode(codec, errors="ignore"))


def to_character(line: str, index: int, encoding: str) -> int:
    """str index in the line -> code units from the line start."""
    index = max(0, min(index, len(line)))
    if encoding == UTF32:
        return index
    codec, width = _CODECS[encoding]
    return len(line[:index].encode(codec, errors="surrogatepass")) // width
