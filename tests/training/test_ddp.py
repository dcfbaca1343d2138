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
    ranks_mod = importlib.import_module("cgt_viz._ranks")   # where train's process group reads the world size

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

    monkeypatch.setattr(ranks_mod, "dist", FakeDist)
    task = TinyTask()
    with pytest.raises(ValueError, match=r"batch_size must be divisible by the number of ranks \(3\), got 8"):
        train(CGT(tiny_config(task)), task, steps=2, batch_size=8, **QUIET)


# ------------------------------------------------------------------ the pretrained-LM head (cgt_viz.hf.distill)
HEAD_SCRIPT = """
import json, os, signal, sys
from cgt_viz.hf import distill as hfd
from cgt_viz.io import save_tensors
from cgt_viz.train import _process_group
from test_ddp import HEAD_STEPS, head_and_cache

out, resume = sys.argv[1], sys.argv[2] == "resume"
built = []
compute = hfd.compute_features
hfd.compute_features = lambda *a, **k: built.append(1) or compute(*a, **k)

def interrupt_at_3(step, loss):      # a Ctrl-C on rank 0 alone, as a terminal sends it to one process
    if step == 3 and not resume:
        os.kill(os.getpid(), signal.SIGINT)

with _process_group("cpu") as (dev, distributed, rank, world):
    model, cache = head_and_cache(os.path.join(out, "cache"))
    hist = hfd.train_head(model, cache, steps=HEAD_STEPS, batch_size=8, lr=1e-2, warmup=2, progress=False,
                          checkpoint_dir=os.path.join(out, "ckpt"), checkpoint_every=100, resume=resume,
                          callback=interrupt_at_3)
    tag = f"{'resumed' if resume else 'first'}-rank{rank}"
    save_tensors(os.path.join(out, tag + ".safetensors"), model.state_dict())
    with open(os.path.join(out, tag + ".json"), "w") as f:
        json.dump({"steps": hist["steps"], "interrupted": hist["interrupted"], "aux": hist["aux"], "built": len(built),
                   "world": world}, f)
"""
HEAD_STEPS = 6


def head_and_cache(root, **head):
    """A seeded pooled-only head over the tiny Llama (templates drawn, read-out calibrated) and its feature cache
    of 16 seeded windows."""
    from cgt_viz import hf
    from cgt_viz.hf import distill as hfd
    from helpers import randomize_templates
    torch.manual_seed(0)
    model = randomize_templates(hf.CGTLM(hf.tiny_llama(seed=0), y_layer=2, d_y=8, n_head_y=2, n_templates=3,
                                         template_rank=2, pooled_only=True, aux_ce=1.0, aux_kl=1.0, aux_kl_top_k=7))
    tokens = torch.randint(0, 96, (16, 6 + 8 + 1), generator=torch.Generator().manual_seed(0))
    cache = hfd.build_feature_cache(model, tokens, 6, top_k=7, root=root, store_dtype="float32", progress=False)
    return model.calibrate_pool_from(cache.tensors["pooled"]), cache


def _torchrun(script: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(script), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.slow
def test_two_gloo_ranks_train_the_head_as_one_process_and_resume_after_a_ctrl_c(tmp_path):
    pytest.importorskip("transformers")
    from cgt_viz.hf import distill as hfd
    script = tmp_path / "ddp_head.py"
    script.write_text(textwrap.dedent(HEAD_SCRIPT))
    proc = _torchrun(script, str(tmp_path), "first")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    r0, r1 = (json.loads((tmp_path / f"first-rank{r}.json").read_text()) for r in (0, 1))
    assert r0["world"] == 2 and r0["built"] == 1 and r1["built"] == 0      # rank 0 built the cache, rank 1 loaded it
    assert len(list((tmp_path / "cache" / "features").iterdir())) == 1
    # the Ctrl-C reached rank 0 alone during step 3; both ranks stopped together after the next step
    assert r0["interrupted"] and r1["interrupted"] and r0["steps"] == r1["steps"] == 4
    from cgt_viz.checkpoint import latest_checkpoint
    assert latest_checkpoint(tmp_path / "ckpt").name == "step-00000004"                 # rank 0's checkpoint

    proc = _torchrun(script, str(tmp_path), "resume")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    w0, w1 = (load_tensors(tmp_path / f"resumed-rank{r}.safetensors") for r in (0, 1))
    assert all(torch.equal(w0[k], w1[k]) for k in w0)                      # the ranks agree exactly
    resumed = json.loads((tmp_path / "resumed-rank0.json").read_text())
    assert resumed["steps"] == HEAD_STEPS and not resumed["interrupted"]

    # one process, the same global batch of 8: the same losses and the same head, to float tolerance
    model, cache = head_and_cache(tmp_path / "single")
    start = {k: v.clone() for k, v in model.state_dict().items()}
    hist = hfd.train_head(model, cache, steps=HEAD_STEPS, batch_size=8, lr=1e-2, warmup=2, progress=False)
    assert resumed["aux"] == pytest.approx(hist["aux"], rel=1e-5)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(w0[k], v, rtol=1e-4, atol=1e-6, msg=k)
    moved = sum(float((model.state_dict()[k] - start[k]).norm()) for k in start)
    assert moved > 1e-3
    # ... and not the head one process trains on one rank's share (4 windows a step): the ranks did average
    half, half_cache = head_and_cache(tmp_path / "single")
    hfd.train_head(half, half_cache, steps=HEAD_STEPS, batch_size=4, lr=1e-2, warmup=2, progress=False)
    assert max(float((half.state_dict()[k] - w0[k]).abs().max()) for k in w0) > 1e-3
