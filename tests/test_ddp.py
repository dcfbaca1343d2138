"""DDP: two CPU ranks (gloo) launched by torch.distributed.run train the same model as one process."""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from cgt_viz import CGT
from cgt_viz.io import load_tensors
from cgt_viz.train import train
from helpers import free_port
from test_train import QUIET, TinyTask, fresh, tiny_config

TESTS = Path(__file__).resolve().parent
SETTINGS = dict(steps=6, batch_size=8, lr=3e-3, eval_every=3, eval_batches=1)

SCRIPT = """
import json, os, sys
import torch
from cgt_viz.io import save_tensors
from cgt_viz.train import train
from test_train import TinyTask, fresh, tiny_config

out = sys.argv[1]
task = TinyTask()
events = []
model, hist = train(fresh(tiny_config(task)), task, device="cpu", progress=False, callbacks=[events.append],
                    checkpoint_dir=os.path.join(out, "ckpt"), checkpoint_every=3, **json.loads(sys.argv[2]))
rank = int(os.environ["RANK"])
save_tensors(os.path.join(out, f"rank{rank}.safetensors"), model.state_dict())
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump({"history": hist.to_dict(), "events": events,
               "group_left": torch.distributed.is_initialized()}, f)
"""


@pytest.mark.slow
def test_two_gloo_ranks_match_one_process(tmp_path):
    script = tmp_path / "ddp_run.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           str(script), str(tmp_path), json.dumps(SETTINGS)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]

    w0, w1 = load_tensors(tmp_path / "rank0.safetensors"), load_tensors(tmp_path / "rank1.safetensors")
    assert w0.keys() == w1.keys() and all(torch.equal(w0[k], w1[k]) for k in w0)   # ranks agree exactly
    r0 = json.loads((tmp_path / "rank0.json").read_text())
    r1 = json.loads((tmp_path / "rank1.json").read_text())
    assert not r0["group_left"] and not r1["group_left"]          # the process group was destroyed
    # only rank 0 logs and checkpoints
    assert [e["kind"] for e in r0["events"]].count("step") == SETTINGS["steps"] and r1["events"] == []
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["latest", "step-00000003", "step-00000006"]

    # one process, the same global batch: the logged loss (averaged over ranks) and the weights agree
    task = TinyTask()
    single, hist = train(fresh(tiny_config(task)), task, **SETTINGS, **QUIET)
    ddp_main = r0["history"]["main"]
    assert ddp_main[0] == pytest.approx(hist.main[0], rel=1e-5)     # step 1: same weights, same rows
    assert ddp_main == pytest.approx(hist.main, rel=2e-3)
    # the aux term is a mean over suffix tokens whose count differs per row, so a mean of per-rank means
    # weighs rows slightly differently than one global mean: a small, expected difference
    assert r0["history"]["total"] == pytest.approx(hist.total, rel=1e-2)
    assert r0["history"]["evals"][-1]["val_main"] == pytest.approx(hist.evals[-1]["val_main"], rel=2e-3)
    # the ranks' weights moved away from the start, and only as far as one process moved them
    init = fresh(tiny_config(task)).state_dict()
    moved = lambda state: sum(float((state[k] - init[k]).norm()) for k in init)
    ref = single.state_dict()
    assert moved(w0) > 0 and moved(w0) == pytest.approx(moved(ref), rel=0.05)


def test_batch_size_must_split_evenly_over_ranks(monkeypatch):
    """The divisibility check runs before any process group exists, so it can be tested in one process."""
    train_mod = importlib.import_module("cgt_viz.train")   # (cgt_viz.train, the attribute, is the function)

    class FakeDist:
        @staticmethod
        def is_initialized():
            return True

        @staticmethod
        def get_world_size():
            return 3

        @staticmethod
        def get_rank():
            return 0

    monkeypatch.setattr(train_mod, "dist", FakeDist)
    task = TinyTask()
    with pytest.raises(ValueError, match=r"batch_size must be divisible by the number of ranks \(3\), got 8"):
        train(CGT(tiny_config(task)), task, steps=2, batch_size=8, **QUIET)
