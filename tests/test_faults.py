"""Faults from the second reliability audit (issue 11): hostile run folders, lost runs, two writers on one
folder, kernel-killing inputs, numeric data errors and OS errors. Each test failed on the code before the
fix (see docs/RELIABILITY.md)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from cgt_viz import CGT, CGTConfig
from cgt_viz.__main__ import main
from cgt_viz.checkpoint import latest_checkpoint, load_checkpoint
from cgt_viz.io import read_json, write_json

torch.set_num_threads(1)
TESTS = Path(__file__).resolve().parent
TINY_MODEL = ["--n-layer", "2", "--d-x", "16", "--n-head", "2", "--d-y", "8", "--n-head-y", "1", "--y-layer", "1",
              "--n-templates", "2", "--mlp-ratio", "2", "--no-progress", "--device", "cpu"]
ICL = ["--task", "icl", "--task-arg", "n_pairs=4", "--task-arg", "P=5", *TINY_MODEL]


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


def _cli(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cgt_viz", *argv], env=_env(), capture_output=True, text=True,
                          timeout=timeout)


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
def test_a_run_folder_never_imports_or_calls_what_it_names(trained_run, tmp_path, task, key):
    run = _copy_run(trained_run, tmp_path / "run")
    marker = tmp_path / "pwned"
    info = read_json(run / "run.json")
    info["settings"]["task"] = task
    info["settings"]["task_arg"] = {key: f"touch {marker}", **({"shell": True} if key == "args" else {})}
    write_json(run / "run.json", info)
    for argv in (["evaluate", str(run), "--n-batches", "1", "--batch-size", "4", "--device", "cpu"],
                 ["train", "--out", str(run), "--resume", "--no-progress", "--device", "cpu"]):
        proc = _cli(*argv)
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
    from cgt_viz.figures import color_spec, template_figure
    spec = color_spec([XSS, "b"])
    assert XSS not in spec["colorbar"]["ticktext"] and "&lt;img src=x onerror=window.__xss=1&gt;" in spec["colorbar"]["ticktext"]
    fig = template_figure(np.zeros((2, 2)), [XSS, "b"], label_names=[XSS], mean_abs=np.zeros((1, 2)))
    assert XSS not in fig.to_json()
