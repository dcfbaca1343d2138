"""Faults from the fourth reliability audit (issue 39) on what cgt_viz writes: a lock never writes through a link,
the results pages escape what they quote, a PNG draws no local file through an inline map style, the head's
training keeps train()'s promises (NaN guard, one run per folder, a finished run resumes to itself), and a save
never overwrites another tool's weights. Real symlinks and real files throughout."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

from helpers import ByteTokenizer  # noqa: E402


# ---------------------------------------------------------------------------------------------- B61: lock links
VICTIM_TEXT = "a file the user owns; the lock must never write into it\n"


def _victim_and_link(folder: Path, tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_text(VICTIM_TEXT)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ".lock").symlink_to(os.path.relpath(victim, folder))
    return victim


def test_a_lock_that_is_a_symbolic_link_is_refused_and_its_target_untouched(tmp_path):
    from cgt_viz.checkpoint import RunLock
    victim = _victim_and_link(tmp_path / "run", tmp_path)
    with pytest.raises(ValueError, match=r"lock file .*\.lock.* must be a regular file.*symbolic link to '\.\./victim"):
        RunLock(tmp_path / "run", "--out").acquire()
    assert victim.read_text() == VICTIM_TEXT
    assert (tmp_path / "run" / ".lock").is_symlink()             # left for the user to look at
    dangling = tmp_path / "run2"
    dangling.mkdir()
    (dangling / ".lock").symlink_to(tmp_path / "nowhere.txt")    # a dangling link: O_CREAT would create the target
    with pytest.raises(ValueError, match="symbolic link"):
        RunLock(dangling).acquire()
    assert not (tmp_path / "nowhere.txt").exists()
    hard = tmp_path / "run3"
    hard.mkdir()
    os.link(victim, hard / ".lock")                              # a hard link to the user's file
    with pytest.raises(ValueError, match="hard link"):
        RunLock(hard).acquire()
    assert victim.read_text() == VICTIM_TEXT


def test_train_and_train_head_refuse_a_linked_lock_in_one_line(tmp_path, capsys, monkeypatch):
    """`train --out` (its .lock and, from Python, the checkpoint folder's ckpt/.lock) and `train-head --out`:
    exit 2, one line naming the lock, the target unchanged."""
    from cgt_viz.__main__ import main
    from test_faults import ICL
    victim = _victim_and_link(tmp_path / "run", tmp_path)
    assert main(["train", *ICL, "--out", str(tmp_path / "run"), "--steps", "1", "--batch-size", "4",
                 "--eval-every", "0"]) == 2
    err = capsys.readouterr().err
    assert "lock file" in err and "symbolic link" in err and "Traceback" not in err
    assert victim.read_text() == VICTIM_TEXT
    _victim_and_link(tmp_path / "head", tmp_path)
    assert main(["train-head", "--out", str(tmp_path / "head"), "--steps", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "lock file" in err and "symbolic link" in err
    assert victim.read_text() == VICTIM_TEXT
    from cgt_viz.train import train
    from test_train import QUIET, TinyTask, fresh, tiny_config
    _victim_and_link(tmp_path / "new" / "ckpt", tmp_path)       # a new run's checkpoint folder
    task = TinyTask()
    with pytest.raises(ValueError, match="symbolic link"):
        train(fresh(tiny_config(task)), task, steps=1, batch_size=4, eval_every=0,
              checkpoint_dir=tmp_path / "new" / "ckpt", **QUIET)
    assert victim.read_text() == VICTIM_TEXT
