"""Which cell is running: the widgets' one hook on IPython's cell events (pre_run_cell, post_run_cell).

Two modules act on those events: `_base` ships plotly's code with a figure widget a cell makes (not with one
a widget callback makes between cells) and empties it from the widgets after the cell; `_static` refreshes
the static copies of the displayed views after each cell and, under CGT_VIZ_STATIC=embed, lets the first
view of each cell carry plotly.js. They register what they do here (`on_cell_start`, `on_cell_end`) and
read `cell_running()`, so both see the same answer (each kept a flag of its own before, and the two
disagreed about the first cell of a session).
"""
from __future__ import annotations

import threading
from typing import Callable

_lock = threading.Lock()
_at_start: list[Callable[[], object]] = []   # run as a cell begins, in the order registered
_at_end: list[Callable[[], object]] = []     # run once a cell has finished
_running = False       # between pre_run_cell and post_run_cell: code running now is a cell's
_following = False     # the two hooks are registered on the kernel's shell (once per session)


def kernel_shell():
    """The IPython shell of a running Jupyter kernel, or None (plain Python, tests, terminal IPython)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    return shell if shell is not None and getattr(shell, "kernel", None) is not None else None


def on_cell_start(callback: Callable[[], object]) -> None:
    """Run `callback()` as each cell begins (once the cells are followed, see `follow_cells`)."""
    if callback not in _at_start:
        _at_start.append(callback)


def on_cell_end(callback: Callable[[], object]) -> None:
    """Run `callback()` after each cell (once the cells are followed, see `follow_cells`)."""
    if callback not in _at_end:
        _at_end.append(callback)


def follow_cells(shell=None) -> bool:
    """Register the hooks on the kernel's shell (`shell`, else `kernel_shell()`), once per session; False
    where no kernel runs (nothing to follow: `cell_running()` stays False)."""
    global _following, _running
    shell = kernel_shell() if shell is None else shell
    if shell is None:
        return False
    with _lock:
        if not _following:
            shell.events.register("pre_run_cell", _cell_started)
            shell.events.register("post_run_cell", _cell_finished)
            _following = True
            _running = True          # what first asks to follow the cells is a cell's code
    return True


def cell_running() -> bool:
    """Whether a cell's code is running now (False between cells: a widget callback, a background thread
    reporting, or no kernel at all)."""
    return _running


def _cell_started(*_args) -> None:
    global _running
    _running = True
    _run_all(_at_start)


def _cell_finished(*_args) -> None:
    global _running
    _running = False
    _run_all(_at_end)


def _run_all(callbacks: list[Callable[[], object]]) -> None:
    # each callback runs even when one before it failed, as when each was a hook of its own; the first error
    # still reaches IPython, which prints it under the cell
    errors = []
    for callback in list(callbacks):
        try:
            callback()
        except Exception as err:
            errors.append(err)
    if errors:
        raise errors[0]
