"""The plateau detector: a run whose main loss sits at the task's no-information level says so in words."""
from __future__ import annotations

import math
import os
import signal
import warnings

import pytest
import torch

from cgt_viz import CGT, CGTConfig
from cgt_viz.plateau import NoInformationLoss, PlateauDetector, PlateauWarning
from cgt_viz.tasks import make_task
from cgt_viz.train import TrainHistory, train
from helpers import TinyTask

QUIET = dict(progress=False, device="cpu")


class ShiftTask(TinyTask):
    """TinyTask, whose no-information level is ln P (a uniform guess over the P answers), or `level`."""

    def __init__(self, P: int = 5, n_pairs: int = 5, level: float | None = None):
        super().__init__(P, n_pairs)
        self.level = level

    def no_information_loss(self):
        level = math.log(self.P) if self.level is None else self.level
        return NoInformationLoss(level, f"ln {self.P}", "Likely cause: a test <b>hint</b>.")


def model_for(task, seed=0):
    torch.manual_seed(seed)
    return CGT(CGTConfig(**task.config_kwargs(), n_layer=2, d_x=16, n_head=2, d_y=8, n_head_y=1, y_layer=1,
                         n_templates=2, mlp_ratio=2))


def test_the_detector_fires_once_after_patience_updates_at_the_level_and_resets_when_the_loss_leaves():
    ref = NoInformationLoss(2.0, "ln e² = 2", "try X")
    det = PlateauDetector(ref, patience=10, tolerance=0.01, window=1)
    assert [det.update(s, 2.0) for s in range(1, 10)] == [None] * 9
    message = det.update(10, 2.0)
    assert message is not None and "ln e² = 2" in message and "try X" in message and "10 updates" in message
    assert det.update(11, 2.0) is None                                   # once per run
    det = PlateauDetector(ref, patience=10, tolerance=0.01, window=1)
    for s in range(1, 10):
        det.update(s, 2.0)
    assert det.update(10, 1.5) is None and det.update(11, 2.0) is None   # leaving the level resets the count
    assert PlateauDetector(ref, patience=0, tolerance=0.01).update(1, 2.0) is None   # 0 = never


def test_a_run_on_the_plateau_warns_in_words_in_history_callbacks_and_warnings():
    task, records = ShiftTask(), []
    with pytest.warns(PlateauWarning, match="no-information level ln 5"):
        _, history = train(model_for(task), task, steps=80, batch_size=16, lr=1e-2, plateau_steps=20,
                           plateau_tolerance=0.05, callbacks=[records.append], **QUIET)
    assert len(history.warnings) == 1 and history.warnings[0]["kind"] == "plateau"
    step = history.warnings[0]["step"]
    mean = sum(history.main[step - 50:step]) / 50
    assert abs(mean - math.log(5)) <= 0.05 * math.log(5)                 # the loss really sits there
    said = [r for r in records if r["kind"] == "warning"]
    assert [r["step"] for r in said] == [step] and "Likely cause" in said[0]["message"]
    assert TrainHistory.from_dict(history.to_dict()).warnings == history.warnings


def test_no_warning_away_from_the_level_or_when_switched_off():
    for task, kw in ((ShiftTask(level=10.0), {}), (ShiftTask(), {"plateau_steps": 0})):
        with warnings.catch_warnings():
            warnings.simplefilter("error", PlateauWarning)
            _, history = train(model_for(task), task, steps=60, batch_size=16, lr=1e-2, **{"plateau_steps": 20, **kw},
                               **QUIET)
        assert history.warnings == []


def test_a_resumed_run_that_already_warned_does_not_warn_again(tmp_path):
    task = ShiftTask()
    kw = dict(steps=100, batch_size=16, lr=1e-2, plateau_steps=20, plateau_tolerance=0.05, **QUIET)
    stop = lambda e: e["kind"] == "step" and e["step"] == 85 and os.kill(os.getpid(), signal.SIGINT)
    with pytest.warns(PlateauWarning):
        _, part = train(model_for(task), task, checkpoint_dir=tmp_path, callbacks=[stop], **kw)
    assert part.interrupted and len(part.warnings) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlateauWarning)
        _, resumed = train(model_for(task), task, checkpoint_dir=tmp_path, resume=True, **kw)
    assert resumed.warnings == part.warnings and len(resumed) == 100


def test_an_old_history_without_warnings_still_loads():
    old = TrainHistory(step=[1], main=[1.0], aux=[0.0], smooth=[0.0], total=[1.0]).to_dict()
    del old["warnings"]
    assert TrainHistory.from_dict(old).warnings == []


def test_builtin_tasks_name_their_level_and_a_fix():
    value = make_task("icl", answer_tokens="value").no_information_loss()
    assert value.level == pytest.approx(math.log(7)) and "token_shift='pair'" in value.hint
    assert "token_shift" not in make_task("icl").no_information_loss().hint
    reg = make_task("regression", dim=4, noise=0.5).no_information_loss()
    assert reg.level == pytest.approx(1.25) and "curriculum" in reg.hint


def test_the_monitor_shows_the_warning_escaped():
    from cgt_viz.widgets import TrainingMonitor
    monitor = TrainingMonitor(min_interval=0)
    monitor({"kind": "step", "step": 1, "main": 1.6, "aux": 0.0, "smooth": 0.0, "total": 1.6, "lr": 1e-3})
    monitor({"kind": "warning", "step": 1, "message": "plateau: <b>stuck</b>"})
    assert "&lt;b&gt;stuck&lt;/b&gt;" in monitor.alerts.value and "<b>" not in monitor.alerts.value
    assert "warning at step 1: plateau" in monitor.static_text()
