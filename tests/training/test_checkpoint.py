"""Checkpoints: round trips, a crash mid-save, truncated or tampered files, pruning, no unpickling."""
from __future__ import annotations

import inspect
import os

import pytest
import torch

import cgt_viz.checkpoint as ckpt_mod
from cgt_viz import CGT
from cgt_viz.checkpoint import (capture_rng, latest_checkpoint, list_checkpoints, load_checkpoint, restore_rng,
                                save_checkpoint)
from cgt_viz.train import param_groups, train
from test_train import QUIET, TinyTask, fresh, same_weights, tiny_config


def _trained(tmp_path, steps=3, **kw):
    task = TinyTask()
    cfg = tiny_config(task)
    model, hist = train(fresh(cfg), task, steps=steps, batch_size=4, eval_every=0, checkpoint_dir=tmp_path,
                        checkpoint_every=1, **QUIET, **kw)
    return task, cfg, model, hist


def test_round_trip_restores_weights_optimizer_rng_and_history(tmp_path):
    _, cfg, model, hist = _trained(tmp_path)
    ck = load_checkpoint(tmp_path)
    assert ck.step == 3 and ck.path.name == "step-00000003"
    restored = CGT(cfg)
    restored.load_state_dict(ck.model_state)
    assert same_weights(restored, model)
    assert ck.history["total"] == hist.total and ck.run["batch_size"] == 4 and ck.run["steps"] == 3
    # the optimizer state loads into the trainer's AdamW groups; every moment has its parameter's shape
    opt = torch.optim.AdamW(param_groups(restored, 0.01))
    opt.load_state_dict(ck.optimizer_state)
    ordered = [p for group in opt.param_groups for p in group["params"]]
    assert len(opt.state) == len(ordered) == len(list(restored.parameters()))
    assert all(opt.state[p]["exp_avg"].shape == p.shape and float(opt.state[p]["step"]) == 3 for p in ordered)
    assert isinstance(opt.param_groups[0]["betas"], tuple) and opt.param_groups[1]["weight_decay"] == 0.0

    # RNG round trip: after restoring, every stream draws the same numbers again
    gen = torch.Generator().manual_seed(7)
    rng = capture_rng({"g": gen})
    first = (torch.rand(3), torch.rand(3, generator=gen), __import__("numpy").random.rand(2), __import__("random").random())
    save_checkpoint(tmp_path / "rng", 1, {}, {}, {"state": {}, "param_groups": []}, rng, {})
    gen2 = torch.Generator().manual_seed(99)
    restore_rng(load_checkpoint(tmp_path / "rng").rng, {"g": gen2})
    again = (torch.rand(3), torch.rand(3, generator=gen2), __import__("numpy").random.rand(2), __import__("random").random())
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert (first[2] == again[2]).all() and first[3] == again[3]


def test_a_crash_in_the_middle_of_a_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    _trained(tmp_path, steps=2)
    before = load_checkpoint(tmp_path)
    calls = {"n": 0}
    real = ckpt_mod.save_tensors

    def crash_on_second_file(path, tensors, metadata=None):   # model.safetensors is written, then the disk "fails"
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("simulated crash while writing the optimizer state")
        return real(path, tensors, metadata)

    monkeypatch.setattr(ckpt_mod, "save_tensors", crash_on_second_file)
    with pytest.raises(OSError, match="simulated"):
        save_checkpoint(tmp_path, 3, before.run, before.model_state, before.optimizer_state, before.rng, before.history)
    after = load_checkpoint(tmp_path)
    assert after.step == 2 and after.path == before.path
    assert all(torch.equal(after.model_state[k], v) for k, v in before.model_state.items())
    assert sorted(os.listdir(tmp_path)) == ["latest", "step-00000001", "step-00000002"]   # no debris


def test_a_crash_before_the_pointer_update_still_finds_a_complete_checkpoint(tmp_path):
    _trained(tmp_path, steps=2)
    (tmp_path / "latest").unlink()                 # as if the process died between the rename and the pointer
    assert latest_checkpoint(tmp_path).name == "step-00000002"
    (tmp_path / "latest").write_text('{"step": 9, "dir": "step-00000009"}')   # a pointer to nothing
    assert load_checkpoint(tmp_path).step == 2


@pytest.mark.parametrize("damage", ["truncate", "tamper", "delete"])
def test_truncated_tampered_or_missing_files_are_rejected(tmp_path, damage):
    _trained(tmp_path, steps=1)
    target = tmp_path / "step-00000001" / "model.safetensors"
    data = target.read_bytes()
    if damage == "truncate":
        target.write_bytes(data[: len(data) // 2])
    elif damage == "tamper":
        target.write_bytes(data[:-8] + bytes(b ^ 0xFF for b in data[-8:]))
    else:
        target.unlink()
    with pytest.raises(ValueError, match="model.safetensors") as info:
        load_checkpoint(tmp_path)
    assert ("checksum" in str(info.value)) or ("missing" in str(info.value))
    # resuming from it fails with the same clear message instead of training on garbage
    task = TinyTask()
    with pytest.raises(ValueError, match="model.safetensors"):
        train(fresh(tiny_config(task)), task, steps=3, batch_size=4, checkpoint_dir=tmp_path, resume=True, **QUIET)


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_checkpoint(tmp_path)
    (tmp_path / "step-00000001").mkdir()
    (tmp_path / "step-00000001" / "state.json").write_text('{"format": "something else"}')
    with pytest.raises(ValueError, match="not a cgt_viz checkpoint"):
        load_checkpoint(tmp_path)


def test_pruning_keeps_the_newest(tmp_path):
    _trained(tmp_path, steps=5, keep_checkpoints=3)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000003", "step-00000004", "step-00000005"]


def test_resaving_a_step_replaces_it_safely(tmp_path):
    _, _, model, _ = _trained(tmp_path, steps=2)
    ck = load_checkpoint(tmp_path)
    state = {k: v + 1 for k, v in ck.model_state.items()}
    save_checkpoint(tmp_path, 2, ck.run, state, ck.optimizer_state, ck.rng, ck.history)
    again = load_checkpoint(tmp_path)
    assert again.step == 2 and all(torch.equal(again.model_state[k], v) for k, v in state.items())
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]


def test_loading_never_unpickles():
    source = inspect.getsource(ckpt_mod)
    assert "pickle" not in source.replace("unpickles", "") and "torch.load(" not in source


def test_atomic_writes_get_ordinary_file_permissions(tmp_path):
    import os
    import stat

    from cgt_viz.io import write_json
    old = os.umask(0o022)
    try:
        write_json(tmp_path / "a.json", {"x": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644   # not mkstemp's 0600
