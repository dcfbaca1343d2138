"""Collecting ȳ for the explorer: all at once, or, for a big data set, a preview of some sequences first
and the rest in a background thread that every reader waits for.

`Collection` holds that thread and the explorer's re-entrant lock (`FullLock`): taking the lock, or
reading an attribute declared `WaitsForEveryPoint`, first waits for the collection, except in the
collecting thread itself and while the display draws the preview (`Collection.peek`).
"""
from __future__ import annotations

import contextlib
import math
import threading
from typing import Callable

import numpy as np

from .. import analysis as A


def batch_size(model, seqs: A.Sequences) -> int:
    """Sequences per forward pass when collecting ȳ: 8192 tokens on a CPU (faster there than
    bigger batches: they fit the cache; benchmarks/bench_explorer.py), collect_ybar's default elsewhere."""
    if next(model.parameters()).device.type != "cpu":
        return 64
    return max(1, 8192 // max(int(seqs.t), 1))


def preview_rows(seqs: A.Sequences, seq: np.ndarray, preview_tokens: int | None, seed: int) -> np.ndarray | None:
    """Rows whose ȳ the first paint shows when collecting all of them takes long (more than 2 ×
    preview_tokens tokens): about preview_tokens tokens, stratified by label; None: no preview (also when
    the rows would hold fewer than 2 of the points `seq` selects)."""
    if preview_tokens is None or int(seqs.lengths.sum()) <= 2 * preview_tokens:
        return None
    per_row = max(float(seqs.lengths.mean()), 1.0)
    k = max(2, int(math.ceil(preview_tokens / per_row)))
    strata = seqs.token_labels[:, 0].astype(str) if seqs.token_labels is not None else np.arange(seqs.n)
    rows = np.sort(A.stratified_subsample(strata, k, seed))
    return rows if np.isin(seq, rows).sum() >= 2 else None


def first_ybar(model, seqs: A.Sequences, rows: np.ndarray | None) -> np.ndarray:
    """ȳ (n, t, d_y) of every row (rows None), or of `rows` only (zeros elsewhere, for the background).
    The explorer checked the model and the sequences when it opened: nothing here checks them again."""
    if rows is None:
        return A._collect_ybar(model, seqs.inputs, batch_size(model, seqs))
    ybar = np.zeros((seqs.n, seqs.t, model.config.d_y), np.float32)
    ybar[rows] = A._collect_ybar(model, seqs.inputs[rows], batch_size(model, seqs))
    return ybar


def rest_of_ybar(model, seqs: A.Sequences, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the rows a preview of `rows` left out, their ȳ): the background thread's work."""
    rest = np.setdiff1d(np.arange(seqs.n), rows)
    return rest, A._collect_ybar(model, seqs.inputs[rest], batch_size(model, seqs))


class FullLock:
    """A re-entrant lock; taking it first waits for the background collection (which takes it to swap in
    every point), except in the collecting thread and while the display shows the preview."""

    def __init__(self, collection: "Collection"):
        self._collection, self._lock = collection, threading.RLock()

    def __enter__(self):
        self._collection.wait()
        self._lock.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self._lock.release()

    def acquire_now(self):
        """The lock without waiting for the collection (the display of the preview)."""
        self._lock.acquire()
        return self

    def release(self) -> None:
        self._lock.release()


class Collection:
    """The background collection of ȳ (at most one per explorer) and the lock that waits for it."""

    def __init__(self):
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self._peeker: int | None = None          # the thread drawing the preview, which must not wait
        self.lock = FullLock(self)

    def start(self, work: Callable[[], None]) -> None:
        """Run work() in the background; an exception it raises is kept and re-raised by `wait`."""
        def run():
            try:
                work()
            except Exception as exc:   # noqa: BLE001 - every reader re-raises it
                self.error = exc
        self.thread = threading.Thread(target=run, daemon=True, name="cgt-viz-ybar")
        self.thread.start()

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def wait(self) -> None:
        """Wait for the collection (not in the thread that collects, nor while the display shows the preview)."""
        thread = self.thread
        if thread is None or threading.get_ident() in (thread.ident, self._peeker):
            return
        thread.join()
        if self.error is not None:
            raise RuntimeError(f"collecting ȳ for the explorer failed: {self.error}") from self.error

    @contextlib.contextmanager
    def peek(self):
        """Hold the lock without waiting for the collection: the display draws what the map shows now."""
        self._peeker = threading.get_ident()
        self.lock.acquire_now()
        try:
            yield
        finally:
            self.lock.release()
            self._peeker = None


class WaitsForEveryPoint:
    """An attribute that, when read, first waits for the owner's background collection (`owner._collection`);
    it is stored under its name with a leading underscore."""

    def __init__(self, doc: str):
        self.__doc__ = doc

    def __set_name__(self, owner, name: str) -> None:
        self.slot = "_" + name

    def __get__(self, view, owner=None):
        if view is None:
            return self
        view._collection.wait()
        return getattr(view, self.slot)

    def __set__(self, view, value) -> None:
        setattr(view, self.slot, value)
