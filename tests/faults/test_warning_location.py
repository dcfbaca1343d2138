"""Issue 34 (docs site): evaluate_specialization's noise-floor warning named torch's _contextlib.py (the
decorators between it and the caller), an install path that reached the rendered tutorial pages. It names
the caller's line."""
from __future__ import annotations

import warnings

import torch

from cgt_viz import CGT, CGTConfig
from cgt_viz.evaluate import evaluate_specialization
from cgt_viz.tasks import make_task


def test_the_noise_floor_warning_names_the_callers_line():
    torch.manual_seed(0)
    task = make_task("icl")
    model = CGT(CGTConfig(**task.config_kwargs(), n_layer=2, d_x=16, d_y=8, y_layer=1, n_templates=2, n_head=2, n_head_y=2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        evaluate_specialization(model, task, k_values=(4,), n_batches=1, batch_size=4)
    noise = [w for w in caught if "noise floor" in str(w.message)]
    assert noise and all(w.filename == __file__ for w in noise), [(w.filename, w.lineno) for w in noise]


def test_trains_aux_delay_warning_names_the_callers_line():
    """train is @checked: its wrapper is one more frame between the warning and the caller."""
    from cgt_viz.train import AuxDelayWarning, train
    task = make_task("icl", n_pairs=6)
    model = CGT(CGTConfig(**task.config_kwargs(), n_layer=2, d_x=16, n_head=2, d_y=8, n_head_y=1, y_layer=1,
                          n_templates=2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(model, task, steps=1, batch_size=2, aux_delay=5, progress=False, device="cpu")
    delay = [w for w in caught if issubclass(w.category, AuxDelayWarning)]
    assert delay and all(w.filename == __file__ for w in delay), [(w.filename, w.lineno) for w in delay]
