"""Issue 34 (low): notebook 01's loss-per-position view was dominated by positions no model can predict
(the random inputs u of synthetic ICL). Given the task's batch, compile-and-compare scores only the positions
its loss mask marks, and the figure's lines join the scored positions."""
from __future__ import annotations

import numpy as np
import torch

import cgt_viz
from cgt_viz import CGT, CGTConfig
from cgt_viz.figures import compare_figure
from cgt_viz.tasks import make_task


def test_a_batch_scores_only_the_masked_positions_and_the_lines_join_them():
    torch.manual_seed(0)
    task = make_task("icl")
    model = CGT(CGTConfig(**task.config_kwargs(), n_layer=2, d_x=16, d_y=8, y_layer=1, n_templates=2, n_head=2, n_head_y=2))
    rows = task.get_batch(4, part="val", generator=torch.Generator().manual_seed(0))
    split = 16
    losses = cgt_viz.CompileCompare(model, rows, split=split).losses()
    scored = rows.loss_mask[:, split:].any(0).numpy()
    assert 0 < scored.sum() < len(scored)                                  # some positions are never scored
    for key in ("prompted", "specialized", "no_context"):
        assert np.isnan(losses[key][~scored]).all() and np.isfinite(losses[key][scored]).all()
    everything = cgt_viz.CompileCompare(model, rows.inputs, split=split).losses()
    assert np.isfinite(everything["prompted"]).sum() > scored.sum()        # raw ids: every position with a target
    fig = compare_figure(losses)
    assert all(t.connectgaps for t in fig.data)
