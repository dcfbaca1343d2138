"""Tasks: shapes, determinism, answers predictable from the hidden numbers, masks, text labels, bad input."""
from __future__ import annotations

import pytest
import torch

from cgt_viz import CGT, CGTConfig
from cgt_viz.tasks import (ByteTokenizer, LinearRegression, SyntheticICL, TextMixture, make_task,
                           task_from_config)
from cgt_viz.tasks.icl import FAMILIES


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def write_corpus(root, topics=("cats", "dogs", "fish"), n_docs=3, length=400):
    for ti, topic in enumerate(topics):
        (root / topic).mkdir(parents=True)
        for d in range(n_docs):
            word = f"{topic}{d} "
            (root / topic / f"{d:03d}.txt").write_text((word * (length // len(word) + 1))[:length])
    return root


@pytest.fixture(scope="module")
def bbc():
    return TextMixture("bbc", block_size=128)


# ---------------------------------------------------------------------------- SyntheticICL
@pytest.mark.parametrize("family", FAMILIES)
def test_icl_answers_follow_the_hidden_numbers(family):
    task = SyntheticICL(family, P=7, n_pairs=10, answer_tokens="value")
    b = task.get_batch(16, generator=gen())
    assert b.inputs.shape == b.targets.shape == b.loss_mask.shape == (16, 20)
    a, bb = b.info["task_params"][:, :1], b.info["task_params"][:, 1:]
    u, ans = b.inputs[:, 0::2], b.inputs[:, 1::2]
    assert (u < 7).all() and (ans >= 7).all() and (ans < 14).all()
    assert torch.equal(ans - 7, (a * u + bb) % 7)
    # the mask covers exactly the positions whose target is an answer token
    assert torch.equal(b.loss_mask, b.targets >= 7)
    assert torch.equal(b.targets[:, :-1], b.inputs[:, 1:]) and b.targets[0, -1] == -100
    if family == "shift":
        assert (a == 1).all()
    if family == "mul":
        assert (bb == 0).all()
    if family == "dihedral":
        assert set(a.flatten().tolist()) <= {1, 6}


def test_icl_pair_answer_tokens_name_the_whole_demonstration():
    task = SyntheticICL("affine", P=5, n_pairs=6, answer_tokens="pair")
    assert task.vocab_size == 5 + 25
    b = task.get_batch(32, generator=gen())
    u, ans = b.inputs[:, 0::2], b.inputs[:, 1::2]
    a, bb = b.info["task_params"][:, :1], b.info["task_params"][:, 1:]
    assert torch.equal(ans, 5 + 5 * u + (a * u + bb) % 5)
    assert torch.equal(task.answer_value(ans), (a * u + bb) % 5)
    assert torch.equal(b.loss_mask, b.targets >= 5) and int(b.inputs.max()) < 30
    assert task.decode([2, 5 + 5 * 2 + 4]) == ["u2", "2→4"]


def test_icl_shift_fraction_mixes_pure_shifts_into_training_only():
    task = SyntheticICL("affine", P=7, n_pairs=4, shift_fraction=1.0)
    assert (task.get_batch(64, generator=gen()).info["task_params"][:, 0] == 1).all()
    a_eval = task.eval_batch(2, 256, generator=gen()).info["task_params"][:, 0]
    assert len(a_eval.unique()) == 6                                    # evaluation covers the whole family
    half = SyntheticICL("affine", P=7, n_pairs=4, shift_fraction=0.5).get_batch(2000, generator=gen())
    assert 0.5 < float((half.info["task_params"][:, 0] == 1).float().mean()) < 0.65   # 0.5 + 0.5/6


def test_icl_is_deterministic_under_a_seed_and_varies_without():
    task = SyntheticICL("affine", P=7, n_pairs=8)
    b1, b2, b3 = task.get_batch(8, generator=gen(3)), task.get_batch(8, generator=gen(3)), task.get_batch(8, generator=gen(4))
    assert torch.equal(b1.inputs, b2.inputs) and torch.equal(b1.split, b2.split)
    assert not torch.equal(b1.inputs, b3.inputs)


def test_icl_split_is_a_pair_boundary_and_novel_mask_is_right():
    task = SyntheticICL("affine", P=5, n_pairs=8, aux_min_pairs=2, novel_split=True)
    b = task.get_batch(64, generator=gen(1))
    assert (b.split % 2 == 0).all() and (b.split >= 4).all() and (b.split <= 14).all()
    u = b.info["u"]
    for row in range(8):
        for i in range(8):
            assert bool(b.info["novel"][row, 2 * i]) == (int(u[row, i]) not in u[row, :i].tolist())
    assert not b.info["novel"][:, 1::2].any()
    # the split is placed before a new u whenever the row has one after aux_min_pairs
    j = b.split // 2
    has_new = b.info["novel"][:, 4::2].any(1)
    assert b.info["novel"][torch.arange(64), 2 * j][has_new].all()


def test_icl_eval_batch_queries_are_new_to_the_prompt():
    task = SyntheticICL("affine", P=7, n_pairs=16)
    b = task.eval_batch(12, 32, generator=gen(), n_queries=2)     # k > P − n_queries is allowed
    assert b.inputs.shape == (32, 28) and (b.split == 24).all()
    assert torch.equal(b.loss_mask.nonzero()[:, 1].unique(), torch.tensor([24, 26]))
    demos, queries = b.info["u"][:, :12], b.info["u"][:, 12:]
    assert not (queries[:, :, None] == demos[:, None, :]).any()


def test_icl_config_kwargs_round_trip_through_the_registry():
    task = make_task("icl", family="dihedral", P=5, n_pairs=6, answer_tokens="value")
    cfg = CGTConfig(d_x=16, n_head=2, d_y=8, n_head_y=1, n_layer=2, y_layer=1, **task.config_kwargs())
    assert cfg.vocab_size == 10 and cfg.block_size == 12 and cfg.aux_suffix_len == 2
    again = task_from_config(cfg)
    assert isinstance(again, SyntheticICL) and again.kwargs() == task.kwargs()
    b = again.get_batch(4, generator=gen())
    CGT(cfg).loss(b.inputs, b.targets, b.loss_mask, split=b.split)   # the batch fits the model
    assert task.decode([3, 7]) == ["u3", "→2"]


# ---------------------------------------------------------------------------- LinearRegression
@pytest.mark.parametrize("layout", ["pair", "split"])
def test_regression_targets_are_the_linear_function_of_x(layout):
    task = LinearRegression(dim=4, n_points=6, noise=0.0, layout=layout)
    b = task.get_batch(8, generator=gen())
    assert b.inputs.shape == (8, 12, 5) and b.targets.shape == (8, 12, 1)
    x, w = b.inputs[:, 0::2, :4], b.info["w"]
    y = torch.einsum("bnd,bd->bn", x, w) / 2.0
    assert torch.allclose(b.targets[:, 0::2, 0], y, atol=1e-5)
    assert torch.allclose(b.inputs[:, 1::2, 4], y, atol=1e-5)            # the y channel carries y_i
    assert (b.inputs[:, 0::2, 4] == 0).all()                             # x positions never show y
    if layout == "pair":                                                 # the y position repeats its own x
        assert torch.equal(b.inputs[:, 1::2, :4], x)
    else:
        assert (b.inputs[:, 1::2, :4] == 0).all()
    assert torch.equal(b.loss_mask[0], torch.tensor([True, False] * 6))
    assert (b.split % 2 == 0).all()
    assert torch.equal(task.get_batch(8, generator=gen()).inputs, b.inputs)
    assert task.decode(b.inputs[0, :2]) == ["x", f"y={float(y[0, 0]):.2f}"]
    assert task_from_config(CGTConfig(d_x=16, n_head=2, d_y=8, n_head_y=1, n_layer=2, y_layer=1,
                                      **task.config_kwargs())).layout == layout


def test_regression_layouts_hold_the_same_examples_and_reject_unknown_layouts():
    pair = LinearRegression(dim=3, n_points=5, layout="pair").eval_batch(3, 4, generator=gen(1))
    split = LinearRegression(dim=3, n_points=5, layout="split").eval_batch(3, 4, generator=gen(1))
    assert torch.equal(pair.targets, split.targets) and torch.equal(pair.loss_mask, split.loss_mask)
    assert torch.equal(pair.inputs[:, 0::2], split.inputs[:, 0::2])       # same x positions, the query too
    assert torch.equal(pair.inputs[:, 1::2, 3], split.inputs[:, 1::2, 3])
    assert LinearRegression().layout == "pair"


def test_regression_noise_and_eval_batch():
    task = LinearRegression(dim=4, n_points=6, noise=0.5)
    b = task.get_batch(256, generator=gen())
    y_clean = torch.einsum("bnd,bd->bn", b.inputs[:, 0::2, :4], b.info["w"]) / 2.0
    resid = b.targets[:, 0::2, 0] - y_clean
    assert 0.4 < float(resid.std()) < 0.6
    e = task.eval_batch(4, 3, generator=gen())
    assert e.inputs.shape == (3, 10, 5) and (e.split == 8).all()
    assert e.loss_mask.nonzero()[:, 1].unique().tolist() == [8]
    cfg = CGTConfig(d_x=16, n_head=2, d_y=8, n_head_y=1, n_layer=2, y_layer=1, **task.config_kwargs())
    assert cfg.input_dim == 5 and cfg.out_dim == 1
    CGT(cfg).loss(b.inputs[:4], b.targets[:4], b.loss_mask[:4], split=b.split[:4])


def test_regression_active_dims_curriculum():
    task = LinearRegression(dim=4, n_points=6, noise=0.0)
    full = task.get_batch(512, generator=gen(3))
    task.set_active_dims(2)
    b = task.get_batch(512, generator=gen(3))
    assert (b.inputs[..., 2:4] == 0).all() and (b.info["w"][:, 2:] == 0).all()
    assert torch.equal(b.inputs[:, 0::2, :2], full.inputs[:, 0::2, :2])    # the same draws, masked
    y = torch.einsum("bnd,bd->bn", b.inputs[:, 0::2, :4], b.info["w"]) / 2.0
    assert torch.allclose(b.targets[:, 0::2, 0], y, atol=1e-5)
    assert 0.85 < float(y.std()) < 1.15                                    # w rescaled: Var(y) stays ≈ 1
    assert (task.eval_batch(2, 8, generator=gen()).inputs[:, 0::2, 2:4] != 0).all()   # eval: the full task
    task.set_active_dims(None)
    assert torch.equal(task.get_batch(512, generator=gen(3)).inputs, full.inputs)

    grow = task.curriculum(10)
    assert task.active_dims == 1                                           # set at once, before step 1
    seen = []
    for step in range(1, 13):
        grow({"kind": "eval", "step": step, "val_main": 1.0})               # other events change nothing
        grow({"kind": "step", "step": step, "main": 1.0})
        seen.append(task.active_dims)
    assert seen == sorted(seen) and seen[0] < 4 and seen[9:] == [4, 4, 4]


# ---------------------------------------------------------------------------- TextMixture
def test_text_folder_corpus_labels_boundary_and_split(tmp_path):
    task = TextMixture(write_corpus(tmp_path), block_size=64, min_excerpt=8, val_fraction=0.34, tokenizer="bytes")
    assert task.topics == ["cats", "dogs", "fish"]
    b = task.get_batch(3, generator=gen(2))
    assert b.inputs.shape == b.targets.shape == (3, 64) and b.loss_mask is None
    assert torch.equal(b.targets[:, :-1], b.inputs[:, 1:])
    for row in range(3):
        c = int(b.info["boundary"][row])
        assert 8 <= c <= 57
        ta, tb = int(b.info["topic_a"][row]), int(b.info["topic_b"][row])
        assert ta != tb
        assert (b.info["topic"][row, :c] == ta).all() and (b.info["topic"][row, c:] == tb).all()
        # the text on each side of the boundary comes from a document of the labelled topic
        before, after = task.text(b.inputs[row, :c]), task.text(b.inputs[row, c:])
        assert task.topics[ta][:3] in before and task.topics[tb][:3] in after
        assert task.doc_names[int(b.info["doc_a"][row])].startswith(task.topics[ta] + "/")
    # split by document: val rows only use val documents, train rows only train documents
    for part in ("train", "val"):
        bb = task.get_batch(3, part=part, generator=gen(5))
        for key in ("doc_a", "doc_b"):
            assert (task.doc_is_val[bb.info[key]] == (part == "val")).all()
    with pytest.raises(ValueError, match="batch_size"):
        task.get_batch(4, part="val")                                   # 3 val documents only


def test_text_bbc_corpus_split_is_disjoint_and_deterministic(bbc):
    assert bbc.topics == ["business", "entertainment", "politics", "sports", "tech"]
    names_val = {n for n, v in zip(bbc.doc_names, bbc.doc_is_val.tolist()) if v}
    names_train = {n for n, v in zip(bbc.doc_names, bbc.doc_is_val.tolist()) if not v}
    assert not names_val & names_train and len(names_val) > 100 and len(names_train) > 1500
    again = TextMixture("bbc", block_size=128)
    assert again.doc_names == bbc.doc_names and torch.equal(again.doc_is_val, bbc.doc_is_val)
    b1, b2 = bbc.get_batch(4, generator=gen(7)), again.get_batch(4, generator=gen(7))
    assert torch.equal(b1.inputs, b2.inputs)
    assert "£" in bbc.text(bbc.data[:200_000])        # cp1252 pound signs were re-encoded as UTF-8
    e = bbc.eval_batch(100, 4, generator=gen())
    assert (e.split == 100).all() and e.loss_mask[:, 100:].all() and not e.loss_mask[:, :100].any()
    assert (bbc.doc_is_val[e.info["doc"]]).all()


def test_text_tokenizer_and_decode():
    task = TextMixture("bbc", block_size=128, tokenizer="bytes")
    tok = task.tokenizer
    assert isinstance(tok, ByteTokenizer) and tok.vocab_size == 256
    assert tok.decode(tok.encode("naïve £5\n")) == "naïve £5\n"
    assert task.decode(tok.encode("a b\n")) == ["a", "·", "b", "↵"]
    cfg_kw = task.config_kwargs()
    assert cfg_kw["vocab_size"] == 256 and cfg_kw["extra"]["task"]["source"] == "bbc"
    assert isinstance(task_from_config(cfg_kw), TextMixture)


def test_text_bad_corpora(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty"):
        TextMixture(tmp_path / "empty")
    root = write_corpus(tmp_path / "few", topics=("a", "b"), n_docs=2)
    (root / "c").mkdir()
    (root / "c" / "only.txt").write_text("x" * 400)
    with pytest.raises(ValueError, match="topic 'c' has 1 training and 0 validation document"):
        TextMixture(root, block_size=64, tokenizer="bytes")
    one = write_corpus(tmp_path / "one", topics=("a",), n_docs=3)
    with pytest.raises(ValueError, match="at least two topics"):
        TextMixture(one, block_size=64, tokenizer="bytes")
    ok = write_corpus(tmp_path / "ok", topics=("a", "b"), n_docs=2)
    with pytest.raises(ValueError, match="block_size"):
        TextMixture(ok, block_size=1000, tokenizer="bytes")                                # documents too short


def test_registry_errors():
    with pytest.raises(ValueError, match="task"):
        task_from_config(CGTConfig(vocab_size=4, block_size=8))
    assert isinstance(make_task("regression", dim=3), LinearRegression)


def test_a_regression_model_saved_before_layouts_rebuilds_its_split_layout():
    kw = LinearRegression(dim=2, n_points=4, layout="split").config_kwargs()
    old = {**kw, "extra": {"task": {k: v for k, v in kw["extra"]["task"].items() if k != "layout"}}}
    assert "layout" not in old["extra"]["task"]
    assert task_from_config(old).layout == "split"
    assert task_from_config(LinearRegression(dim=2, n_points=4).config_kwargs()).layout == "pair"


def test_icl_curriculum_falls_from_shifts_to_the_task_share_and_eval_ignores_it():
    task = SyntheticICL(answer_tokens="value", shift_fraction=0.2)
    grow = task.curriculum(100)
    assert task.shift_fraction == 1.0
    shifts = lambda: float((task.get_batch(4000, generator=torch.Generator().manual_seed(0)).info["task_params"][:, 0] == 1)
                           .float().mean())
    assert shifts() == 1.0                                                  # every row a pure shift at the start
    grow({"kind": "step", "step": 50})
    assert task.shift_fraction == pytest.approx(0.6)
    grow({"kind": "eval", "step": 100})                                     # only steps move it
    assert task.shift_fraction == pytest.approx(0.6)
    grow({"kind": "step", "step": 300})
    assert task.shift_fraction == pytest.approx(0.2)                         # the task's own share after `steps`
    assert 0.25 < shifts() < 0.4                                           # 0.2 + 0.8 · (1 of the 6 units is 1)
    evaluated = task.eval_batch(8, 4000, generator=torch.Generator().manual_seed(0)).info["task_params"][:, 0]
    assert 0.1 < float((evaluated == 1).float().mean()) < 0.23               # uniform over a: 1 in 6
