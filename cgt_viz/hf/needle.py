"""A needle probe: does a compiled prompt carry a word that only this document holds?

`compile_comparison` tells a document from its topic on average (own − topic mean, G at prompt-token positions),
but a real name in a BBC article is partly known from its topic ("Blair" in politics). The needle probe removes
that: in a window whose prompt names a proper noun that the continuation names again, every occurrence of that
word is replaced by an invented one ("Zorvak"), absent from the whole corpus. No topic, no training document and
no prior can then predict the continuation's first mention of it; only the prompt can. The scored positions are
those of that first mention in the continuation.

Why at token level, with an invented word of the same number of tokens as the original (per form, with and
without a leading space): the window keeps its length and its cut, so the prompt is still p tokens, the
continuation m, and every other position is the original document's; nothing is re-cut around the change. A
word of letters between non-letters is its own pre-token for a byte-level BPE, so encoding the invented word alone
gives the tokens it would have in the window's text.

    needles = needle_windows(task, "test", prefix_len=64, suffix_len=64)
    needle_comparison(head, needles, topic_means)["first"]["G"]
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .._checks import Bool, Has, Instance, Int, checked, refuse
from ._args import HeadModel

_RUN = re.compile(r"[A-Za-z\u0080-\uffff]+")          # a run of letters; non-ASCII (and "�" of a split byte) counts
_NAME = re.compile(r"[A-Z][a-z]{2,}")                  # a capitalised word: what a needle may replace
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "tr", "vl", "zh")
_VOWELS = ("a", "e", "i", "o", "u")
_CODAS = ("", "", "", "n", "r", "k", "x", "l")
MASKS = ("first", "all")

DOCUMENTS_TASK = Has("document_ids", "decode", "text", "check_part",
                     what="a task with documents and a tokenizer (BBCTokens)")


@dataclass
class Needles:
    """Needle windows: tokens (n, p + m + 1) with the invented word, original (n, p + m + 1) as the document has
    them, topics (n,), docs (n,), and the scored masks over the m continuation positions (position j predicts
    tokens[:, p + 1 + j]): first (n, m) the first token of the needle's first mention in the continuation, all
    (n, m) every token of that mention. words: (original, invented) per window."""

    tokens: torch.Tensor
    original: torch.Tensor
    topics: torch.Tensor
    docs: torch.Tensor
    first: torch.Tensor
    all: torch.Tensor
    prefix_len: int
    words: list[tuple[str, str]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)


def word_runs(pieces: list[str]) -> list[tuple[str, int, int, bool, bool]]:
    """The letter runs of a token sequence, given each token's text -> [(text, first token, end token (exclusive),
    spaced, aligned)]. aligned: the run starts where its first token starts (after that token's one leading
    space: spaced) and ends where its last token ends, so replacing those tokens replaces the word and nothing
    else. Non-ASCII letters (and the "�" of a byte split across tokens) belong to runs, so "Beyonc" of "Beyoncé"
    is never taken for a word."""
    starts, pos = [], 0
    for p in pieces:
        starts.append(pos)
        pos += len(p)
    text = "".join(pieces)
    token_at = np.searchsorted(np.array(starts + [pos]), np.arange(len(text) + 1), side="right") - 1
    runs = []
    for m in _RUN.finditer(text):
        a, b = m.start(), m.end()
        first, last = int(token_at[a]), int(token_at[b - 1])
        lead = a - starts[first]
        spaced = lead == 1 and pieces[first][0] == " "
        aligned = (lead == 0 or spaced) and b == starts[last] + len(pieces[last])
        runs.append((m.group(), first, last + 1, spaced, aligned))
    return runs


def corpus_words(texts) -> tuple[set[str], set[str]]:
    """Every letter word of the texts, lowercased, and the words that occur written in lowercase -> (all, lower).
    A capitalised word whose lowercase form never occurs is taken for a proper noun ("Blair", not "The")."""
    every, lower = set(), set()
    for text in texts:
        for w in _RUN.findall(text):
            every.add(w.lower())
            if w.islower():
                lower.add(w)
    return every, lower


def invent_word(tokenizer, counts: dict[bool, int], banned: set[str], rng: np.random.Generator,
                tries: int = 2000) -> tuple[str, dict[bool, list[int]]] | None:
    """A capitalised word of random syllables (2 or 3; from rng) that the tokenizer writes in counts[spaced]
    tokens for each form needed (spaced: with a leading space) and whose lowercase form is not in banned (the
    corpus's words) -> (word, {spaced: token ids}), or None after `tries` draws."""
    for _ in range(tries):
        word = "".join(_ONSETS[rng.integers(len(_ONSETS))] + _VOWELS[rng.integers(len(_VOWELS))]
                       + _CODAS[rng.integers(len(_CODAS))] for _ in range(int(rng.integers(2, 4)))).capitalize()
        if word.lower() in banned:
            continue
        ids = {spaced: list(tokenizer.encode((" " if spaced else "") + word, add_special_tokens=False))
               for spaced in counts}
        if all(len(ids[s]) == n for s, n in counts.items()) \
                and all(_RUN.fullmatch(tokenizer.decode(ids[s]).strip() or "-") for s in counts):
            return word, ids
    return None


def needle_in(pieces: list[str], prefix_len: int, common: set[str] | None = None,
              min_tokens: int = 1) -> list[dict[str, Any]]:
    """The words that can be a needle in one window (each token's text in pieces, p = prefix_len tokens of
    prompt) -> [{"word", "occurrences": [(first, end, spaced)], "scored": (first, end)}], in order of
    appearance. A word qualifies when it is capitalised (and, given common, the corpus's words written in
    lowercase, its lowercase form is not among them: a proper noun, "Blair" and not "The"), each occurrence is
    at least min_tokens tokens,
    every letter run equal to it is token-aligned, it occurs whole within the prompt, no occurrence straddles
    the prompt's end, and its first mention from token p on starts at p + 1 or later (its first token is a
    scored target) and ends before the window's last token (the word is not cut by the window's end)."""
    runs = word_runs(pieces)
    n = len(pieces)
    out = []
    for word in dict.fromkeys(r[0] for r in runs if _NAME.fullmatch(r[0])):
        if common is not None and word.lower() in common:
            continue
        occ = [r for r in runs if r[0] == word]
        if not all(r[4] and r[2] - r[1] >= min_tokens for r in occ):
            continue
        if not any(r[2] <= prefix_len for r in occ) or any(r[1] < prefix_len < r[2] for r in occ):
            continue
        later = [r for r in occ if r[1] >= prefix_len]
        if not later or later[0][1] < prefix_len + 1 or later[0][2] >= n:
            continue
        out.append({"word": word, "occurrences": [(r[1], r[2], r[3]) for r in occ],
                    "scored": (later[0][1], later[0][2])})
    return out


def substitute(tokens: torch.Tensor, occurrences: list[tuple[int, int, bool]],
               ids: dict[bool, list[int]]) -> torch.Tensor:
    """A copy of one window tokens (L,) with every occurrence (first, end, spaced) replaced by ids[spaced], of the
    same length (invent_word made it so)."""
    out = tokens.clone()
    for first, end, spaced in occurrences:
        out[first:end] = torch.tensor(ids[spaced], dtype=out.dtype)
    return out


def needle_masks(scored: list[tuple[int, int]], prefix_len: int, suffix_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The scored mention (first, end) of each window's needle (token indices in the window) -> first (n, m), all
    (n, m) over the m = suffix_len continuation positions: position j predicts window token p + 1 + j."""
    first = torch.zeros(len(scored), suffix_len, dtype=torch.bool)
    every = torch.zeros(len(scored), suffix_len, dtype=torch.bool)
    for i, (a, b) in enumerate(scored):
        first[i, a - prefix_len - 1] = True
        every[i, a - prefix_len - 1:b - prefix_len - 1] = True
    return first, every


@checked(task=DOCUMENTS_TASK, prefix_len=Int(1), suffix_len=Int(2), per_doc=Int(1), per_topic=Int(1, none=True),
         tries=Int(1), min_tokens=Int(1), seed=Int(0))
def needle_windows(task, part: str = "test", prefix_len: int = 64, suffix_len: int = 64, per_doc: int = 1,
                   per_topic: int | None = None, tries: int = 64, min_tokens: int = 2, seed: int = 0) -> Needles:
    """Needle windows of prefix_len + suffix_len + 1 tokens from the documents of `part`: per document (up to
    per_topic documents per topic that have one, in a seeded order) up to per_doc windows that do not overlap,
    found among `tries` random offsets. In each, one proper noun of the prompt that the continuation names again
    (`needle_in`, chosen at random among those that qualify) is replaced, every occurrence, by an invented word
    (`invent_word`) absent from every document of the corpus (all parts) -> Needles. The same seed gives the
    same windows and words.

    min_tokens: the fewest tokens of a needle (each form). With 2, the default, the invented word is never one
    token of the vocabulary, so never a word the LM holds whole ("Biden", "Nova" are single tokens absent from the
    2004–05 corpus); an invented word of random syllables split by the tokenizer is nonsense to the LM too."""
    task.check_part(part)
    tok = task.tokenizer
    length = prefix_len + suffix_len + 1
    every, lower = corpus_words(task.text(d) for d in task.docs)
    rng = np.random.default_rng(seed)
    rows, originals, topics, docs, scored, words = [], [], [], [], [], []
    for ti in range(len(task.topics)):
        pool = task.document_ids(part, ti)
        kept = 0
        for d in (pool[i] for i in rng.permutation(len(pool))):
            ids = task.docs[d]
            if len(ids) < length or (per_topic is not None and kept >= per_topic):
                continue
            pieces = task.decode(ids)
            taken: list[int] = []
            for s in rng.permutation(len(ids) - length + 1)[:tries].tolist():
                if len(taken) >= per_doc:
                    break
                if any(abs(s - t) < length for t in taken):
                    continue
                found = needle_in(pieces[s:s + length], prefix_len, lower, min_tokens)
                if not found:
                    continue
                pick = found[int(rng.integers(len(found)))]
                counts = {sp: b - a for a, b, sp in pick["occurrences"]}
                if len({(sp, b - a) for a, b, sp in pick["occurrences"]}) != len(counts):
                    continue          # one form written in two token counts: no single word fits both
                made = invent_word(tok, counts, every, rng)
                if made is None:
                    continue
                window = ids[s:s + length]
                rows.append(substitute(window, pick["occurrences"], made[1]))
                originals.append(window)
                topics.append(ti)
                docs.append(d)
                scored.append(pick["scored"])
                words.append((pick["word"], made[0]))
                taken.append(s)
            kept += bool(taken)
    if not rows:
        raise refuse("part", f"a part with documents whose prompt names a word that the continuation repeats",
                     f"{part!r}: no needle window among {tries} offsets per document",
                     hint="raise tries or shorten the windows")
    first, all_ = needle_masks(scored, prefix_len, suffix_len)
    return Needles(torch.stack(rows), torch.stack(originals), torch.tensor(topics), torch.tensor(docs), first, all_,
                   prefix_len, words)


_NEEDLES = Instance(Needles, "the Needles that needle_windows returns")
_MEANS = Instance(torch.Tensor, "None or a tensor (topics, d_y) of mean summaries", none=True)


@torch.no_grad()
@checked(model=HeadModel(), needles=_NEEDLES, topic_means=_MEANS, batch_size=Int(1), seed=Int(0), original=Bool())
def needle_losses(model, needles: Needles, topic_means: torch.Tensor | None = None, batch_size: int = 8,
                  seed: int = 0, original: bool = False) -> dict[str, dict[str, torch.Tensor]]:
    """Each condition of `window_losses` (prompted, compiled, the controls, topic_mean, no_context) at the needle's
    positions, the mean per window -> {"first": {condition: (n,)}, "all": {...}}: first (`Needles.first`) the
    needle's first token, what a model must recall; all (`Needles.all`) each of its tokens, the later ones partly
    predictable from the first. With original, the windows as the documents have them (the real word)."""
    from .measure import losses_at, window_losses
    tokens = needles.original if original else needles.tokens
    losses = window_losses(model, tokens, needles.prefix_len, needles.topics, needles.docs, topic_means,
                           batch_size, seed, per_position=True)                   # {condition: (n, m)}
    return {kind: losses_at(losses, getattr(needles, kind)) for kind in MASKS}


def summarize_needles(losses: dict[str, dict[str, torch.Tensor]], docs: torch.Tensor, n_boot: int = 2000,
                      seed: int = 0) -> dict[str, Any]:
    """`needle_losses` -> per mask, `summarize_comparison` of the windows' losses there (each condition's loss,
    G, own − topic mean, own − other, with 95 % intervals over documents) and the prompted LM's gain there,
    no_context − prompted, with its interval ("prompted_gain")."""
    from .measure import document_interval, summarize_comparison
    out = {}
    for kind, at in losses.items():
        out[kind] = summarize_comparison(at, docs, n_boot, seed)
        out[kind]["prompted_gain"] = document_interval(at["no_context"] - at["prompted"], docs, n_boot, seed)
    return out


@torch.no_grad()
@checked(model=HeadModel(), needles=_NEEDLES, topic_means=_MEANS, batch_size=Int(1), seed=Int(0), n_boot=Int(10),
         original=Bool())
def needle_comparison(model, needles: Needles, topic_means: torch.Tensor | None = None, batch_size: int = 8,
                      seed: int = 0, n_boot: int = 2000, original: bool = False) -> dict[str, Any]:
    """The needle probe of a head -> {"first": ..., "all": ..., "n_windows", "n_documents", "words"}: per mask,
    `summarize_needles` of `needle_losses` (G, own − topic mean, own − other, each condition's loss and the
    prompted LM's gain at the needle, with 95 % intervals over documents). With original, the same on the windows
    as the documents have them under "original": how much of the real word the topic already told."""
    res: dict[str, Any] = {"n_windows": len(needles), "n_documents": int(len(torch.unique(needles.docs))),
                           "words": [list(w) for w in needles.words]}
    res.update(summarize_needles(needle_losses(model, needles, topic_means, batch_size, seed), needles.docs,
                                 n_boot, seed))
    if original:
        res["original"] = summarize_needles(needle_losses(model, needles, topic_means, batch_size, seed, original=True),
                                            needles.docs, n_boot, seed)
    return res
