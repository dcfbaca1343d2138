"""Tokenizers for the text task. Byte-level by default: no vocabulary file, nothing to download.

A tokenizer is any object with `vocab_size`, `encode(text) -> list[int]`, `decode(ids) -> str` and
`token_str(id) -> str` (a printable label for one token, used for hover text), so a BPE tokenizer can
be dropped in later.
"""
from __future__ import annotations

from typing import Iterable

from .._checks import describe, is_int

# how the invisible bytes print in hover text
_VISIBLE = {9: "⇥", 10: "↵", 13: "␍", 32: "·"}


class ByteTokenizer:
    """UTF-8 bytes as tokens 0..255 (vocab_size 256)."""

    name = "bytes"
    vocab_size = 256

    def encode(self, text: str | bytes) -> list[int]:
        """str (encoded as UTF-8) or bytes -> list of ints in 0..255."""
        if isinstance(text, str):
            return list(text.encode("utf-8"))
        if isinstance(text, (bytes, bytearray)):
            return list(bytes(text))
        raise TypeError(f"text must be str or bytes, got {describe(text)}")

    def decode(self, ids: Iterable[int]) -> str:
        """Token ids -> text; byte sequences that are not valid UTF-8 (a cut character) become '�'."""
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
            raise TypeError(f"ids must be an iterable of ints in 0..255, got {describe(ids)}")
        ids = list(ids.tolist() if hasattr(ids, "tolist") else ids)
        bad = [i for i in ids if not is_int(i) or not 0 <= i < 256]
        if bad:
            raise ValueError(f"ids must be ints in 0..255 (bytes), got {bad[:5]}")
        return bytes(ids).decode("utf-8", errors="replace")

    def token_str(self, token: int) -> str:
        """One token as a short printable label: 'a', '·' for a space, '↵' for a newline, '\\xe2' otherwise."""
        token = int(token)
        if not 0 <= token < 256:
            raise ValueError(f"token must be a byte in 0..255, got {token}")
        if token in _VISIBLE:
            return _VISIBLE[token]
        if 33 <= token < 127:
            return chr(token)
        return f"\\x{token:02x}"

    def __repr__(self) -> str:
        return "ByteTokenizer()"
