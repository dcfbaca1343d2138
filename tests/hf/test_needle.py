"""The needle probe (issue 36, item 4): windows whose prompt names a proper noun that the continuation repeats, the
word renamed everywhere in the window to an invented one, scored where the continuation first names it."""
from __future__ import annotations

import functools
import re

import pytest
import torch

from helpers import ByteTokenizer

pytest.importorskip("transformers")

from cgt_viz.hf.data import BBCTokens  # noqa: E402
from cgt_viz.hf.needle import (Needles, needle_comparison, needle_in, needle_masks, needle_windows,  # noqa: E402
                               substitute, word_runs)

NAMES = ["Varnek", "Solberg", "Quillan", "Temprow", "Ardmoor", "Hollis", "Brennick", "Castell"]
P, M = 24, 24


@functools.lru_cache(None)
def _corpus(root: str) -> str:
    from pathlib import Path
    for t, topic in enumerate(("sport", "tech")):
        (Path(root) / topic).mkdir()
        for d in range(3):
            lines = []
            for k in range(6):
                a, b = NAMES[(t * 3 + d + k) % len(NAMES)], NAMES[(t * 3 + d + k + 3) % len(NAMES)]
                lines.append(f"{a} won the cup and {a} thanked {b}; the fans of {a} sang. ")
            (Path(root) / topic / f"{d}.txt").write_text("".join(lines))
    return root


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return BBCTokens(ByteTokenizer(), block_size=P + M, source=_corpus(str(tmp_path_factory.mktemp("needles"))),
                     val_fraction=0.3)


@pytest.fixture(scope="module")
def needles(task):
    return needle_windows(task, "train", P, M, per_doc=2, min_tokens=1, seed=3)


def test_word_runs_are_token_aligned_words():
    pieces = [" The", " Bl", "air", ",", " said", " Beyonc", "\ufffd", " x", "(B", "ob", ")"]
    runs = word_runs(pieces)
    assert [(r[0], r[1], r[2], r[3], r[4]) for r in runs] == [
        ("The", 0, 1, True, True), ("Blair", 1, 3, True, True), ("said", 4, 5, True, True),
        ("Beyonc\ufffd", 5, 7, True, True),     # a split non-ASCII letter stays in its word: never "Beyonc"
        ("x", 7, 8, True, True), ("Bob", 8, 10, False, False)]    # "(B" holds a letter and something else


def test_a_constructed_needle_is_the_hand_computed_one():
    text = "Mr Kolar sat. Then Kolar ran."       # bytes: the prompt is "Mr Kolar sat." (13), the rest 16
    pieces = list(text)
    found = needle_in(pieces, 13)
    # "Then" is capitalised but not in the prompt; "Mr" is too short for a name
    assert [f["word"] for f in found] == ["Kolar"]
    assert found[0]["occurrences"] == [(3, 8, False), (19, 24, False)]
    assert found[0]["scored"] == (19, 24)
    first, every = needle_masks([found[0]["scored"]], 13, len(text) - 13 - 1)
    # position j predicts window token 13 + 1 + j: "K" of the second "Kolar" is token 19, so j = 5; its 5 letters 5..9
    assert first[0].nonzero().flatten().tolist() == [5]
    assert every[0].nonzero().flatten().tolist() == [5, 6, 7, 8, 9]
    tokens = torch.tensor([ord(c) for c in text])
    out = substitute(tokens, found[0]["occurrences"], {False: [ord(c) for c in "Zupax"]})
    assert "".join(map(chr, out.tolist())) == "Mr Zupax sat. Then Zupax ran."
    # not a needle: the word's first mention after the prompt is the continuation's first input (token 13), so the
    # continuation itself shows it; a word straddling the prompt's end; a word only in the continuation
    assert needle_in(list("Kolar sat. Kolar ran. Kolar"), 11) == []
    assert needle_in(list("Mr Kolar is Kolar"), 14) == []
    assert [f["word"] for f in needle_in(list("Mr Kolar sat. Then Kolar ran."), 13, common={"kolar"})] == []
    assert needle_in(pieces, 13, min_tokens=6) == []


def test_every_occurrence_and_nothing_else_is_replaced_lengths_kept(task, needles):
    assert len(needles) >= 4
    n, length = needles.tokens.shape
    assert length == P + M + 1 and needles.original.shape == (n, length)
    assert needles.first.shape == needles.all.shape == (n, M)
    for i, (old, new) in enumerate(needles.words):
        before, after = task.text(needles.original[i]), task.text(needles.tokens[i])
        assert re.sub(rf"\b{old}\b", new, before) == after     # every occurrence, and nothing else
        assert len(new) == len(old)                            # bytes: as many tokens
        assert re.search(rf"\b{old}\b", after) is None


def test_the_invented_word_is_absent_from_the_corpus_and_the_source_windows(task, needles):
    corpus = " ".join(task.text(d) for d in task.docs).lower()
    for i, (old, new) in enumerate(needles.words):
        assert new.lower() not in re.findall(r"[a-z]+", corpus)
        assert new.lower() not in task.text(needles.original[i]).lower()
        assert new != old and new[0].isupper()


def test_the_masks_mark_the_first_mention_in_the_continuation(task, needles):
    for i, (old, new) in enumerate(needles.words):
        (j,) = needles.first[i].nonzero().flatten().tolist()
        at = P + 1 + j                                        # the window token position j predicts
        assert task.text(needles.tokens[i, at:at + len(new)]) == new
        assert new not in task.text(needles.tokens[i, P:at])  # not named earlier in the continuation
        assert new in task.text(needles.tokens[i, :P])        # but named in the prompt
        assert needles.all[i].nonzero().flatten().tolist() == list(range(j, j + len(new)))


def test_same_seed_same_windows(task, needles):
    again = needle_windows(task, "train", P, M, per_doc=2, min_tokens=1, seed=3)
    assert torch.equal(again.tokens, needles.tokens) and again.words == needles.words
    assert torch.equal(again.first, needles.first) and torch.equal(again.docs, needles.docs)


@functools.lru_cache(None)
def _head():
    from cgt_viz import hf
    torch.manual_seed(0)
    return hf.CGTLM(hf.tiny_llama(seed=0, vocab_size=256), y_layer=2, d_y=8, n_head_y=2, n_templates=3).eval()


def test_needle_comparison_reads_window_losses_at_the_needle(needles):
    from cgt_viz.hf.measure import window_losses
    model = _head()
    means = torch.randn(2, 8, generator=torch.Generator().manual_seed(1))
    res = needle_comparison(model, needles, means, n_boot=20, original=True)
    assert res["n_windows"] == len(needles) and len(res["words"]) == len(needles)
    losses = window_losses(model, needles.tokens, P, needles.topics, needles.docs, means, per_position=True)
    for kind in ("first", "all"):
        mask = getattr(needles, kind)
        per_window = {c: (v * mask).sum(1) / mask.sum(1) for c, v in losses.items()}
        docs = torch.unique(needles.docs)
        per_doc = {c: torch.stack([v[needles.docs == d].mean() for d in docs]) for c, v in per_window.items()}
        r = res[kind]
        assert r["loss_compiled"]["value"] == pytest.approx(float(per_doc["compiled"].mean()), rel=1e-5)
        gap = per_doc["no_context"].mean() - per_doc["prompted"].mean()
        assert r["G"]["value"] == pytest.approx(float((per_doc["no_context"].mean() - per_doc["compiled"].mean()) / gap),
                                                rel=1e-4)
        assert r["prompted_gain"]["value"] == pytest.approx(float(gap), rel=1e-4, abs=1e-6)
        assert "own_minus_topic_mean" in r and "G" in res["original"][kind]


def test_compile_comparison_needles_opt_in_keeps_the_rest(task):
    from cgt_viz.hf.measure import compile_comparison
    kw = dict(part="train", prompt_lens=(P,), suffix_len=M, draws=1, per_topic=2)
    plain = compile_comparison(_head(), task, **kw)
    with_needles = compile_comparison(_head(), task, needles=True, **kw)
    assert "needle" not in plain[f"p={P}"] and "G" in with_needles[f"p={P}"]["needle"]["first"]
    assert {k: v for k, v in with_needles[f"p={P}"].items() if k != "needle"} == plain[f"p={P}"]


def test_bad_arguments_are_refused_by_name(task, needles):
    from cgt_viz.hf.measure import compile_comparison
    from cgt_viz.hf.tiny import RandomWindows
    for kw, name, err in ((dict(prefix_len=0), "prefix_len", ValueError), (dict(suffix_len=1), "suffix_len", ValueError),
                          (dict(per_doc=0), "per_doc", ValueError), (dict(tries=1.5), "tries", TypeError),
                          (dict(min_tokens=0), "min_tokens", ValueError), (dict(seed=-1), "seed", ValueError),
                          (dict(part="nope"), "part", ValueError)):
        with pytest.raises(err, match=name):
            needle_windows(task, **{"part": "train", **kw})
    with pytest.raises(TypeError, match="task"):
        needle_windows("corpus")
    with pytest.raises(ValueError, match="part"):       # no window: the refusal says how to find one
        needle_windows(task, "train", P, M, min_tokens=20)
    with pytest.raises(TypeError, match="needles"):
        needle_comparison(_head(), needles.tokens)
    with pytest.raises(ValueError, match="n_boot"):
        needle_comparison(_head(), needles, n_boot=1)
    with pytest.raises(TypeError, match="task"):         # a task without documents, refused before any window
        compile_comparison(_head(), RandomWindows(vocab_size=256), prompt_lens=(4,), suffix_len=4, needles=True)
    with pytest.raises(TypeError, match="needles"):
        compile_comparison(_head(), task, prompt_lens=(4,), suffix_len=4, needles="yes")
    assert isinstance(needles, Needles)


def test_the_results_page_quotes_the_needle_file(tmp_path):
    """docs/results.md's needle table is read from needle_smollm2.json: a changed value there changes the page."""
    import json
    import shutil
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "benchmarks"))
    import results_pages
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    shutil.copy(root / results_pages.NEEDLE, tmp_path / results_pages.NEEDLE)
    data = json.loads((tmp_path / results_pages.NEEDLE).read_text())
    data["memory"]["first"]["G"] = {"value": 0.777, "ci95": [0.701, 0.802]}
    (tmp_path / results_pages.NEEDLE).write_text(json.dumps(data))
    section = "\n".join(results_pages.needle_section(tmp_path))
    assert "0.78 [0.70, 0.80]" in section and "| first |" in section
    assert results_pages.needle_section(tmp_path / "nowhere") == []
