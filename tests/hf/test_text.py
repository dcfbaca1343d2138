"""The text path: tokenizers (GPT-2 offline, corpus BPE, bytes), the task rebuilt from a saved model, the
tokenizer checked by name, corpus files that are not plain text, links out of the corpus, compact token
storage, and an 8-topic folder run end to end."""
from __future__ import annotations

import inspect
import json
import os
import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from cgt_viz import CGT, CGTConfig, train
from cgt_viz.tasks import (ByteTokenizer, CorpusBPE, GPT2Tokenizer, TextMixture, make_task, task_from_config,
                           tokenizer_from_spec)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TOPIC_WORDS = {
    "astronomy": "star planet orbit telescope galaxy comet nebula moon",
    "biology": "cell gene protein enzyme tissue organism species membrane",
    "chemistry": "atom molecule bond acid reaction element solvent catalyst",
    "economics": "market price inflation trade bank demand supply interest",
    "geology": "rock mineral volcano fault sediment magma crust quartz",
    "history": "empire king war treaty dynasty revolution castle century",
    "music": "melody chord rhythm guitar piano symphony tempo song",
    "sport": "goal match team league coach player score season",
}
SHARED = "the of and a in is was for with on".split()


def write_topics(root, topics=TOPIC_WORDS, n_docs=4, n_words=160, seed=0):
    """root/<topic>/NNN.txt: sentences of a topic's own words mixed with shared function words."""
    rng = random.Random(seed)
    for topic, words in topics.items():
        (root / topic).mkdir(parents=True, exist_ok=True)
        own = words.split()
        for d in range(n_docs):
            text = " ".join(rng.choice(own) if rng.random() < 0.6 else rng.choice(SHARED) for _ in range(n_words))
            (root / topic / f"{d:03d}.txt").write_text(text.capitalize() + ".\n")
    return root


def tiny_cgt(task, **kw):
    torch.manual_seed(0)
    return CGT(CGTConfig(**task.config_kwargs(), n_layer=2, d_x=32, n_head=2, d_y=8, n_head_y=2, y_layer=1,
                         n_templates=2, **kw))


# ---------------------------------------------------------------------------- tokenizers
def test_gpt2_tokenizer_builds_offline_and_matches_gpt2_ids():
    tok = GPT2Tokenizer()
    assert tok.vocab_size == 50257 and tok.name == "gpt2" and tok.dtype == np.uint16
    assert tok.encode("Hello world") == [15496, 995]
    text = "naïve café: £5 — it's 2004.\n\nNew paragraph"
    assert tok.decode(tok.encode(text)) == text
    assert [tok.token_str(i) for i in tok.encode("Hello world\n\n")] == ["Hello", " world", "↵↵"]


def test_encode_array_in_chunks_equals_encoding_at_once():
    text = "".join(f"Line {i} says  something.\n\n  indented {i}\n" for i in range(400))
    for tok in (GPT2Tokenizer(), CorpusBPE.train([text], 300)):
        whole = np.asarray(tok.encode(text))
        for chunk in (50, 333, 4096):
            part = tok.encode_array(text, chunk_chars=chunk)
            assert part.dtype == np.uint16 and np.array_equal(part, whole)


def test_corpus_bpe_reloads_exactly_from_its_spec_and_refuses_an_edited_one():
    texts = [" ".join(v.split() * 20) for v in TOPIC_WORDS.values()]
    bpe = CorpusBPE.train(texts, vocab_size=300)
    assert bpe.vocab_size == 300 and bpe.name.startswith("bpe300-")
    again = CorpusBPE.train(texts, vocab_size=300)
    assert again.name == bpe.name                                 # training is deterministic
    spec = json.loads(json.dumps(bpe.spec()))                     # survives JSON, as in config.json
    back = tokenizer_from_spec(spec)
    sample = "the telescope saw a comet near the galaxy; unknown wörds too"
    assert back.name == bpe.name and back.encode(sample) == bpe.encode(sample)
    assert back.decode(back.encode(sample)) == sample
    spec["definition"] = spec["definition"].replace('"telescope"', '"telescopf"', 1) \
        if '"telescope"' in spec["definition"] else spec["definition"] + " "
    with pytest.raises(ValueError, match="does not match its sha256"):
        tokenizer_from_spec(spec)


def test_make_task_text_tokenizer_argument(tmp_path):
    root = write_topics(tmp_path, dict(list(TOPIC_WORDS.items())[:3]))
    for name, cls, dtype in (("bytes", ByteTokenizer, np.uint8), ("gpt2", GPT2Tokenizer, np.uint16),
                             ("bpe", CorpusBPE, np.uint16)):
        task = make_task("text", source=str(root), tokenizer=name, bpe_vocab=300, block_size=64, min_excerpt=8)
        assert isinstance(task.tokenizer, cls) and task.data.dtype == dtype
        assert task.config_kwargs()["vocab_size"] == task.tokenizer.vocab_size
        b = task.get_batch(2, generator=torch.Generator().manual_seed(0))
        assert b.inputs.dtype == torch.long and int(b.inputs.max()) < task.tokenizer.vocab_size


def test_bpe_token_strings_read_as_text(tmp_path):
    task = make_task("text", source=str(write_topics(tmp_path)), bpe_vocab=400, block_size=64, min_excerpt=8)
    b = task.get_batch(2, generator=torch.Generator().manual_seed(0))
    pieces = task.decode(b.inputs[0])
    assert "".join(pieces).replace("↵", "\n").replace("·", " ") == task.text(b.inputs[0])   # the text, cut in tokens
    assert max(len(p) for p in pieces) > 3 and task.joiner == ""           # whole words, not one byte each


# ---------------------------------------------------------------------------- saved models
def test_saved_text_model_rebuilds_its_task_and_tokenizer(tmp_path):
    task = make_task("text", source=str(write_topics(tmp_path / "corpus")), bpe_vocab=400, block_size=64,
                     min_excerpt=8)
    model = tiny_cgt(task, y_readout="ema")
    model.save_pretrained(tmp_path / "model")
    loaded = CGT.from_pretrained(tmp_path / "model")
    again = task_from_config(loaded.config)
    assert again.tokenizer.name == task.tokenizer.name and again.topics == task.topics
    g = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    b1, b2 = task.get_batch(4, part="val", generator=g()), again.get_batch(4, part="val", generator=g())
    assert torch.equal(b1.inputs, b2.inputs) and torch.equal(b1.info["topic"], b2.info["topic"])
    assert torch.equal(b1.info["boundary"], b2.info["boundary"])
    assert torch.equal(loaded(b1.inputs), model(b1.inputs))


def test_model_refuses_a_task_with_another_tokenizer_by_name(tmp_path):
    root = str(write_topics(tmp_path))
    bpe = make_task("text", source=root, bpe_vocab=400, block_size=64, min_excerpt=8)
    model = tiny_cgt(bpe)
    as_bytes = make_task("text", source=root, tokenizer="bytes", block_size=64, min_excerpt=8)  # 256 <= 400 ids
    with pytest.raises(ValueError, match=rf"trained with tokenizer '{bpe.tokenizer.name}' but the task uses 'bytes'"):
        train(model, as_bytes, steps=1, batch_size=2, progress=False, device="cpu")


def test_old_byte_level_config_rebuilds_a_byte_task(tmp_path):
    task = make_task("text", source=str(write_topics(tmp_path)), tokenizer="bytes", block_size=64, min_excerpt=8)
    kw = task.config_kwargs()
    del kw["extra"]["task"]["tokenizer"], kw["extra"]["task"]["bpe_vocab"]    # as written before tokenizers
    assert isinstance(task_from_config(kw).tokenizer, ByteTokenizer)


def test_ema_readout_is_causal_and_generation_with_cache_matches():
    torch.manual_seed(0)
    model = CGT(CGTConfig(vocab_size=40, block_size=32, n_layer=3, d_x=16, n_head=2, d_y=8, n_head_y=2,
                          y_layer=1, y_readout="ema")).eval()
    with torch.no_grad():                       # templates that act, so ȳ changes the logits
        for temps in model.templates.values():
            for t in temps.values():
                t.coeff.weight.normal_(0, 1.0)
    idx = torch.randint(40, (2, 24))
    assert torch.allclose(model.context(idx)[:, :10], model.context(idx[:, :10]), atol=1e-5)
    other = idx.clone()
    other[:, 12:] = (other[:, 12:] + 1) % 40
    assert not torch.allclose(model(idx), model(other))
    assert torch.equal(model.generate(idx[:, :6], 12, temperature=0, use_cache=True),
                       model.generate(idx[:, :6], 12, temperature=0, use_cache=False))


# ---------------------------------------------------------------------------- corpus files (issue 11)
def test_corpus_symlink_outside_the_root_is_refused_by_name(tmp_path):
    root = write_topics(tmp_path / "corpus", dict(list(TOPIC_WORDS.items())[:2]))
    secret = tmp_path / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("password = hunter2 " * 200)
    (root / "astronomy" / "zz_link.txt").symlink_to(secret)
    with pytest.raises(ValueError, match=r"astronomy/zz_link\.txt.*symbolic link to .*secret\.txt.*outside the corpus "
                                         r"root"):
        TextMixture(root, tokenizer="bytes", block_size=64, min_excerpt=8)


def test_corpus_topic_folder_linked_outside_is_refused_and_inside_links_work(tmp_path):
    root = write_topics(tmp_path / "corpus", dict(list(TOPIC_WORDS.items())[:2]))
    elsewhere = write_topics(tmp_path / "elsewhere", {"music": TOPIC_WORDS["music"]})
    (root / "music").symlink_to(elsewhere / "music")
    with pytest.raises(ValueError, match=r"corpus entry .*music.* outside the corpus root"):
        TextMixture(root, tokenizer="bytes", block_size=64, min_excerpt=8)
    inside = write_topics(tmp_path / "ok", dict(list(TOPIC_WORDS.items())[:2]))
    (inside / "biology" / "zz_alias.txt").symlink_to(inside / "astronomy" / "000.txt")
    task = TextMixture(inside, tokenizer="bytes", block_size=64, min_excerpt=8)
    assert "biology/zz_alias.txt" in task.doc_names


def _task_text(task) -> str:
    return task.text(task.data)


def test_utf16_and_bom_files_are_decoded_not_read_as_cp1252(tmp_path):
    root = write_topics(tmp_path, dict(list(TOPIC_WORDS.items())[:2]))
    body = "Ünïcode naïve café text, written in UTF-16 with a byte-order mark. " * 5
    (root / "astronomy" / "zz16.txt").write_bytes(body.encode("utf-16"))            # BOM + UTF-16 LE
    (root / "biology" / "zz16be.txt").write_bytes(b"\xfe\xff" + body.encode("utf-16-be"))
    (root / "biology" / "zz8.txt").write_bytes(b"\xef\xbb\xbf" + ("BOM UTF-8 café. " * 20).encode())
    task = TextMixture(root, tokenizer="bytes", block_size=64, min_excerpt=8)
    text = _task_text(task)
    assert text.count(body) == 2 and "BOM UTF-8 café." in text
    assert "\ufeff" not in text and "ÿþ" not in text and "\x00" not in text


def test_binary_or_unmarked_utf16_file_is_refused_naming_it(tmp_path):
    root = write_topics(tmp_path, dict(list(TOPIC_WORDS.items())[:2]))
    (root / "biology" / "zz_image.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 4)
    with pytest.raises(ValueError, match=r"corpus file 'biology/zz_image\.txt' holds NUL bytes.*binary, or UTF-16"):
        TextMixture(root, tokenizer="bytes", block_size=64, min_excerpt=8)
    other = write_topics(tmp_path / "b", dict(list(TOPIC_WORDS.items())[:2]))
    (other / "astronomy" / "zz_nobom.txt").write_bytes("text without a mark ".encode("utf-16-le") * 20)
    with pytest.raises(ValueError, match=r"'astronomy/zz_nobom\.txt' holds NUL bytes"):
        TextMixture(other, tokenizer="bytes", block_size=64, min_excerpt=8)


def test_tokens_are_stored_compactly(tmp_path):
    task = TextMixture(write_topics(tmp_path), tokenizer="bytes", block_size=64, min_excerpt=8)
    assert task.data.dtype == np.uint8 and task.data.nbytes == int(task.doc_len.sum())


MEMORY_PROBE = textwrap.dedent("""
    import inspect, json, sys
    from cgt_viz.tasks import TextMixture

    def status(key):
        return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key))

    with open("/proc/self/clear_refs", "w") as f:     # reset the peak (VmHWM) to the current size
        f.write("5")
    before = status("VmRSS:")
    kw = {"tokenizer": "bytes"} if "tokenizer" in inspect.signature(TextMixture).parameters else {}
    task = TextMixture(sys.argv[1], block_size=256, **kw)
    print(json.dumps({"kib": status("VmHWM:") - before}))
""")


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc to measure peak memory")
def test_a_50_mb_corpus_file_costs_a_few_times_its_size_not_int64(tmp_path):
    root = tmp_path / "big"
    for topic in ("a", "b"):
        (root / topic).mkdir(parents=True)
        (root / topic / "small.txt").write_text(f"{topic} small document. " * 100)
    line = b"The quick brown fox jumps over the lazy dog, again and again.\n"
    (root / "a" / "huge.txt").write_bytes(line * (50_000_000 // len(line)))
    (root / "b" / "large.txt").write_bytes(line * 1000)
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(root)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    grown_mb = json.loads(out.stdout.strip().splitlines()[-1])["kib"] / 1024
    assert grown_mb < 4 * 50, f"building the task grew peak memory by {grown_mb:.0f} MB for 50 MB of text"


# ---------------------------------------------------------------------------- eight topics, end to end
def test_eight_topic_folder_runs_the_whole_text_path(tmp_path):
    from cgt_viz.analysis import template_ablation
    from cgt_viz.evaluate import collect_excerpt_ends, knn_topic_accuracy, text_position_curves
    from cgt_viz.sequences import prepare_sequences

    root = write_topics(tmp_path / "wiki8", n_docs=5, n_words=200)
    task = make_task("text", source=str(root), bpe_vocab=512, block_size=64, min_excerpt=8, val_fraction=0.2)
    assert task.topics == sorted(TOPIC_WORDS) and len(task.topics) == 8
    model = tiny_cgt(task, y_readout="ema")
    model, hist = train(model, task, steps=30, batch_size=8, lr=3e-3, progress=False, device="cpu", eval_every=0)
    assert len(hist) == 30 and np.isfinite(hist.main).all() and hist.main[-1] < hist.main[0]
    model.save_pretrained(tmp_path / "model")
    model = CGT.from_pretrained(tmp_path / "model")
    task = task_from_config(model.config)
    b = task.get_batch(8, part="val", generator=torch.Generator().manual_seed(0))
    assert b.info["topic"].shape == (8, 64) and set(b.info["topic"].unique().tolist()) <= set(range(8))
    cut = b.info["boundary"]
    assert all((b.info["topic"][i, :c] == b.info["topic_a"][i]).all() for i, c in enumerate(cut.tolist()))
    feats, labels = collect_excerpt_ends(model, task, n_batches=4, batch_size=8)
    assert feats.shape == (64, 8) and set(labels.tolist()) <= set(range(8))
    assert 0.0 <= knn_topic_accuracy(feats, labels, n_neighbors=3, folds=2) <= 1.0
    curves = text_position_curves(model, task, n_batches=1, batch_size=8)
    assert np.isfinite(curves["loss_specialized"]).all()
    abl = template_ablation(model, b.inputs, b.targets, model.template_sites[0])
    assert abl["delta"].shape == (2,)
    seqs = prepare_sequences(model, b)
    words = set(" ".join(TOPIC_WORDS.values()).split())
    row = "".join(seqs.token_text[0])
    assert seqs.joiner == "" and sum(w in row for w in words) >= 5    # hover text reads as the words


def test_no_switch_control_rows_keep_excerpt_a_and_one_topic(tmp_path):
    task = make_task("text", source=str(write_topics(tmp_path)), tokenizer="bytes", block_size=64, min_excerpt=8)
    mixed = task.get_batch(16, part="train", generator=torch.Generator().manual_seed(5))
    control = task.get_batch(16, part="train", generator=torch.Generator().manual_seed(5), switch=False)
    assert torch.equal(control.info["boundary"], mixed.info["boundary"])
    assert torch.equal(control.info["topic_a"], mixed.info["topic_a"])
    assert torch.equal(control.info["doc_a"], mixed.info["doc_a"])
    assert bool((mixed.info["topic_b"] != mixed.info["topic_a"]).all())
    assert torch.equal(control.info["topic_b"], control.info["topic_a"])
    assert bool((control.info["topic"] == control.info["topic_a"][:, None]).all())
    assert torch.equal(task.doc_topic[control.info["doc_b"]], control.info["topic_a"])
    for i, cut in enumerate(mixed.info["boundary"].tolist()):       # excerpt A is the same tokens
        assert torch.equal(control.inputs[i, :cut], mixed.inputs[i, :cut])


def test_step_profile_control_shares_everything_before_the_switch(tmp_path):
    """Causality: control rows keep excerpt A, so ȳ's steps before the boundary are the same with and without
    the switch, and differ after it; the ratios are what the profiles say."""
    from cgt_viz.evaluate import step_window_means, text_step_profile
    from cgt_viz.figures import step_profile_figure
    task = make_task("text", source=str(write_topics(tmp_path)), tokenizer="bytes", block_size=64, min_excerpt=8)
    model = tiny_cgt(task)
    prof = text_step_profile(model, task, boundary=40, window=8, n_batches=2, batch_size=4, part="train", seed=3)
    pos = prof["positions"]
    assert pos.tolist() == list(range(1, 64)) and prof["n_rows"] == 8
    before = pos < 40
    np.testing.assert_allclose(prof["step_switch"][before], prof["step_no_switch"][before], rtol=1e-5, atol=1e-6)
    assert not np.allclose(prof["step_switch"][~before], prof["step_no_switch"][~before])
    after = (pos >= 40) & (pos < 48)
    elsewhere = ~after & (pos >= 8)
    assert prof["ratio"] == pytest.approx(prof["step_switch"][after].mean() / prof["step_switch"][elsewhere].mean())
    assert step_window_means(np.arange(1.0, 11.0), boundary=5, window=2) == (5.5, np.mean([2, 3, 4, 7, 8, 9, 10]))
    fig = step_profile_figure({"<b>tiny</b>": prof})
    assert len(fig.data) == 2 and all("&lt;b&gt;tiny" in tr.name for tr in fig.data)
    assert f"{prof['ratio']:.3f}" in fig.data[0].name and fig.data[1].line.dash == "dot"
