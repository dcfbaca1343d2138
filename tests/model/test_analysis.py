"""cgt_viz.analysis: input normalisation, ȳ collection, projections, subsampling, smoothness, templates."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cgt_viz import CGT, CGTConfig
from cgt_viz import analysis as A
from cgt_viz.tasks.base import Batch, Task
from helpers import randomize_templates


def tiny_cgt(vocab_size=256, seed=0, randomize=True, **kw) -> CGT:
    cfg = CGTConfig(vocab_size=vocab_size, block_size=48, n_layer=3, d_x=32, n_head=2, d_y=16, n_head_y=2,
                    y_layer=1, n_templates=4, **kw)
    torch.manual_seed(seed)
    model = CGT(cfg).eval()
    return randomize_templates(model, bias_std=0.2) if randomize else model   # give the templates something to do


class TopicTask(Task):
    """Two 'topics' per row, tokens drawn from disjoint halves of the vocabulary, boundary at 10."""

    name = "topic-test"
    topics = ["low", "high"]

    def config_kwargs(self):
        return {"vocab_size": 256, "block_size": 48}

    def get_batch(self, batch_size, part="train", generator=None, device="cpu"):
        low = torch.randint(0, 128, (batch_size, 10), generator=generator)
        high = torch.randint(128, 256, (batch_size, 14), generator=generator)
        seq = torch.cat([low, high], 1)
        topic = torch.cat([torch.zeros(batch_size, 10, dtype=torch.long), torch.ones(batch_size, 14, dtype=torch.long)], 1)
        targets = torch.roll(seq, -1, 1)
        return Batch(seq, targets, None, None, {"topic": topic, "boundary": torch.full((batch_size,), 10)})


@pytest.fixture(scope="module")
def model():
    return tiny_cgt()


# ---------------------------------------------------------------------------------------------- inputs
def test_prepare_tokens_strings_and_task(model):
    idx = torch.randint(0, 256, (3, 12))
    seqs = A.prepare_sequences(model, idx, labels=["a", "b", "c"])
    assert seqs.inputs.shape == (3, 12) and seqs.lengths.tolist() == [12, 12, 12]
    assert seqs.token_labels.shape == (3, 12) and set(seqs.token_labels[1]) == {"b"}

    strings = A.prepare_sequences(model, ["hi there", "a much longer string"])
    assert strings.lengths.tolist() == [8, 20] and strings.inputs.shape == (2, 20)
    assert "".join(strings.token_text[0]) == "hi there"
    assert strings.inputs[0, 8:].eq(0).all()                      # right padding
    targets, _ = strings.scoring()
    assert (targets[0, 7:] == A.IGNORE_INDEX).all() and targets[0, 0] == ord("i")

    from_task = A.prepare_sequences(model, TopicTask(), n_batches=2, batch_size=3)
    assert from_task.n == 6 and from_task.boundary.tolist() == [10] * 6
    assert from_task.token_labels[0, 9] == "low" and from_task.token_labels[0, 10] == "high"
    assert from_task.targets is not None


def test_padding_does_not_change_earlier_ybar(model):
    """ȳ is causal: a short string's ȳ inside a padded batch equals its ȳ computed alone."""
    both = A.prepare_sequences(model, ["short one", "a considerably longer sentence"])
    alone = A.prepare_sequences(model, ["short one"])
    yb_both, yb_alone = A.collect_ybar(model, both.inputs), A.collect_ybar(model, alone.inputs)
    assert np.allclose(yb_both[0, :9], yb_alone[0], atol=1e-5)
    assert np.allclose(A.collect_ybar(model, both.inputs, batch_size=1), yb_both, atol=1e-5)
    direct = model.context(both.inputs).detach().numpy()
    assert np.allclose(yb_both, direct, atol=1e-5)


def test_collect_cache_and_names(model):
    idx = torch.randint(0, 256, (2, 6))
    out = A.collect_cache(model, idx, ["ybar", "coeffs.2.attn_in"])
    assert out["ybar"].shape == (2, 6, 16) and out["coeffs.2.attn_in"].shape == (2, 6, 4)


# ---------------------------------------------------------------------------------------------- points
def test_select_positions_modes():
    lengths = np.array([6, 4])
    seq, pos = A.select_positions(lengths, "all")
    assert len(seq) == 10 and pos[:6].tolist() == list(range(6))
    seq, pos = A.select_positions(lengths, "ends", boundary=np.array([3, -1]))
    assert list(zip(seq.tolist(), pos.tolist())) == [(0, 2), (0, 5), (1, 3)]
    seq, pos = A.select_positions(lengths, 2)
    assert pos.tolist() == [1, 3, 5, 1, 3]
    seq, pos = A.select_positions(lengths, [0, 5])
    assert list(zip(seq.tolist(), pos.tolist())) == [(0, 0), (0, 5), (1, 0)]


def test_collect_points_hover_and_half(model):
    seqs = A.prepare_sequences(model, ["ab<cd", "xyz"], labels=["one", "two"], boundary=[2, -1])
    pts = A.collect_points(seqs, A.collect_ybar(model, seqs.inputs))
    assert len(pts) == 8 and pts.ybar.shape == (8, 16)
    i = int(np.nonzero((pts.seq == 0) & (pts.pos == 2))[0][0])
    assert pts.token[i] == "<" and "<b>[&lt;]</b>" in pts.hover[i] and "label: one" in pts.hover[i]
    assert pts.half[pts.seq == 0].tolist() == [0, 0, 1, 1, 1]
    assert pts.half[pts.seq == 1].tolist() == [0, 0, 1]                  # no boundary: halves of the row
    df = pts.frame(np.array([i]), np.zeros((8, 2)))
    assert df.loc[0, ["sequence", "position", "token", "label"]].tolist() == [0, 2, "<", "one"]
    sub = pts.take(np.array([1, 0]))
    assert sub.pos.tolist() == [1, 0] and len(A.Points.concat(pts, sub)) == 10


def test_concat_sequences_pads_and_keeps_scoring(model):
    a = A.prepare_sequences(model, ["abc"], labels=["x"])
    b = A.prepare_sequences(model, ["longer text"])
    both = A.concat_sequences(a, b)
    assert both.inputs.shape == (2, 11) and both.lengths.tolist() == [3, 11]
    assert both.token_labels[0, 0] == "x" and both.token_labels[1, 0] is None
    targets, _ = both.scoring()
    assert (targets[0, 2:] == A.IGNORE_INDEX).all()


# ---------------------------------------------------------------------------------------------- projections
def test_pca_matches_sklearn_and_transform_is_consistent():
    from sklearn.decomposition import PCA
    X = np.random.default_rng(0).normal(size=(200, 8)) * np.arange(1, 9)
    proj = A.Projector("pca")
    Y = proj.fit_transform(X)
    ref = PCA(2).fit_transform(X)
    assert np.allclose(np.abs(Y), np.abs(ref), atol=1e-3)
    assert np.allclose(proj.transform(X[:5]), Y[:5], atol=1e-4)
    assert Y[:, 0].var() > Y[:, 1].var()


def test_tsne_transform_places_known_points_on_their_embedding():
    X = np.random.default_rng(1).normal(size=(60, 5)).astype(np.float32)
    proj = A.Projector("tsne", perplexity=5.0)
    Y = proj.fit_transform(X)
    assert Y.shape == (60, 2)
    assert np.allclose(proj.transform(X[:4]), Y[:4], atol=1e-3)


def test_projector_errors():
    with pytest.raises(ValueError, match="not fitted"):
        A.Projector("pca").transform(np.zeros((3, 4)))
    assert A.Projector("pca").fit_transform(np.random.rand(5, 1)).shape == (5, 2)    # d_y = 1: flat second axis


def test_stratified_subsample_keeps_every_stratum_in_proportion():
    strata = np.array(["big"] * 900 + ["mid"] * 95 + ["tiny"] * 5)
    idx = A.stratified_subsample(strata, 100, seed=3)
    assert len(idx) == 100 and np.all(np.diff(idx) > 0)
    kept = dict(zip(*np.unique(strata[idx], return_counts=True)))
    assert set(kept) == {"big", "mid", "tiny"} and 85 <= kept["big"] <= 91 and kept["tiny"] >= 1
    assert np.array_equal(A.stratified_subsample(strata, 5000), np.arange(1000))
    many = np.arange(50)                                         # more strata than the cap
    assert len(A.stratified_subsample(many, 10)) == 10


# ---------------------------------------------------------------------------------------------- smoothness
def test_token_smoothness():
    y = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 2.0], [0.0, -2.0]])
    step, cos = A.token_smoothness(y)
    assert np.isnan(step[0]) and np.isnan(cos[0])
    assert np.allclose(step[1:], [0.0, np.sqrt(5), 4.0]) and np.allclose(cos[1:], [1.0, 0.0, -1.0])
    batched = A.token_smoothness(np.stack([y, y * 3]))[0]
    assert batched.shape == (2, 4) and np.allclose(batched[1, 1:], 3 * step[1:])


# ---------------------------------------------------------------------------------------------- templates
def test_parse_site(model):
    assert A.parse_site(model, "3.mlp_in") == (3, "mlp_in") == A.parse_site(model, (3, "mlp_in"))


def test_site_coefficients_and_means(model):
    ybar = np.random.default_rng(0).normal(size=(7, 16)).astype(np.float32)
    c = A.site_coefficients(model, ybar, "2.attn_in")
    ref = model.coefficients(torch.from_numpy(ybar))["2.attn_in"].detach().numpy()
    assert np.allclose(c, ref, atol=1e-6)
    names, table = A.mean_abs_by_label(c, np.array(["a", "b", "a", "a", "b", "b", "b"]))
    assert names == ["a", "b"] and np.allclose(table[0], np.abs(c[[0, 2, 3]]).mean(0))


def test_delta_w_singular_values_match_the_dense_update(model):
    y = torch.randn(16)
    sv = A.delta_w_singular_values(model, y.numpy(), "3.mlp_in")
    lora_a, lora_b = model.lora_factors(y)["blocks.2.mlp.c_fc.weight"]
    dense = torch.linalg.svdvals((lora_b @ lora_a).double())[:4].detach().numpy()
    assert sv.shape == (4,) and np.allclose(sv, dense, rtol=1e-4, atol=1e-6)
    assert np.allclose(A.delta_w_singular_values(tiny_cgt(randomize=False), y.numpy(), "3.mlp_in"), 0)


def test_ablate_switches_a_template_off_without_touching_the_model(model):
    idx = torch.randint(0, 256, (2, 12))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    zeroed = copy.deepcopy(model)
    with torch.no_grad():                       # the same template switched off by editing its coefficient row
        zeroed.templates["2"]["attn_in"].coeff.weight[1] = 0
        zeroed.templates["2"]["attn_in"].coeff.bias[1] = 0
    ablated = model(idx, ablate={"2.attn_in": [1]})
    assert torch.allclose(ablated, zeroed(idx), atol=1e-6)
    assert not torch.allclose(ablated, model(idx), atol=1e-4)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    _, cache = model.run_with_cache(idx, names="coeffs.2.*", ablate={"2.attn_in": 1})
    assert sorted(cache) == ["coeffs.2.attn_in", "coeffs.2.mlp_in"] and (cache["coeffs.2.attn_in"][..., 1] == 0).all()


def test_template_ablation_measures_only_that_template(model):
    idx = torch.randint(0, 256, (4, 16))
    targets = torch.roll(idx, -1, 1)
    dead = tiny_cgt()
    with torch.no_grad():                                            # template 2 never fires at this site
        dead.templates["3"]["attn_in"].coeff.weight[2] = 0
        dead.templates["3"]["attn_in"].coeff.bias[2] = 0
    out = A.template_ablation(dead, idx, targets, "3.attn_in")
    assert out["templates"].tolist() == [0, 1, 2, 3] and out["delta"][2] == 0
    assert np.abs(out["delta"]).max() > 0
    main = dead.loss(idx, targets, split=5)["main"].item()
    assert out["base"] == pytest.approx(main, rel=1e-5)
    assert dead.training is False and len(A.template_ablation(dead, idx, targets, "3.attn_in", templates=[1])["delta"]) == 1


# ---------------------------------------------------------------------------------------------- compare
def test_compare_losses_match_the_three_models(model):
    idx = torch.randint(0, 256, (3, 20))
    targets = torch.roll(idx, -1, 1)
    out = A.compare_losses(model, idx, targets, 8)
    assert out["position"].tolist() == list(range(8, 20))

    def ce(logits, tgt):
        return F.cross_entropy(logits.transpose(1, 2), tgt, reduction="none").mean(0).detach().numpy()
    assert np.allclose(out["prompted"], ce(model(idx)[:, 8:], targets[:, 8:]), atol=1e-5)
    assert np.allclose(out["specialized"], ce(model.aux_logits(idx, 8), targets[:, 8:]), atol=1e-5)
    assert np.allclose(out["no_context"], ce(model.x_only()(idx[:, 8:]), targets[:, 8:]), atol=1e-5)
    plain = tiny_cgt(randomize=False)                                   # T = I: specialised is no-context
    same = A.compare_losses(plain, idx, targets, 8)
    assert np.allclose(same["specialized"], same["no_context"], atol=1e-5)


def test_compare_losses_respect_the_mask(model):
    idx = torch.randint(0, 256, (2, 10))
    targets = torch.roll(idx, -1, 1)
    mask = torch.zeros(2, 10, dtype=torch.bool)
    mask[:, 6] = True
    out = A.compare_losses(model, idx, targets, 4, loss_mask=mask)
    assert np.isnan(out["prompted"][0]) and not np.isnan(out["prompted"][2])


# ---------------------------------------------------------------------------------------------- training
def test_training_series_from_every_history_shape():
    records = [{"kind": "step", "step": s, "main": 1.0 / (s + 1), "aux": 0.5, "smooth": 0.0, "total": 2.0, "lr": 1e-3}
               for s in range(5)] + [{"kind": "eval", "step": 4, "val_main": 0.3}, {"kind": "end", "step": 5}]
    steps, evals = A.training_series(records)
    assert set(steps) == {"main", "aux", "smooth", "total"} and steps["main"][0].tolist() == [0, 1, 2, 3, 4]
    assert evals["val_main"][1].tolist() == [0.3]
    from cgt_viz.train import TrainHistory
    hist = TrainHistory(step=[1, 2], main=[2.0, 1.0], aux=[1.0, 1.0], smooth=[0.0, 0.0], total=[3.0, 2.0],
                        lr=[1e-3, 1e-3], grad_norm=[1.0, 1.0], evals=[{"step": 2, "val_acc": 0.5}])
    steps, evals = A.training_series(hist)
    assert steps["main"][1].tolist() == [2.0, 1.0] and evals["val_acc"][0].tolist() == [2]
    steps, _ = A.training_series(hist.to_dict())
    assert steps["total"][1].tolist() == [3.0, 2.0]


def test_vectors_model_with_default_output_dim_is_scored():
    """output_dim left to default (= input_dim): targets (n, t, input_dim) are what the loss takes."""
    torch.manual_seed(0)
    model = CGT(CGTConfig(input_dim=3, block_size=16, n_layer=3, d_x=16, n_head=2, d_y=8, n_head_y=1, y_layer=1,
                          n_templates=2)).eval()
    inputs, targets = torch.randn(2, 10, 3), torch.randn(2, 10, 3)
    out = A.compare_losses(model, inputs, targets, 4)
    for key in ("prompted", "specialized", "no_context"):
        assert out[key].shape == (6,) and np.isfinite(out[key]).all()
    ablation = A.template_ablation(model, inputs, targets, "2.attn_in")
    with torch.no_grad():
        np.testing.assert_allclose(ablation["base"], model.loss(inputs, targets)["main"].item(), rtol=1e-5)
