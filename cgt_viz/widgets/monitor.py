"""The training monitor: live loss curves fed by the trainer's callbacks.

    monitor = TrainingMonitor()
    display(monitor)
    model, history = train(model, task, steps=2000, batch_size=32, callbacks=[monitor])

The monitor is itself the callback (it is called with each record dict, see the protocol in train.py).
A call only appends numbers to Python lists; the plot is redrawn at most every `min_interval` seconds
(and at every evaluation and at the end), with long curves thinned, so it does not slow training.
"""
from __future__ import annotations

import time

import ipywidgets as W
import numpy as np

from .._checks import Bool, Float, Height, Int, checked
from ..analysis import NOT_PLOTTED
from ..figures import drawn_series, thin, training_curves_figure
from ._base import figure_widget, html_status, replace_figure
from ._static import StaticForm

KINDS = ("step", "eval", "end", "warning")


class TrainingMonitor(StaticForm, W.VBox):
    """Callable with callback records; shows training losses (log scale) and evaluation metrics."""

    @checked(min_interval=Float(0, hint=" (seconds between redraws)"), log_y=Bool(),
             max_points=Int(2, hint=" (points drawn per curve)"), height=Height())
    def __init__(self, *, min_interval: float = 0.5, log_y: bool = True, max_points: int = 2000,
                 title: str = "Training", height: int = 460):
        self.min_interval, self.log_y, self.max_points = min_interval, log_y, max_points
        self.title, self.height = title, height
        self.records: list[dict] = []
        self._steps: dict[str, tuple[list, list]] = {}
        self._evals: dict[str, tuple[list, list]] = {}
        self._last_draw = 0.0
        self._t0: float | None = None
        self.redraws = 0
        self.figure = figure_widget(self.figure_static())
        self.status = W.HTML(html_status("waiting for the first training step …"))
        self.warnings: list[str] = []      # the trainer's warnings in words (e.g. a loss plateau)
        self.alerts = W.HTML("")
        super().__init__([self.status, self.alerts, self.figure])

    def __call__(self, record: dict) -> None:
        """One callback record: {"kind": "step" | "eval" | "end", "step": int, <name>: float, ...}, or
        {"kind": "warning", "step": int, "message": str} (shown in words above the curves)."""
        if not isinstance(record, dict):
            raise TypeError(f"record must be a dict (the trainer callback protocol), got {type(record).__name__}")
        kind = record.get("kind")
        if kind not in KINDS or "step" not in record:
            raise ValueError(f"record must have 'kind' in {KINDS} and a 'step', got {record!r}")
        now = time.monotonic()
        if self._t0 is None:
            self._t0 = now
        self.records.append(dict(record))
        if kind == "warning":
            self.warnings.append(f"step {record['step']}: {record.get('message', '')}")
            self.alerts.value = "<br>".join(html_status("⚠ " + w, "error") for w in self.warnings)
            return
        target = self._steps if kind == "step" else self._evals if kind == "eval" else None
        if target is not None:
            for key, value in record.items():
                if key not in NOT_PLOTTED and isinstance(value, (int, float)) and not isinstance(value, bool):
                    xs, ys = target.setdefault(key, ([], []))
                    xs.append(record["step"])
                    ys.append(float(value))
        if kind != "step" or now - self._last_draw >= self.min_interval:
            self.redraw(final=kind == "end")

    @property
    def history(self) -> list[dict]:
        """Every record received so far (a list of dicts, as passed by the trainer)."""
        return list(self.records)

    def figure_static(self):
        """The curves so far as a static `go.Figure` (training_curves_figure of the records)."""
        return training_curves_figure(self.records, log_y=self.log_y, title=self.title, max_points=self.max_points,
                                      height=self.height)

    def static_figures(self) -> list:
        return [self.figure_static()]

    def static_text(self) -> str:
        last = self.records[-1] if self.records else {}
        text = f"training monitor: {len(self._steps.get('main', ([], []))[0])} steps recorded, last step {last.get('step', '-')}"
        return "\n".join([text] + [f"warning at {w}" for w in self.warnings])

    def redraw(self, final: bool = False) -> None:
        """Push the current curves to the plot (called for you, throttled)."""
        self._last_draw = time.monotonic()
        self.redraws += 1
        names = [tr.name for tr in self.figure.data]
        steps = drawn_series(self._steps)[0]            # no curve for a term that is 0 throughout
        want = list(steps) + list(self._evals)
        if names != want:                      # a new series appeared: rebuild the trace list once
            replace_figure(self.figure, self.figure_static())
        else:
            with self.figure.batch_update():
                for trace, (xs, ys) in zip(self.figure.data, list(steps.values()) + list(self._evals.values())):
                    trace.x = thin(np.asarray(xs), self.max_points)
                    trace.y = thin(np.asarray(ys), self.max_points)
        last = self.records[-1] if self.records else {}
        elapsed = time.monotonic() - (self._t0 or time.monotonic())
        parts = [f"step {last.get('step', 0)}"]
        for key in ("main", "aux", "smooth", "total"):
            if key in self._steps:
                parts.append(f"{key} {self._steps[key][1][-1]:.4f}")
        for key, (_, ys) in self._evals.items():
            parts.append(f"{key} {ys[-1]:.4f}")
        n_steps = len(self._steps.get("main", ([], []))[0])
        if elapsed > 0 and n_steps:
            parts.append(f"{n_steps / elapsed:.1f} steps/s")
        self.status.value = html_status(("done · " if final else "") + " · ".join(parts), "ok" if final else "busy")
