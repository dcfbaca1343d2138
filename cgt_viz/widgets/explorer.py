"""The ȳ explorer: the context summary of many tokens embedded in 2-D, coloured, selectable, linked.

    ex = cgt_viz.explore(model, task_or_tokens_or_strings, labels=None)
    ex                     # displays: PCA at once, UMAP fitting in the background (status line)
    ex.selection           # box/lasso selection as a DataFrame (point, sequence, position, token, label, x, y)
    ex.open_sequence(3)    # what a click does: smoothness strip + template inspector for sequence 3
    ex.search("sport")     # select the points whose token or label contains it (the search box); a DataFrame
    ex.neighbors(17, k=10) # nearest points in ȳ by cosine (listed under the map after a click)
    ex.isolate(); ex.show_all()      # only the selection / back to every point, in the current projection
    ex.clear()                       # the Clear button: no selection, no search hits, no neighbours marked
    ex.set_components(2, 3)          # PCA on PC 2 and PC 3 (the PCs picker, up to PC 5)
    ex.set_projection("umap", dims=3)  # a 3-D map (PC 1-3, or UMAP / t-SNE with 3 components; the 2-D/3-D toggle)
    ex.set_hidden(["tech"])          # what a click on a legend entry does; ex.hidden_categories
    ex.export("sel.csv")             # the Export CSV button: the selection (or every point)

A categorical colouring (topic, document, excerpt half, token) draws one trace per category with a legend
entry each; numbers (position) get a colour bar. Search hits, and a clicked point with its nearest
neighbours, are ringed and labelled by one more trace drawn over the map (the last; `highlighted`).
The map paints with PCA; a background projection (UMAP by default) is fitted meanwhile and the status line
says when it is ready; it is shown when picked under Projection (the map does not change under a
selection on its own). In 3-D (plotly's Scatter3d: drag to turn, scroll to zoom)
a click still opens a point's sequence, but a box or lasso selects nothing (plotly has no 3-D selection), and
a selection made from Python (select, search) is listed, not drawn.

Big arrays (ȳ, tokens) stay in Python attributes; only the drawn points (x, y, colour codes, hover text)
go to the browser, so a saved notebook grows by the plotted points, not by ȳ.
"""
from __future__ import annotations

import html
import math
import threading
import time
from typing import Any

import ipywidgets as W
import numpy as np

from .. import analysis as A
from .._checks import (Bool, Choice, Height, Int, check_array, check_choice, check_index, check_int, checked,
                       describe, is_number)
from ..figures import highlight_trace, map_groups, plural, short_token, ybar_map_figure
from ..sequences import model_device
from ._base import check_view_ybar, figure_widget, html_status, replace_figure
from ._static import STATIC_MAX_POINTS, StaticForm

MAX_PCS = 5          # principal components offered by the PC picker
NEIGHBOURS_SHOWN = 8  # neighbours listed under the map after a click
TOKEN_COLOURS = 12   # colour by token: the most frequent tokens get a colour each, the rest are "other"
AXIS_NAMES = {"pca": ("PC 1", "PC 2", "PC 3"), "umap": ("UMAP 1", "UMAP 2", "UMAP 3"),
              "tsne": ("t-SNE 1", "t-SNE 2", "t-SNE 3")}
METHOD_NAMES = {"pca": "PCA", "umap": "UMAP", "tsne": "t-SNE"}


# the explorer's own options, declared for explore() and Explorer()
_VIEW_ARGS = dict(projection=Choice(*A.PROJECTIONS), background=Choice(*A.PROJECTIONS, none=True),
                  max_points=Int(2, hint=" (points drawn)"), linked=Bool(), height=Height(),
                  dims=Int(2, 3, hint=" (a 2-D or 3-D map)"))


def _check_projection_params(projection_params) -> dict:
    """projection_params (checked before any ȳ is collected) -> projection_params for every method."""
    want = f"None or a dict {{method: dict of keyword arguments}} with methods in {A.PROJECTIONS}"
    if projection_params is None:
        projection_params = {}
    if not isinstance(projection_params, dict):
        raise TypeError(f"projection_params must be {want}, got {describe(projection_params)}")
    for method, kwargs in projection_params.items():
        if method not in A.PROJECTIONS or not isinstance(kwargs, dict):
            raise ValueError(f"projection_params must be {want}, got {{{method!r}: {describe(kwargs)}}}")
    return {m: dict(projection_params.get(m, {})) for m in A.PROJECTIONS}


def _check_pair(name: str, value) -> tuple[float, float]:
    """A range (lo, hi) of two finite numbers, in either order."""
    want = f"{name} must be a pair (lo, hi) of finite numbers, got {describe(value)}"
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 2:
        raise TypeError(want)
    if not all(is_number(v) for v in value):
        raise TypeError(want)
    lo, hi = (float(v) for v in value)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(want)
    return min(lo, hi), max(lo, hi)


def _key(method: str, dims: int) -> str:
    """Where the coordinates of a projection are kept: "umap" (2-D), "umap3d" (3-D)."""
    return method if dims == 2 else f"{method}3d"


def _split(key: str) -> tuple[str, int]:
    return (key[:-2], 3) if key.endswith("3d") else (key, 2)


def _method_name(key: str) -> str:
    method, dims = _split(key)
    return METHOD_NAMES[method] + (" 3-D" if dims == 3 else "")


def _import_for_threads(*methods: str | None) -> None:
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


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")   # what makes a spreadsheet read a cell as a formula


def _csv_safe(df):
    """df with every text cell that a spreadsheet would run as a formula prefixed with a single quote."""
    from pandas.api.types import is_object_dtype, is_string_dtype
    df = df.copy()
    for col in df.columns:
        if is_object_dtype(df[col]) or is_string_dtype(df[col]):     # pandas 3 stores text as "str"
            df[col] = df[col].map(lambda v: "'" + v if isinstance(v, str) and v.startswith(FORMULA_START) else v)
    return df


def _top_tokens(tokens: np.ndarray, k: int) -> np.ndarray:
    """Each token's own string if it is among the k most frequent, else "other"."""
    keys = tokens.astype(str)
    names, which, counts = np.unique(keys, return_inverse=True, return_counts=True)
    top = set(np.argsort(-counts, kind="stable")[:k].tolist())
    shown = np.array([repr(str(t)) if j in top else "other" for j, t in enumerate(names.tolist())], dtype=object)
    return shown[which.reshape(-1)]


def _batch_size(model, seqs: A.Sequences) -> int:
    """Sequences per forward pass when collecting ȳ: about 8k tokens on a CPU (faster there than bigger
    batches: they fit the cache), collect_ybar's default elsewhere."""
    if model_device(model).type != "cpu":
        return 64
    return max(1, 8192 // max(int(seqs.t), 1))


@checked(**_VIEW_ARGS)
def explore(model, data, labels=None, *, positions: Any = "all", projection: str = "pca",
            background: str | None = "umap", color_by: str | None = None, max_points: int = 100_000,
            boundary=None, n_batches: int = 4, batch_size: int = 32, seed: int = 0, linked: bool = True,
            projection_params: dict | None = None, height: int = 520, dims: int = 2) -> "Explorer":
    """Collect ȳ for the tokens of `data` and open the explorer.

    data       LongTensor (n, t) | list of strings (the model's task tokenizer, else bytes) | Batch | Task
               (n_batches × batch_size sequences drawn with `seed`; per-token topics become labels)
    labels     None, one per sequence (n,), or one per token (n, t)
    positions  "all" | "ends" (last token of each excerpt) | k (every k-th token) | list of positions
    projection the first paint: "pca" (instant), "umap" or "tsne" (fitted in the background)
    dims       2 or 3: a 2-D map or a 3-D one (see `Explorer.set_projection`)
    background a projection to fit in a background thread right away (None: only when picked)
    max_points cap on drawn points; beyond it a stratified subsample (by label, else by sequence) is drawn
    projection_params  {method: keyword arguments for its reducer}, e.g. {"umap": {"n_neighbors": 30}}
    """
    A.require_cgt(model)
    _check_projection_params(projection_params)   # before the work
    seqs = A.prepare_sequences(model, data, labels, boundary, n_batches=n_batches, batch_size=batch_size, seed=seed)
    return Explorer(model, seqs, positions=positions, projection=projection, background=background,
                    color_by=color_by, max_points=max_points, seed=seed, linked=linked,
                    projection_params=projection_params, height=height, dims=dims)


class _FullLock:
    """The explorer's re-entrant lock; taking it first waits for a background ȳ collection (which takes it
    to swap in every point), except in the collecting thread and while the display shows the preview."""

    def __init__(self, explorer: "Explorer"):
        self._explorer, self._lock = explorer, threading.RLock()

    def __enter__(self):
        self._explorer._await_full()
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


class _WaitsForEveryPoint:
    """An Explorer attribute that, when read, first waits for a background ȳ collection (see `Explorer`); it is
    stored under its name with a leading underscore."""

    def __init__(self, doc: str):
        self.__doc__ = doc

    def __set_name__(self, owner, name: str) -> None:
        self.slot = "_" + name

    def __get__(self, explorer, owner=None):
        if explorer is None:
            return self
        explorer._await_full()
        return getattr(explorer, self.slot)

    def __set__(self, explorer, value) -> None:
        setattr(explorer, self.slot, value)


# how long after we remove a box/lasso outline its answering deselect may still arrive (a loaded machine is slow)
_OWN_DESELECT_S = 10.0

class Explorer(StaticForm, W.VBox):
    """ipywidgets layout around a FigureWidget of ȳ points; see `explore` for the arguments.

    Collecting ȳ of more than 2 × `preview_tokens` tokens (CPU: ~3 s per 100k tokens on one thread for a
    small model) first paints a preview: the PCA of about `preview_tokens` tokens from sequences stratified
    by label, while a background thread collects the rest and then draws every point. Python never sees
    the preview: every method and attribute waits for the full set (`wait()` does only that).
    `Explorer.preview_tokens = None` turns the preview off."""

    preview_tokens: int | None = 16_384

    @checked(**_VIEW_ARGS)
    def __init__(self, model, sequences: A.Sequences, ybar: np.ndarray | None = None, *, positions: Any = "all",
                 projection: str = "pca", background: str | None = "umap", color_by: str | None = None,
                 max_points: int = 100_000, seed: int = 0, linked: bool = True,
                 projection_params: dict | None = None, height: int = 520, dims: int = 2):
        A.require_cgt(model)
        if not isinstance(sequences, A.Sequences):
            raise TypeError(f"sequences must be an analysis.Sequences (use cgt_viz.explore for raw data), "
                            f"got {type(sequences).__name__}")
        self.projection_params = _check_projection_params(projection_params)
        self.dims = dims
        self.model, self.seqs, self.seed, self.positions = model, sequences, seed, positions
        self.max_points, self._linked_enabled, self.height = int(max_points), bool(linked), int(height)
        self._lock = _FullLock(self)
        self._collector: threading.Thread | None = None
        self._collect_error: BaseException | None = None
        self._peek_thread: int | None = None
        seq, pos = A.select_positions(sequences.lengths, positions, sequences.boundary)
        if len(seq) < 2:
            raise ValueError(f"data with positions={positions!r} gives {len(seq)} token; the explorer needs at "
                             f"least 2 points (pass more or longer sequences)")
        self._strata_name = "label" if sequences.token_labels is not None else "sequence"
        self.label_name = sequences.label_name
        self._preview_rows = None if ybar is not None else self._pick_preview(sequences, seq)
        if ybar is not None:
            self._ybar_full = check_view_ybar(ybar, sequences, model)
        elif self._preview_rows is None:
            self._ybar_full = A.collect_ybar(model, sequences.inputs, batch_size=_batch_size(model, sequences))
        else:   # the first paint shows these rows; the rest is collected in the background (see `wait`)
            rows = self._preview_rows
            self._ybar_full = np.zeros((sequences.n, sequences.t, model.config.d_y), np.float32)
            self._ybar_full[rows] = A.collect_ybar(model, sequences.inputs[rows],
                                                   batch_size=_batch_size(model, sequences))
        self._take_points(seq, pos)

        self._coords: dict[str, np.ndarray] = {}
        self._projectors: dict[str, A.Projector] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._errors: dict[str, BaseException] = {}
        self._selected = np.zeros(0, dtype=np.int64)
        self._highlight = (np.zeros(0, dtype=np.int64), [], "highlighted")   # (points, labels, trace name)
        self._strip = self._inspector = None
        self._syncing = False

        self.color_options = self._color_options()
        if color_by is None:
            color_by = self.label_name if self.label_name in self.color_options else "position"
        check_choice("color_by", color_by, self.color_options)
        self.color_by = color_by

        first = "pca"                           # always the first paint: instant; others follow when fitted
        t0 = time.perf_counter()
        self._fit_now(_key(first, self.dims))
        self._groups: list[np.ndarray] = []
        self.figure = figure_widget(self._figure(first))
        self.projection = first
        self._wire_traces()

        self.projection_picker = W.Dropdown(options=[(METHOD_NAMES[m], m) for m in A.PROJECTIONS], value=first,
                                            description="Projection", layout=W.Layout(width="220px"))
        self.color_picker = W.Dropdown(options=list(self.color_options), value=color_by, description="Colour by",
                                       layout=W.Layout(width="240px"))
        self.status = W.HTML(html_status(f"{_method_name(_key(first, self.dims))} of {len(self.points):,} points in "
                                         f"{time.perf_counter() - t0:.2f} s", "ok"))
        self.selection_info = W.HTML(html_status("Drag a box or lasso to select points; click a point to open "
                                                 "its sequence below."))
        self.linked = W.VBox([])
        self.projection_picker.observe(self._on_projection_picked, names="value")
        self.dims_picker = W.ToggleButtons(options=[("2-D", 2), ("3-D", 3)], value=self.dims,
                                           tooltips=["a 2-D map (box and lasso select)", "a 3-D map (drag to turn)"],
                                           style={"button_width": "44px"}, layout=W.Layout(width="auto"))
        self.dims_picker.observe(lambda ch: None if self._syncing else
                                 self._ui(lambda: self.set_projection(self.projection_picker.value, dims=ch["new"])),
                                 names="value")
        self.color_picker.observe(self._on_color_picked, names="value")
        n_pc = min(MAX_PCS, self.points.ybar.shape[1])
        pairs = [(a, b) for a in range(1, n_pc + 1) for b in range(a + 1, n_pc + 1)]
        self.components = (1, 2)
        self.pc_picker = W.Dropdown(options=[(f"PC {a} & {b}", (a, b)) for a, b in pairs] or [("PC 1 & 2", (1, 2))],
                                    value=(1, 2), description="PCs", layout=W.Layout(width="170px"))
        self.pc_picker.observe(lambda ch: None if self._syncing else self.set_components(*ch["new"]), names="value")
        self.search_box = W.Text(placeholder="search a token or label", continuous_update=False,
                                 layout=W.Layout(width="220px"))
        self.search_box.observe(lambda ch: None if self._syncing else
                                self.search(ch["new"]) if ch["new"] else self.clear(), names="value")
        self.isolate_button = W.Button(description="Isolate selection", tooltip="re-project only the selected points",
                                       layout=W.Layout(width="140px"))
        self.isolate_button.on_click(lambda _b: self._ui(self.isolate))
        self.all_button = W.Button(description="Show all", tooltip="back to every point", layout=W.Layout(width="90px"))
        self.all_button.on_click(lambda _b: self._ui(self.show_all))
        self.export_button = W.Button(description="Export CSV", tooltip="the selection (or every point) as a CSV file",
                                      layout=W.Layout(width="100px"))
        self.export_button.on_click(lambda _b: self._ui(self.export))
        self.clear_button = W.Button(description="Clear", tooltip="no selection, no search hits, no neighbours marked",
                                     layout=W.Layout(width="70px"))
        self.clear_button.on_click(lambda _b: self._ui(self.clear))
        self.neighbours_info = W.HTML("")
        self._stack: list[tuple] = []
        super().__init__([W.HBox([self.projection_picker, self.dims_picker, self.pc_picker, self.color_picker,
                                  self.status]),
                          W.HBox([self.search_box, self.clear_button, self.isolate_button, self.all_button,
                                  self.export_button]),
                          self.figure, self.selection_info, self.neighbours_info, self.linked])
        if self._preview_rows is not None:
            _import_for_threads(background)      # the collector starts the background fit itself
            self._collector = threading.Thread(target=self._collect_rest, args=(background,), daemon=True,
                                               name="cgt-viz-ybar")
            self._collector.start()
        if projection != first:
            self.set_projection(projection)
        if self._preview_rows is None and background is not None and background != "pca" \
                and _key(background, self.dims) not in self._threads:
            self._start_fit(_key(background, self.dims))

    # ------------------------------------------------------------------ preview while ȳ is collected
    def _pick_preview(self, sequences: A.Sequences, seq: np.ndarray) -> np.ndarray | None:
        """Rows whose ȳ the first paint shows when collecting all of them takes long (more than
        2 × PREVIEW_TOKENS tokens): about PREVIEW_TOKENS tokens, stratified by label; None: no preview."""
        if self.preview_tokens is None or int(sequences.lengths.sum()) <= 2 * self.preview_tokens:
            return None
        per_row = max(float(sequences.lengths.mean()), 1.0)
        k = max(2, int(math.ceil(self.preview_tokens / per_row)))
        strata = (sequences.token_labels[:, 0].astype(str) if sequences.token_labels is not None
                  else np.arange(sequences.n))
        rows = np.sort(A.stratified_subsample(strata, k, self.seed))
        return rows if np.isin(seq, rows).sum() >= 2 else None

    def _take_points(self, seq: np.ndarray, pos: np.ndarray) -> None:
        """The drawn points among the tokens (seq, pos): all, or a stratified subsample of max_points (of the
        preview rows' tokens while the preview is shown)."""
        if self._preview_rows is not None and self._collector is None:
            keep = np.isin(seq, self._preview_rows)
            seq, pos = seq[keep], pos[keep]
        labelled = self.seqs.token_labels is not None
        strata = self.seqs.token_labels[seq, pos].astype(str) if labelled else seq
        shown = A.stratified_subsample(strata, self.max_points, self.seed)   # before hover text is built for them
        self._n_total = len(seq)
        self._points = A.points_at(self.seqs, self._ybar_full, seq[shown], pos[shown])

    def _collect_rest(self, background: str | None) -> None:
        """Background thread: ȳ of the rows the preview left out, then every point drawn (PCA afresh)."""
        t0 = time.perf_counter()
        try:
            rest = np.setdiff1d(np.arange(self.seqs.n), self._preview_rows)
            part = A.collect_ybar(self.model, self.seqs.inputs[rest], batch_size=_batch_size(self.model, self.seqs))
            with self._lock:
                self._ybar_full[rest] = part
                seq, pos = A.select_positions(self.seqs.lengths, self.positions, self.seqs.boundary)
                self._take_points(seq, pos)
                self._preview_rows = None
                self._coords, self._projectors = {}, {}
                self._selected = np.zeros(0, dtype=np.int64)
                self._highlight = (np.zeros(0, dtype=np.int64), [], "highlighted")
                self.color_options = self._color_options()
                self._fit_now(_key("pca", self.dims))
                self.projection = "pca"
                self._redraw()
                self._describe_selection()
        except Exception as exc:   # shown in the status line; `wait()` re-raises it
            self._collect_error = exc
            self._set_status(f"collecting ȳ failed: {type(exc).__name__}: {exc}", "error")
            return
        self._set_status(f"ȳ of every token collected and {_method_name(_key('pca', self.dims))} of "
                         f"{len(self._points):,} points in {time.perf_counter() - t0:.1f} s", "ok")
        if background is not None and background != "pca":
            self._start_fit(_key(background, self.dims))

    def _await_full(self) -> None:
        """What Python sees is always every point: wait for a background ȳ collection (not in the thread
        that collects, nor while the display shows the preview)."""
        thread = self.__dict__.get("_collector")
        if thread is None or threading.get_ident() in (thread.ident, self.__dict__.get("_peek_thread")):
            return
        thread.join()
        if self._collect_error is not None:
            raise RuntimeError(f"collecting ȳ for the explorer failed: {self._collect_error}") from self._collect_error

    def wait(self) -> "Explorer":
        """Wait until ȳ of every token is collected (a big data set first paints a preview of some of its
        sequences and collects the rest in the background; any other method waits for it too)."""
        self._await_full()
        return self

    @property
    def collecting(self) -> bool:
        """True while the map shows a preview and ȳ of the other sequences is still being collected."""
        return self._collector is not None and self._collector.is_alive()

    points = _WaitsForEveryPoint("The drawn points (ȳ, sequence, position, token, hover text, label).")
    ybar_full = _WaitsForEveryPoint("ȳ of every token of `seqs`: (n, t, d_y).")
    n_total = _WaitsForEveryPoint("How many tokens the positions select (the drawn points are at most max_points of them).")
    projectors = _WaitsForEveryPoint("The fitted reducers by method (they place points that `add` brings).")

    def _ipython_display_(self) -> None:
        # the display shows what the map shows now (a preview while ȳ is collected), without waiting; the
        # static copy follows after the cell (refresh_static waits for every point)
        self._peek_thread = threading.get_ident()
        self._lock.acquire_now()
        try:
            super()._ipython_display_()
        finally:
            self._lock.release()
            self._peek_thread = None

    # ------------------------------------------------------------------ data
    def _wire_traces(self) -> None:
        """(Re)attach the selection, click and deselect callbacks to every trace (after the traces change)."""
        self._buffer: list[np.ndarray] = []
        n = self._n_map
        last = n - 1
        for i, trace in enumerate(self.figure.data[:n]):
            trace.on_selection(lambda tr, pts, sel, i=i: self._on_plotly_selection(i, last, pts, sel))
            trace.on_deselect(lambda tr, pts, i=i: self._on_plotly_deselect() if i == last else None)
            trace.on_click(lambda tr, pts, state, i=i: self._on_plotly_click(i, pts))
        for trace in self.figure.data[n:]:          # the highlight overlay: a click opens the point under it
            trace.on_click(lambda tr, pts, state: self._on_overlay_click(pts))

    @property
    def _n_map(self) -> int:
        """How many of the figure's traces draw the points (the rest: the highlight overlay)."""
        return len(self._groups) if self._groups else 1

    def _on_overlay_click(self, points) -> None:
        if points.point_inds:
            rows = self._highlight[0]
            i = points.point_inds[0]
            if 0 <= i < len(rows):
                self.open_point(int(rows[i]))

    def _clear_outline(self) -> None:
        """Remove a box/lasso outline drawn in the browser. plotly.js keeps it in layout.selections and
        re-applies it on every redraw (overriding selectedpoints set from Python), and the Python side of
        the figure does not know it is there, so the relayout is sent as is."""
        self._quiet_until = time.monotonic() + _OWN_DESELECT_S   # the deselect plotly answers with is ours
        with self.figure.batch_update():
            self.figure.layout.selections = ()
        self.figure._send_relayout_msg({"selections": []})

    def _on_plotly_deselect(self) -> None:
        # one deselect answers our own outline removal: ignore it (once), however late a busy machine delivers it
        if time.monotonic() < getattr(self, "_quiet_until", 0.0):
            self._quiet_until = 0.0
            return
        self.select([])

    def _to_points(self, trace: int, local) -> np.ndarray:
        """Indices within trace `trace` -> indices of drawn points (0..M−1)."""
        local = np.asarray(local, dtype=np.int64)
        return self._groups[trace][local] if self._groups else local

    def _color_options(self) -> dict[str, tuple[np.ndarray, str]]:
        pts, opts = self.points, {}
        if pts.label is not None:
            opts[self.label_name] = (pts.label.astype(str), "categorical")
        opts["position"] = (pts.pos, "continuous")
        opts["document"] = (pts.seq, "categorical")
        opts["excerpt half"] = (np.where(pts.half == 0, "first", "second"), "categorical")
        opts["token"] = (_top_tokens(pts.token, TOKEN_COLOURS), "categorical")
        return opts

    def _note(self) -> str:
        m = len(self.points)
        if self._preview_rows is not None:
            return (f"preview: ȳ of {len(self._preview_rows):,} of {self.seqs.n:,} sequences ({m:,} tokens); "
                    f"collecting the rest in the background…")
        if getattr(self, "_stack", None):
            return f"isolated selection: {m:,} of {len(self._stack[0][0]):,} drawn tokens, projected afresh"
        if m < self.n_total:
            by = self.label_name if self._strata_name == "label" else "document"
            return (f"showing {m:,} of {self.n_total:,} tokens, a subsample stratified by {html.escape(str(by), quote=False)} "
                    f"(max_points={self.max_points:,})")
        return f"{m:,} tokens from {len(np.unique(self.points.seq)):,} sequences"

    def _figure(self, method: str, rows: np.ndarray | None = None, note: str | None = None, selection: bool = True):
        """The map in projection `method` (rows: a subset of the drawn points, for the static copy)."""
        values, kind = self.color_options[self.color_by]
        coords, hover = self._coords[_key(method, self.dims)], self.points.hover
        selected = self._selected if selection else np.zeros(0, np.int64)
        marked, labels, name = getattr(self, "_highlight", (np.zeros(0, np.int64), [], "highlighted"))
        if rows is not None:
            pos = np.full(len(self.points), -1)
            pos[rows] = np.arange(len(rows))
            values, coords, hover = values[rows], coords[rows], hover[rows]
            selected = pos[selected][pos[selected] >= 0]
            keep = pos[marked] >= 0
            marked, labels = pos[marked][keep], [lab for lab, k in zip(labels, keep) if k]
        if rows is None:
            self._groups = map_groups(values, kind)[1]
        return ybar_map_figure(coords, values, hover, color_name=self.color_by, color_kind=kind,
                               note=note or self._note(), axis_names=self._axis_names(method), height=self.height,
                               selected=selected if len(selected) else None,
                               highlight=marked, highlight_labels=labels, highlight_name=name,
                               title=f"ȳ of {len(self.points):,} tokens · {_method_name(_key(method, self.dims))}")

    def _axis_names(self, method: str) -> tuple[str, ...]:
        d, key = self.dims, _key(method, self.dims)
        if method == "pca" and d == 2 and getattr(self, "_pc_ratio", None) is not None:
            return tuple(f"PC {c} ({100 * self._pc_ratio[c - 1]:.0f}% of variance)" for c in self.components)
        if method == "pca" and key in self._projectors:
            ratio = self._projectors[key].reducer.explained_variance_ratio_
            names = [f"PC {i + 1} ({100 * r:.0f}% of variance)" for i, r in enumerate(ratio[:d])]
            return tuple(names + list(AXIS_NAMES["pca"][len(names):d]))
        return AXIS_NAMES[method][:d]

    def _ui(self, action) -> None:
        """Run a button's action; a refusal (e.g. isolate with nothing selected) goes to the status line."""
        try:
            action()
        except (ValueError, TypeError) as err:
            self._set_status(str(err), "error")          # html_status escapes it

    # ------------------------------------------------------------------ principal components
    def set_components(self, a: int, b: int) -> None:
        """Show principal components a and b (1-based, up to MAX_PCS and d_y) and switch to PCA."""
        n_pc = min(MAX_PCS, self.points.ybar.shape[1])
        a = check_int("a", a, 1, n_pc, hint=" (a principal component)")
        b = check_int("b", b, 1, n_pc, hint=" (a principal component)")
        if a == b:
            raise ValueError(f"a and b must be two different components, got {a} and {b}")
        X = self.points.ybar.astype(np.float64)
        centered = X - X.mean(0)
        evals, evecs = np.linalg.eigh(centered.T @ centered / max(len(X) - 1, 1))
        order = np.argsort(evals)[::-1][:n_pc]
        comps = evecs[:, order].T
        comps *= np.sign(comps[np.arange(len(comps)), np.abs(comps).argmax(1)])[:, None]   # as analysis' PCA
        self._pc_ratio = evals[order] / max(evals.sum(), 1e-12)
        self.components = (a, b)
        with self._lock:
            self._coords["pca"] = (centered @ comps[[a - 1, b - 1]].T).astype(np.float32)
        self._syncing = True
        try:
            if self.pc_picker.value != (a, b) and (a, b) in [v for _, v in self.pc_picker.options]:
                self.pc_picker.value = (a, b)
        finally:
            self._syncing = False
        self.set_projection("pca", dims=2)         # a pair of components is a 2-D map
        self._show_projection("pca")

    # ------------------------------------------------------------------ search, neighbours, export
    @checked(field=Choice("any", "token", "label"))
    def search(self, query: str, field: str = "any"):
        """Select the drawn points whose token (field="token"), label ("label"), or either ("any") contains
        `query` (case-insensitive); returns them as a DataFrame like `selection`."""
        if not isinstance(query, str) or not query:
            raise TypeError(f"query must be a non-empty string, got {describe(query)}")
        q = query.lower()
        hit = np.zeros(len(self.points), bool)
        if field in ("any", "token"):
            hit |= np.char.find(np.char.lower(self.points.token.astype(str)), q) >= 0
        if field in ("any", "label") and self.points.label is not None:
            hit |= np.char.find(np.char.lower(self.points.label.astype(str)), q) >= 0
        found = np.nonzero(hit & self._visible_mask())[0]
        self.select(found)
        self.set_highlight(found, [str(t) for t in self.points.token[found]],
                           f"search “{query}”: {plural(len(found), 'hit')}")
        if not hit.any():
            self.selection_info.value = html_status(f"no token or label contains {query!r}", "error")
        return self.selection

    def set_highlight(self, points, labels=None, name: str = "highlighted") -> None:
        """Ring and label drawn points on the map (the overlay trace drawn last): search hits, a point and its
        neighbours; [] clears. labels: one string per point (default: its token)."""
        idx = self._check_points(points)
        if labels is None:
            labels = [str(t) for t in self.points.token[idx]]
        if len(labels) != len(idx):
            raise ValueError(f"labels must have one string per point ({len(idx)}), got {len(labels)}")
        self._highlight = (idx, [str(s) for s in labels], str(name))
        self._draw_highlight()

    @property
    def highlighted(self):
        """The ringed points (search hits, or the opened point and its neighbours) as a DataFrame like
        `selection`, with the label drawn next to each."""
        idx, labels, _ = self._highlight
        df = self._frame(idx).reset_index(drop=True)
        df["mark"] = labels
        return df

    def _draw_highlight(self) -> None:
        """Put the current highlight into the overlay trace (in place)."""
        n = self._n_map
        if len(self.figure.data) <= n:
            return
        idx, labels, name = self._highlight
        new = highlight_trace(self.coords, idx, labels, name, self.points.hover)
        with self.figure.batch_update():
            self.figure.data[n].update(new.to_plotly_json(), overwrite=True)

    def clear(self) -> None:
        """No selection, no search hits and no neighbours marked (the Clear button)."""
        self._highlight = (np.zeros(0, dtype=np.int64), [], "highlighted")
        self.select([])
        self._draw_highlight()
        self.neighbours_info.value = ""
        if self.search_box.value:
            self._syncing = True
            try:
                self.search_box.value = ""
            finally:
                self._syncing = False

    def neighbors(self, point: int, k: int = 10):
        """The k drawn points nearest to `point` by cosine similarity of ȳ, most similar first: a DataFrame
        like `selection` with a `cosine` column."""
        m = len(self.points)
        point = check_index("point", point, m)
        k = check_int("k", k, 1, max(m - 1, 1), hint=" (other drawn points)")
        Y = self.points.ybar.astype(np.float64)
        norms = np.linalg.norm(Y, axis=1)
        cos = Y @ Y[point] / np.maximum(norms * norms[point], 1e-12)
        cos[point] = -np.inf
        idx = np.argpartition(-cos, min(k, m - 1) - 1)[:k]
        idx = idx[np.argsort(-cos[idx], kind="stable")]
        df = self._frame(idx).reset_index(drop=True)
        df["cosine"] = cos[idx]
        return df

    def _show_neighbours(self, point: int) -> None:
        df = self.neighbors(point, min(NEIGHBOURS_SHOWN, len(self.points) - 1))
        rows = "".join(f"<tr><td>{int(r.point)}</td><td>{int(r.sequence)}</td><td>{int(r.position)}</td>"
                       f"<td><code>{html.escape(str(r.token))}</code></td><td>{html.escape(str(r.label))}</td>"
                       f"<td>{r.cosine:.3f}</td></tr>" for r in df.itertuples())
        head = html.escape(str(self.points.token[point]))
        self.neighbours_info.value = (
            f"<div style='font-size:12px'><b>nearest in ȳ (cosine) to point {point}</b> <code>{head}</code> — "
            f"<code>explorer.neighbors({point})</code> gives them as a DataFrame<table style='font-size:12px'>"
            f"<tr><th>point</th><th>seq</th><th>pos</th><th>token</th><th>label</th><th>cos</th></tr>{rows}"
            f"</table></div>")
        return df

    def export(self, path=None) -> str:
        """Write the selection (every drawn point when nothing is selected) as CSV; returns the path
        (default: ybar_selection.csv in the working folder). The Export button calls it.

        A text cell (token, label) that begins with =, +, -, @, a tab or a carriage return gets a leading
        single quote (OWASP's rule against CSV injection): a spreadsheet then shows it as text instead of
        running it as a formula. Numbers are written as they are; `selection` keeps the text unchanged.
        Rows end with CRLF (RFC 4180), so a cell holding a carriage return is quoted and stays one cell
        (with a bare "\\n" ending, a lone "\\r" went out unquoted and started a new row in every reader)."""
        from pathlib import Path
        df = self.selection if self._selected.size else self._frame(np.arange(len(self.points)))
        target = Path("ybar_selection.csv" if path is None else path)
        _csv_safe(df).to_csv(target, index=False, lineterminator="\r\n")
        self._set_status(f"wrote {len(df):,} rows to {target.resolve()}", "ok")
        return str(target)

    # ------------------------------------------------------------------ isolate
    def isolate(self) -> None:
        """Keep only the selected points and project them afresh in the current projection: PCA at once;
        UMAP or t-SNE is fitted on them in the background (the map shows their PCA meanwhile, the status
        line says so, and the fitted one follows). Point indices then refer to the isolated set;
        `show_all()` goes back."""
        if not self._selected.size:
            raise ValueError("isolate needs a selection: select points first (box, lasso, search or select())")
        if len(self._selected) < 2:        # refused before any state changes: a projection needs 2 points
            raise ValueError(f"isolate needs a selection of at least 2 points to project afresh, got 1 point "
                             f"(point {int(self._selected[0])}, what a click selects); select more points "
                             f"(box, lasso, search or select())")
        for thread in list(self._threads.values()):
            thread.join()
        method = self.projection_picker.value              # the projection asked for (the one shown, or fitting)
        with self._lock:
            self._stack.append((self.points, self._coords, self.projectors, self._threads, self._errors))
            self.points = self.points.take(self._selected)
            self._coords, self.projectors, self._threads, self._errors = {}, {}, {}, {}
            self._reset_view(method)

    def show_all(self) -> None:
        """Undo `isolate` (every isolation, back to all drawn points), in the current projection (fitted in
        the background when it was not fitted on every point yet)."""
        if not self._stack:
            return
        method = self.projection_picker.value
        with self._lock:
            self.points, self._coords, self.projectors, self._threads, self._errors = self._stack[0]
            self._stack.clear()
            self._reset_view(method)

    def _reset_view(self, method: str = "pca") -> None:
        """After the point set changed: no selection or marks, the default PCs, and `method` drawn (at once
        when fitted or PCA; else PCA now and `method` fitted in the background, drawn when ready)."""
        self._selected = np.zeros(0, dtype=np.int64)
        self._highlight = (np.zeros(0, dtype=np.int64), [], "highlighted")
        self.neighbours_info.value = ""
        self._pc_ratio, self.components = None, (1, 2)
        self.color_options = self._color_options()
        key = _key(method, self.dims)
        if _key("pca", self.dims) not in self._coords:
            self._fit_now(_key("pca", self.dims))
        shown = method if key in self._coords else "pca"
        self._syncing = True
        try:
            self.projection_picker.value = method          # the picker keeps asking for it
            self.pc_picker.value = (1, 2)
        finally:
            self._syncing = False
        self.projection = shown
        self._redraw()
        self._describe_selection()
        where = f"{'isolated: ' if self._stack else ''}{plural(len(self.points), 'point')}"
        if shown == method:
            self._set_status(f"{where} · {_method_name(key)}", "ok")
        else:
            self._start_fit(key)                           # says "fitting in the background …"; drawn when ready
            self._set_status(f"{where} · showing PCA while {_method_name(key)} is fitted on them in the "
                             f"background…", "busy")

    def figure_static(self, max_points: int | None = None, selection: bool = True):
        """The current view as a plain `go.Figure` (for write_html / reports); max_points: draw a subsample
        (stratified like the map's) of at most that many points; selection: show the selection."""
        if max_points is None or len(self.points) <= max_points:
            return self._figure(self.projection, selection=selection)
        max_points = check_int("max_points", max_points, 2)
        strata = self.points.label.astype(str) if self.points.label is not None else self.points.seq
        rows = A.stratified_subsample(strata, max_points, self.seed)
        return self._figure(self.projection, rows, note=f"static copy: {len(rows):,} of {len(self.points):,} drawn "
                                                        f"points ({self._note()})", selection=selection)

    def static_figures(self) -> list:
        """The map (at most STATIC_MAX_POINTS points) and the linked views that are open. The selection is
        left out: a changed static copy is re-published after the cell, which re-renders the live widget, and
        a selection set since then would be lost from the page."""
        figs = [self.figure_static(STATIC_MAX_POINTS, selection=False)]
        if self._strip is not None:
            figs += [self._strip.figure_for(self._strip.sequence, self._strip.highlight), self._inspector.figure_for()]
        return figs

    def static_text(self) -> str:
        return (f"ȳ explorer: {len(self.points):,} tokens, {_method_name(_key(self.projection, self.dims))}, "
                f"colour by {self.color_by}")

    @property
    def coords(self) -> np.ndarray:
        """(M, 2) coordinates of the drawn points in the current projection ((M, 3) in 3-D)."""
        self._await_full()
        return self._coords[_key(self.projection, self.dims)]

    # ------------------------------------------------------------------ projection
    def _fit_now(self, key: str, target: tuple | None = None) -> np.ndarray:
        """Fit the projection `key` ("pca", "umap3d", ...; see _key) on the drawn points; target: (points,
        coords dict, projectors dict) of the point set it is for (a background fit captures them when it
        starts, so an isolate or show_all meanwhile cannot mix coordinates of two point sets)."""
        method, dims = _split(key)
        points, coords_d, proj_d = target or (self.points, self._coords, self.projectors)
        proj = A.Projector(method, seed=self.seed, dims=dims, **self.projection_params[method])
        coords = proj.fit_transform(points.ybar)
        with self._lock:
            proj_d[key], coords_d[key] = proj, coords
        return coords

    def _start_fit(self, key: str) -> None:
        _import_for_threads(_split(key)[0])        # here, not in the thread (see _import_for_threads)
        with self._lock:
            if key in self._coords or (key in self._threads and self._threads[key].is_alive()):
                return
            self._errors.pop(key, None)
            hint = (" (the first UMAP in a process also compiles numba: ~20–60 s on a small CPU)"
                    if key.startswith("umap") else "")
            self._set_status(f"{_method_name(key)}: fitting in the background on {len(self.points):,} points{hint}…",
                             "busy")
            target = (self.points, self._coords, self.projectors)
            thread = threading.Thread(target=self._fit_job, args=(key, target), daemon=True, name=f"cgt-viz-{key}")
            self._threads[key] = thread
        thread.start()

    def _fit_job(self, key: str, target: tuple | None = None) -> None:
        t0 = time.perf_counter()
        try:
            self._fit_now(key, target)
        except Exception as exc:   # shown in the status line; set_projection(wait=True) re-raises it
            self._errors[key] = exc
            self._set_status(f"{_method_name(key)} failed: {type(exc).__name__}: {exc}", "error")
            return
        if target is not None and target[1] is not self._coords:   # fitted for a point set no longer shown
            return
        self._set_status(f"{_method_name(key)} ready ({time.perf_counter() - t0:.1f} s)"
                         + ("" if self._wanted() == key else " — pick it under Projection"), "ok")
        if self._wanted() == key:
            self._show_projection(*_split(key))

    def _wanted(self) -> str:
        """The projection the pickers ask for, as a key ("umap3d")."""
        method = self.projection_picker.value if hasattr(self, "projection_picker") else self.projection
        return _key(method, self.dims_picker.value if hasattr(self, "dims_picker") else self.dims)

    def _pick_dims(self, dims: int) -> None:
        """Set the 2-D/3-D toggle (`dims` is what the map draws, set when it is drawn)."""
        if hasattr(self, "dims_picker") and self.dims_picker.value != dims:
            self._syncing = True
            try:
                self.dims_picker.value = dims
            finally:
                self._syncing = False

    @checked(method=Choice(*A.PROJECTIONS), wait=Bool(), dims=Int(2, 3, none=True, hint=" (a 2-D or 3-D map)"))
    def set_projection(self, method: str, wait: bool = False, dims: int | None = None) -> None:
        """Show PCA, UMAP or t-SNE coordinates; fits (in the background unless wait=True) when not cached.
        dims: 2 or 3 (a 3-D map: PC 1-3, or UMAP / t-SNE with 3 components); None keeps the current one."""
        dims = self.dims if dims is None else dims
        self._await_full()
        if self.projection_picker.value != method:
            self._syncing = True
            try:
                self.projection_picker.value = method
            finally:
                self._syncing = False
        self._pick_dims(dims)
        key = _key(method, dims)
        if key in self._coords:
            self._show_projection(method, dims)
            return
        if method == "pca":                        # instant: no background thread
            self._fit_now(key)
            self._show_projection(method, dims)
            return
        self._start_fit(key)
        if wait:
            self._threads[key].join()
            if key in self._errors:
                raise self._errors[key]

    def _on_color_picked(self, change) -> None:
        if not self._syncing:
            self.set_color(change["new"])

    def _on_projection_picked(self, change) -> None:
        if not self._syncing:
            self.set_projection(change["new"])

    def _show_projection(self, method: str, dims: int | None = None) -> None:
        """Draw the coordinates of `method` in `dims` (default: the current; 2-D <-> 3-D rebuilds the traces)."""
        dims = self.dims if dims is None else dims
        key = _key(method, dims)
        with self._lock:
            xyz = self._coords[key]
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
                    self.figure.layout.title.text = (f"ȳ of {len(self.points):,} tokens · {_method_name(key)}"
                                                     f"<br><sup>{self._note()}</sup>")
                self.projection = method
                self._draw_highlight()                         # the rings follow their points
                self._clear_outline()                          # a box/lasso drawn in the old coordinates
        if key not in self._threads or not self._threads[key].is_alive():
            self._set_status(f"showing {_method_name(key)}", "ok")

    def _set_status(self, text: str, kind: str = "info") -> None:
        if hasattr(self, "status"):
            self.status.value = html_status(text, kind)

    # ------------------------------------------------------------------ colour
    def set_color(self, by: str) -> None:
        """Colour points by one of `color_options` (topic/label, position, document, excerpt half)."""
        check_choice("color_by", by, self.color_options)   # the name explore() takes
        with self._lock:
            self.color_by = by
            self._redraw()
        if self.color_picker.value != by:
            self._syncing = True
            try:
                self.color_picker.value = by
            finally:
                self._syncing = False

    def _redraw(self) -> None:
        """Rebuild the traces (colouring, point set or legend grouping changed), keeping the selection."""
        replace_figure(self.figure, self._figure(self.projection))
        self._clear_outline()
        self._wire_traces()

    # ------------------------------------------------------------------ selection
    def select(self, points, _from_browser: bool = False) -> None:
        """Select drawn points by index (0..M−1); [] clears. Also what a box/lasso in the browser calls.
        The map shows the selection (other points faint; a box/lasso outline from the browser is removed)."""
        idx = self._check_points(points)
        self._selected = np.unique(idx)
        if self.figure.data and self.figure.data[0].type == "scatter3d":   # no selection in plotly's 3-D scatter
            self._describe_selection()
            return
        per_trace, traces = self._restyle_selection()
        if not _from_browser:
            # one message for both: the page drops a box/lasso outline it would otherwise re-apply over
            # the new selectedpoints (see _clear_outline)
            self._quiet_until = time.monotonic() + _OWN_DESELECT_S
            self.figure._send_update_msg({"selectedpoints": per_trace}, {"selections": []}, trace_indexes=traces)
        self._describe_selection()

    def _restyle_selection(self) -> tuple[list, list[int]]:
        """Set the map traces' selectedpoints to the selection (not the highlight overlay's)."""
        groups = self._groups or [np.arange(len(self.points))]
        per_trace = [np.nonzero(np.isin(rows, self._selected))[0].tolist() if self._selected.size else None
                     for rows in groups]
        traces = list(range(self._n_map))                  # not the highlight overlay
        self.figure.plotly_update(restyle_data={"selectedpoints": per_trace}, trace_indexes=traces)
        return per_trace, traces

    def _check_points(self, points) -> np.ndarray:
        """Indices of drawn points: a list/array of ints in 0..M−1 -> (k,) int64."""
        m = len(self.points)
        want = f"a list of point indices (ints in 0..{m - 1})"
        if isinstance(points, (str, bytes, dict)) or not hasattr(points, "__len__"):
            raise TypeError(f"points must be {want}, got {describe(points)}")
        idx = np.asarray(points).reshape(-1)
        if idx.size == 0:
            return np.zeros(0, dtype=np.int64)
        if not np.issubdtype(idx.dtype, np.integer):
            raise TypeError(f"points must be {want}, got {describe(points)}")
        bad = idx[(idx < 0) | (idx >= m)]
        if bad.size:
            raise ValueError(f"points must be indices in 0..{m - 1}, got {describe(points)} "
                             f"({bad.size} out of range, e.g. {int(bad[0])})")
        return idx.astype(np.int64)

    # ------------------------------------------------------------------ legend
    @property
    def hidden_categories(self) -> list[str]:
        """The categories hidden from the map (a click on their legend entry, or `set_hidden`)."""
        if not self._groups:
            return []
        return [html.unescape(t.name) for t in self.figure.data[:self._n_map] if t.visible in ("legendonly", False)]

    def set_hidden(self, categories) -> None:
        """Hide these categories of the current colouring (and show the others); [] shows all."""
        if isinstance(categories, str) or not hasattr(categories, "__iter__"):
            raise TypeError(f"categories must be a list of category names, got {describe(categories)}")
        if not self._groups:
            raise ValueError(f"categories can only be hidden in a colouring with a legend (one trace per "
                             f"category); colour by {self.color_by!r} has none, got {list(categories)}")
        names = [html.unescape(t.name) for t in self.figure.data[:self._n_map]]   # escaped user strings
        unknown = [c for c in categories if str(c) not in names]
        if unknown:
            raise ValueError(f"categories must be names of the colouring {self.color_by!r} ({names}), got {unknown}")
        hide = {str(c) for c in categories}
        with self.figure.batch_update():
            for t in self.figure.data[:self._n_map]:
                t.visible = "legendonly" if html.unescape(t.name) in hide else True

    def _visible_mask(self) -> np.ndarray:
        """(M,) bool: the drawn points whose category is not hidden."""
        mask = np.ones(len(self.points), bool)
        for t, rows in zip(self.figure.data, self._groups):
            if t.visible in ("legendonly", False):
                mask[rows] = False
        return mask

    def select_box(self, x: tuple[float, float], y: tuple[float, float]) -> None:
        """Select the visible drawn points inside a rectangle of the current projection; x, y: (lo, hi)."""
        (x0, x1), (y0, y1) = _check_pair("x", x), _check_pair("y", y)
        self._need_2d("select_box")
        xy = self.coords
        inside = (xy[:, 0] >= x0) & (xy[:, 0] <= x1) & (xy[:, 1] >= y0) & (xy[:, 1] <= y1)
        self.select(np.nonzero(inside & self._visible_mask())[0])

    def select_lasso(self, xs, ys) -> None:
        """Select the drawn points inside a polygon (vertices xs, ys) of the current projection."""
        xs, ys = check_array("xs", xs, 1), check_array("ys", ys, 1)
        if len(xs) < 3 or xs.shape != ys.shape:
            raise ValueError(f"xs and ys must be two equal-length lists of >= 3 vertices, got shapes {xs.shape} "
                             f"and {ys.shape}")
        self._need_2d("select_lasso")
        px, py = self.coords[:, 0][:, None], self.coords[:, 1][:, None]
        x0, y0, x1, y1 = xs, ys, np.roll(xs, -1), np.roll(ys, -1)
        crosses = ((y0 > py) != (y1 > py)) & (px < (x1 - x0) * (py - y0) / np.where(y1 == y0, 1e-12, y1 - y0) + x0)
        self.select(np.nonzero((crosses.sum(1) % 2 == 1) & self._visible_mask())[0])

    def _need_2d(self, what: str) -> None:
        if self.dims != 2:
            raise ValueError(f"{what} works on a 2-D map, got dims={self.dims}: call set_projection(..., dims=2) "
                             f"first, or select points with select() or search()")

    def _frame(self, rows: np.ndarray):
        """points.frame of `rows` with their coordinates: x, y (and z in 3-D)."""
        coords = self.coords
        df = self.points.frame(rows, coords)
        if coords.shape[1] == 3:
            df["z"] = coords[np.asarray(rows, dtype=np.int64), 2]
        return df

    @property
    def selection(self):
        """The selected points as a pandas DataFrame: point, sequence, position, token, token_id, label, x, y
        (and z in 3-D)."""
        df = self._frame(self._selected)
        return df.reset_index(drop=True)

    def _on_plotly_selection(self, i: int, last: int, points, selector=None) -> None:
        # plotly calls every trace's callback once per selection event, in trace order
        if i == 0:
            self._buffer = []
        self._buffer.append(self._to_points(i, points.point_inds))
        if i == last:
            chosen = np.concatenate(self._buffer) if self._buffer else np.zeros(0, np.int64)
            if not len(chosen) and self._selected.size and time.monotonic() < getattr(self, "_quiet_until", 0.0):
                # plotly.js answers a selection sent from Python (selectedpoints, no outline) with an empty
                # plotly_selected; after a click that event names traces (the clicked point's), and plotly.py
                # then sets their selectedpoints to () before calling us: not the user's, so the selection is
                # put back (a restyle: no new event). An empty box in the next seconds is ignored the same way.
                self._restyle_selection()
                return
            self.select(chosen, _from_browser=True)
            if len(chosen) == 1:
                # a click (clickmode "event+select") selects its point and then sends plotly_click in the
                # same instant; the frontend may pass on only the first of the two messages (after a box
                # or lasso it always did): so a one-point selection opens the point itself (a selector
                # may still be attached: plotly repeats the last lasso's outline in the event)
                self._opened_by_select = int(chosen[0])
                self.open_point(int(chosen[0]))

    def _describe_selection(self) -> None:
        n = len(self._selected)
        if n == 0:
            self.selection_info.value = html_status("No selection. Drag a box or lasso; click a point to open it.")
            return
        text = (f"{plural(n, 'point')} selected from "
                f"{plural(len(np.unique(self.points.seq[self._selected])), 'sequence')}")
        if self.points.label is not None:
            labs, counts = np.unique(self.points.label[self._selected].astype(str), return_counts=True)
            top = ", ".join(f"{lab}: {c}" for lab, c in sorted(zip(labs, counts), key=lambda p: -p[1])[:6])
            text += f" ({top})"
        self.selection_info.value = html_status(text, markup=" — <code>explorer.selection</code> has them as a DataFrame")

    # ------------------------------------------------------------------ linked views
    def _on_plotly_click(self, i: int, points) -> None:
        if points.point_inds:
            point = int(self._to_points(i, points.point_inds[:1])[0])
            if getattr(self, "_opened_by_select", None) == point:    # opened by its click-selection already
                self._opened_by_select = None
                return
            self.open_point(point)

    def open_point(self, point: int) -> None:
        """Open the linked views for the sequence of drawn point `point`, its token highlighted, and list
        its nearest neighbours in ȳ under the map."""
        point = check_index("point", point, len(self.points))
        if len(self.points) > 1:
            df = self._show_neighbours(point)
            self.set_highlight([point] + df["point"].tolist(),
                               [f"▶ {self.points.token[point]}"] + [f"{i + 1}. {t}" for i, t in enumerate(df["token"])],
                               f"point {point} and its {plural(len(df), 'nearest neighbour')} in ȳ")
        self.open_sequence(int(self.points.seq[point]), int(self.points.pos[point]))

    def open_sequence(self, sequence: int, position: int | None = None) -> None:
        """Show the smoothness strip and the template inspector of one sequence below the map."""
        sequence = check_index("sequence", sequence, self.seqs.n)
        position = check_int("position", position, 0, int(self.seqs.lengths[sequence]) - 1, allow_none=True,
                             hint=f" (a token of sequence {sequence})")
        if not self._linked_enabled:
            return
        from .smoothness import SmoothnessStrip
        from .templates import TemplateInspector
        if self._strip is None:
            # both views are built before either is kept: a failure leaves the explorer as it was
            strip = SmoothnessStrip(self.model, self.seqs, ybar=self.ybar_full, sequence=sequence, highlight=position)
            inspector = TemplateInspector(self.model, self.seqs, ybar=self.ybar_full, sequence=sequence, token=position)
            self._strip, self._inspector = strip, inspector
            self.linked.children = [strip, inspector]
        else:
            self._strip.show(sequence, position)
            self._inspector.show(sequence=sequence, token=position)

    @property
    def strip(self):
        """The linked smoothness strip (None until a point is opened)."""
        return self._strip

    @property
    def inspector(self):
        """The linked template inspector (None until a point is opened)."""
        return self._inspector

    # ------------------------------------------------------------------ new points
    def add(self, data, labels=None, boundary=None) -> int:
        """Add sequences; their tokens are placed with the cached reducers' `transform` (no refit).
        Returns the number of points added."""
        if self._stack:
            raise ValueError("add needs every point shown: call show_all() first (the explorer is isolated)")
        new = A.prepare_sequences(self.model, data, labels, boundary)
        for thread in list(self._threads.values()):   # a fit in flight must finish before the point set grows
            thread.join()
        offset = self.seqs.n
        ybar_new = A.collect_ybar(self.model, new.inputs)
        seq, pos = A.select_positions(new.lengths, self.positions, new.boundary)
        pts = A.points_at(new, ybar_new, seq, pos, seq_offset=offset)
        with self._lock:
            for method, proj in self.projectors.items():
                self._coords[method] = np.concatenate([self._coords[method], proj.transform(pts.ybar)])
            for method in [m for m in self._coords if m not in self.projectors]:
                del self._coords[method]
            self.seqs = A.concat_sequences(self.seqs, new)
            t = max(self.ybar_full.shape[1], ybar_new.shape[1])
            pad = lambda y: np.pad(y, ((0, 0), (0, t - y.shape[1]), (0, 0)))
            self.ybar_full = np.concatenate([pad(self.ybar_full), pad(ybar_new)])
            self.points = A.Points.concat(self.points, pts)
            self.n_total += len(pts)
            self.color_options = self._color_options()
            if self.color_by not in self.color_options:
                self.color_by = "position"
            self._syncing = True
            try:
                self.color_picker.options = list(self.color_options)
                self.color_picker.value = self.color_by
            finally:
                self._syncing = False
            self._selected = np.zeros(0, dtype=np.int64)
            self._highlight = (np.zeros(0, dtype=np.int64), [], "highlighted")
            self._redraw()
        if self._strip is not None:
            self._strip.seqs, self._strip.ybar = self.seqs, self.ybar_full
            self._inspector.set_data(self.seqs, self.ybar_full)
        if getattr(self, "_pc_ratio", None) is not None:          # chosen components: recomputed on every point
            self.set_components(*self.components)
        return len(pts)
