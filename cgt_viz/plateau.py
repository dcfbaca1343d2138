"""Noticing a run that learns nothing: the main loss parked at the task's no-information level.

A task that knows the loss of a model that ignores the context (`Task.no_information_loss()`: ln P for
SyntheticICL, Var(y) + noise² for regression) lets `train` watch the running mean of the main loss. When it
has stayed within `plateau_tolerance` (relative) of that level for `plateau_steps` updates, the run says so
in words, once: a `PlateauWarning`, an entry in `history.warnings`, and a callback record
{"kind": "warning", "step", "message"} that the training monitor shows.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


class PlateauWarning(UserWarning):
    """The main loss has stayed at the task's no-information level (the run has not started learning)."""


@dataclass(frozen=True)
class NoInformationLoss:
    """What a model that ignores the context scores on a task, and what to do when a run stays there."""

    level: float   # the loss value
    what: str      # how to read it, e.g. "ln 7 = 1.946: a uniform guess over the 7 answers"
    hint: str      # the likely cause and what to try


@dataclass
class PlateauDetector:
    """Feed it the main loss of each update; `update` returns a message the first time the loss has sat at
    the level for `patience` consecutive updates (mean over the last `window` updates), else None."""

    reference: NoInformationLoss
    patience: int
    tolerance: float
    window: int = 50
    fired: bool = False
    _recent: deque = field(init=False, repr=False)
    _run: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self._recent = deque(maxlen=self.window)

    def update(self, step: int, main: float) -> str | None:
        if self.fired or self.patience <= 0:
            return None
        self._recent.append(main)
        mean = sum(self._recent) / len(self._recent)
        level = self.reference.level
        self._run = self._run + 1 if abs(mean - level) <= self.tolerance * abs(level) else 0
        if self._run < self.patience:
            return None
        self.fired = True
        return (f"plateau: after {step} updates the main loss ({mean:.4g}, mean of the last {len(self._recent)}) "
                f"has stayed at the no-information level {self.reference.what} for {self._run} updates: the model "
                f"is not using the context yet. {self.reference.hint}")
