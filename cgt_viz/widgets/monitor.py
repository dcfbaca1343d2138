"""The training monitor: live loss curves fed by the trainer's callbacks.

    monitor = TrainingMonitor()
    display(monitor)
    model, history = train(model, task, steps=2000, batch_size=32, callbacks=[monitor])

The monitor is itself the callback (it is called with each record dict, see the protocol in train.py).
A call only appends numbers to Python lists; the plot is redrawn at most every `min_interval` seconds
(and at every evaluation and at the end), with long curves thinned, so it does not slow training.

The trainer's first record ({"kind": "start"}) gives the run's length, aux_delay and the loss weights: terms
of weight 0 get no curve, "total" is main + Σ w·term with the full weights (as val_total is), a dashed
line marks where the aux term joins, and the status line says "step N of M" with an ETA. `smoothing`
(the slider) draws an EMA of the train curves over the faint raw ones.
"""
from __future__ import annotations

import time

import ipywidgets as W

from .._checks import Bool, Float, Height, Int, checked, refuse
from ..analysis import NOT_PLOTTED
from ..figures import run_info, term_weights, training_curves_figure
from ._base import figure_widget, html_status, replace_figure
from ._static import StaticForm

KINDS = ("start", "step", "eval", "end", "warning")


def format_seconds(s: float) -> str:
    """12 s, 3 min 20 s, 1 h 05 min."""
    s = max(0, int(round(s)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {(s % 3600) // 60:02d} min"


class TrainingMonitor(StaticForm, W.VBox):
    """Callable with callback records; shows training losses (log scale) and evaluation metrics."""

    @checked(min_interval=Float(0, hint=" (seconds between redraws)"), log_y=Bool(),
             max_points=Int(2, hint=" (points drawn per curve)"),
             smoothing=Float(0, 0.999, hint=" (EMA weight: 0 = raw curves)"),
             steps=Int(1, none=True, hint=" (the run's length)"), height=Height())
    def __init__(self, *, min_interval: float = 0.5, log_y: bool = True, max_points: int = 2000,
                 title: str = "Training", smoothing: float = 0.0, weights=None, steps: int | None = None,
                 height: int = 460):
        """smoothing: EMA of the train curves (0 = raw; the slider); weights ({term: w} or the model's
        config) and steps: what the trainer's start record says otherwise (for records from elsewhere)."""
        self.min_interval, self.log_y, self.max_points = min_interval, log_y, max_points
        self.smoothing, self.weights, self.steps = float(smoothing), weights, steps
        self.title, self.height = title, height
        self.records: list[dict] = []
        self._steps: dict[str, tuple[list, list]] = {}
        self._evals: dict[str, tuple[list, list]] = {}
        self._last_draw = 0.0
        self._draw_cost = 0.0
        self._t0: float | None = None
        self._first_step: int | None = None      # the step before the first update this monitor saw (resume)
        self._ended: float | None = None         # when the run's "end" record came: a redraw later (the smoothing
                                                 # slider) still says "done · took …", timed to the end, not to now
        self.redraws = 0
        self.figure = figure_widget(self.figure_static())
        self.status = W.HTML(html_status("waiting for the first training step …"))
        self.warnings: list[str] = []      # the trainer's warnings in words (e.g. a loss plateau)
        self.alerts = W.HTML("")
        self.smoothing_slider = W.FloatSlider(value=self.smoothing, min=0.0, max=0.99, step=0.01,
                                              description="smoothing", continuous_update=False,
                                              tooltip="EMA of the train curves (0: raw)",
                                              layout=W.Layout(width="300px"))
        self.smoothing_slider.observe(lambda ch: self.set_smoothing(ch["new"]), names="value")
        super().__init__([W.HBox([self.status, self.smoothing_slider]), self.alerts, self.figure])

    def set_smoothing(self, smoothing: float) -> None:
        """EMA weight of the train curves (0: raw curves; 0.9: about the last 10 steps); redraws."""
        self.smoothing = float(Float(0, 0.999).check("smoothing", smoothing))
        if self.smoothing_slider.value != min(self.smoothing, 0.99):
            self.smoothing_slider.value = min(self.smoothing, 0.99)
        self.redraw()

    def __call__(self, record: dict) -> None:
        """One callback record: {"kind": "step" | "eval" | "end", "step": int, <name>: float, ...}, or
        {"kind": "warning", "step": int, "message": str} (shown in words above the curves)."""
        if not isinstance(record, dict):
            raise refuse("record", "a dict (the trainer callback protocol)", type(record).__name__, TypeError)
        kind = record.get("kind")
        if kind not in KINDS or "step" not in record:
            raise refuse("record", f"'kind' in {KINDS} and a 'step'", repr(record), verb="have")
        now = time.monotonic()
        if self._t0 is None:
            self._t0 = now
        self.records.append(dict(record))
        if kind == "start":
            self._t0, self._first_step, self._ended = now, int(record["step"]), None
            self.steps = record.get("steps", self.steps) if self.steps is None else self.steps
            return
        if kind == "step" and self._first_step is None:
            self._t0, self._first_step = now, int(record["step"]) - 1
        if kind == "end":
            self._ended = now
        elif kind == "step":
            self._ended = None                  # more steps after an end: a resumed run
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
        # at most every min_interval, and never more than a tenth of the time on drawing (min_interval ≥ 10 × the last draw's cost)
        if kind != "step" or now - self._last_draw >= max(self.min_interval, 10 * self._draw_cost):
            self.redraw()                     # final once the "end" record has come

    @property
    def history(self) -> list[dict]:
        """Every record received so far (a list of dicts, as passed by the trainer)."""
        return list(self.records)

    def figure_static(self):
        """The curves so far as a static `go.Figure` (training_curves_figure of the records)."""
        return training_curves_figure(self.records, log_y=self.log_y, title=self.title, max_points=self.max_points,
                                      weights=self.weights, steps=self.steps, smoothing=self.smoothing,
                                      height=self.height)

    def static_figures(self) -> list:
        return [self.figure_static()]

    def static_text(self) -> str:
        last = self.records[-1] if self.records else {}
        text = f"training monitor: {len(self._steps.get('main', ([], []))[0])} steps recorded, last step {last.get('step', '-')}"
        return "\n".join([text] + [f"warning at {w}" for w in self.warnings])

    def redraw(self, final: bool | None = None) -> None:
        """Push the current curves to the plot (called for you, throttled). final: the run has ended
        (None: as the records say)."""
        final = self._ended is not None if final is None else final
        t0 = self._last_draw = time.monotonic()
        self.redraws += 1
        fig = self.figure_static()
        if [t.name for t in self.figure.data] != [t.name for t in fig.data]:   # a new series: rebuild once
            replace_figure(self.figure, fig)
        else:
            with self.figure.batch_update():
                for old, new in zip(self.figure.data, fig.data):
                    old.x, old.y = new.x, new.y
                self.figure.layout.title.text = fig.layout.title.text
                self.figure.layout.shapes = fig.layout.shapes
                self.figure.layout.annotations = fig.layout.annotations
                self.figure.layout.xaxis.range = fig.layout.xaxis.range
                self.figure.layout.xaxis2.range = fig.layout.xaxis2.range
        self.status.value = html_status(self.status_text(final), "ok" if final else "busy")
        self._draw_cost = time.monotonic() - t0

    def status_text(self, final: bool | None = None) -> str:
        """The status line: step N of M, the latest losses, steps/s and the ETA; once the run has ended
        (final; None: as the records say), "done", the time it took and its rate, however late it is drawn."""
        final = self._ended is not None if final is None else final
        last = self.records[-1] if self.records else {}
        step = int(last.get("step", 0))
        parts = [f"step {step:,}" + (f" of {self.steps:,}" if self.steps else "")]
        weights = term_weights(self.weights if self.weights is not None else run_info(self.records).get("weights"))
        latest = {k: ys[-1] for k, (_, ys) in self._steps.items() if ys}
        if weights is not None and "main" in latest:      # the figure's total: full weights, as val_total
            latest["total"] = latest["main"] + sum(w * latest.get(k, 0.0) for k, w in weights.items()
                                                   if k not in ("main", "total"))
        for key in ("main", "aux", "smooth", "total"):
            if key in latest and not (weights is not None and weights.get(key) == 0):
                parts.append(f"{key} {latest[key]:.4f}")
        for key, (_, ys) in self._evals.items():
            parts.append(f"{key} {ys[-1]:.4f}")
        now = self._ended if (final and self._ended is not None) else time.monotonic()
        elapsed = now - (self._t0 or now)
        done = step - (self._first_step or 0)
        if elapsed > 0 and done > 0:
            rate = done / elapsed
            parts.append(f"{rate:.1f} steps/s")
            if self.steps and not final and step < self.steps:
                parts.append(f"ETA {format_seconds((self.steps - step) / rate)}")
            elif final:
                parts.append(f"took {format_seconds(elapsed)}")
        return ("done · " if final else "") + " · ".join(parts)
