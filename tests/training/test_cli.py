"""The CLI: train / evaluate / report, exit codes, and kill-then-resume giving the uninterrupted weights."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cgt_viz import CGT, GPT
from cgt_viz.__main__ import main
from cgt_viz.checkpoint import latest_checkpoint
from cgt_viz.io import load_tensors, read_json

TESTS = Path(__file__).resolve().parent
TINY = ["--task", "test_train:TinyTask", "--n-layer", "2", "--d-x", "16", "--n-head", "2", "--d-y", "8",
        "--n-head-y", "1", "--y-layer", "1", "--n-templates", "2", "--mlp-ratio", "2", "--no-progress",
        "--device", "cpu"]


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


def test_train_then_evaluate_then_report(tmp_path, capsys):
    out = tmp_path / "runs" / "tiny"
    assert main(["train", *TINY, "--out", str(out), "--steps", "8", "--batch-size", "4", "--task-arg", "P=4",
                 "--eval-every", "4", "--checkpoint-every", "4"]) == 0
    assert "trained 8 steps" in capsys.readouterr().out
    model = CGT.from_pretrained(out / "model")
    assert model.config.d_x == 16 and model.config.vocab_size == 8                   # --task-arg P=4 reached the task
    history = read_json(out / "history.json")
    assert history["step"] == list(range(1, 9)) and [e["step"] for e in history["evals"]] == [4, 8]
    assert read_json(out / "run.json")["settings"]["task_arg"] == {"P": 4}
    assert latest_checkpoint(out / "ckpt").name == "step-00000008"
    # the final model equals the last checkpoint's weights
    ck = load_tensors(out / "ckpt" / "step-00000008" / "model.safetensors")
    assert all(torch.equal(ck[k], v) for k, v in model.state_dict().items())

    assert main(["evaluate", str(out), "--n-batches", "1", "--batch-size", "4", "--task", "test_train:TinyTask"]) == 0
    printed = capsys.readouterr().out
    assert "val_main" in printed and "no eval_batch" in printed                      # graceful fallback, said so
    assert (out / "evaluation.json").is_file()

    assert main(["report", str(out)]) == 0
    page = (out / "report.html").read_text()
    assert page.count("<div id=") >= 2 and "Plotly.newPlot" in page                  # curves, drawn by plotly
    assert "<script src=\"http" not in page and "cdn.plot.ly" not in page.split("/*")[0]   # works offline
    assert "val_main" in page and "test_train:TinyTask" in page


@pytest.mark.parametrize("task, task_args", [("icl", ["--task-arg", "n_pairs=6", "--task-arg", "P=5"]),
                                             ("regression", ["--task-arg", "dim=3", "--task-arg", "n_points=6"])])
def test_registered_tasks_train_and_print_the_comparison_table(tmp_path, capsys, task, task_args):
    out = tmp_path / task
    tiny = [a for a in TINY[2:]]                       # the tiny model flags, without --task
    assert main(["train", "--task", task, *task_args, *tiny, "--out", str(out), "--steps", "3", "--batch-size", "4"]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(out), "--k", "2,3", "--n-batches", "1", "--batch-size", "4"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    header = lines[0].split()
    assert {"k", "loss_prompted", "loss_specialized", "loss_no_context", "gap_closed"} <= set(header)
    assert [row.split()[0] for row in lines[2:]] == ["2", "3"]                   # one row per k
    assert [r["k"] for r in read_json(out / "evaluation.json")] == [2, 3]


def test_gpt_baseline_run(tmp_path):
    out = tmp_path / "gpt"
    assert main(["train", *TINY, "--model", "gpt", "--out", str(out), "--steps", "3", "--batch-size", "4"]) == 0
    assert isinstance(GPT.from_pretrained(out / "model"), GPT)


@pytest.mark.parametrize("argv, message", [
    (["train", "--task", "nope", "--out", "{out}"], "unknown --task 'nope'"),
    (["train", *TINY, "--out", "{out}", "--steps", "0"], "--steps must be None or an int >= 1 (None: planned from minutes), got 0"),
    (["train", *TINY, "--out", "{out}", "--batch-size", "-2"], "--batch-size must be an int >= 1, got -2"),
    (["train", *TINY, "--out", "{out}", "--lr", "0"], "--lr must be a finite number > 0"),
    (["train", *TINY, "--out", "{out}", "--task-arg", "P"], "--task-arg must look like key=value, got 'P'"),
    (["train", *TINY, "--out", "{out}", "--task-arg", "bogus=1"], "bogus"),        # the task refuses it
    (["train", *TINY, "--out", "{out}", "--d-y", "7", "--n-head-y", "2"], "d_y must be divisible by n_head_y"),
    (["train", "--out", "{out}"], "--task is required"),
    (["train", "--task", "no_such_module:Task", "--out", "{out}"], "cannot import"),
    (["evaluate", "{out}"], "must be a run folder"),
    (["report", "{out}"], "must be a run folder"),
])
def test_bad_input_exits_2_with_a_message(tmp_path, capsys, argv, message):
    argv = [a.replace("{out}", str(tmp_path / "run")) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_resume_with_different_settings_exits_2(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(["train", *TINY, "--out", out, "--steps", "2", "--batch-size", "2"]) == 0
    assert main(["train", *TINY, "--out", out, "--steps", "4", "--batch-size", "2"]) == 2
    assert "pass --resume" in capsys.readouterr().err
    assert main(["train", *TINY, "--out", out, "--steps", "4", "--batch-size", "2", "--resume", "--d-x", "32"]) == 2
    assert "d_x (the run 16, now 32)" in capsys.readouterr().err
    assert main(["train", "--out", out, "--steps", "4", "--resume", "--lr", "0.01"]) == 2
    assert "--lr 0.01 (the run has 0.001)" in capsys.readouterr().err
    # --steps may grow: the run continues from its checkpoint with only --out and --resume
    # (the run's own Task class is typed again: a module:Class is never imported because run.json names it)
    assert main(["train", "--out", out, "--steps", "4", "--resume", "--no-progress", "--task", "test_train:TinyTask"]) == 0
    assert read_json(Path(out) / "history.json")["step"] == [1, 2, 3, 4]


def test_the_real_process_exits_2_without_a_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "cgt_viz", "train", "--task", "nope", "--out", str(tmp_path / "x")],
                          env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "unknown --task" in proc.stderr and "Traceback" not in proc.stderr


# ------------------------------------------------------------------------------------ kill and resume
STEPS = 40
KILL_ARGS = [*TINY, "--steps", str(STEPS), "--batch-size", "4", "--checkpoint-every", "1", "--eval-every", "10",
             "--task-arg", "P=5"]


@pytest.fixture(scope="module")
def reference_weights(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "run"
    assert main(["train", *KILL_ARGS, "--out", str(out)]) == 0
    return CGT.from_pretrained(out / "model").state_dict(), read_json(out / "history.json")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["SIGINT", "SIGTERM", "SIGKILL"])
def test_killed_run_resumes_to_the_uninterrupted_weights(tmp_path, reference_weights, sig):
    ref_state, ref_history = reference_weights
    out = tmp_path / "run"
    kill_at = random.Random(f"{sig}-{os.getpid()}").randint(3, STEPS // 2)   # a random step, printed on failure
    proc = subprocess.Popen([sys.executable, "-m", "cgt_viz", "train", *KILL_ARGS, "--out", str(out)],
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        found = latest_checkpoint(out / "ckpt")
        if found is not None and int(found.name.split("-")[1]) >= kill_at:
            proc.send_signal(sig)
            break
        time.sleep(0.005)
    _, err = proc.communicate(timeout=60)
    if sig in (signal.SIGINT, signal.SIGTERM):   # SIGTERM: what a cluster scheduler sends
        assert proc.returncode == 130, err                      # stopped cleanly, said how to resume
        assert "--resume" in err and "Traceback" not in err
    else:
        assert proc.returncode == -signal.SIGKILL, err
    stopped = int(latest_checkpoint(out / "ckpt").name.split("-")[1])
    assert kill_at <= stopped < STEPS, (kill_at, stopped)       # it really was stopped part-way
    assert not (out / "model").exists()

    assert main(["train", "--out", str(out), "--resume", "--no-progress", "--task", "test_train:TinyTask"]) == 0
    resumed = CGT.from_pretrained(out / "model").state_dict()
    assert all(torch.equal(resumed[k], v) for k, v in ref_state.items()), f"killed at step {stopped}"
    history = read_json(out / "history.json")
    assert history["total"] == ref_history["total"] and history["evals"] == ref_history["evals"]


# ----------------------------------------------------------------- a pretrained-LM task: train-head's pipeline
HEAD = ["--task", "smollm2-bbc", "--steps", "4", "--batch-size", "4", "--y-layer", "2", "--d-y", "8",
        "--n-templates", "2", "--template-rank", "1", "--threads", "1", "--no-progress", "--device", "cpu",
        "--checkpoint-every", "1", "--task-arg", "prefix=8", "--task-arg", "suffix=8", "--task-arg", "train_per_topic=4",
        "--task-arg", "val_windows=5", "--task-arg", "eval_per_topic=2", "--task-arg", "eval_draws=1",
        "--task-arg", "eval_prompts=[8]", "--task-arg", "top_k=5", "--task-arg", "skip_test=true"]


@pytest.mark.slow
def test_train_with_a_pretrained_lm_task_runs_the_head_pipeline_and_resumes_like_any_run(tiny_smollm2, tmp_path,
                                                                                         capsys, monkeypatch):
    from cgt_viz.hf import CGTLM
    from cgt_viz.hf import distill as hfd
    straight = tmp_path / "straight"
    assert main(["train", *HEAD, "--out", str(straight)]) == 0
    metrics = read_json(straight / "metrics.json")
    s = metrics["settings"]          # train's flags and the task args reached the head's pipeline
    assert (s["steps"], s["batch"], s["d_y"], s["templates"], s["rank"], s["prefix"], s["top_k"]) == (4, 4, 8, 2, 1, 8, 5)
    assert metrics["training"]["steps"] == 4 and "p=8" in metrics["val"] and "test" not in metrics
    head = CGTLM.from_pretrained(straight, tiny_smollm2)
    assert head.pooled_only and head.config.d_y == 8 and head.config.aux_kl_top_k == 5
    assert read_json(straight / "run.json")["settings"]["task"] == "smollm2-bbc"
    capsys.readouterr()

    assert main(["train", *HEAD, "--out", str(straight)]) == 2                   # a run is there already
    assert "pass --resume" in capsys.readouterr().err
    assert main(["evaluate", str(straight)]) == 2                                # not a from-scratch run
    assert "train-head --out" in capsys.readouterr().err

    # Ctrl-C after step 2 (a KeyboardInterrupt out of the training), then `train --out OUT --resume`
    train_head = hfd.train_head

    def stopped_at_2(*args, **kw):
        def stop(step, out):
            if step == 2:
                raise KeyboardInterrupt
        return train_head(*args, **{**kw, "callback": stop})

    monkeypatch.setattr(hfd, "train_head", stopped_at_2)
    killed = tmp_path / "killed"
    assert main(["train", *HEAD, "--out", str(killed)]) == 130
    assert "--resume" in capsys.readouterr().err and not (killed / "metrics.json").exists()
    monkeypatch.setattr(hfd, "train_head", train_head)
    assert main(["train", "--out", str(killed), "--resume", "--steps", "6"]) == 2  # the run's settings, or none
    assert "was started with different settings: --steps 6 (the run has 4)" in capsys.readouterr().err
    assert main(["train", "--out", str(killed), "--resume", "--no-progress"]) == 0
    resumed = CGTLM.from_pretrained(killed, tiny_smollm2).state_dict()
    for k, v in head.state_dict().items():
        assert torch.equal(resumed[k], v), k
    assert read_json(killed / "metrics.json")["training"]["steps"] == 4


@pytest.mark.parametrize("extra, message", [
    (["--n-layer", "2"], "--n-layer: no such setting for --task smollm2-bbc"),
    (["--model", "gpt"], "--model: no such setting"),
    (["--task-arg", "bogus=1"], "--task-arg bogus=1: not a setting of --task smollm2-bbc; allowed keys:"),
    (["--minutes", "0"], "--minutes must be"),
    (["--task-arg", "skip_test=3"], "--task-arg skip_test must be true or false, got 3"),
])
def test_a_pretrained_lm_task_refuses_what_it_cannot_use_by_name(tmp_path, capsys, extra, message):
    out = tmp_path / "run"
    assert main(["train", "--task", "smollm2-bbc", "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err
    assert not (out / "run.json").exists()


# ------------------------------------------------------------------------------------------ the CLI in a log
def test_train_writing_to_a_file_logs_one_line_per_interval(tmp_path):
    """stdout and stderr are files (not terminals): a plain line per evaluation interval, no carriage returns."""
    log = tmp_path / "train.log"
    argv = [a for a in TINY if a != "--no-progress"]
    with log.open("w") as f:
        proc = subprocess.run([sys.executable, "-m", "cgt_viz", "train", *argv, "--out", str(tmp_path / "run"),
                               "--steps", "12", "--batch-size", "4", "--eval-every", "3", "--task-arg", "P=4"],
                              env=_env(), stdout=f, stderr=subprocess.STDOUT, timeout=300)
    text = log.read_text()
    assert proc.returncode == 0, text
    assert "\r" not in text
    lines = [line for line in text.splitlines() if line.startswith("train step ")]
    assert [line.split()[2] for line in lines] == ["3/12", "6/12", "9/12", "12/12"]
    assert all("main " in line and "val_main " in line for line in lines)


def test_progress_is_a_bar_in_a_terminal_and_lines_in_a_log(capsys):
    from cgt_viz.train import _LogProgress, _progress_bar

    class Terminal:
        def isatty(self):
            return True

        def write(self, text):
            pass

        def flush(self):
            pass

    bar = _progress_bar(10, 0, every=5, stream=Terminal())
    assert not isinstance(bar, _LogProgress)
    bar.close()
    lines = _progress_bar(10, 0, every=4, stream=sys.stderr)      # pytest's capture: not a terminal
    assert isinstance(lines, _LogProgress)
    for step in range(1, 11):
        lines.update(1)
        lines.set_postfix(main=f"{1 / step:.3g}")
        lines.step_done(step)
    err = capsys.readouterr().err.splitlines()
    assert [line.split()[2] for line in err] == ["4/10", "8/10", "10/10"]     # every 4th update and the last
    assert err[-1].endswith("s") and "main 0.1" in err[-1]


def test_train_help_shows_each_flags_default_for_the_chosen_task(capsys):
    """--help's defaults are the values the run takes when the flag is left out (its recipe, else the library's)."""
    from pathlib import Path as P

    from cgt_viz import CGTConfig
    from cgt_viz.__main__ import MODEL_FLAGS, TRAIN_FIELDS, _parser, _settings

    library = CGTConfig(vocab_size=8)          # a model flag the recipe leaves out takes CGTConfig's value
    for task in ("icl", "regression", "text"):
        argv = ["train", "--task", task, "--out", "unused"]
        settings = _settings(_parser().parse_args(argv), P("/nonexistent/run"))
        sub = next(a for a in _parser(argv)._actions if a.dest == "command").choices["train"]
        helps = {a.dest: a.help for a in sub._actions}
        for name in (*TRAIN_FIELDS, *MODEL_FLAGS, "curriculum"):
            value = settings[name] if name in settings else getattr(library, name)
            assert "the task's recipe" not in helps[name]
            if value is None and name not in ("curriculum", "minutes"):   # decided by train() from steps (minutes: no budget)
                assert f"steps // " in helps[name] and helps[name].rstrip(")").split(" = ")[-1].isdigit(), helps[name]
                continue
            shown = (",".join(str(v) for v in value) if isinstance(value, (tuple, list)) else "off" if name == "curriculum" and not value
                     else str(value))
            assert f"default: {shown})" in helps[name], (task, name, helps[name])
    with pytest.raises(SystemExit) as done:
        main(["train", "--task", "regression", "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "default: 3000" in out.replace("\n", " ").replace("  ", " ")
    assert "(default: the task's recipe" not in out


def test_a_run_that_ends_before_aux_delay_says_so(tmp_path, capsys):
    assert main(["train", *TINY, "--out", str(tmp_path / "short"), "--steps", "4", "--batch-size", "4",
                 "--aux-delay", "4", "--task-arg", "P=4"]) == 0
    err = capsys.readouterr().err
    warned = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert len(warned) == 1 and "steps = 4 ends before aux_delay = 4" in warned[0]
    assert ".py:" not in err                                   # a log line, not Python's file:line header
    assert main(["train", *TINY, "--out", str(tmp_path / "long"), "--steps", "4", "--batch-size", "4",
                 "--aux-delay", "3", "--task-arg", "P=4"]) == 0
    assert "aux_delay" not in capsys.readouterr().err


def test_aux_delay_past_the_last_step_warns_for_a_cgt_only():
    """A run that ends before the auxiliary loss joins warns (and tells the monitor); the GPT baseline, which
    has no auxiliary loss, neither warns nor reports an aux weight to the monitor."""
    import warnings

    from cgt_viz.train import AuxDelayWarning, train
    from helpers import TinyTask
    from test_train import fresh, tiny_config

    task = TinyTask()
    events = []
    with pytest.warns(AuxDelayWarning, match="aux_delay = 5"):
        train(fresh(tiny_config(task)), task, steps=3, batch_size=4, aux_delay=5, progress=False,
              callbacks=[events.append])
    assert [e["kind"] for e in events].count("warning") == 1
    assert events[0]["weights"]["aux"] == 1.0
    gpt_events = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", AuxDelayWarning)
        train(fresh(tiny_config(task), cls=GPT), task, steps=3, batch_size=4, aux_delay=5, progress=False,
              callbacks=[gpt_events.append])
        train(fresh(tiny_config(task)), task, steps=3, batch_size=4, aux_delay=2, progress=False)
    start = gpt_events[0]
    assert start["kind"] == "start" and start["weights"]["aux"] == 0.0 and start["weights"]["smooth"] == 0.0
    assert "warning" not in [e["kind"] for e in gpt_events]


def test_the_gpt_baselines_monitor_shows_no_aux_term():
    """Notebook 01's baseline monitor: a plain GPT has no auxiliary loss, so neither the total's formula nor the
    status line nor the curves mention one (they said "total = main + 1·aux" and "aux 0.0000")."""
    import cgt_viz
    from helpers import TinyTask
    from test_train import fresh, tiny_config

    from cgt_viz.train import train

    task = TinyTask()
    gpt_monitor, cgt_monitor = cgt_viz.TrainingMonitor(min_interval=0), cgt_viz.TrainingMonitor(min_interval=0)
    train(fresh(tiny_config(task), cls=GPT), task, steps=4, batch_size=4, eval_every=2, progress=False,
          callbacks=[gpt_monitor])
    train(fresh(tiny_config(task)), task, steps=4, batch_size=4, eval_every=2, progress=False,
          callbacks=[cgt_monitor])
    gpt_fig, cgt_fig = gpt_monitor.static_figures()[0], cgt_monitor.static_figures()[0]
    words = lambda fig: " ".join(a.text for a in fig.layout.annotations)   # noqa: E731 (the subplot titles)
    assert "total = main" in words(gpt_fig) and "aux" not in words(gpt_fig)
    assert "aux" not in gpt_monitor.status_text(final=True) and not any("aux" in (t.name or "") for t in gpt_fig.data)
    assert "aux" in words(cgt_fig) and "aux " in cgt_monitor.status_text(final=True)   # a CGT keeps its term
