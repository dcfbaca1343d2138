"""The trainer: learning, schedule, callbacks, determinism, exact resume, Ctrl-C, divergence, bad input."""
from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import math
import os
import signal
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from cgt_viz import CGT, GPT, CGTConfig
from cgt_viz.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint
from cgt_viz.tasks.base import Batch, Task
from cgt_viz.train import TrainHistory, TrainingDiverged, lr_at, param_groups, resolve_device, train
from cgt_viz.train_config import TrainConfig
from helpers import TinyTask


class NaNRegression(Task):
    """Vectors-mode regression whose targets turn NaN from the `nan_from`-th training batch on."""

    name = "nan_regression"

    def __init__(self, nan_from: int, value: float = float("nan")):
        self.nan_from, self.calls, self.value = nan_from, 0, value

    def config_kwargs(self):
        return {"input_dim": 3, "block_size": 6}

    def get_batch(self, batch_size, part="train", generator=None, device="cpu"):
        x = torch.randn(batch_size, 6, 3, generator=generator)
        y = x.flip(-1).clone()
        if part == "train":
            self.calls += 1
            if self.calls >= self.nan_from:
                y[0, 0, 0] = self.value
        return Batch(x, y).to(device)


def tiny_config(task: Task, **over) -> CGTConfig:
    kw = dict(n_layer=2, d_x=16, n_head=2, d_y=8, n_head_y=1, y_layer=1, n_templates=2, mlp_ratio=2)
    kw.update(over)
    return CGTConfig(**task.config_kwargs(), **kw)


def fresh(cfg: CGTConfig, cls=CGT, seed: int = 0):
    torch.manual_seed(seed)
    return cls(cfg)


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


QUIET = dict(progress=False, device="cpu")


def interrupt_at(step: int):
    """A callback that presses Ctrl-C (SIGINT to this process) right after `step` completes."""
    def fn(event):
        if event["kind"] == "step" and event["step"] == step:
            os.kill(os.getpid(), signal.SIGINT)
    return fn


# ------------------------------------------------------------------------------------------ learning
def test_training_lowers_the_loss_for_cgt_and_gpt():
    task = TinyTask()
    for cls in (CGT, GPT):
        model, hist = train(fresh(tiny_config(task), cls), task, steps=40, batch_size=16, lr=1e-2, eval_every=0, **QUIET)
        first, last = sum(hist.main[:5]) / 5, sum(hist.main[-5:]) / 5
        assert last < first - 0.3, (cls.__name__, first, last)
        assert len(hist) == 40 and hist.step == list(range(1, 41))
        if cls is GPT:
            assert set(hist.aux) == {0.0} and hist.main == hist.total


def test_history_callbacks_and_schedule():
    task, events = TinyTask(), []
    extra = lambda model, step: {"probe": float(step) * 2}
    model, hist = train(fresh(tiny_config(task, w_smooth=0.5)), task, steps=12, batch_size=4, lr=2e-3, warmup=3,
                        min_lr_ratio=0.25, eval_every=5, eval_batches=2, eval_fn=extra, callbacks=[events.append], **QUIET)
    steps = [e for e in events if e["kind"] == "step"]
    evals = [e for e in events if e["kind"] == "eval"]
    assert [e["step"] for e in steps] == list(range(1, 13))
    assert set(steps[0]) == {"kind", "step", "main", "aux", "smooth", "total", "lr"}
    assert all(type(e[k]) is float for e in steps for k in ("main", "aux", "smooth", "total", "lr"))   # plain floats
    assert [e["step"] for e in evals] == [5, 10, 12]                      # every 5 and at the last step
    assert {"val_main", "val_aux", "val_total", "probe"} <= set(evals[0]) and evals[1]["probe"] == 20.0
    assert events[-1] == {"kind": "end", "step": 12}
    # total = main + w_aux·aux + w_smooth·smooth, as the model defines it
    for e in steps:
        assert e["total"] == pytest.approx(e["main"] + 1.0 * e["aux"] + 0.5 * e["smooth"], rel=1e-5)
    # schedule: linear warm-up to lr, then cosine down to lr·min_lr_ratio
    assert hist.lr[:3] == pytest.approx([2e-3 / 3, 4e-3 / 3, 2e-3])
    assert all(a >= b for a, b in zip(hist.lr[2:], hist.lr[3:]))
    assert hist.lr[-1] == pytest.approx(lr_at(11, 12, 2e-3, 3, 0.25)) and hist.lr[-1] > 0.25 * 2e-3
    assert lr_at(12, 12, 1.0, 3, 0.25) == pytest.approx(0.25)
    df = hist.to_dataframe()
    assert list(df.columns[:6]) == ["step", "main", "aux", "smooth", "total", "lr"] and len(df) == 12
    assert len(hist.evals_dataframe()) == 3
    assert TrainHistory.from_dict(hist.to_dict()) == hist


def test_weight_decay_spares_biases_norms_and_embeddings():
    model = CGT(tiny_config(TinyTask()))
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    ids = {id(p) for p in no_decay["params"]}
    assert id(model.gpt.embed.weight) in ids and id(model.gpt.wpe.weight) in ids and id(model.y_embed.weight) in ids
    assert id(model.gpt.ln_f.weight) in ids and id(model.gpt.blocks[0].attn.c_attn.bias) in ids
    assert id(model.gpt.blocks[0].attn.c_attn.weight) in {id(p) for p in decay["params"]}
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_device_auto_prefers_cuda_then_mps_then_cpu():
    want = "cuda" if torch.cuda.is_available() else (
        "mps" if torch.backends.mps.is_available() else "cpu")
    assert resolve_device("auto").type == want


# ------------------------------------------------------------------------------------ determinism
def test_same_seed_same_curve_and_eval_never_changes_the_run():
    task = TinyTask()
    cfg = tiny_config(task, dropout=0.1, smooth="vae", w_smooth=0.1)
    a, ha = train(fresh(cfg), task, steps=8, batch_size=4, eval_every=0, **QUIET)
    b, hb = train(fresh(cfg), task, steps=8, batch_size=4, eval_every=0, **QUIET)
    c, hc = train(fresh(cfg), task, steps=8, batch_size=4, eval_every=1, **QUIET)
    d, hd = train(fresh(cfg), task, steps=8, batch_size=4, eval_every=0, seed=1, **QUIET)
    assert ha.total == hb.total and same_weights(a, b)
    assert ha.total == hc.total and same_weights(a, c)     # evaluating (8 times) did not perturb training
    assert ha.total != hd.total                             # the seed matters


def test_resume_reproduces_the_uninterrupted_run_bit_for_bit(tmp_path):
    """Train 2k steps straight vs k steps, Ctrl-C, resume: same losses, same weights (CGT with dropout + VAE noise)."""
    task = TinyTask()
    cfg = tiny_config(task, dropout=0.1, smooth="vae", w_smooth=0.1)
    kw = dict(steps=12, batch_size=4, eval_every=4, **QUIET)
    full, h_full = train(fresh(cfg), task, **kw)

    part, h_part = train(fresh(cfg), task, checkpoint_dir=tmp_path, checkpoint_every=5, callbacks=[interrupt_at(6)], **kw)
    assert h_part.interrupted and len(h_part) == 6                 # returned cleanly after step 6
    assert load_checkpoint(tmp_path).step == 6                      # ... and checkpointed it
    assert same_weights(part, _loaded(cfg, tmp_path))               # the model equals the checkpoint: not half-updated
    assert part(torch.zeros(1, 4, dtype=torch.long)).isfinite().all()   # and usable

    resumed, h_res = train(fresh(cfg, seed=123), task, checkpoint_dir=tmp_path, checkpoint_every=5, resume=True, **kw)
    assert h_res.total == h_full.total and h_res.evals == h_full.evals and not h_res.interrupted
    assert same_weights(resumed, full)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000010", "step-00000012"]   # keep=2


def _loaded(cfg, path):
    model = CGT(cfg)
    model.load_state_dict(load_checkpoint(path).model_state)
    return model


def test_resume_from_a_different_run_is_a_clear_error(tmp_path):
    task = TinyTask()
    cfg = tiny_config(task)
    train(fresh(cfg), task, steps=2, batch_size=4, eval_every=0, checkpoint_dir=tmp_path, **QUIET)
    with pytest.raises(ValueError, match=r"different run.*config\.d_x"):
        train(fresh(tiny_config(task, d_x=32)), task, steps=4, batch_size=4, checkpoint_dir=tmp_path, resume=True, **QUIET)
    with pytest.raises(ValueError, match=r"different run.*\blr\b"):
        train(fresh(cfg), task, steps=4, batch_size=4, lr=5e-3, checkpoint_dir=tmp_path, resume=True, **QUIET)
    with pytest.raises(ValueError, match="model_class"):
        train(fresh(cfg, GPT), task, steps=4, batch_size=4, checkpoint_dir=tmp_path, resume=True, **QUIET)
    with pytest.raises(ValueError, match="resume=True"):                     # no silent overwrite either
        train(fresh(cfg), task, steps=4, batch_size=4, checkpoint_dir=tmp_path, **QUIET)
    # the same run may be extended (steps may differ)
    _, hist = train(fresh(cfg), task, steps=3, batch_size=4, eval_every=0, checkpoint_dir=tmp_path, resume=True, **QUIET)
    assert hist.step == [1, 2, 3]


# --------------------------------------------------------------------------------------- divergence
def test_nan_loss_stops_with_the_step_and_term_and_keeps_the_last_good_state(tmp_path):
    # finite data whose loss overflows float32 (NaN data is named as bad data: test_faults)
    task = NaNRegression(nan_from=5, value=1e30)
    cfg = tiny_config(task)
    model = fresh(cfg)
    events = []
    with pytest.raises(TrainingDiverged, match=r"step 5: the main loss is inf") as info:
        train(model, task, steps=10, batch_size=4, eval_every=0, checkpoint_dir=tmp_path, checkpoint_every=2,
              callbacks=[events.append], **QUIET)
    err = info.value
    assert err.step == 5 and err.term == "main" and len(err.history) == 4
    assert load_checkpoint(tmp_path).step == 4 and err.checkpoint.name == "step-00000004"
    assert same_weights(model, _loaded(cfg, tmp_path))   # step 5 applied no update
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert events[-1] == {"kind": "end", "step": 4}


# ----------------------------------------------------------------------------------------- bad input
def _unread_settings(names: set[str]) -> set[str]:
    """Of `names`, those the training loop (`_run`) never reads as `cfg.<name>`."""
    run = importlib.import_module("cgt_viz.train")._run      # (cgt_viz.train, the attribute, is the function)
    tree = ast.parse(textwrap.dedent(inspect.getsource(run)))
    read = {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "cfg"}
    return names - read


def test_every_train_config_field_is_read_by_the_training_loop():
    """A TrainConfig field the loop does not read would be a setting accepted and silently ignored."""
    run = importlib.import_module("cgt_viz.train")._run
    params = inspect.signature(run).parameters
    assert list(params)[0] == "cfg" and not any(p.kind is p.VAR_KEYWORD for p in params.values())  # no **_unused
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert _unread_settings(fields) == set()
    assert _unread_settings(fields | {"a_new_setting"}) == {"a_new_setting"}   # the check sees a field left out


def test_lr_of_a_one_step_run_is_finite():
    assert math.isfinite(lr_at(0, 1, 1e-3, 0, 0.1))


def test_aux_delay_and_ramp_weight_the_aux_term_in_the_total():
    from cgt_viz.train import aux_weight_scale
    assert [aux_weight_scale(s, 2, 4) for s in range(7)] == [0, 0, 0.25, 0.5, 0.75, 1, 1]
    assert aux_weight_scale(0, 0, 0) == 1.0
    task = TinyTask()
    cfg = tiny_config(task, w_aux=1.0)
    records = []
    train(fresh(cfg), task, steps=5, batch_size=4, aux_delay=2, aux_ramp=2, progress=False,
          callbacks=[lambda r: records.append(r) if r["kind"] == "step" else None])
    scales = [0.0, 0.0, 0.5, 1.0, 1.0]
    for rec, scale in zip(records, scales):
        want = rec["main"] + scale * rec["aux"] + cfg.w_smooth * rec["smooth"]
        assert abs(rec["total"] - want) < 1e-5, (rec, scale)
    assert records[0]["aux"] > 0  # still computed and logged while it does not count


def test_an_update_that_overflows_the_weights_is_reported_as_such(tmp_path, monkeypatch):
    """An update with finite gradients can still overflow (e.g. a huge lr): simulate it by corrupting one weight
    after the first optimizer step; the next loss is NaN and the error must not claim the weights are good."""
    real_step = torch.optim.AdamW.step

    def overflowing_step(self, *args, **kwargs):
        out = real_step(self, *args, **kwargs)
        with torch.no_grad():
            self.param_groups[0]["params"][0].fill_(float("inf"))
        return out

    monkeypatch.setattr(torch.optim.AdamW, "step", overflowing_step)
    task = TinyTask()
    model = fresh(tiny_config(task))
    with pytest.raises(TrainingDiverged, match="weights are already NaN/inf") as info:
        train(model, task, steps=5, batch_size=4, eval_every=0, **QUIET)
    assert info.value.step == 2 and not info.value.weights_finite
    # with checkpoints: the step-1 checkpoint would hold the inf weights, so it is refused and none is written
    model = fresh(tiny_config(task))
    with pytest.raises(TrainingDiverged, match="step 1: the weights after the update") as info:
        train(model, task, steps=5, batch_size=4, eval_every=0, checkpoint_dir=tmp_path, checkpoint_every=1, **QUIET)
    assert info.value.checkpoint is None and latest_checkpoint(tmp_path) is None


def test_train_config_is_the_one_list_of_settings():
    import dataclasses

    from cgt_viz.__main__ import TRAIN_FIELDS, _parser, _settings
    from cgt_viz.recipes import RECIPES
    from cgt_viz.train_config import TrainConfig

    names = [f.name for f in dataclasses.fields(TrainConfig)]
    train_parser = next(a for a in _parser()._actions if a.dest == "command").choices["train"]
    assert set(names) <= {a.dest for a in train_parser._actions} and list(TRAIN_FIELDS) == names
    cfg = TrainConfig(steps=7, betas=[0.8, 0.9])
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg and cfg.betas == (0.8, 0.9)
    assert "steps" not in cfg.identity(warmup=0) and cfg.identity(warmup=3)["warmup"] == 3
    # the CLI's defaults for a task are the recipe its notebook trains; flags override them
    args = _parser().parse_args(["train", "--task", "icl", "--out", "unused", "--steps", "5"])
    settings = _settings(args, Path("/nonexistent/run"))
    recipe = RECIPES["icl"]
    assert settings["steps"] == 5 and settings["aux_delay"] == recipe["train"]["aux_delay"] == 500
    assert settings["d_x"] == recipe["model"]["d_x"] and settings["n_templates"] == recipe["model"]["n_templates"]


def test_a_task_argument_selects_its_recipe_variant_in_the_cli():
    from cgt_viz.__main__ import _parser, _settings
    from cgt_viz.recipes import RECIPES, VARIANTS, recipe_for

    def settings(*argv):
        return _settings(_parser().parse_args(["train", "--out", "unused", *argv]), Path("/nonexistent/run"))

    base = settings("--task", "regression")
    wide = settings("--task", "regression", "--task-arg", "dim=16")
    change = VARIANTS["regression-dim16"]["change"]
    assert base["steps"] == RECIPES["regression"]["train"]["steps"] and base["task_arg"]["dim"] == 4
    assert wide["task_arg"] == {**RECIPES["regression"]["task"], **change["task"]} and wide["task_arg"]["dim"] == 16
    train_fields = {**RECIPES["regression"]["train"], **change["train"]}
    assert all(wide[k] == v for k, v in train_fields.items()) and wide["curriculum"] == change["curriculum"]
    assert wide["curriculum"] != base["curriculum"]                          # the variant changes something
    assert settings("--task", "regression", "--task-arg", "dim=16", "--steps", "7")["steps"] == 7   # flags still win
    # the icl variant matches on the task's own default family (affine) too, and not on another family
    affine = settings("--task", "icl", "--task-arg", "answer_tokens=value")
    assert affine["task_arg"]["novel_split"] is True and affine["curriculum"] == VARIANTS["icl-value-affine"]["change"]["curriculum"]
    shift = settings("--task", "icl", "--task-arg", "answer_tokens=value", "--task-arg", "family=shift")
    assert shift["curriculum"] is None and "novel_split" not in shift["task_arg"]
    assert recipe_for("icl") == RECIPES["icl"] and recipe_for("module:Task", {"dim": 16}) == {}
    assert wide["recipe"] == "regression-dim16" and base["recipe"] == "regression" and shift["recipe"] == "icl"


def _cli_settings(*argv):
    from cgt_viz.__main__ import _parser, _settings

    return _settings(_parser().parse_args(["train", "--out", "unused", *argv]), Path("/nonexistent/run"))


def test_recipe_names_a_variant_or_the_plain_recipe_whatever_the_task_arguments():
    from cgt_viz.recipes import RECIPES, VARIANTS

    named = _cli_settings("--task", "regression", "--recipe", "regression-dim16")
    implied = _cli_settings("--task", "regression", "--task-arg", "dim=16")
    assert named == implied and named["recipe"] == "regression-dim16"
    # the plain recipe on 16 dimensions: the variant's curriculum and n_points are not applied
    plain = _cli_settings("--task", "regression", "--task-arg", "dim=16", "--recipe", "regression")
    assert plain["recipe"] == "regression" and plain["task_arg"]["dim"] == 16
    assert plain["curriculum"] == RECIPES["regression"]["curriculum"] != VARIANTS["regression-dim16"]["change"]["curriculum"]
    assert plain["task_arg"]["n_points"] == RECIPES["regression"]["task"]["n_points"]
    assert _cli_settings("--task", "icl", "--recipe", "icl-value-affine")["task_arg"]["novel_split"] is True
    assert _cli_settings("--task", "regression", "--recipe", "regression-dim16", "--steps", "7")["steps"] == 7


@pytest.mark.parametrize("argv, says", [
    (["--task", "regression", "--recipe", "nope"],
     "--recipe must be one of icl, regression, text, regression-dim16, icl-value-affine, got str 'nope'"),
    (["--task", "icl", "--recipe", "regression-dim16"],
     "--recipe must be a recipe of task 'icl' (icl, icl-value-affine), got 'regression-dim16', a recipe of task "
     "'regression'"),
    (["--task", "test_train:TinyTask", "--recipe", "icl"], "--recipe must be a recipe of task 'test_train:TinyTask' "
                                                           "(it has none)"),
])
def test_a_recipe_that_is_not_one_of_the_tasks_is_refused_naming_the_flag(argv, says):
    from cgt_viz.__main__ import CLIError

    with pytest.raises(CLIError) as refused:
        _cli_settings(*argv)
    assert str(refused.value).startswith(says)


@pytest.mark.parametrize("argv, note", [
    (["--task", "regression", "--task-arg", "dim=16"],
     "recipe: regression-dim16 (chosen by --task-arg dim=16; --recipe to choose another)"),
    (["--task", "icl", "--task-arg", "answer_tokens=value"],
     "recipe: icl-value-affine (chosen by --task-arg answer_tokens=value and the default family=affine; --recipe to "
     "choose another)"),
    (["--task", "regression", "--task-arg", "dim=16", "--recipe", "regression-dim16"], None),   # chosen by name
    (["--task", "regression"], None),                                                         # no variant
])
def test_a_variant_chosen_by_the_task_arguments_is_named_when_the_run_starts(tmp_path, capsys, argv, note):
    from cgt_viz.__main__ import main

    tiny = ["--n-layer", "2", "--d-x", "16", "--n-head", "2", "--d-y", "8", "--n-head-y", "1", "--y-layer", "1",
            "--n-templates", "2", "--no-progress", "--device", "cpu", "--steps", "1", "--batch-size", "2",
            "--eval-every", "0", "--curriculum", "0"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)      # steps < aux_delay: a one-step run
        assert main(["train", *argv, *tiny, "--out", str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    recipes = [line for line in err.splitlines() if line.startswith("recipe:")]
    assert recipes == ([note] if note else [])
    assert main(["train", "--out", str(tmp_path / "run"), "--resume", "--no-progress"]) == 0
    assert "recipe:" not in capsys.readouterr().err           # said once, when the run started


def test_train_help_shows_the_defaults_of_the_named_recipe():
    from cgt_viz.__main__ import _parser
    from cgt_viz.recipes import RECIPES, VARIANTS

    def helps(*argv):
        sub = next(a for a in _parser(["train", *argv])._actions if a.dest == "command").choices["train"]
        return {a.dest: a.help for a in sub._actions}

    named = helps("--task", "regression", "--recipe", "regression-dim16")
    assert f"(default: {VARIANTS['regression-dim16']['change']['curriculum']})" in named["curriculum"]
    assert "(default: regression-dim16)" in named["recipe"]
    plain = helps("--task", "regression", "--task-arg", "dim=16", "--recipe", "regression")
    assert f"(default: {RECIPES['regression']['curriculum']})" in plain["curriculum"]
    assert "(default: regression)" in plain["recipe"]
    assert "(default: regression-dim16)" in helps("--task", "regression", "--task-arg", "dim=16")["recipe"]
