"""Issue 34: moving the monitor's smoothing slider after training turned "done · took 9 min 53 s" into an
in-progress line whose rate counted the time since the end. The clock is the monitor module's, replaced
here, so the test reads no wall clock."""
from __future__ import annotations

import re

import pytest

from cgt_viz.widgets import TrainingMonitor
from cgt_viz.widgets import monitor as monitor_module


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(monitor_module.time, "monotonic", lambda: now[0])
    return now


def _run(monitor, clock, steps: int, seconds_per_step: float) -> None:
    monitor({"kind": "start", "step": 0, "steps": steps, "weights": {"main": 1.0, "aux": 1.0}})
    for step in range(1, steps + 1):
        clock[0] += seconds_per_step
        monitor({"kind": "step", "step": step, "main": 5.0 / step, "aux": 4.0 / step, "total": 9.0 / step})
    monitor({"kind": "end", "step": steps})


def _rate(text: str) -> float:
    return float(re.search(r"([\d.]+) steps/s", text).group(1))


def test_the_status_stays_done_with_the_runs_rate_after_the_slider_moves(clock):
    monitor = TrainingMonitor(min_interval=0.0)
    _run(monitor, clock, steps=40, seconds_per_step=0.5)
    done = monitor.status.value
    assert "done · " in done and "took 20 s" in done and _rate(done) == 2.0
    clock[0] += 600                                   # ten minutes later the user moves the slider
    monitor.smoothing_slider.value = 0.5
    assert monitor.smoothing == 0.5
    assert monitor.status.value == done               # same words, same rate, still "done"
    monitor.redraw()
    assert monitor.status.value == done


def test_a_resumed_run_into_the_same_monitor_is_in_progress_again(clock):
    monitor = TrainingMonitor(min_interval=0.0)
    _run(monitor, clock, steps=10, seconds_per_step=1.0)
    assert "done" in monitor.status.value
    monitor({"kind": "start", "step": 10, "steps": 20})
    clock[0] += 1.0
    monitor({"kind": "step", "step": 11, "main": 0.4, "aux": 0.3, "total": 0.7})
    assert not monitor.status_text().startswith("done") and "took" not in monitor.status_text()
