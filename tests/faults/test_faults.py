"""Faults from the second reliability audit (issue 11): hostile run folders, lost runs, two writers on one
folder, kernel-killing inputs, numeric data errors and OS errors. Each test failed on the code before the
fix (see docs/RELIABILITY.md)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from cgt_viz import CGT, CGTConfig
from cgt_viz.__main__ import main
from cgt_viz.checkpoint import latest_checkpoint, load_checkpoint
from cgt_viz.io import read_json, write_json

TESTS = Path(__file__).resolve().parents[1]   # tests/ (this file is in tests/faults/)
TINY_MODEL = ["--n-layer", "2", "--d-x", "16", "--n-head", "2", "--d-y", "8", "--n-head-y", "1", "--y-layer", "1",
              "--n-templates", "2", "--mlp-ratio", "2", "--no-progress", "--device", "cpu"]
ICL = ["--task", "icl", "--task-arg", "n_pairs=4", "--task-arg", "P=5", *TINY_MODEL]


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


def _cli(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The real process: exit code and stderr as the user sees them."""
    return subprocess.run([sys.executable, "-m", "cgt_viz", *argv], env=_env(), capture_output=True, text=True,
                          timeout=timeout)


def _main(capsys, *argv: str) -> subprocess.CompletedProcess:
    """main() in this process (no torch import per call), reported like _cli; an exception escaping main()
    is what the user would see as a traceback."""
    import traceback
    capsys.readouterr()
    try:
        code = main(list(argv))
    except SystemExit as exit_:
        code = exit_.code
    except Exception:  # noqa: BLE001
        code, tb = 99, traceback.format_exc()
    else:
        tb = ""
    err = capsys.readouterr().err
    return subprocess.CompletedProcess(argv, code, "", err + tb)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A finished two-step icl run (copied per test with _copy_run before anything is changed)."""
    out = tmp_path_factory.mktemp("faults") / "run"
    assert main(["train", *ICL, "--out", str(out), "--steps", "2", "--batch-size", "4", "--eval-every", "0"]) == 0
    return out


def _copy_run(run: Path, dest: Path) -> Path:
    import shutil
    shutil.copytree(run, dest)
    return dest


# ------------------------------------------------------------------------------- 1. a run folder is data
HOSTILE = [("subprocess:run", "args"), ("os:system", "command")]


@pytest.mark.parametrize("task, key", HOSTILE, ids=[t for t, _ in HOSTILE])
def test_a_run_folder_never_imports_or_calls_what_it_names(trained_run, tmp_path, capsys, task, key):
    run = _copy_run(trained_run, tmp_path / "run")
    marker = tmp_path / "pwned"
    info = read_json(run / "run.json")
    info["settings"]["task"] = task
    info["settings"]["task_arg"] = {key: f"touch {marker}", **({"shell": True} if key == "args" else {})}
    write_json(run / "run.json", info)
    for argv in (["evaluate", str(run), "--n-batches", "1", "--batch-size", "4", "--device", "cpu"],
                 ["train", "--out", str(run), "--resume", "--no-progress", "--device", "cpu"]):
        proc = _main(capsys, *argv)
        assert not marker.exists(), f"{argv[0]} ran the command named in run.json"
        assert proc.returncode == 2 and "not a registered task" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


def test_a_users_task_class_is_passed_in_python_or_typed_on_the_command_line(tmp_path):
    from cgt_viz.__main__ import load_run
    from test_train import TinyTask
    run = tmp_path / "run"
    assert main(["train", "--task", "test_train:TinyTask", *TINY_MODEL, "--out", str(run), "--steps", "1",
                 "--batch-size", "2"]) == 0
    with pytest.raises(Exception, match="not a registered task"):
        load_run(run)
    _, task, _ = load_run(run, task=TinyTask())
    assert isinstance(task, TinyTask)
    _, task, _ = load_run(run, task="test_train:TinyTask")      # what `evaluate --task ...` does
    assert type(task).__name__ == "TinyTask"


# ------------------------------------------------------------------------------- 2. no stored XSS
XSS = "<img src=x onerror=window.__xss=1>"


def _tiny_cgt():
    torch.manual_seed(0)
    return CGT(CGTConfig(vocab_size=256, block_size=32, n_layer=2, d_x=16, n_head=2, d_y=8, n_head_y=1, y_layer=1,
                         n_templates=2)).eval()


def xss_pages() -> dict[str, str]:
    """HTML the widgets and figures produce from a label that is an XSS payload (used by the browser test)."""
    import plotly.io as pio

    from cgt_viz import explore
    from cgt_viz.figures import ybar_map_figure
    from cgt_viz.widgets._base import html_status
    data = torch.randint(0, 256, (4, 12), generator=torch.Generator().manual_seed(0))
    ex = explore(_tiny_cgt(), data, labels=[XSS, "b", XSS, "b"], background=None)
    ex.select(list(range(len(ex.points))))
    fig = ybar_map_figure(np.random.default_rng(0).normal(size=(4, 2)), [XSS, "b", XSS, "b"], title="t")
    return {"selection summary": ex.selection_info.value, "status": html_status(f"failed: {XSS}", "error"),
            "figure": pio.to_html(fig, full_html=True, include_plotlyjs=True)}


def test_user_strings_in_widget_html_are_escaped():
    pages = xss_pages()
    for name in ("selection summary", "status"):
        assert XSS not in pages[name] and "&lt;img src=x onerror=window.__xss=1&gt;" in pages[name], name
    assert "<code>explorer.selection</code>" in pages["selection summary"]      # the widget's own markup stays


def test_labels_in_figures_are_escaped():
    from cgt_viz.figures import color_spec, template_figure, ybar_map_figure
    spec = color_spec(np.arange(20.0), name=XSS)                              # a colour bar's title
    assert spec["colorbar"]["title"]["text"] == "&lt;img src=x onerror=window.__xss=1&gt;"
    legend = ybar_map_figure(np.zeros((2, 2)), color=[XSS, "b"], color_name=XSS)   # legend entries and title
    assert XSS not in legend.to_json() and "&lt;img src=x onerror=window.__xss=1&gt;" in [t.name for t in legend.data]
    fig = template_figure(np.zeros((2, 2)), [XSS, "b"], label_names=[XSS], mean_abs=np.zeros((1, 2)))
    assert XSS not in fig.to_json()


# ------------------------------------------------------------------------------- 3. paths stay inside
def _ckpt_run(tmp_path, steps=2, **kw):
    from cgt_viz.train import train
    from test_train import QUIET, TinyTask, fresh, tiny_config
    task = TinyTask()
    model, hist = train(fresh(tiny_config(task)), task, steps=steps, batch_size=4, eval_every=0,
                        checkpoint_dir=tmp_path / "ckpt", checkpoint_every=1, **QUIET, **kw)
    return task, model, hist


@pytest.mark.parametrize("target", ["../../outside", "../outside", "/tmp/x", "step-00000001/../../outside"])
def test_the_latest_pointer_may_not_leave_the_checkpoint_folder(tmp_path, target):
    import shutil
    _ckpt_run(tmp_path)
    ckpt = tmp_path / "ckpt"
    outside = (ckpt / target).resolve() if not target.startswith("/") else Path(target)
    if not target.startswith("/"):   # a complete checkpoint outside ckpt/, so following the pointer would "work"
        shutil.copytree(ckpt / "step-00000002", outside, dirs_exist_ok=True)
    write_json(ckpt / "latest", {"step": 2, "dir": target})
    with pytest.raises(ValueError, match="checkpoint pointer .* must name a step-NNNNNNNN folder inside"):
        load_checkpoint(ckpt)


def test_a_step_folder_that_is_a_link_out_is_refused(tmp_path):
    import shutil
    _ckpt_run(tmp_path)
    ckpt = tmp_path / "ckpt"
    shutil.copytree(ckpt / "step-00000002", tmp_path / "elsewhere")
    shutil.rmtree(ckpt / "step-00000002")
    os.symlink(tmp_path / "elsewhere", ckpt / "step-00000002")
    with pytest.raises(ValueError, match="leads outside"):
        load_checkpoint(ckpt)


# ------------------------------------------------------------------------------- 4. nothing lost
class FewValDocs:
    """A TinyTask whose validation split cannot fill a batch of more than 2 (like a small text corpus)."""


def _few_val_task():
    from test_train import TinyTask

    class _Task(TinyTask):
        def get_batch(self, batch_size, part="train", generator=None, device="cpu"):
            if part == "val" and batch_size > 2:
                raise ValueError(f"batch_size {batch_size} is more than the 2 documents of the val split")
            return super().get_batch(batch_size, part, generator, device)
    return _Task()


def test_a_run_that_cannot_evaluate_is_refused_before_step_1(tmp_path):
    from cgt_viz.train import train
    from test_train import QUIET, fresh, tiny_config
    task = _few_val_task()
    steps = []
    with pytest.raises(ValueError, match=r"pre-flight: the evaluation batches cannot be built.*eval_every=0"):
        train(fresh(tiny_config(task)), task, steps=40, batch_size=4, checkpoint_dir=tmp_path / "ckpt",
              callbacks=[steps.append], **QUIET)
    assert steps == []                                 # refused before any update, not at step 2 (steps // 20)


def test_an_unwritable_or_full_checkpoint_folder_is_refused_before_step_1(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    from cgt_viz.train import train
    from test_train import QUIET, TinyTask, fresh, tiny_config
    task, steps = TinyTask(), []
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError, match="checkpoint_dir .* is not writable"):
        train(fresh(tiny_config(task)), task, steps=4, batch_size=4, eval_every=0, checkpoint_dir=tmp_path / "file" / "ck",
              callbacks=[steps.append], **QUIET)
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(OSError, match=r"pre-flight: checkpoint_dir .* has 0.0 MiB free, but the checkpoints need"):
        train(fresh(tiny_config(task)), task, steps=4, batch_size=4, eval_every=0, checkpoint_dir=tmp_path / "ck",
              callbacks=[steps.append], **QUIET)
    assert steps == []


def tiny_reference(steps: int):
    """TinyTask, its config, and the weights of an uninterrupted run of `steps` steps (what a resume must give)."""
    from cgt_viz.train import train
    from test_train import QUIET, TinyTask, fresh, tiny_config
    task = TinyTask()
    cfg = tiny_config(task)
    return task, cfg, train(fresh(cfg), task, steps=steps, batch_size=4, eval_every=0, **QUIET)[0]


def test_an_error_that_is_not_a_crash_saves_the_completed_steps_first(tmp_path):
    """A callback (or eval_fn, or the task) failing at step 7 of a run checkpointed every 5: steps 6 and 7 are
    saved before the error is raised, and resuming gives the uninterrupted run's weights."""
    from cgt_viz.train import train
    from test_train import QUIET, fresh, same_weights
    task, cfg, reference = tiny_reference(10)

    def fail_at_7(event):
        if event["kind"] == "step" and event["step"] == 7:
            raise RuntimeError("the notebook's plotting callback broke")
    with pytest.raises(RuntimeError, match="plotting callback broke") as info:
        train(fresh(cfg), task, steps=10, batch_size=4, eval_every=0, checkpoint_dir=tmp_path, checkpoint_every=5,
              callbacks=[fail_at_7], **QUIET)
    assert load_checkpoint(tmp_path).step == 7
    assert any("7 completed steps were checkpointed" in n for n in getattr(info.value, "__notes__", []))
    resumed, hist = train(fresh(cfg), task, steps=10, batch_size=4, eval_every=0, checkpoint_dir=tmp_path,
                          checkpoint_every=5, resume=True, **QUIET)
    assert hist.step == list(range(1, 11)) and same_weights(resumed, reference)


# ------------------------------------------------------------------------------- 5. one writer per folder
def test_a_second_writer_on_a_run_folder_is_refused(trained_run, tmp_path, capsys):
    run = _copy_run(trained_run, tmp_path / "run")
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (run / ".lock").write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname(), "time": 0}))
        proc = _main(capsys, "train", "--out", str(run), "--resume", "--steps", "3", "--no-progress", "--device", "cpu")
        assert proc.returncode == 2 and f"in use by pid {holder.pid}" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
        from cgt_viz.checkpoint import FolderLocked, RunLock
        with pytest.raises(FolderLocked, match="in use by pid"):
            RunLock(run).acquire()
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone: its lock is stale and the resume goes ahead (and releases the lock at the end)
    proc = _main(capsys, "train", "--out", str(run), "--resume", "--steps", "3", "--no-progress", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert read_json(run / "history.json")["step"] == [1, 2, 3] and not (run / ".lock").exists()
    (run / ".lock").write_text(json.dumps({"pid": 1, "host": "another-host", "time": 0}))
    with pytest.raises(FolderLocked, match="host 'another-host'.*remove the lock file"):
        RunLock(run).acquire()


def test_train_in_python_locks_its_checkpoint_folder(tmp_path):
    from cgt_viz.checkpoint import FolderLocked, RunLock
    from cgt_viz.train import train
    from test_train import QUIET, TinyTask, fresh, tiny_config
    task = TinyTask()
    with RunLock(tmp_path / "ckpt"):
        with pytest.raises(FolderLocked, match="this process"):
            train(fresh(tiny_config(task)), task, steps=2, batch_size=4, eval_every=0, checkpoint_dir=tmp_path / "ckpt",
                  **QUIET)
    _ckpt_run(tmp_path, steps=2)                        # released: the next run may write there
    assert not (tmp_path / "ckpt" / ".lock").exists()


# ------------------------------------------------------------------------------- 6. state.json, run.json, debris
def _edit_state_json(tmp_path, steps: int, edit) -> None:
    """A checkpointed run of `steps` steps whose newest state.json is then edited in place by edit(state)."""
    _ckpt_run(tmp_path, steps=steps)
    state_file = tmp_path / "ckpt" / f"step-{steps:08d}" / "state.json"
    state = read_json(state_file)
    edit(state)
    write_json(state_file, state)


def test_an_edited_state_json_is_refused(tmp_path):
    _edit_state_json(tmp_path, 3, lambda state: state.update(step=1))
    with pytest.raises(ValueError, match="state.json' does not match its checksum"):
        load_checkpoint(tmp_path / "ckpt")


def test_state_json_with_missing_keys_is_refused_by_name(tmp_path):
    _edit_state_json(tmp_path, 2, lambda state: state.pop("optimizer"))
    with pytest.raises(ValueError, match=r"lacks \['optimizer'\]"):
        load_checkpoint(tmp_path / "ckpt")


def test_a_refused_flag_writes_no_run_json_and_the_corrected_command_runs(tmp_path, capsys):
    out = tmp_path / "run"
    # --eval-every -2 is refused (by TrainConfig, before training): run.json must not stay behind
    assert main(["train", *ICL, "--out", str(out), "--steps", "2", "--batch-size", "4", "--eval-every", "-2"]) == 2
    assert "--eval-every must be" in capsys.readouterr().err
    assert not (out / "run.json").exists()
    assert main(["train", *ICL, "--out", str(out), "--steps", "2", "--batch-size", "4", "--eval-every", "1"]) == 0


def test_leftover_temp_files_are_cleaned(tmp_path):
    _ckpt_run(tmp_path, steps=1)
    ckpt = tmp_path / "ckpt"
    debris = [ckpt / ".latest.abc123.tmp", ckpt / ".old-step-00000001-deadbeef"]
    debris[0].write_text("{")
    debris[1].mkdir()
    _ckpt_run(tmp_path, steps=2, resume=True)
    assert not any(d.exists() for d in debris), sorted(p.name for p in ckpt.iterdir())


# ------------------------------------------------------------------------------- 9. data errors named as such
def _regression_task(corrupt):
    from test_train import NaNRegression

    class _Task(NaNRegression):
        def get_batch(self, batch_size, part="train", generator=None, device="cpu"):
            batch = super().get_batch(batch_size, part, generator, device)
            if part == "train" and self.calls >= self.nan_from:
                corrupt(batch)
            return batch
    return _Task(nan_from=3, value=0.0)


def _masked_nan(batch):
    batch.loss_mask = torch.ones(batch.inputs.shape[:2], dtype=torch.bool)
    batch.loss_mask[:, -1] = False
    batch.targets[1, -1, 0] = float("nan")        # only at an unscored position


@pytest.mark.parametrize("corrupt, field, extra", [
    (lambda b: b.targets.__setitem__((0, 2, 1), float("nan")), "targets", ""),
    (lambda b: b.targets.__setitem__((0, 2, 1), float("inf")), "targets", ""),
    (_masked_nan, "targets", "loss_mask leaves unscored"),
    (lambda b: b.inputs.__setitem__((1, 0, 0), float("nan")), "inputs", ""),
], ids=["nan target", "inf target", "nan in a masked target", "nan input"])
def test_nan_or_inf_in_the_data_is_named_as_bad_data_with_its_step_and_field(tmp_path, corrupt, field, extra):
    from cgt_viz.train import TrainingDiverged, train
    from test_train import QUIET, fresh, tiny_config
    task = _regression_task(corrupt)
    with pytest.raises(ValueError) as info:
        train(fresh(tiny_config(task)), task, steps=6, batch_size=4, eval_every=0, checkpoint_dir=tmp_path, **QUIET)
    msg = str(info.value)
    assert not isinstance(info.value, TrainingDiverged)
    assert f"the training batch of step 3: batch.{field} holds NaN/inf" in msg and "data is bad" in msg, msg
    assert extra in msg and "lower lr" not in msg
    assert load_checkpoint(tmp_path).step == 2                # the two good steps were saved before raising


def test_a_float16_model_is_refused_by_dtype_before_step_1():
    from cgt_viz.train import train
    from test_train import QUIET, TinyTask, fresh, tiny_config
    task, steps = TinyTask(), []
    with pytest.raises(TypeError, match="float16.*AdamW's eps"):
        train(fresh(tiny_config(task)).half(), task, steps=3, batch_size=4, eval_every=0, callbacks=[steps.append],
              **QUIET)
    assert steps == []


# ------------------------------------------------------------------------------- 10. OS errors in the CLI
def _break_out_is_a_file(run, tmp_path):
    (tmp_path / "afile").write_text("x")
    return ["train", *ICL, "--out", str(tmp_path / "afile"), "--steps", "2"], "afile"


def _break_report_output_is_a_dir(run, tmp_path):
    (tmp_path / "outdir").mkdir()
    return ["report", str(run), "--output", str(tmp_path / "outdir")], "outdir"


def _break_latest_is_a_dir(run, tmp_path):
    (run / "ckpt" / "latest").unlink()
    (run / "ckpt" / "latest").mkdir()
    return ["train", "--out", str(run), "--resume", "--steps", "3", "--no-progress", "--device", "cpu"], "latest"


def _break_state_json_keys(run, tmp_path):
    import shutil
    shutil.rmtree(run / "model")
    state_file = latest_checkpoint(run / "ckpt") / "state.json"
    state = read_json(state_file)
    del state["rng"]
    write_json(state_file, state)
    return ["evaluate", str(run), "--device", "cpu"], "state.json"


def _break_nested_json(run, tmp_path):
    (run / "run.json").write_text("[" * 100_000 + "]" * 100_000)
    return ["report", str(run)], "run.json"


def _break_non_utf8_json(run, tmp_path):
    (run / "run.json").write_bytes(b'{"settings": "\xff\xfe"}')
    return ["evaluate", str(run)], "run.json"


def _break_run_json_keys(run, tmp_path):
    write_json(run / "run.json", {"config": {}})
    return ["evaluate", str(run)], "run.json"


BREAKS = [_break_out_is_a_file, _break_report_output_is_a_dir, _break_latest_is_a_dir, _break_state_json_keys,
          _break_nested_json, _break_non_utf8_json, _break_run_json_keys]


@pytest.mark.parametrize("breaker", BREAKS, ids=[b.__name__[7:] for b in BREAKS])
def test_os_and_file_errors_reach_the_cli_user_as_one_line(trained_run, tmp_path, capsys, breaker):
    run = _copy_run(trained_run, tmp_path / "run")
    argv, where = breaker(run, tmp_path)
    # the real process for one case (the user's view, exit code included); main() in-process for the rest
    proc = _cli(*argv) if breaker is _break_out_is_a_file else _main(capsys, *argv)
    assert proc.returncode not in (0, 1) and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.strip().splitlines() if not ln.startswith("note: ")]
    assert len(lines) == 1 and lines[0].startswith("error: ") and where in lines[0], proc.stderr[-2000:]


def test_disk_full_during_a_save_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch, capsys):
    import errno

    import cgt_viz.checkpoint as ckpt_mod
    out = tmp_path / "run"
    real = ckpt_mod.save_tensors
    calls = {"n": 0}

    def full_after_two(path, tensors, metadata=None):
        calls["n"] += 1
        if calls["n"] > 4:   # two checkpoints (two files each) fit, the third does not
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, tensors, metadata)
    monkeypatch.setattr(ckpt_mod, "save_tensors", full_after_two)
    code = main(["train", *ICL, "--out", str(out), "--steps", "4", "--batch-size", "4", "--eval-every", "0",
                 "--checkpoint-every", "1", "--aux-delay", "0"])   # (4 steps before icl's aux_delay would warn first)
    err = capsys.readouterr().err
    assert code == 3 and err.startswith("error: No space left on device: ") and "Traceback" not in err, err
    assert load_checkpoint(out / "ckpt").step == 2       # the previous checkpoint is intact


# ------------------------------------------------------------------------------- 8. from_pretrained checks first
@pytest.fixture
def saved_model(tmp_path):
    path = tmp_path / "model"
    _tiny_cgt().save_pretrained(path)
    return path


def _edit_config(path, **changes):
    meta = read_json(path / "config.json")
    meta["config"].update(changes)
    write_json(path / "config.json", meta)


@pytest.mark.parametrize("changes, message", [
    ({"n_layer": 10**9}, "n_layer 1000000000 must be at most the"),
    ({"d_x": 2**40, "n_head": 1}, "d_x 1099511627776 must be at most the"),
    ({"vocab_size": 10**12}, "vocab_size 1000000000000 must be at most the"),
    ({"d_x": 32}, "do not match its config.json: shapes differ"),
    ({"n_layer": 3}, "do not match its config.json"),
], ids=["n_layer 1e9", "huge d_x", "huge vocab", "d_x mismatch", "n_layer mismatch"])
def test_from_pretrained_checks_the_config_against_the_file_before_allocating(saved_model, monkeypatch, changes,
                                                                              message):
    from helpers import allocated_builds, record_model_builds
    _edit_config(saved_model, **changes)
    # a size no file this large could hold is refused from the header alone: not even a shapes-only (meta) model
    # is built at it; a size that merely differs from the file's is found by a meta model's shapes
    from_the_header = "must be at most the" in message

    def at_the_edited_size(cls, args, kwargs):
        return from_the_header and all(getattr(args[0], k) == v for k, v in changes.items())
    builds = record_model_builds(monkeypatch, CGT, refuse=at_the_edited_size)
    with pytest.raises(ValueError, match=message):
        CGT.from_pretrained(saved_model)
    assert allocated_builds(builds) == []
    assert [b for b in builds if at_the_edited_size(CGT, b[2], b[3])] == []


def test_a_config_missing_fields_is_refused_not_defaulted(saved_model):
    meta = read_json(saved_model / "config.json")
    del meta["config"]["w_smooth"], meta["config"]["sites"]
    write_json(saved_model / "config.json", meta)
    with pytest.raises(ValueError, match=r"lacks the config fields \['sites', 'w_smooth'\]"):
        CGT.from_pretrained(saved_model)


def test_nan_weights_load_with_a_warning_naming_them(tmp_path):
    model = _tiny_cgt()
    with torch.no_grad():
        model.gpt.wpe.weight[0, 0] = float("nan")
    model.save_pretrained(tmp_path / "m")
    with pytest.warns(RuntimeWarning, match=r"NaN/inf in 1 tensors \(gpt.wpe.weight\)"):
        CGT.from_pretrained(tmp_path / "m")


def test_a_mismatched_model_folder_is_one_line_in_the_cli(trained_run, tmp_path):
    run = _copy_run(trained_run, tmp_path / "run")
    _edit_config(run / "model", d_x=32)
    proc = _cli("evaluate", str(run), "--device", "cpu")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "shapes differ" in proc.stderr, proc.stderr[-2000:]


# ------------------------------------------------------------------------------- 7. degenerate projections
def _tsne_in_a_child(X: np.ndarray, tmp_path) -> subprocess.CompletedProcess:
    """t-SNE segfaulted the kernel on identical points: run it in a child process, so the test survives."""
    np.save(tmp_path / "X.npy", X)
    code = ("import numpy as np, sys; from cgt_viz.analysis import Projector\n"
            f"X = np.load({str(tmp_path / 'X.npy')!r})\n"
            "try:\n    Projector('tsne').fit_transform(X)\nexcept ValueError as e:\n    print('REFUSED', e); sys.exit(3)\n"
            "print('RAN')\n")
    return subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("X", [np.ones((40, 8), np.float32), np.repeat(np.eye(3, 8, dtype=np.float32), 20, 0)],
                         ids=["constant", "3 distinct points"])
def test_tsne_on_degenerate_points_is_refused_not_a_crash(X, tmp_path):
    proc = _tsne_in_a_child(X, tmp_path)
    assert proc.returncode == 3 and "distinct points" in proc.stdout, (proc.returncode, proc.stdout, proc.stderr[-1500:])


# ------------------------------------------------------------------------------- SIGTERM (kept)
def test_sigterm_mid_run_checkpoints_and_resumes_to_the_uninterrupted_weights(tmp_path):
    import signal

    from cgt_viz.train import train
    from test_train import QUIET, fresh, same_weights
    task, cfg, reference = tiny_reference(8)

    def term_at_3(event):
        if event["kind"] == "step" and event["step"] == 3:
            os.kill(os.getpid(), signal.SIGTERM)       # what a cluster scheduler sends before killing a job
    model, hist = train(fresh(cfg), task, steps=8, batch_size=4, eval_every=0, checkpoint_dir=tmp_path,
                        checkpoint_every=100, callbacks=[term_at_3], **QUIET)
    assert hist.interrupted and len(hist) == 3 and load_checkpoint(tmp_path).step == 3
    resumed, hist = train(fresh(cfg), task, steps=8, batch_size=4, eval_every=0, checkpoint_dir=tmp_path,
                          checkpoint_every=100, resume=True, **QUIET)
    assert not hist.interrupted and same_weights(resumed, reference)


def test_the_explorer_says_a_constant_ybar_cannot_be_embedded_by_tsne():
    from cgt_viz import explore
    model = _tiny_cgt()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()                                   # every token gets the same ȳ
    data = torch.randint(0, 256, (3, 12), generator=torch.Generator().manual_seed(0))
    ex = explore(model, data, background=None)
    with pytest.raises(ValueError, match="distinct points"):
        ex.set_projection("tsne", wait=True)
    assert "t-SNE failed: ValueError: X must hold at least 4 distinct points" in ex.status.value   # which view, why
    assert np.isfinite(ex.coords).all()                 # the PCA view stays usable


def test_a_model_larger_than_the_free_memory_is_refused_before_loading(saved_model, monkeypatch):
    import cgt_viz.io as io_mod
    monkeypatch.setattr(io_mod, "_available_memory", lambda: 1000)
    with pytest.raises(ValueError, match=r"needs about .* GiB to load, but only .* GiB of memory is free"):
        CGT.from_pretrained(saved_model)
    monkeypatch.setattr(io_mod, "_available_memory", lambda: None)     # unknown: no refusal
    CGT.from_pretrained(saved_model)


def test_fields_added_later_are_migrated_explicitly_and_the_model_is_unchanged(saved_model):
    from cgt_viz.config import ADDED_FIELDS
    before = CGT.from_pretrained(saved_model)
    meta = read_json(saved_model / "config.json")
    for name in ADDED_FIELDS:                 # a folder written before these fields existed
        del meta["config"][name]
    write_json(saved_model / "config.json", meta)
    after = CGT.from_pretrained(saved_model)
    assert after.config == before.config
    idx = torch.randint(0, after.config.vocab_size, (2, 6))
    assert torch.equal(after(idx), before(idx))
