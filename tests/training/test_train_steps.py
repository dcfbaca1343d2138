"""The one training loop's variation points: a TrainStep other than a task's, the time budget, a length planned
from it, and the per-prompt LoRA's optimisation through `train` (the same numbers as a plain Adam loop)."""
from __future__ import annotations

import importlib

import pytest
import torch

from cgt_viz import CGT, CGTConfig
from cgt_viz.checkpoint import latest_checkpoint, load_checkpoint
from cgt_viz.lora_baseline import fit_factors
from cgt_viz.steps import FullBatchStep, Parameters, TrainStep
from cgt_viz.train import PLAN_AFTER, train
from helpers import TinyTask

train_module = importlib.import_module("cgt_viz.train")   # the package's `train` is the function


class FakeClock:
    """time.perf_counter for cgt_viz.train that moves only when a step event says so: budgets tested by counts."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def __getattr__(self, name):          # everything else of the time module, unchanged
        import time
        return getattr(time, name)


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(train_module, "time", fake)
    return fake


def _quadratic(target: float = 3.0):
    """A full-batch objective over one parameter vector: ((p − target)²).sum()."""
    p = torch.nn.Parameter(torch.zeros(4))
    return p, FullBatchStep(lambda: ((p - target) ** 2).sum(), "quadratic")


def test_a_time_budget_stops_after_the_first_update_past_it_with_a_checkpoint(clock, tmp_path):
    p, step = _quadratic()
    advance = lambda e: setattr(clock, "now", clock.now + 10.0) if e["kind"] == "step" else None   # 10 s an update
    _, history = train(Parameters([p]), step, steps=100, minutes=0.5, eval_every=0, progress=False,
                       checkpoint_dir=tmp_path / "ckpt", checkpoint_every=50, callbacks=[advance])
    # the clock reads 30 s after update 3's event: update 4 finds the budget spent, completes, and the run stops
    assert history.step == [1, 2, 3, 4] and history.timed_out and not history.interrupted
    assert latest_checkpoint(tmp_path / "ckpt").name == "step-00000004"
    # minutes may change on resume (a new budget for the rest): the run continues from step 4
    _, more = train(Parameters([p]), step, steps=100, minutes=0.5, eval_every=0, progress=False,
                    checkpoint_dir=tmp_path / "ckpt", checkpoint_every=50, resume=True, callbacks=[advance])
    assert more.step[:5] == [1, 2, 3, 4, 5] and more.step[-1] == 8 and more.timed_out


def test_steps_none_plans_the_length_from_the_first_updates_rate(clock, tmp_path):
    p, step = _quadratic()
    advance = lambda e: setattr(clock, "now", clock.now + 1.0) if e["kind"] == "step" else None    # 1 s an update
    lrs = []
    _, history = train(Parameters([p]), step, steps=None, minutes=1.0, warmup=0, lr=0.1, min_lr_ratio=0.0,
                       eval_every=0, checkpoint_every=1000, progress=False, checkpoint_dir=tmp_path / "ckpt",
                       callbacks=[advance, lambda e: lrs.append(e["lr"]) if e["kind"] == "step" else None])
    planned = PLAN_AFTER + int(PLAN_AFTER * 60 * 1.0 / PLAN_AFTER)       # 10 updates took 10 s of a 60 s budget
    assert load_checkpoint(latest_checkpoint(tmp_path / "ckpt")).run["steps"] == planned
    assert history.timed_out and len(history) == 61                     # the budget ends the run at 60 s
    assert lrs[:PLAN_AFTER] == pytest.approx([0.1] * PLAN_AFTER, rel=1e-9)  # no schedule before the plan
    assert lrs[30] == pytest.approx(train_module.lr_at(30, planned, 0.1, 0, 0.0))   # then the cosine to `planned`


def test_steps_none_without_a_budget_is_refused_by_name():
    p, step = _quadratic()
    with pytest.raises(ValueError, match=r"steps must be an int, or None with minutes, warmup, eval_every and "
                                         r"checkpoint_every given.*got None with minutes, warmup, checkpoint_every unset"):
        train(Parameters([p]), step, steps=None, eval_every=0, progress=False)


def test_a_train_step_needs_only_a_module_and_a_task_model_needs_its_loss():
    p, step = _quadratic()
    with pytest.raises(TypeError, match=r"model must be an nn.Module \(what the TrainStep's loss trains\), got"):
        train([p], step, steps=1, progress=False)
    with pytest.raises(TypeError, match=r"model must be a cgt_viz CGT or GPT \(an nn.Module with .loss\)"):
        train(Parameters([p]), TinyTask(), steps=1, progress=False)


def test_the_protocol_declares_every_verb_the_loop_calls():
    """The base raises NotImplementedError for each verb a step must define (a new step cannot forget one
    silently); the optional ones have defaults."""
    base = TrainStep()
    for call in (lambda: base.identity(), lambda: base.train_batch(0, 2, {}, "cpu"),
                 lambda: base.val_batches(2, 1, 0, "cpu"), lambda: base.shard(None, 0, 1),
                 lambda: base.loss(None, None)):
        with pytest.raises(NotImplementedError):
            call()
    assert base.no_information_loss() is None and base.check_fits(None) is None


def test_fit_factors_is_a_plain_adam_loop_through_train():
    """The per-prompt LoRA's optimisation (train_lora, peft_lora_baseline) runs through `train` and gives the
    numbers of the ten-line Adam loop it replaced: the same parameters and objective at every snapshot."""
    target = torch.linspace(-1, 2, 6)
    start = torch.randn(6, generator=torch.Generator().manual_seed(0))
    p = torch.nn.Parameter(start.clone())
    objective = lambda: ((p - target) ** 4).sum()
    cks = fit_factors([p], objective, (0, 3, 20), 0.05, lambda: {"w": (p.detach().clone(), p.detach().clone())},
                      "quartic")
    q = torch.nn.Parameter(start.clone())
    opt = torch.optim.Adam([q], lr=0.05)
    expected, losses = {0: q.detach().clone()}, {}
    for k in range(1, 21):
        loss = ((q - target) ** 4).sum()
        losses[k] = float(loss.detach())
        opt.zero_grad()
        loss.backward()
        opt.step()
        expected[k] = q.detach().clone()
    assert [c.step for c in cks] == [0, 3, 20]
    for c in cks:
        assert torch.equal(c.factors["w"][0], expected[c.step]), c.step
        if c.step:
            assert c.train_kl == losses[c.step]
    assert cks[0].train_seconds == 0.0 and 0 < cks[1].train_seconds <= cks[2].train_seconds


def test_fit_factors_leaves_the_callers_global_random_stream_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    p, step = _quadratic()
    fit_factors([p], step.objective, (0, 2), 0.1, lambda: {}, "quadratic")
    assert torch.equal(torch.rand(3), expected)


def test_a_cgt_trains_the_same_through_an_explicit_task_step():
    """train(model, task) is train(model, TaskStep(task)): the same losses, update for update."""
    from cgt_viz.steps import TaskStep
    task = TinyTask()
    cfg = CGTConfig(**task.config_kwargs(), n_layer=2, d_x=16, d_y=8, n_head=2, n_head_y=2, y_layer=1,
                    n_templates=2, template_rank=1)
    runs = []
    for source in (task, TaskStep(task)):
        torch.manual_seed(0)
        _, history = train(CGT(cfg), source, steps=4, batch_size=4, eval_every=2, progress=False)
        runs.append((history.total, [e["val_total"] for e in history.evals]))
    assert runs[0] == runs[1]
