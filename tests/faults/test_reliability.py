"""Edge cases from the reliability audit (issue 7) that no single module's tests own: widgets on a model
left in training mode, a very large point cloud, empty and single-point selections, and determinism."""
from __future__ import annotations

import numpy as np
import torch

from cgt_viz import CGT, CGTConfig, explore
from cgt_viz import analysis as A
from cgt_viz.figures import ybar_map_figure


def dropout_cgt():
    torch.manual_seed(0)
    cfg = CGTConfig(vocab_size=256, block_size=32, n_layer=3, d_x=16, n_head=2, d_y=8, n_head_y=1, y_layer=1,
                    n_templates=2, dropout=0.3)
    return CGT(cfg)


def test_views_of_a_model_in_training_mode_are_deterministic_and_leave_its_mode_alone():
    model = dropout_cgt().train()
    data = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(0))
    first = A.collect_ybar(model, data)
    second = A.collect_ybar(model, data)
    assert model.training, "collecting ȳ must restore training mode"
    np.testing.assert_array_equal(first, second)  # dropout off while collecting
    with torch.no_grad():
        np.testing.assert_allclose(first, model.eval().context(data).numpy(), rtol=1e-5, atol=1e-6)


def test_two_hundred_thousand_points_are_subsampled_visibly_not_silently():
    rng = np.random.default_rng(0)
    n = 200_000
    labels = rng.integers(0, 5, n)
    keep = A.stratified_subsample(labels, cap=50_000)
    assert len(keep) == 50_000 and len(np.unique(keep)) == 50_000
    shares = np.bincount(labels[keep], minlength=5) / len(keep)
    np.testing.assert_allclose(shares, np.bincount(labels, minlength=5) / n, atol=0.01)
    fig = ybar_map_figure(rng.normal(size=(n, 2)), labels, note=f"showing 50,000 of {n:,} tokens")
    assert sum(len(tr.x) for tr in fig.data) == n
    assert type(fig.data[0]).__name__ == "Scattergl"


def test_empty_and_single_point_selections():
    model = dropout_cgt().eval()
    data = torch.randint(0, 256, (3, 12), generator=torch.Generator().manual_seed(1))
    ex = explore(model, data, background=None)
    ex.select([])
    assert len(ex.selection) == 0 and list(ex.selection.columns)[:3] == ["point", "sequence", "position"]
    ex.select([5])
    assert len(ex.selection) == 1 and int(ex.selection["point"][0]) == 5


def test_same_seed_same_loss_curve_twice():
    from cgt_viz.tasks import make_task
    from cgt_viz.train import train
    task = make_task("icl", n_pairs=6)
    curves = []
    for _ in range(2):
        torch.manual_seed(3)
        cfg = CGTConfig(**task.config_kwargs(), n_layer=2, d_x=16, n_head=2, d_y=8, n_head_y=1, y_layer=1,
                        n_templates=2, dropout=0.1)
        _, history = train(CGT(cfg), task, steps=6, batch_size=8, seed=3, progress=False)
        curves.append(history["total"])
    assert curves[0] == curves[1]
