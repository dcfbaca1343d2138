"""Faults from the fourth reliability audit (issue 39), the rest: a real full disk is one line, sizes are checked
before anything is allocated, a head run resumes only to itself, the feature cache is checked against what was
asked for, and the errors name what the user typed. Real file-size limits, real files, real processes."""
from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
from pathlib import Path

import pytest
import torch

from test_faults import ICL
from test_faults4_writes import HEAD_FLAGS, _train_head, _tree


# ---------------------------------------------------------------------------------------------- A21, B16, B18
@contextlib.contextmanager
def file_size_limit(nbytes: int):
    """A real limit on the size of any file this process writes (RLIMIT_FSIZE, what `ulimit -f` sets): a write
    past it fails with EFBIG (os error 27), as a full disk fails with ENOSPC, inside safetensors' Rust writer
    too. SIGXFSZ is ignored meanwhile (its default action ends the process)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if hard != resource.RLIM_INFINITY and hard < nbytes:
        pytest.skip(f"the hard file-size limit here is {hard} bytes")
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)


def _one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if not line.startswith("warning:")]
    assert len(lines) == 1 and "Traceback" not in err and "SafetensorError" not in err, err
    return lines[0]


def test_a_full_disk_during_a_train_checkpoint_is_one_line_naming_the_file(tmp_path, capsys):
    """A21: the optimizer state of the first checkpoint does not fit; the run ends in one line naming the file
    of the step folder and the OS's reason, and leaves no step folder or pointer a resume would trust."""
    from cgt_viz.__main__ import main
    from cgt_viz.checkpoint import latest_checkpoint
    out = tmp_path / "run"
    with file_size_limit(60_000):          # the tiny model's weights fit, its AdamW state does not
        code = main(["train", *ICL, "--out", str(out), "--steps", "2", "--batch-size", "4", "--eval-every", "0",
                     "--checkpoint-every", "1"])
    line = _one_line(capsys.readouterr().err)
    assert code == 3, line
    assert line.startswith("error: File too large: ") and "step-00000001/train_state.safetensors" in line, line
    assert ".tmp" not in line
    assert latest_checkpoint(out / "ckpt") is None
    assert not [p for p in (out / "ckpt").iterdir() if p.name != ".lock"] if (out / "ckpt").exists() else True
    assert main(["train", *ICL, "--out", str(out), "--steps", "2", "--batch-size", "4", "--eval-every", "0",
                 "--checkpoint-every", "1"]) == 0          # the same command runs once there is room


def test_a_full_disk_during_the_feature_cache_is_one_line_and_leaves_no_cache(tiny_smollm2, tmp_path, capsys):
    """B16: the training cache does not fit: one line naming the cache file, no cache folder or temp folder
    left (a later run would load it), no head; the same command then builds it and trains."""
    with file_size_limit(40_000):
        code, err = _train_head(capsys, tmp_path / "head")
    line = _one_line(err)
    assert code == 3 and line.startswith("error: File too large: ") and "features.safetensors" in line, line
    assert ".partial" not in line
    features = Path(os.environ["CGT_VIZ_CACHE"]) / "features"
    assert [p.name for p in features.iterdir()] == [] if features.exists() else True
    assert not (tmp_path / "head" / "model.safetensors").exists()
    assert _train_head(capsys, tmp_path / "head")[0] == 0


def test_a_full_disk_during_a_head_checkpoint_is_one_line_and_leaves_no_state(tiny_smollm2, tmp_path, capsys):
    """B18: the caches exist (a first run built them); the head's first checkpoint does not fit: one line naming
    the file, no head-state.json naming a state that is not there, no head; --resume then trains from step 0."""
    assert _train_head(capsys, tmp_path / "first")[0] == 0
    out = tmp_path / "head"
    with file_size_limit(20_000):          # the caches and the head fit, the head with its AdamW state does not
        code, err = _train_head(capsys, out)
    line = _one_line(err)
    assert code == 3 and line.startswith("error: File too large: ") and "/ckpt/head-state" in line, line
    assert not (out / "ckpt" / "head-state.json").exists() and not (out / "model.safetensors").exists()
    assert not [p for p in (out / "ckpt").iterdir() if p.name != ".lock"] if (out / "ckpt").exists() else True
    code, err = _train_head(capsys, out)
    assert code == 0, err
    assert (out / "model.safetensors").read_bytes() == (tmp_path / "first" / "model.safetensors").read_bytes()


def test_a_read_only_folder_names_the_file_asked_for_not_a_temp_file(tmp_path, monkeypatch):
    """B50: a write into a folder that refuses new files names the file that was asked for (mkstemp's random
    `.name.xxxx.tmp` meant nothing to the user). Root ignores a folder's permissions, so there the OS's refusal
    is what mkstemp raises for anyone else."""
    from cgt_viz.io import write_json
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    if os.access(folder, os.W_OK):                      # root: the refusal an ordinary user gets
        import tempfile

        def refused(prefix="", suffix="", dir=None):
            raise PermissionError(13, "Permission denied", os.path.join(dir, f"{prefix}k3j2h1{suffix}"))
        monkeypatch.setattr(tempfile, "mkstemp", refused)
    try:
        with pytest.raises(PermissionError) as caught:
            write_json(folder / "metrics.json", {"a": 1})
    finally:
        folder.chmod(0o755)
    assert caught.value.filename == str(folder / "metrics.json") and ".tmp" not in str(caught.value)
    assert list(folder.iterdir()) == []


# ---------------------------------------------------------------------------------------------- B19, B20, B21, B45
HUGE = 10 ** 9


@pytest.mark.parametrize("flags, named", [
    (["--d-x", "1000000"], "--d-x"),
    (["--n-templates", "100000000"], "--n-templates"),
    (["--task-arg", f"P={HUGE}"], "P"),
    (["--task-arg", "n_pairs=10000000", "--task-arg", "aux_min_pairs=1"], "n_pairs"),
    (["--threads", "100000"], "--threads"),
])
def test_train_sizes_are_refused_with_an_estimate_before_anything_is_allocated(tmp_path, capsys, flags, named):
    """B19/B20 (train): a model, a vocabulary or a block the machine cannot hold, and a thread count no machine
    runs, are refused in one line naming the argument (with the estimate in GiB), before anything is written."""
    from cgt_viz.__main__ import main
    import time
    t0 = time.perf_counter()
    code = main(["train", *ICL, "--out", str(tmp_path / "run"), "--steps", "1", "--batch-size", "4",
                 "--eval-every", "0", *flags])
    line = _one_line(capsys.readouterr().err)
    assert code == 2 and f"{named} must be " in line, line
    assert "GiB" in line or named == "--threads", line
    assert not (tmp_path / "run" / "run.json").exists()


def test_regression_n_points_is_refused_with_an_estimate(tmp_path):
    from cgt_viz.tasks.regression import LinearRegression
    with pytest.raises(ValueError, match=r"n_points must be small enough to fit in the .* GiB of memory free here, "
                                         r"got 10000000, for which the attention over the block of 20000000 "
                                         r"positions .* needs about .* GiB"):
        LinearRegression(n_points=10 ** 7)
    LinearRegression(n_points=64)                      # an ordinary size is not refused


@pytest.mark.parametrize("flags, named, says", [
    (["--d-y", str(10 ** 8)], "--d-y", "the head's training state"),
    (["--templates", str(10 ** 7)], "--templates", "the head's training state"),
    (["--rank", str(10 ** 8)], "--rank", "the head's training state"),
    (["--per-doc", str(10 ** 12)], "--per-doc", "the feature cache"),
    (["--top-k", "1000"], "--top-k", "the LM's vocabulary"),
    (["--threads", "100000"], "--threads", "cores"),
])
def test_train_head_sizes_are_refused_before_the_head_or_the_cache(tiny_smollm2, tmp_path, capsys, flags, named, says):
    """B21, B45 (train-head): sizes checked once the LM is loaded (its widths and vocabulary decide them), before
    the head, the windows or a cache are allocated; --top-k above the vocabulary is refused (it meant 'all')."""
    code, err = _train_head(capsys, tmp_path / "head", *flags)
    line = _one_line(err)
    assert code == 2 and f"{named} must be " in line and says in line, line
    features = Path(os.environ["CGT_VIZ_CACHE"]) / "features"
    assert not features.exists() or list(features.iterdir()) == []
    assert not (tmp_path / "head" / "model.safetensors").exists()


# ---------------------------------------------------------------------------------------------- B32, B33, B35, B34
@pytest.fixture
def head_and_cache(tmp_path):
    pytest.importorskip("transformers")
    from cgt_viz import hf
    from cgt_viz.hf import distill as hfd
    from test_distill import _head, _windows
    lm = hf.tiny_llama(seed=0)
    cache = hfd.build_feature_cache(_head(lm), _windows(n=8), 6, top_k=7, root=tmp_path, progress=False)
    return (lambda **kw: _head(lm, **kw)), cache


class Died(BaseException):
    """A process killed at that instruction (nothing after it runs, no handler catches it)."""


def test_a_death_between_the_two_head_state_writes_resumes_to_the_uninterrupted_weights(head_and_cache, tmp_path,
                                                                                         monkeypatch):
    """B32: the run dies after the tensors of step 5 are written and before head-state.json is: the resume
    continues from step 5 (the state the file holds), so 8 steps give the uninterrupted run's weights."""
    from cgt_viz.hf import distill as hfd
    make, cache = head_and_cache
    kw = dict(steps=8, batch_size=3, warmup=2, progress=False)
    straight = make()
    hfd.train_head(straight, cache, **kw)
    real = hfd.write_json

    def die_at_step_5(path, obj):
        if Path(path).name == hfd.HEAD_STATE_JSON and obj["step"] == 5:
            raise Died
        return real(path, obj)
    monkeypatch.setattr(hfd, "write_json", die_at_step_5)
    with pytest.raises(Died):
        hfd.train_head(make(), cache, checkpoint_dir=tmp_path / "ckpt", checkpoint_every=1, **kw)
    monkeypatch.setattr(hfd, "write_json", real)
    assert json.loads((tmp_path / "ckpt" / hfd.HEAD_STATE_JSON).read_text())["step"] == 4   # the death's trace
    resumed = make()
    hist = hfd.train_head(resumed, cache, checkpoint_dir=tmp_path / "ckpt", resume=True, **kw)
    assert hist["steps"] == 8 and len(hist["aux"]) == 8
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_resuming_a_head_state_of_another_head_or_an_incomplete_one_is_named(head_and_cache, tmp_path):
    """B33: a head of another d_y / n_templates is named with the tensor and both shapes (not load_state_dict's
    traceback); B35: a state without its history or its generator is named, not a KeyError."""
    from cgt_viz.hf import distill as hfd
    from cgt_viz.io import load_tensors, save_tensors
    make, cache = head_and_cache
    folder = tmp_path / "ckpt"
    kw = dict(steps=4, batch_size=3, warmup=2, progress=False, checkpoint_dir=folder)

    def stop_at_2(step, out):
        if step == 2:
            raise KeyboardInterrupt
    assert hfd.train_head(make(), cache, callback=stop_at_2, **kw)["interrupted"]
    from cgt_viz import hf
    for other in (dict(d_y=16), dict(n_templates=5)):
        model = hf.CGTLM(hf.tiny_llama(seed=0), y_layer=2, d_y=other.get("d_y", 8), n_head_y=2,
                         n_templates=other.get("n_templates", 3), template_rank=2, pooled_only=True, aux_kl=1.0,
                         aux_ce=0.5, aux_kl_top_k=7)
        with pytest.raises(ValueError, match=r"is of another head than this model: shapes differ \(.*the state has "
                                             r".*this model .*resume with the run's settings"):
            hfd.train_head(model, cache, resume=True, **kw)
    tensors = load_tensors(folder / hfd.HEAD_STATE)
    info = json.loads((folder / hfd.HEAD_STATE_JSON).read_text())
    del info["history"]
    save_tensors(folder / hfd.HEAD_STATE, tensors, metadata={"format": hfd.HEAD_STATE_FORMAT, "info": json.dumps(info)})
    with pytest.raises(ValueError, match=r"is not a complete head training state: history missing"):
        hfd.train_head(make(), cache, resume=True, **kw)
    info = json.loads((folder / hfd.HEAD_STATE_JSON).read_text())
    save_tensors(folder / hfd.HEAD_STATE, {k: v for k, v in tensors.items() if k != "generator"},
                 metadata={"format": hfd.HEAD_STATE_FORMAT, "info": json.dumps(info)})
    with pytest.raises(ValueError, match=r"lacks \['generator'\]"):
        hfd.train_head(make(), cache, resume=True, **kw)


@pytest.mark.parametrize("flag, value", [("--batch", "2"), ("--lr", "0.01"), ("--seed", "1"), ("--top-k", "4"),
                                         ("--prefix", "6")])
def test_train_head_resume_with_other_settings_is_refused_before_any_cache(tiny_smollm2, tmp_path, capsys,
                                                                           monkeypatch, flag, value):
    """B34: an interrupted head run resumed with another --batch, --lr, --seed, --top-k or --prefix is refused
    in one line naming the flag and both values, before the LM's caches are built (no new cache folder)."""
    from cgt_viz.hf import distill as hfd
    real = hfd.train_head

    def stop_at_2(*a, **k):
        return real(*a, **k, callback=lambda step, out: (_ for _ in ()).throw(KeyboardInterrupt) if step == 2 else None)
    monkeypatch.setattr(hfd, "train_head", stop_at_2)
    out = tmp_path / "head"
    code, err = _train_head(capsys, out)
    assert code == 130 and (out / "ckpt" / "head-state.json").exists(), err
    monkeypatch.setattr(hfd, "train_head", real)
    caches = sorted((Path(os.environ["CGT_VIZ_CACHE"]) / "features").iterdir())
    args = list(HEAD_FLAGS)
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    from cgt_viz.__main__ import main
    capsys.readouterr()
    code = main(["train-head", *args, "--out", str(out), "--resume"])
    line = _one_line(capsys.readouterr().err)
    assert code == 2 and "--resume must be given the flags the head run was started with" in line, line
    assert f"{flag} " in line and "(the run has " in line, line
    assert sorted((Path(os.environ["CGT_VIZ_CACHE"]) / "features").iterdir()) == caches
    code, err = _train_head(capsys, out, "--resume")                    # its own flags resume it
    assert code == 0, err
