"""The recipe of each built-in task: what its notebook trains, and what `python -m cgt_viz train --task NAME`
uses by default (flags override any of it). docs/results.md measures these recipes.

    task    task constructor arguments          model   CGTConfig fields (beside the task's own)
    train   TrainConfig fields                  curriculum  updates over which regression's live dimensions grow
"""
from __future__ import annotations

from typing import Any

_SMALL = dict(n_layer=4, d_x=64, n_head=4, d_y=32, n_head_y=2, y_layer=2, n_templates=16, template_rank=1)

RECIPES: dict[str, dict[str, Any]] = {
    "icl": {"task": {}, "model": dict(_SMALL, sites=("attn_in", "mlp_in")),
            "train": dict(steps=2000, batch_size=32, lr=1e-3, aux_delay=500, aux_ramp=250)},
    "regression": {"task": dict(dim=4, n_points=16, noise=0.1),
                   "model": dict(_SMALL, sites=("attn_in", "attn_out", "mlp_in", "mlp_out")),
                   "train": dict(steps=3000, batch_size=32, lr=1e-3, aux_delay=500, aux_ramp=250),
                   "curriculum": 1000},
    "text": {"task": {}, "model": dict(n_layer=4, d_x=128, n_head=4, d_y=64, n_head_y=2, y_layer=2, n_templates=8,
                                       template_rank=2),
             "train": dict(steps=1500, batch_size=32, lr=1e-3)},
}
