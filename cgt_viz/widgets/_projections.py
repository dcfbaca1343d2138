"""The explorer's projections: one set of drawn points with its coordinates and fitted reducers per
projection, the fits that run in background threads, and switching what the map shows (`Projecting`, a
mixin of `Explorer`).

A projection is kept under a key: the method for a 2-D map ("umap"), with "3d" appended for a 3-D one
("umap3d"). `PointSet.new_fit` makes the thread of a background fit; the thread writes into the set it was
made for, so an isolate or show_all meanwhile (which swap the explorer's set) cannot mix coordinates of
two point sets.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

import numpy as np

from .. import analysis as A
from .._checks import Bool, Choice, Constraint, Int, check_int, checked, describe, refuse
from ..geometry import PCA

MAX_PCS = 5          # principal components offered by the PC picker
AXIS_NAMES = {"pca": ("PC 1", "PC 2", "PC 3"), "umap": ("UMAP 1", "UMAP 2", "UMAP 3"),
              "tsne": ("t-SNE 1", "t-SNE 2", "t-SNE 3")}
METHOD_NAMES = {"pca": "PCA", "umap": "UMAP", "tsne": "t-SNE"}


def finite_ybar(ybar: np.ndarray) -> np.ndarray:
    """The points' ȳ, refused by that name when it holds NaN/inf (a projection would call it its own "X")."""
    bad = ~np.isfinite(ybar)
    if bad.any():
        rows = int(bad.any(axis=-1).sum())
        raise refuse("ȳ (the model's summaries of the shown points)", "finite to be projected",
                     f"{int(bad.sum())} NaN or inf values in {rows} of the {len(ybar)} points",
                     hint="the model's weights hold NaN/inf (saved after its training diverged?); load a checkpoint "
                          "from before the divergence")
    return ybar


class ProjectionParams(Constraint):
    """projection_params: None or {method: dict of keyword arguments} -> a dict for every method."""

    normalizes = True
    want = f"None or a dict {{method: dict of keyword arguments}} with methods in {A.PROJECTIONS}"

    def check(self, name, value, args=None):
        params = {} if value is None else value
        if not isinstance(params, dict):
            raise refuse(name, self.want, describe(params), TypeError)
        for method, kwargs in params.items():
            if method not in A.PROJECTIONS or not isinstance(kwargs, dict):
                raise refuse(name, self.want, f"{{{method!r}: {describe(kwargs)}}}")
        return {m: dict(params.get(m, {})) for m in A.PROJECTIONS}

    def bad_values(self):
        return [{"isomap": {}}, {"umap": 5}, 5]

    def shown(self, value):   # the offending method or value
        return "isomap" if value == {"isomap": {}} else "int 5"


def key_of(method: str, dims: int) -> str:
    """Where the coordinates of a projection are kept: "umap" (2-D), "umap3d" (3-D)."""
    return method if dims == 2 else f"{method}3d"


def split_key(key: str) -> tuple[str, int]:
    return (key[:-2], 3) if key.endswith("3d") else (key, 2)


def method_name(key: str) -> str:
    method, dims = split_key(key)
    return METHOD_NAMES[method] + (" 3-D" if dims == 3 else "")


def import_for_threads(*methods: str | None) -> None:
    """Import, in the calling (main) thread, what the explorer's background threads would import first.
    plotly looks pandas up in sys.modules (without importing it) while it builds any figure, so pandas
    half-imported by a fit thread (umap imports it) broke the figures the main thread drew meanwhile:
    "partially initialized module 'pandas' has no attribute 'Series'". So pandas, each projection's library
    and numba's thread pool (UMAP's first fit loads it) are all imported here, before a thread starts."""
    import pandas  # noqa: F401
    for method in methods:
        try:
            if method == "umap":
                import numba
                import umap  # noqa: F401
                numba.get_num_threads()          # loads numba's threading layer (a lazy import otherwise)
            elif method == "tsne":
                import sklearn.manifold  # noqa: F401
                import sklearn.neighbors  # noqa: F401
        except ImportError:                      # the fit then says what is missing in the status line
            pass


# a fit thread's report when it ends: (the set it fitted, key, seconds taken or the exception it raised)
FitDone = Callable[["PointSet", str, "float | BaseException"], None]


class PointSet:
    """Drawn points (analysis.Points) with their projections: coords and projectors by key, the background
    fit threads by key and the errors they ended with. `lock` is the explorer's (shared by every set)."""

    def __init__(self, points: A.Points, params: dict, seed: int, lock):
        self.points, self.params, self.seed, self.lock = points, params, seed, lock
        self.coords: dict[str, np.ndarray] = {}
        self.projectors: dict[str, A.Projector] = {}
        self.threads: dict[str, threading.Thread] = {}
        self.errors: dict[str, BaseException] = {}

    def fit(self, key: str) -> np.ndarray:
        """Fit projection `key` on these points (in the calling thread) and keep it."""
        method, dims = split_key(key)
        proj = A.Projector(method, seed=self.seed, dims=dims, **self.params[method])
        coords = proj.fit_transform(finite_ybar(self.points.ybar))
        with self.lock:
            self.projectors[key], self.coords[key] = proj, coords
        return coords

    def fitting(self, key: str) -> bool:
        return key in self.threads and self.threads[key].is_alive()

    def new_fit(self, key: str, done: FitDone) -> threading.Thread | None:
        """The thread (not started) that fits `key` and then calls done(self, key, seconds or exception);
        None when `key` is fitted or being fitted already."""
        import_for_threads(split_key(key)[0])    # here, not in the thread (see import_for_threads)
        with self.lock:
            if key in self.coords or self.fitting(key):
                return None
            self.errors.pop(key, None)
            thread = threading.Thread(target=self._fit_job, args=(key, done), daemon=True, name=f"cgt-viz-{key}")
            self.threads[key] = thread
        return thread

    def _fit_job(self, key: str, done: FitDone) -> None:
        t0 = time.perf_counter()
        try:
            self.fit(key)
        except Exception as exc:   # reported through done; wait(key) re-raises it
            self.errors[key] = exc
            done(self, key, exc)
            return
        done(self, key, time.perf_counter() - t0)

    def wait(self, key: str) -> None:
        """Wait for the background fit of `key`; re-raise what it failed with."""
        self.threads[key].join()
        if key in self.errors:
            raise self.errors[key]

    def join(self) -> None:
        """Wait for every background fit (before the points change)."""
        for thread in list(self.threads.values()):
            thread.join()

    def take(self, rows: np.ndarray) -> "PointSet":
        """A new set of the points `rows`, nothing fitted."""
        return PointSet(self.points.take(rows), self.params, self.seed, self.lock)

    def extend(self, new: A.Points) -> None:
        """Append points, placed by each fitted reducer's transform (no refit); coordinates without a
        fitted reducer are dropped."""
        for key, proj in self.projectors.items():
            self.coords[key] = np.concatenate([self.coords[key], proj.transform(new.ybar)])
        for key in [k for k in self.coords if k not in self.projectors]:
            del self.coords[key]
        self.points = A.Points.concat(self.points, new)


class Projecting:
    """What the map shows: PCA, UMAP or t-SNE, in 2-D or 3-D, or a chosen pair of principal components.
    A mixin of `Explorer`, which provides `_set` (the current PointSet), `_lock`, `_collection`, `figure`
    and `_groups`, `projection` and `dims` (what is drawn), the pickers `projection_picker`, `dims_picker`,
    `pc_picker`, `_pc_ratio` and `components`, and `_redraw`, `_draw_highlight`, `_clear_outline`, `_note`,
    `_set_status` and `quietly`."""

    @property
    def coords(self) -> np.ndarray:
        """(M, 2) coordinates of the drawn points in the current projection ((M, 3) in 3-D)."""
        self._collection.wait()
        return self._set.coords[key_of(self.projection, self.dims)]

    def _start_fit(self, key: str) -> None:
        thread = self._set.new_fit(key, self._fit_done)
        if thread is None:                         # fitted, or fitting already
            return
        hint = (" (the first UMAP in a process also compiles numba, which takes a while on a small CPU)"
                if key.startswith("umap") else "")
        self._set_status(f"{method_name(key)}: fitting in the background on {len(self._set.points):,} points{hint}…",
                         "busy")
        if not hasattr(self, "_fit_asked"):
            self._fit_asked: dict[str, float] = {}
        self._fit_asked[key] = time.perf_counter()
        thread.start()

    def _fit_done(self, points: PointSet, key: str, result) -> None:
        """A background fit ended (in its thread): say so, and draw it when it is what the pickers ask for."""
        if isinstance(result, BaseException):      # set_projection(wait=True) re-raises it
            self._set_status(f"{method_name(key)} failed: {type(result).__name__}: {result}", "error")
            return
        if points is not self._set:                 # fitted for a point set no longer shown
            return
        wanted = key_of(self.projection_picker.value, self.dims_picker.value) == key
        if wanted:
            self._show_projection(*split_key(key))
        # the status is set once the map is drawn, and counts from when the fit was asked for: the fit's own
        # time (it may have waited for ȳ or shared the CPU) was shorter than what the user saw
        asked = getattr(self, "_fit_asked", {}).pop(key, None)
        waited = "" if asked is None else f"{time.perf_counter() - asked:.1f} s after it was asked for; "
        self._set_status(f"{method_name(key)} ready ({waited}the fit itself {result:.1f} s)"
                         + ("" if wanted else " — pick it under Projection"), "ok")

    @checked(method=Choice(*A.PROJECTIONS), wait=Bool(), dims=Int(2, 3, none=True, hint=" (a 2-D or 3-D map)"))
    def set_projection(self, method: str, wait: bool = False, dims: int | None = None) -> None:
        """Show PCA, UMAP or t-SNE coordinates; fits (in the background unless wait=True) when not cached.
        dims: 2 or 3 (a 3-D map: PC 1-3, or UMAP / t-SNE with 3 components); None keeps the current one."""
        dims = self.dims if dims is None else dims
        self._collection.wait()
        with self.quietly():                        # the pickers say what is asked for; `dims` what is drawn
            if self.projection_picker.value != method:
                self.projection_picker.value = method
            if self.dims_picker.value != dims:
                self.dims_picker.value = dims
        key = key_of(method, dims)
        if key in self._set.coords:
            self._show_projection(method, dims)
            return
        if method == "pca":                        # instant: no background thread
            self._set.fit(key)
            self._show_projection(method, dims)
            return
        self._start_fit(key)
        if wait:
            self._set.wait(key)

    def _show_projection(self, method: str, dims: int | None = None) -> None:
        """Draw the coordinates of `method` in `dims` (default: the current; 2-D <-> 3-D rebuilds the traces)."""
        dims = self.dims if dims is None else dims
        key = key_of(method, dims)
        with self._lock:
            xyz = self._set.coords[key]
            three = dims == 3
            if three != (self.figure.data[0].type == "scatter3d"):
                self.projection, self.dims = method, dims
                self._redraw()
            else:
                with self.figure.batch_update():
                    groups = self._groups or [np.arange(len(xyz))]
                    for trace, rows in zip(self.figure.data, groups):
                        trace.x, trace.y = xyz[rows, 0], xyz[rows, 1]
                        if three:
                            trace.z = xyz[rows, 2]
                    self.dims = dims
                    names = self._axis_names(method)
                    axes = ((self.figure.layout.scene.xaxis, self.figure.layout.scene.yaxis,
                             self.figure.layout.scene.zaxis) if three else (self.figure.layout.xaxis,
                                                                            self.figure.layout.yaxis))
                    for axis, name in zip(axes, names):
                        axis.title.text = name
                    self.figure.layout.title.text = (f"ȳ of {len(self._set.points):,} tokens · {method_name(key)}"
                                                     f"<br><sup>{self._note()}</sup>")
                self.projection = method
                self._draw_highlight()                         # the rings follow their points
                self._clear_outline()                          # a box/lasso drawn in the old coordinates
        if not self._set.fitting(key):
            self._set_status(f"showing {method_name(key)}", "ok")

    # ------------------------------------------------------------------ principal components
    def set_components(self, a: int, b: int) -> None:
        """Show principal components a and b (1-based, up to MAX_PCS and d_y) and switch to PCA."""
        n_pc = min(MAX_PCS, self.points.ybar.shape[1])
        a = check_int("a", a, 1, n_pc, hint=" (a principal component)")
        b = check_int("b", b, 1, n_pc, hint=" (a principal component)")
        if a == b:
            raise refuse("a and b", "two different components", f"{a} and {b}")
        pca = PCA(n_pc)
        coords = pca.fit_transform(finite_ybar(self.points.ybar))
        self._pc_ratio, self.components = pca.explained_variance_ratio_, (a, b)
        with self._lock:
            self._set.coords["pca"] = np.ascontiguousarray(coords[:, [a - 1, b - 1]])
        if self.pc_picker.value != (a, b) and (a, b) in [v for _, v in self.pc_picker.options]:
            with self.quietly():
                self.pc_picker.value = (a, b)
        self.set_projection("pca", dims=2)         # a pair of components is a 2-D map
        self._show_projection("pca")

    def _axis_names(self, method: str) -> tuple[str, ...]:
        d, key = self.dims, key_of(method, self.dims)
        if method == "pca" and d == 2 and self._pc_ratio is not None:
            return tuple(f"PC {c} ({100 * self._pc_ratio[c - 1]:.0f}% of variance)" for c in self.components)
        if method == "pca" and key in self._set.projectors:
            ratio = self._set.projectors[key].reducer.explained_variance_ratio_
            names = [f"PC {i + 1} ({100 * r:.0f}% of variance)" for i, r in enumerate(ratio[:d])]
            return tuple(names + list(AXIS_NAMES["pca"][len(names):d]))
        return AXIS_NAMES[method][:d]
