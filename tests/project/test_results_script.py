"""benchmarks/tasks_results.py: the README's results tables, measured on held-out seeds."""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import tasks_results  # noqa: E402


def test_every_run_builds_from_a_recipe_and_the_default_seeds_are_held_out():
    assert set(tasks_results.SYNTHETIC) < set(tasks_results.RUNS)
    for recipe, *_ in tasks_results.RUNS.values():
        assert recipe in tasks_results.RECIPES
    assert not set(tasks_results.DEFAULT_SEEDS) & set(tasks_results.TUNING_SEEDS)


def test_rows_are_written_as_they_come_and_resume_skips_them(tmp_path, capsys):
    out = tmp_path / "tasks.json"
    argv = ["--runs", "icl-value-shift", "regression", "--seeds", "5", "--steps", "6", "--eval-batches", "1",
            "--out", str(out)]
    first = tasks_results.main(argv)
    rows = json.loads(out.read_text())["rows"]
    assert [(r["run"], r["seed"]) for r in rows] == [("icl-value-shift", 5), ("regression", 5)]
    icl, reg = rows
    assert icl["token_shift"] == "pair" and icl["task_args"]["answer_tokens"] == "value"   # value answers shift tokens
    assert [row["k"] for row in reg["by_k"]] == [1, 2, 4, 8] and reg["k"] == 8
    assert "| icl-value-shift (k = 8, acc) | 5 | 6 |" in first["table"] and "| G (k) |" in first["table"] and "(k = 1)" in first["table"]
    again = tasks_results.main(argv + ["--resume"])
    assert again["rows"] == rows                                          # nothing re-trained
    assert "tuning_seeds" in again and again["table"] == first["table"]


def test_an_interrupted_run_writes_no_row(tmp_path, monkeypatch):
    """SIGINT/SIGTERM stops train() cleanly between steps; a shortened run must not become a row of the table."""
    real_train = tasks_results.train

    def interrupted_train(*args, **kwargs):
        stop = lambda e: e["kind"] == "step" and e["step"] == 2 and os.kill(os.getpid(), signal.SIGTERM)
        return real_train(*args, **{**kwargs, "callbacks": list(kwargs.get("callbacks", [])) + [stop]})

    monkeypatch.setattr(tasks_results, "train", interrupted_train)
    out = tmp_path / "tasks.json"
    with pytest.raises(KeyboardInterrupt, match="interrupted after 2 of 6 steps"):
        tasks_results.main(["--runs", "icl", "--seeds", "5", "--steps", "6", "--eval-batches", "1", "--out", str(out)])
    assert not out.exists()


@pytest.mark.parametrize("name", sorted(tasks_results.RUNS))
def test_every_run_can_build_its_prompts(name):
    """The k values of each run fit its task (checked before training: a misfit used to surface after it)."""
    recipe, task_changes, _, ks = tasks_results.RUNS[name]
    task = tasks_results.make_task(recipe, **{**tasks_results.RECIPES[recipe]["task"], **task_changes})
    for k in ks:
        assert task.eval_batch(k, 2).inputs.shape[1] >= 2 * k
