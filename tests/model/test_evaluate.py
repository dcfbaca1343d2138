"""Evaluation: the gap-closed formula, probes, seed statistics, smoothness, and every column on tiny models."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cgt_viz import CGT, GPT, CGTConfig
from cgt_viz.evaluate import (MODES, collect_excerpt_ends, collect_summaries, evaluate_specialization, gap_closed,
                              knn_topic_accuracy, linear_probe, mean_ci, seeds_summary, smoothness_stats,
                              text_position_curves)
from cgt_viz.tasks import LinearRegression, SyntheticICL, TextMixture

TINY = dict(d_x=16, n_head=2, n_layer=3, d_y=8, n_head_y=1, y_layer=1, n_templates=2)


def tiny_model(task, seed=0, perturb=True):
    torch.manual_seed(seed)
    model = CGT(CGTConfig(**TINY, **task.config_kwargs()))
    if perturb:   # non-zero template coefficients, so the specialised model differs from x_only
        with torch.no_grad():
            for _, temps in model.templates.items():
                for site in temps.values():
                    site.coeff.weight.normal_(0, 0.5)
    return model


# ---------------------------------------------------------------------------- formula and statistics
def test_gap_closed_formula():
    assert gap_closed(2.0, 1.0, 0.0) == pytest.approx(0.5)
    assert gap_closed(2.0, 0.5, 1.0) == pytest.approx(1.5)       # specialised beats prompted
    assert gap_closed(2.0, 2.5, 1.0) == pytest.approx(-0.5)      # specialised worse than nothing
    assert math.isnan(gap_closed(1.0, 0.5, 1.0))                  # the prompt does not help: undefined
    assert math.isnan(gap_closed(1.0, 0.5, 1.5))


def test_mean_ci_and_seeds_summary():
    mean, half = mean_ci([1.0, 2.0, 3.0])
    assert mean == pytest.approx(2.0) and half == pytest.approx(4.302653 / math.sqrt(3), rel=1e-5)
    assert math.isnan(mean_ci([5.0])[1]) and math.isnan(mean_ci([])[0])
    runs = [[{"k": 4, "g": 0.5, "acc": 0.9, "name": "x"}, {"k": 8, "g": 0.7, "acc": 1.0, "name": "x"}],
            [{"k": 4, "g": 0.7, "acc": 0.8, "name": "x"}, {"k": 8, "g": 0.9, "acc": 1.0, "name": "x"}]]
    rows = {r["k"]: r for r in seeds_summary(runs)}
    assert rows[4]["n_seeds"] == 2 and rows[4]["g_mean"] == pytest.approx(0.6)
    assert rows[8]["acc_ci95"] == pytest.approx(0.0) and "name_mean" not in rows[4]


def test_smoothness_stats():
    const = np.ones((10, 4))
    s = smoothness_stats(const)
    assert s["mean_step_norm"] == pytest.approx(0.0) and s["mean_cosine"] == pytest.approx(1.0)
    flip = np.stack([np.ones(4) * (-1) ** i for i in range(6)])[None]     # (1, 6, 4), sign flips every token
    s = smoothness_stats(flip)
    assert s["mean_cosine"] == pytest.approx(-1.0) and s["mean_step_norm"] == pytest.approx(4.0)


# ---------------------------------------------------------------------------- probes
def test_linear_probe_decodes_linearly_encoded_parameters_and_not_noise():
    rng = np.random.default_rng(0)
    params = np.stack([rng.integers(1, 7, 600), rng.integers(0, 7, 600)], 1)          # (a, b)
    onehot = np.concatenate([np.eye(7)[params[:, 0]], np.eye(7)[params[:, 1]]], 1)     # (n, 14)
    feats = onehot @ rng.normal(size=(14, 32)) + 0.05 * rng.normal(size=(600, 32))      # ȳ-like, linear code
    good = linear_probe(feats, params)
    assert good["kind"] == "classification" and min(good["scores"]) > 0.95
    noise = linear_probe(rng.normal(size=(600, 32)), params)
    assert max(noise["scores"]) < 0.35
    w = rng.normal(size=(600, 16))
    reg = linear_probe(w @ rng.normal(size=(16, 32)) + 0.01 * rng.normal(size=(600, 32)), w)
    assert reg["kind"] == "regression" and reg["mean"] > 0.95
    assert linear_probe(rng.normal(size=(600, 32)), w)["mean"] < 0.1


def test_knn_topic_accuracy_separates_clusters():
    rng = np.random.default_rng(1)
    labels = np.repeat(np.arange(4), 30)
    centres = rng.normal(size=(4, 8)) * 5
    assert knn_topic_accuracy(centres[labels] + rng.normal(size=(120, 8)), labels) > 0.95
    assert knn_topic_accuracy(rng.normal(size=(120, 8)), labels) < 0.5


# ---------------------------------------------------------------------------- on tiny models
@pytest.mark.parametrize("task", [SyntheticICL("affine", P=5, n_pairs=8), LinearRegression(dim=3, n_points=8)])
def test_evaluate_specialization_returns_every_column(task):
    model = tiny_model(task)
    baseline = GPT(model.config)
    rows = evaluate_specialization(model, task, k_values=(2, 4), n_batches=2, batch_size=8, baseline=baseline)
    assert [r["k"] for r in rows] == [2, 4]
    for r in rows:
        for mode in MODES:
            assert np.isfinite(r[f"loss_{mode}"])
            assert np.isfinite(r[f"acc_{mode}"]) == (task.name == "icl")
        assert r["n_scored"] == 16
        assert r["gap_closed"] == pytest.approx(gap_closed(r["loss_no_context"], r["loss_specialized"],
                                                           r["loss_prompted"]), nan_ok=True)
        assert r["spec_merge_max_diff"] < 1e-4                    # merged GPT == forward_specialized
        assert r["loss_specialized"] != r["loss_no_context"]
    # deterministic in seed, and the model is left in the mode it was in
    model.train()
    again = evaluate_specialization(model, task, k_values=(2, 4), n_batches=2, batch_size=8, baseline=baseline)
    assert model.training
    assert again[0]["loss_prompted"] == rows[0]["loss_prompted"]


def test_untrained_cgt_specialised_equals_no_context():
    task = SyntheticICL("shift", P=5, n_pairs=6)
    model = tiny_model(task, perturb=False)                      # T = I: compiling changes nothing
    row = evaluate_specialization(model, task, k_values=3, n_batches=1, batch_size=8)[0]
    assert row["loss_specialized"] == pytest.approx(row["loss_no_context"], abs=1e-6)
    assert "loss_baseline" not in row and "acc_baseline" not in row    # no baseline: no baseline columns
    # the prompt cannot help an untrained T = I model: G is NaN, with the reason, and a warning
    assert math.isnan(row["gap_closed"]) and "noise floor 0.01" in row["gap_closed_note"]


def test_gap_closed_is_nan_under_the_noise_floor():
    assert math.isnan(gap_closed(2.004, 2.025, 2.0))              # 0.004 nats of help: G would be −5.25
    assert gap_closed(2.004, 2.025, 2.0, eps=1e-3) == pytest.approx(-5.25)
    from cgt_viz.evaluate import gap_note
    assert gap_note(2.5, 2.0) == "" and "0.004" in gap_note(2.004, 2.0)


def test_collect_summaries_and_probe_shapes():
    task = SyntheticICL("affine", P=5, n_pairs=8)
    feats, params = collect_summaries(tiny_model(task), task, k=4, n_batches=2, batch_size=16)
    assert feats.shape == (32, 8) and params.shape == (32, 2)
    res = linear_probe(feats, params)
    assert len(res["scores"]) == 2 and all(0 <= s <= 1 for s in res["scores"])
    feats, w = collect_summaries(tiny_model(LinearRegression(dim=3, n_points=6)), LinearRegression(dim=3, n_points=6),
                                 k=3, n_batches=1, batch_size=16)
    assert feats.shape == (16, 8) and w.shape == (16, 3)


def test_text_curves_and_excerpt_ends(tmp_path):
    for topic in ("cats", "dogs"):
        (tmp_path / topic).mkdir()
        for d in range(3):
            (tmp_path / topic / f"{d}.txt").write_text(f"{topic} number {d} says hello. " * 10)
    task = TextMixture(tmp_path, block_size=32, min_excerpt=4, val_fraction=0.34)
    model = tiny_model(task)
    curves = text_position_curves(model, task, n_batches=1, batch_size=2, part="train")
    assert curves["boundary"] == 16 and curves["split"] == 8
    assert curves["positions"].tolist() == list(range(8, 32))
    for mode in ("prompted", "specialized", "no_context"):
        assert curves[f"loss_{mode}"].shape == (24,) and np.isfinite(curves[f"loss_{mode}"]).all()
    row = evaluate_specialization(model, task, k_values=(4,), n_batches=1, batch_size=2)[0]   # prompt = 4 bytes
    assert row["n_scored"] == 2 * (32 - 4) and np.isfinite(row["acc_specialized"])
    feats, labels = collect_excerpt_ends(model, task, n_batches=2, batch_size=2, part="train")
    assert feats.shape == (8, 8) and labels.shape == (8,) and set(labels.tolist()) <= {0, 1}


def test_knn_grouped_folds_never_judge_a_row_by_its_own_group():
    """Rows of one group (say, excerpts of one document) share their features and their label: ungrouped folds
    find a row's own group among its neighbours; grouped folds cannot, so the labels drawn at random per group
    are then guessed at chance."""
    rng = np.random.default_rng(0)
    group = np.repeat(np.arange(60), 4)                                    # 60 groups of 4 rows
    label = rng.integers(0, 3, 60)[group]
    features = rng.normal(size=(60, 16))[group] + 0.01 * rng.normal(size=(240, 16))
    assert knn_topic_accuracy(features, label, n_neighbors=1) > 0.9
    grouped = knn_topic_accuracy(features, label, n_neighbors=1, groups=group)
    assert grouped < 0.6
    with pytest.raises(ValueError, match="groups"):
        knn_topic_accuracy(features, label, groups=group[:10])
