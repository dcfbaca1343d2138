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
from test_faults_writes import HEAD_FLAGS, _train_head, _tree


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
    the file, no `latest` naming a checkpoint that is not there, no head; the same command then trains from step 0."""
    assert _train_head(capsys, tmp_path / "first")[0] == 0
    out = tmp_path / "head"
    with file_size_limit(20_000):          # the caches and the head fit, the head with its AdamW state does not
        code, err = _train_head(capsys, out)
    line = _one_line(err)
    assert code == 3 and line.startswith("error: File too large: ") and "/ckpt/step-00000001/" in line, line
    from cgt_viz.checkpoint import latest_checkpoint
    assert latest_checkpoint(out / "ckpt") is None and not (out / "model.safetensors").exists()
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
def test_train_sizes_are_refused_with_an_estimate_before_anything_is_allocated(tmp_path, capsys, monkeypatch, flags,
                                                                              named):
    """B19/B20 (train): a model, a vocabulary or a block the machine cannot hold, and a thread count no machine
    runs, are refused in one line naming the argument (with the estimate in GiB), before anything is allocated
    (no model off the meta device, no threads started) or written."""
    from helpers import allocated_builds, record_model_builds

    from cgt_viz import CGT, GPT
    from cgt_viz.__main__ import main
    builds = record_model_builds(monkeypatch, CGT, GPT)
    threads_asked = []

    def record_threads(n):      # not passed on: a count that slipped through would start that many threads
        threads_asked.append(n)
        raise AssertionError(f"torch.set_num_threads({n}) was called before the thread count was refused")
    monkeypatch.setattr(torch, "set_num_threads", record_threads)
    code = main(["train", *ICL, "--out", str(tmp_path / "run"), "--steps", "1", "--batch-size", "4",
                 "--eval-every", "0", *flags])
    line = _one_line(capsys.readouterr().err)
    assert code == 2 and f"{named} must be " in line, line
    assert "GiB" in line or named == "--threads", line
    assert allocated_builds(builds) == [] and threads_asked == []
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


@pytest.mark.parametrize("dies_at", [5, 1])
def test_a_death_while_a_head_checkpoint_is_written_resumes_to_the_uninterrupted_weights(head_and_cache, tmp_path,
                                                                                         monkeypatch, dies_at):
    """B32: the run dies while the checkpoint of step 5 is written (before its state.json, the file that makes it
    complete): the resume continues from step 4, the newest complete one, so 8 steps give the uninterrupted run's
    weights. At step 1 there is no checkpoint at all: the resume starts from step 0."""
    import cgt_viz.checkpoint as ck
    from cgt_viz.hf import distill as hfd
    make, cache = head_and_cache
    kw = dict(steps=8, batch_size=3, warmup=2, progress=False)
    straight = make()
    hfd.train_head(straight, cache, **kw)
    real = ck.write_json

    def die_at(path, obj):
        if Path(path).name == "state.json" and obj.get("step") == dies_at:
            raise Died
        return real(path, obj)
    monkeypatch.setattr(ck, "write_json", die_at)
    with pytest.raises(Died):
        hfd.train_head(make(), cache, checkpoint_dir=tmp_path / "ckpt", checkpoint_every=1, **kw)
    monkeypatch.setattr(ck, "write_json", real)
    newest = ck.latest_checkpoint(tmp_path / "ckpt")                                      # the death's trace
    assert (newest.name == "step-00000004") if dies_at == 5 else newest is None
    resumed = make()
    hist = hfd.train_head(resumed, cache, checkpoint_dir=tmp_path / "ckpt", resume=True, **kw)
    assert hist["steps"] == 8 and len(hist["aux"]) == 8
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_resuming_the_checkpoint_of_another_head_or_of_the_old_format_is_named(head_and_cache, tmp_path):
    """B33: a checkpoint of a head of another d_y / n_templates is named with the setting and both values (not
    load_state_dict's traceback); a folder of the old head-state format is refused by name, not resumed."""
    from cgt_viz.hf import distill as hfd
    make, cache = head_and_cache
    folder = tmp_path / "ckpt"
    kw = dict(steps=4, batch_size=3, warmup=2, progress=False, checkpoint_dir=folder)

    def stop_at_2(step, out):
        if step == 2:
            raise KeyboardInterrupt
    assert hfd.train_head(make(), cache, callback=stop_at_2, **kw)["interrupted"]
    from cgt_viz import hf
    for other, named in ((dict(d_y=16), r"config\.d_y \(checkpoint 8, now 16\)"),
                         (dict(n_templates=5), r"config\.n_templates \(checkpoint 3, now 5\)")):
        model = hf.CGTLM(hf.tiny_llama(seed=0), y_layer=2, d_y=other.get("d_y", 8), n_head_y=2,
                         n_templates=other.get("n_templates", 3), template_rank=2, pooled_only=True, aux_kl=1.0,
                         aux_ce=0.5, aux_kl_top_k=7)
        with pytest.raises(ValueError, match=r"was written by a different run; it differs in: .*" + named):
            hfd.train_head(model, cache, resume=True, **kw)
    old = tmp_path / "old"
    old.mkdir()
    (old / "head-state.json").write_text('{"step": 2}')
    for resume in (True, False):
        with pytest.raises(ValueError, match=r"checkpoint_dir must be a checkpoint folder of cgt_viz.train .*holds a "
                                             r"head training state of the old format cgt_viz.head_state/2 "
                                             r"\(head-state.json\).*remove the folder to train from step 0"):
            hfd.train_head(make(), cache, **{**kw, "checkpoint_dir": old, "resume": resume})
    assert (old / "head-state.json").read_text() == '{"step": 2}'                      # refused, not removed


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
    from cgt_viz.checkpoint import latest_checkpoint
    assert code == 130 and latest_checkpoint(out / "ckpt") is not None, err
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


# ---------------------------------------------------------------------------------------------- B08, B10, B14, B15
def _retamper(folder: Path, change) -> None:
    """Rewrite a cache's tensors (and/or manifest) through `change(tensors, manifest)`, then recompute the
    manifest's size and sha256, as a tamperer who knows the format would: only the content checks can tell."""
    from cgt_viz.hf import distill as hfd
    from cgt_viz.io import load_tensors, save_tensors, sha256_file
    tensors = load_tensors(folder / hfd.FEATURES_NAME)
    manifest = json.loads((folder / hfd.MANIFEST_NAME).read_text())
    change(tensors, manifest)
    save_tensors(folder / hfd.FEATURES_NAME, tensors, metadata={"format": hfd.CACHE_FORMAT})
    manifest.update(file_bytes=(folder / hfd.FEATURES_NAME).stat().st_size, sha256=sha256_file(folder / hfd.FEATURES_NAME))
    (folder / hfd.MANIFEST_NAME).write_text(json.dumps(manifest))


def _drop_settings(t, m):
    del m["settings"]


def _narrow(t, m):
    t["suffix_x"] = t["suffix_x"][..., :-1].contiguous()
    t["pooled"] = t["pooled"][..., :-1].contiguous()


def _token_out_of_range(t, m):
    t["tokens"][0, 0] = 10 ** 6


def _teacher_out_of_range(t, m):
    t["teacher_ids"][0, 0, 0] = -3


def _fewer_rows(t, m):
    t["topic"] = t["topic"][:-1].contiguous()


def _wrong_dtype(t, m):
    t["pooled"] = t["pooled"].double()


@pytest.mark.parametrize("change, says", [
    (_drop_settings, "the manifest has no 'settings' object"),
    (_narrow, r"pooled is \(8, 63\) torch.float32, the manifest makes it \(n=8, d=64\)"),
    (_token_out_of_range, r"tokens holds 0..1000000, each must be a token id in 0..95"),
    (_teacher_out_of_range, r"teacher_ids holds -3..\d+, each must be a token id in 0..95"),
    (_fewer_rows, r"topic is \(7,\) torch.int64, the manifest makes it \(n=8\)"),
    (_wrong_dtype, r"pooled is \(8, 64\) torch.float64"),
])
def test_a_tampered_feature_cache_with_a_recomputed_checksum_is_refused_naming_what(head_and_cache, change, says):
    """B08: a cache whose content was changed and whose size and sha256 were recomputed is refused when it is
    loaded for a build (the tensors against the manifest and the LM: shapes, dtypes, rows, id ranges), naming
    the folder and what is wrong: never a KeyError/IndexError/RuntimeError in training."""
    from cgt_viz.hf import distill as hfd
    from test_distill import _windows
    make, cache = head_and_cache
    _retamper(cache.path, change)
    with pytest.raises(ValueError, match=r"the feature cache .* is not the cache asked for or does not match its "
                                         r"manifest: .*" + says):
        hfd.build_feature_cache(make(), _windows(n=8), 6, top_k=7, root=cache.path.parent.parent, progress=False)


def test_a_cache_folder_holding_another_cache_is_refused(head_and_cache, tmp_path):
    """B10: the folder of one cache holding another (another top_k, another LM's weights): its manifest's key,
    settings and weights hash are compared with what was asked for."""
    import shutil
    from cgt_viz import hf
    from cgt_viz.hf import distill as hfd
    from test_distill import _head, _windows
    make, cache = head_and_cache
    root = cache.path.parent.parent
    other = hfd.build_feature_cache(make(), _windows(n=8), 6, top_k=5, root=root, progress=False)
    shutil.rmtree(cache.path)
    shutil.copytree(other.path, cache.path)                       # the top-7 folder now holds the top-5 cache
    with pytest.raises(ValueError, match=r"its key is '.*', asked for '.*'.*its setting top_k is 5, asked for 7"):
        hfd.build_feature_cache(make(), _windows(n=8), 6, top_k=7, root=root, progress=False)
    shutil.rmtree(cache.path)
    model2 = _head(hf.tiny_llama(seed=1))                          # another LM's weights, under this LM's key
    shutil.copytree(hfd.build_feature_cache(model2, _windows(n=8), 6, top_k=7, root=root, progress=False).path,
                    cache.path)
    with pytest.raises(ValueError, match=r"its weights_sha256 is"):
        hfd.build_feature_cache(make(), _windows(n=8), 6, top_k=7, root=root, progress=False)


def test_a_cache_root_that_is_a_file_or_a_dangling_link_is_named(head_and_cache, tmp_path):
    """B14: the feature cache's root as a dangling link is named with its target (not "File exists"); as a file
    it is named (not the .partial temp folder)."""
    from cgt_viz.hf import distill as hfd
    from test_distill import _windows
    make, _ = head_and_cache
    link = tmp_path / "linked"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"the cache root .*linked' is a dangling symbolic link to .*nowhere"):
        hfd.build_feature_cache(make(), _windows(n=8), 6, top_k=7, root=link, progress=False)
    file = tmp_path / "file"
    file.write_text("x")
    with pytest.raises(NotADirectoryError, match=r"the cache root .*file' is a file, not a folder") as caught:
        hfd.build_feature_cache(make(), _windows(n=8), 6, top_k=7, root=file, progress=False)
    assert ".partial" not in str(caught.value)


BUILDER = """
import os, sys, time
sys.path.insert(0, {tests!r})
from pathlib import Path
from cgt_viz import hf
from cgt_viz.hf import distill as hfd
from test_distill import _head, _windows
real = hfd.compute_features
def slow(*a, **k):                      # a computation long enough for the builders to overlap
    Path({marks!r}, str(os.getpid())).touch()
    time.sleep(1.0)
    return real(*a, **k)
hfd.compute_features = slow
model = _head(hf.tiny_llama(seed=0))
Path({ready!r}, str(os.getpid())).touch()
while not Path({go!r}).exists():
    time.sleep(0.005)
cache = hfd.build_feature_cache(model, _windows(n=8), 6, top_k=7, root={root!r}, progress=False)
print(cache.path, len(cache))
"""


def test_concurrent_builders_of_one_cache_all_get_it_and_it_is_computed_once(tmp_path):
    """B15: three processes asking for the same cache at once (real processes, released together): every one
    gets it, the features are computed once (the others wait for the builder's lock and load its cache), and no
    temp folder is left."""
    pytest.importorskip("transformers")
    import subprocess
    import sys
    from test_faults import _env
    marks, ready, go, root = tmp_path / "marks", tmp_path / "ready", tmp_path / "go", tmp_path / "cache"
    marks.mkdir()
    ready.mkdir()
    code = BUILDER.format(tests=str(Path(__file__).parent), marks=str(marks), ready=str(ready), go=str(go),
                          root=str(root))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=_env()) for _ in range(3)]
    import time
    deadline = time.monotonic() + 120
    while len(list(ready.iterdir())) < len(procs) and time.monotonic() < deadline:   # each built its model
        time.sleep(0.05)
    go.touch()
    results = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-800:] for _, err in results]
    paths = {out.split()[0] for out, _ in results}
    assert len(paths) == 1 and all(out.split()[1] == "8" for out, _ in results)
    assert len(list(marks.iterdir())) == 1                       # computed once
    assert not [p for p in (root / "features").iterdir() if p.name.endswith(".partial")]


# ---------------------------------------------------------------------------------------------- B47, B63
BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.parametrize("flags, says", [
    (["--lr", "nan"], "--lr must be a finite number > 0.0, got nan"),
    (["--lm-lr", "0"], "--lm-lr must be a finite number > 0.0"),
    (["--steps", "0,x"], "--steps must be comma-separated step counts"),
    (["--lm-compile-steps", "-1"], "--lm-compile-steps must be comma-separated step counts"),
    (["--prompts", "0"], "--prompts must be an int >= 1"),
    (["--temperature", "-1"], "--temperature must be a finite number > 0.0"),
    (["--threads", "100000"], "--threads must be an int in 1.."),
    (["--tasks", "nope"], "--tasks must be a comma-separated subset"),
])
def test_bench_lora_vs_compile_refuses_bad_flags_in_one_line_before_any_work(tmp_path, flags, says):
    """B47: a bad flag of benchmarks/bench_lora_vs_compile.py is one line, exit 2, before a model is loaded or
    trained (its lr of nan was refused only after the ICL model had trained)."""
    import subprocess
    import sys
    from test_faults import _env
    proc = subprocess.run([sys.executable, str(BENCH / "bench_lora_vs_compile.py"), *flags, "--out", str(tmp_path / "o"),
                           "--icl-model", str(tmp_path / "icl")], capture_output=True, text=True, timeout=120,
                          env=_env())
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "icl").exists() and not (tmp_path / "o").exists()


def _results_root(root: Path) -> None:
    (root / "benchmarks" / "results").mkdir(parents=True)
    (root / "docs").mkdir()
    (root / "README.md").write_text("# readme\n\n<!-- results:begin -->\nold\n<!-- results:end -->\n")
    (root / "docs" / "results.md").write_text("# Results\n")


@pytest.mark.parametrize("content, says", [
    ({"argv": ["tasks_results.py"], "table": "| a |"}, r"has no field \['rows'\]"),
    ({"argv": ["tasks_results.py"], "rows": "abc", "table": "| a |"}, r"\(last read: \['rows'\]\) .*AttributeError"),
    ("{not json", r"is not a JSON result file"),
    ([1, 2], r"holds a JSON list, not the object of a result file"),
])
def test_results_pages_name_the_file_and_field_of_a_damaged_result_file(tmp_path, capsys, content, says):
    """B63: results_pages.py on a result file lacking a field, holding one of another kind, or not JSON: one
    line naming the file (and the field), exit 2, nothing written (it was a KeyError/TypeError/JSONDecodeError
    traceback without the file, which stopped `make docs` with no clue)."""
    import sys
    sys.path.insert(0, str(BENCH))
    import results_pages as rp
    _results_root(tmp_path)
    file = tmp_path / rp.TASKS
    file.write_text(content if isinstance(content, str) else json.dumps(content))
    before = _tree(tmp_path)
    for argv in ([], ["--check"]):
        capsys.readouterr()
        assert rp.main(argv, root=tmp_path) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and str(file) in err and "Traceback" not in err, err
        assert __import__("re").search(says, err), err
    assert _tree(tmp_path) == before


# ---------------------------------------------------------------------------------------------- B22, B23, B26
@pytest.mark.parametrize("flags, says", [
    (["--batch", "1000"], r"--batch must be an int in 1..40 \(the training cache will hold 40 windows"),
    (["--prefix", "100000"], r"--prefix must be short enough that every topic keeps documents of the head's "
                             r"windows .*got 100000, for windows of 100009 tokens"),
    (["--eval-prompts", "100000"], r"--eval-prompts must be short enough .*got 100000"),
    (["--y-layer", "99"], r"--y-layer must be an int in 1..3 \(the LM has 4 layers"),
    (["--sites", "nope"], r"--sites must be names from"),
    (["--device", "cuda:7"], r"--device must be"),
])
def test_train_head_names_the_flag_before_any_cache_is_built(tiny_smollm2, tmp_path, capsys, flags, says):
    """B23: --batch larger than the training cache is refused before the caches are built (~26 min on BBC),
    naming --batch (not batch_size). B22: a --prefix or --eval-prompts longer than the documents names that
    flag (not block_size). Also --y-layer, --sites, --device by their flags (not y_layer, sites, device)."""
    import re
    code, err = _train_head(capsys, tmp_path / "head", *flags)
    line = _one_line(err)
    assert code == 2 and re.search(says, line), line
    features = Path(os.environ["CGT_VIZ_CACHE"]) / "features"
    assert not features.exists() or list(features.iterdir()) == []


@pytest.mark.parametrize("bad, good", [
    (["--sites", "nope"], ["--sites", "attn_in,mlp_in"]),
    (["--device", "cuda:7"], ["--device", "cpu"]),
    (["--y-layer", "99"], ["--y-layer", "2"]),
    (["--task-arg", "prefix=100000"], ["--task-arg", "prefix=8"]),
    (["--batch-size", "1000"], ["--batch-size", "4"]),
])
def test_a_refused_flag_of_train_with_a_pretrained_task_leaves_no_run_json(tiny_smollm2, tmp_path, capsys, bad, good):
    """B26: `train --task smollm2-bbc` with a bad --sites, --device, --y-layer, prefix or batch is refused and
    leaves no run.json, so the corrected command runs (it was refused as "already holds a run", and --resume
    replayed the bad flag)."""
    from cgt_viz.__main__ import main
    from test_cli import HEAD

    def with_(pairs):
        args = list(HEAD)
        for flag, value in zip(pairs[::2], pairs[1::2]):
            if flag == "--task-arg":
                key = value.split("=")[0]
                args = [a for i, a in enumerate(args) if not (a.startswith(key + "=") or
                                                             (a == "--task-arg" and args[i + 1].startswith(key + "=")))]
                args += [flag, value]
            elif flag in args:
                args[args.index(flag) + 1] = value
            else:
                args += [flag, value]
        return args
    out = tmp_path / "run"
    capsys.readouterr()
    assert main(["train", *with_(bad), "--out", str(out)]) == 2
    _one_line(capsys.readouterr().err)
    assert not (out / "run.json").exists()
    assert main(["train", *with_(good), "--out", str(out)]) == 0, capsys.readouterr().err
    assert (out / "run.json").exists() and (out / "metrics.json").exists()


# ---------------------------------------------------------------------------------------------- cosmetic
def test_train_head_out_that_is_a_file_or_a_dangling_link_is_named(tiny_smollm2, tmp_path, capsys):
    """B40: `train-head --out` a file or a dangling link: one line naming it (and the link's target), exit 2,
    not "File exists"."""
    file = tmp_path / "file"
    file.write_text("mine\n")
    code, err = _train_head(capsys, file)
    line = _one_line(err)
    assert code == 2 and "--out must be a run folder (or a new path), got the file" in line and "File exists" not in line
    assert file.read_text() == "mine\n"
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    code, err = _train_head(capsys, link)
    line = _one_line(err)
    assert code == 2 and "a dangling symbolic link to" in line and "nowhere" in line, line
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_train_head_results_that_is_not_a_regular_file_is_refused_before_the_run(tiny_smollm2, tmp_path, capsys, kind):
    """B41: --results a directory (it failed after the run, naming a temp file) or a FIFO (replaced by a regular
    file) is refused before anything is loaded, naming --results and what it is; the thing stays as it was."""
    target = tmp_path / "speeds"
    if kind == "directory":
        target.mkdir()
    else:
        os.mkfifo(target)
    code, err = _train_head(capsys, tmp_path / "head", "--results", str(target))
    line = _one_line(err)
    assert code == 3 and "--results must be a regular file or a new path, got a" in line and str(target) in line, line
    assert target.is_dir() if kind == "directory" else __import__("stat").S_ISFIFO(os.lstat(target).st_mode)
    assert not (tmp_path / "head" / "ckpt").exists()


def test_a_curriculum_longer_than_the_run_is_noted(tmp_path, capsys):
    """B44: a curriculum (the regression recipe's) longer than --steps trains with a warning saying how far it
    gets and how to change it; a curriculum that fits says nothing."""
    from cgt_viz.__main__ import main
    from test_faults import TINY_MODEL
    args = ["train", "--task", "regression", "--task-arg", "dim=4", "--task-arg", "n_points=8", *TINY_MODEL,
            "--steps", "3", "--batch-size", "4", "--eval-every", "0", "--aux-delay", "0"]
    assert main([*args, "--out", str(tmp_path / "a"), "--curriculum", "30"]) == 0
    err = capsys.readouterr().err
    assert "warning: --curriculum 30 (updates of the task's curriculum) is longer than --steps 3" in err, err
    assert main([*args, "--out", str(tmp_path / "b"), "--curriculum", "3"]) == 0
    assert "--curriculum" not in capsys.readouterr().err


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_weights_stored_as_integers_or_bools_are_refused_not_cast(tmp_path, dtype):
    """B53: a model folder whose float weights are stored as int64, int32 or bool (load_state_dict would cast
    them silently) is refused naming the tensor and its dtype: CGT.from_pretrained and CGTLM.from_pretrained."""
    from cgt_viz import CGT, CGTConfig
    from cgt_viz.io import load_tensors, save_tensors
    model = CGT(CGTConfig(vocab_size=16, block_size=8, n_layer=2, d_x=16, n_head=2, d_y=8, n_head_y=1, y_layer=1,
                          n_templates=2))
    model.save_pretrained(tmp_path / "m")
    file = tmp_path / "m" / "model.safetensors"
    state = load_tensors(file)
    name = next(k for k, v in state.items() if v.is_floating_point() and v.dim() == 2)
    state[name] = (state[name] * 10).to(dtype)
    save_tensors(file, state, metadata={"model_class": "CGT"})
    with pytest.raises(ValueError, match=rf"store float weights as other dtypes: {name} \("):
        CGT.from_pretrained(tmp_path / "m")
    pytest.importorskip("transformers")
    from cgt_viz import hf
    lm = hf.tiny_llama(seed=0)
    head = hf.CGTLM(lm, y_layer=2, d_y=8, n_head_y=2, n_templates=3, template_rank=2, pooled_only=True)
    head.save_pretrained(tmp_path / "h")
    file = tmp_path / "h" / "model.safetensors"
    state = load_tensors(file)
    name = next(k for k, v in state.items() if v.is_floating_point() and v.dim() == 2)
    state[name] = state[name].to(dtype)
    save_tensors(file, state, metadata={"model_class": "CGTLM"})
    with pytest.raises(ValueError, match=rf"store float weights as other dtypes: {__import__('re').escape(name)} \("):
        hf.CGTLM.from_pretrained(tmp_path / "h", lm)


def test_an_explorer_of_a_model_with_nan_weights_names_ybar_not_x():
    """B59: the explorer of a model whose weights hold NaN (a run saved after it diverged) says that ȳ holds
    NaN, how much, and why, not "X must be finite" (the projector's own argument, which the user never passed)."""
    from cgt_viz import CGT, CGTConfig
    from cgt_viz import analysis as A
    from cgt_viz.widgets import Explorer
    torch.manual_seed(0)
    model = CGT(CGTConfig(vocab_size=16, block_size=8, n_layer=2, d_x=16, n_head=2, d_y=8, n_head_y=1, y_layer=1,
                          n_templates=2))
    with torch.no_grad():
        next(p for n, p in model.named_parameters() if n.startswith("y_blocks") or "y" in n).fill_(float("nan"))
    seqs = A.prepare_sequences(model, torch.randint(0, 16, (3, 8)))
    with pytest.raises(ValueError) as caught:
        Explorer(model, seqs, background=None)
    msg = str(caught.value)
    assert msg.startswith("ȳ (the model's summaries of the shown points) must be finite") and "NaN or inf" in msg, msg
    assert "X must" not in msg and "diverged" in msg


@pytest.mark.parametrize("bom, encoding", [(b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"),
                                           (b"\xff\xfe\x00\x00", "utf-32-le")])
def test_binary_data_behind_a_byte_order_mark_is_refused(tmp_path, bom, encoding):
    """B67: a byte-order mark followed by binary data (zeros decode as U+0000) passed the NUL rule, which looked
    only at files without a mark (2 GB accepted, 4.8 GB peak memory); now refused naming the file, from the
    first block, before the whole file is decoded. Text with a mark still loads."""
    from cgt_viz.tasks.text import load_corpus
    for topic in ("a", "b"):
        (tmp_path / topic).mkdir()
        (tmp_path / topic / "ok.txt").write_bytes(bom + "plain text, with a mark".encode(encoding))
    (tmp_path / "a" / "blob.txt").write_bytes(bom + bytes(1 << 20))
    # (a UTF-16-LE mark and zeros read as a UTF-32-LE mark: either way a NUL character)
    with pytest.raises(ValueError, match=r"corpus file 'a/blob.txt' holds NUL characters \(U\+0000, the first at "
                                         r"character 0\) after its utf-\d\d-.e byte-order mark: it is binary data"):
        load_corpus(tmp_path)
    (tmp_path / "a" / "blob.txt").write_bytes(bom + ("text " * 20000 + "\x00 late").encode(encoding))
    with pytest.raises(ValueError, match=r"holds NUL characters \(U\+0000, the first at character 100000\)"):
        load_corpus(tmp_path)
    (tmp_path / "a" / "blob.txt").unlink()
    assert sorted(load_corpus(tmp_path)) == ["a", "b"]


SIGINT_AT_TORCH = """
import builtins, os, signal
_real = builtins.__import__
def _import(name, *args, **kwargs):
    if name == "torch" and not getattr(_import, "sent", False):
        _import.sent = True
        os.kill(os.getpid(), signal.SIGINT)       # a real Ctrl-C, delivered while torch is being imported
    return _real(name, *args, **kwargs)
builtins.__import__ = _import
"""


def test_ctrl_c_while_torch_imports_is_one_line_and_exit_code_130(tmp_path):
    """A20: Ctrl-C while `python -m cgt_viz` imports torch (seconds at start-up) printed a KeyboardInterrupt
    traceback; now one line, exit 130. A real SIGINT, sent by the process to itself as torch's import begins (a
    sitecustomize on the child's path); imported as a library, the interrupt still reaches the caller."""
    import subprocess
    import sys
    from test_faults import _env
    (tmp_path / "sitecustomize.py").write_text(SIGINT_AT_TORCH)
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    proc = subprocess.run([sys.executable, "-m", "cgt_viz", "train", "--help"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 130, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.strip() == "error: interrupted (Ctrl-C) while starting", proc.stderr[-2000:]
    proc = subprocess.run([sys.executable, "-c", "import cgt_viz"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode != 0 and "KeyboardInterrupt" in proc.stderr                 # the library caller's
