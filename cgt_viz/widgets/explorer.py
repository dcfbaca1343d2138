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
import time
from typing import Any

import ipywidgets as W
import numpy as np

from .. import analysis as A
from .._checks import Bool, Choice, Height, Instance, Int, check_choice, check_index, check_int, checked
from ..contracts import Model, check_inputs
from ..sequences import prepare_sequences_unchecked
from ..figures import map_groups, plural, ybar_map_figure
from ._base import Controls, check_view_ybar, figure_widget, html_status, replace_figure
from ._collect import Collection, WaitsForEveryPoint, first_ybar, preview_rows, rest_of_ybar
from ._projections import (MAX_PCS, METHOD_NAMES, PointSet, Projecting, ProjectionParams, import_for_threads,
                           key_of, method_name)
from ._selection import MapSelection, unmarked
from ._static import STATIC_MAX_POINTS, StaticForm

TOKEN_COLOURS = 12   # colour by token: the most frequent tokens get a colour each, the rest are "other"

# the explorer's own options, declared for explore() and Explorer()
_VIEW_ARGS = dict(model=Model(), projection=Choice(*A.PROJECTIONS), background=Choice(*A.PROJECTIONS, none=True),
                  projection_params=ProjectionParams(),
                  max_points=Int(2, hint=" (points drawn)"), linked=Bool(), height=Height(),
                  dims=Int(2, 3, hint=" (a 2-D or 3-D map)"))


def _top_tokens(tokens: np.ndarray, k: int) -> np.ndarray:
    """Each token's own string if it is among the k most frequent, else "other"."""
    keys = tokens.astype(str)
    names, which, counts = np.unique(keys, return_inverse=True, return_counts=True)
    top = set(np.argsort(-counts, kind="stable")[:k].tolist())
    shown = np.array([repr(str(t)) if j in top else "other" for j, t in enumerate(names.tolist())], dtype=object)
    return shown[which.reshape(-1)]


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

    The model and every argument are checked here, once (the declarations above; `data` in
    `prepare_sequences`' private pass, its token ids once on the host); nothing below checks them again.
    """
    seqs = prepare_sequences_unchecked(model, data, labels, boundary, n_batches, batch_size, seed, "val")
    return Explorer._open(model, seqs, None, positions=positions, projection=projection, background=background,
                          color_by=color_by, max_points=max_points, seed=seed, linked=linked,
                          projection_params=projection_params, height=height, dims=dims)


class Explorer(MapSelection, Projecting, Controls, StaticForm, W.VBox):
    """ipywidgets layout around a FigureWidget of ȳ points; see `explore` for the arguments.

    Collecting ȳ of more than 2 × `preview_tokens` tokens (benchmarks/bench_explorer.py times the collection)
    first paints a preview: the PCA of about `preview_tokens` tokens from sequences stratified
    by label, while a background thread collects the rest and then draws every point. Python never sees
    the preview: every method and attribute waits for the full set (`wait()` does only that).
    `Explorer.preview_tokens = None` turns the preview off.

    Its rooms: ȳ collected in the background (`_collect`), the point sets and their projections
    (`_projections.PointSet`, `Projecting`), selection and marks (`_selection.MapSelection`), the tables
    (`_tables`); the maths in `cgt_viz.geometry`. This class builds the view and holds what ties them."""

    preview_tokens: int | None = 16_384
    static_slots = 3          # the map, the linked strip and inspector once a point is opened

    @checked(**_VIEW_ARGS, sequences=Instance(A.Sequences, "an analysis.Sequences (use cgt_viz.explore for raw data)"))
    def __init__(self, model, sequences: A.Sequences, ybar: np.ndarray | None = None, *, positions: Any = "all",
                 projection: str = "pca", background: str | None = "umap", color_by: str | None = None,
                 max_points: int = 100_000, seed: int = 0, linked: bool = True,
                 projection_params: dict | None = None, height: int = 520, dims: int = 2):
        check_inputs(model.config, sequences.inputs, "sequences.inputs")   # built for this model?
        self._build(model, sequences, ybar, positions=positions, projection=projection, background=background,
                    color_by=color_by, max_points=max_points, seed=seed, linked=linked,
                    projection_params=projection_params, height=height, dims=dims)

    @classmethod
    def _open(cls, model, sequences: A.Sequences, ybar, **view) -> "Explorer":
        """An explorer of arguments its caller checked (`explore`): built without checking them again."""
        self = cls.__new__(cls)
        self._build(model, sequences, ybar, **view)
        return self

    def _build(self, model, sequences, ybar, *, positions, projection, background, color_by, max_points, seed,
               linked, projection_params, height, dims) -> None:
        params = projection_params
        seq, pos = A.select_positions(sequences.lengths, positions, sequences.boundary)
        if len(seq) < 2:
            raise ValueError(f"data with positions={positions!r} gives {len(seq)} token; the explorer needs at "
                             f"least 2 points (pass more or longer sequences)")
        self._init_state(model, sequences, positions, params, seed, max_points, linked, height, dims)
        # ȳ: given, collected now, or (a big data set) a preview of some rows now and the rest in the background
        self._preview_rows = None if ybar is not None else preview_rows(sequences, seq, self.preview_tokens, seed)
        self._ybar_full = (check_view_ybar(ybar, sequences, model) if ybar is not None
                           else first_ybar(model, sequences, self._preview_rows))
        self._take_points(seq, pos, self._preview_rows)
        self.color_options = self._color_options()
        if color_by is None:
            color_by = self.label_name if self.label_name in self.color_options else "position"
        self.color_by = check_choice("color_by", color_by, self.color_options)
        self._build_controls()
        t0 = time.perf_counter()
        self._set.fit(key_of("pca", dims))      # the first paint is always PCA: instant; others follow when fitted
        self.figure = figure_widget(self._figure("pca"))
        self._wire_traces()
        self._set_status(f"{method_name(key_of('pca', dims))} of {len(self._set.points):,} points in "
                         f"{time.perf_counter() - t0:.2f} s", "ok")
        # the status has a line of its own and the control rows wrap whole controls: in a notebook narrower
        # than the controls (JupyterLab with its side panel open) the status was squeezed into a column of words
        rows = W.Layout(flex_flow="row wrap", align_items="center")
        super().__init__([W.HBox([self.projection_picker, self.dims_picker, self.pc_picker, self.color_picker],
                                 layout=rows),
                          W.HBox([self.search_box, self.clear_button, self.isolate_button, self.all_button,
                                  self.export_button], layout=W.Layout(flex_flow="row wrap", align_items="center")),
                          self.status, self.figure, self.selection_info, self.neighbours_info, self.linked])
        self._start_background(projection, background)

    def _init_state(self, model, sequences, positions, params, seed, max_points, linked, height, dims) -> None:
        """Every attribute the methods read, set before any of them runs (a fit or collection thread too)."""
        self.model, self.seqs, self.seed, self.positions, self.dims = model, sequences, seed, positions, dims
        self.projection_params, self.projection = params, "pca"
        self.max_points, self._linked_enabled, self.height = int(max_points), bool(linked), int(height)
        self.label_name = sequences.label_name
        self._strata_name = "label" if sequences.token_labels is not None else "sequence"
        self._collection = Collection()
        self._lock = self._collection.lock
        self._stack: list[PointSet] = []         # the point sets isolate left; show_all goes back to the first
        self._init_selection()
        self._strip = self._inspector = None
        self._pc_ratio, self.components = None, (1, 2)   # set_components' shares of variance (None: PC 1 & 2)
        self._groups: list[np.ndarray] = []      # the drawn points of each map trace ([]: one trace, every point)

    def _build_controls(self) -> None:
        """The pickers, buttons and text lines around the map, each wired to the method it calls."""
        self.projection_picker = W.Dropdown(options=[(METHOD_NAMES[m], m) for m in A.PROJECTIONS], value="pca",
                                            description="Projection", layout=W.Layout(width="220px"))
        self.on_user(self.projection_picker, self.set_projection)
        self.dims_picker = W.ToggleButtons(options=[("2-D", 2), ("3-D", 3)], value=self.dims,
                                           tooltips=["a 2-D map (box and lasso select)", "a 3-D map (drag to turn)"],
                                           style={"button_width": "44px"}, layout=W.Layout(width="auto"))
        self.on_user(self.dims_picker,
                     lambda dims: self._ui(lambda: self.set_projection(self.projection_picker.value, dims=dims)))
        self.color_picker = W.Dropdown(options=list(self.color_options), value=self.color_by, description="Colour by",
                                       layout=W.Layout(width="240px"))
        self.on_user(self.color_picker, self.set_color)
        n_pc = min(MAX_PCS, self._set.points.ybar.shape[1])
        pairs = [(a, b) for a in range(1, n_pc + 1) for b in range(a + 1, n_pc + 1)]
        self.pc_picker = W.Dropdown(options=[(f"PC {a} & {b}", (a, b)) for a, b in pairs] or [("PC 1 & 2", (1, 2))],
                                    value=(1, 2), description="PCs", layout=W.Layout(width="170px"))
        self.on_user(self.pc_picker, lambda pair: self.set_components(*pair))
        self.search_box = W.Text(placeholder="search a token or label", continuous_update=False,
                                 layout=W.Layout(width="220px"))
        self.on_user(self.search_box, lambda query: self.search(query) if query else self.clear())
        self.isolate_button = self._button("Isolate selection", "re-project only the selected points", 140, self.isolate)
        self.all_button = self._button("Show all", "back to every point", 90, self.show_all)
        self.export_button = self._button("Export CSV", "the selection (or every point) as a CSV file", 100, self.export)
        self.clear_button = self._button("Clear", "no selection, no search hits, no neighbours marked", 70, self.clear)
        self.status = W.HTML("")
        self.selection_info = W.HTML(html_status("Drag a box or lasso to select points; click a point to open "
                                                 "its sequence below."))
        self.neighbours_info = W.HTML("")
        self.linked = W.VBox([])

    def _button(self, text: str, tip: str, width: int, action) -> W.Button:
        button = W.Button(description=text, tooltip=tip, layout=W.Layout(width=f"{width}px"))
        button.on_click(lambda _b: self._ui(action))
        return button

    def _start_background(self, projection: str, background: str | None) -> None:
        """The rest of ȳ (after a preview), the first projection asked for, the background fit."""
        if self._preview_rows is not None:
            import_for_threads(background)      # the collector starts the background fit itself
            self._collection.start(lambda: self._collect_rest(background))
        if projection != "pca":
            self.set_projection(projection)
        if self._preview_rows is None and background not in (None, "pca") \
                and key_of(background, self.dims) not in self._set.threads:
            self._start_fit(key_of(background, self.dims))

    # ------------------------------------------------------------------ preview while ȳ is collected
    def _take_points(self, seq: np.ndarray, pos: np.ndarray, rows: np.ndarray | None = None) -> None:
        """The drawn points among the tokens (seq, pos) (of the sequences `rows` only, for a preview): all, or
        a stratified subsample of max_points; a new point set, nothing fitted."""
        if rows is not None:
            keep = np.isin(seq, rows)
            seq, pos = seq[keep], pos[keep]
        labelled = self.seqs.token_labels is not None
        strata = self.seqs.token_labels[seq, pos].astype(str) if labelled else seq
        shown = A.stratified_subsample(strata, self.max_points, self.seed)   # before hover text is built for them
        self._n_total = len(seq)
        points = A.points_at(self.seqs, self._ybar_full, seq[shown], pos[shown])
        self._set = PointSet(points, self.projection_params, self.seed, self._lock)

    def _collect_rest(self, background: str | None) -> None:
        """Background thread: ȳ of the rows the preview left out, then every point drawn (PCA afresh)."""
        t0 = time.perf_counter()
        try:
            rest, part = rest_of_ybar(self.model, self.seqs, self._preview_rows)
            with self._lock:
                self._ybar_full[rest] = part
                seq, pos = A.select_positions(self.seqs.lengths, self.positions, self.seqs.boundary)
                self._take_points(seq, pos)
                self._preview_rows = None
                self._selected, self._highlight = np.zeros(0, dtype=np.int64), unmarked()
                self.color_options = self._color_options()
                self._set.fit(key_of("pca", self.dims))
                self.projection = "pca"
                self._redraw()
                self._describe_selection()
        except Exception as exc:   # shown in the status line; `wait()` re-raises it
            self._set_status(f"collecting ȳ failed: {type(exc).__name__}: {exc}", "error")
            raise
        self._set_status(f"ȳ of every token collected and {method_name(key_of('pca', self.dims))} of "
                         f"{len(self._set.points):,} points in {time.perf_counter() - t0:.1f} s", "ok")
        if background not in (None, "pca"):
            self._start_fit(key_of(background, self.dims))

    def wait(self) -> "Explorer":
        """Wait until ȳ of every token is collected (a big data set first paints a preview of some of its
        sequences and collects the rest in the background; any other method waits for it too)."""
        self._collection.wait()
        return self

    @property
    def collecting(self) -> bool:
        """True while the map shows a preview and ȳ of the other sequences is still being collected."""
        return self._collection.running

    ybar_full = WaitsForEveryPoint("ȳ of every token of `seqs`: (n, t, d_y).")
    n_total = WaitsForEveryPoint("How many tokens the positions select (the drawn points are at most max_points of them).")

    @property
    def points(self) -> A.Points:
        """The drawn points (ȳ, sequence, position, token, hover text, label)."""
        self._collection.wait()
        return self._set.points

    @property
    def projectors(self) -> dict:
        """The fitted reducers by method (they place points that `add` brings)."""
        self._collection.wait()
        return self._set.projectors

    # the current point set as it is now, without waiting for a collection (what the display draws)
    _points = property(lambda self: self._set.points)
    _coords = property(lambda self: self._set.coords)
    _threads = property(lambda self: self._set.threads)

    def _ipython_display_(self) -> None:
        # the display shows what the map shows now (a preview while ȳ is collected), without waiting; the
        # static copy follows after the cell (refresh_static waits for every point)
        with self._collection.peek():
            super()._ipython_display_()

    # ------------------------------------------------------------------ the map's figure
    def _color_options(self) -> dict[str, tuple[np.ndarray, str]]:
        pts, opts = self._set.points, {}
        if pts.label is not None:
            opts[self.label_name] = (pts.label.astype(str), "categorical")
        opts["position"] = (pts.pos, "continuous")
        opts["document"] = (pts.seq, "categorical")
        opts["excerpt half"] = (np.where(pts.half == 0, "first", "second"), "categorical")
        opts["token"] = (_top_tokens(pts.token, TOKEN_COLOURS), "categorical")
        return opts

    def _note(self) -> str:
        m = len(self._set.points)
        if self._preview_rows is not None:
            return (f"preview: ȳ of {len(self._preview_rows):,} of {self.seqs.n:,} sequences ({m:,} tokens); "
                    f"collecting the rest in the background…")
        if self._stack:
            return f"isolated selection: {m:,} of {len(self._stack[0].points):,} drawn tokens, projected afresh"
        if m < self.n_total:
            by = self.label_name if self._strata_name == "label" else "document"
            return (f"showing {m:,} of {self.n_total:,} tokens, a subsample stratified by {html.escape(str(by), quote=False)} "
                    f"(max_points={self.max_points:,})")
        return f"{m:,} tokens from {len(np.unique(self._set.points.seq)):,} sequences"

    def _figure(self, method: str, rows: np.ndarray | None = None, note: str | None = None, selection: bool = True):
        """The map in projection `method` (rows: a subset of the drawn points, for the static copy)."""
        values, kind = self.color_options[self.color_by]
        points = self._set.points
        coords, hover = self._set.coords[key_of(method, self.dims)], points.hover
        selected = self._selected if selection else np.zeros(0, np.int64)
        marked, labels, name = self._highlight
        if rows is not None:
            pos = np.full(len(points), -1)
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
                               title=f"ȳ of {len(points):,} tokens · {method_name(key_of(method, self.dims))}")

    def _ui(self, action) -> None:
        """Run a control's action; a refusal (e.g. isolate with nothing selected) goes to the status line."""
        try:
            action()
        except (ValueError, TypeError) as err:
            self._set_status(str(err), "error")          # html_status escapes it

    def _set_status(self, text: str, kind: str = "info") -> None:
        self.status.value = html_status(text, kind)

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
        self._set.join()
        method = self.projection_picker.value              # the projection asked for (the one shown, or fitting)
        with self._lock:
            self._stack.append(self._set)
            self._set = self._set.take(self._selected)
            self._reset_view(method)

    def show_all(self) -> None:
        """Undo `isolate` (every isolation, back to all drawn points), in the current projection (fitted in
        the background when it was not fitted on every point yet)."""
        if not self._stack:
            return
        method = self.projection_picker.value
        with self._lock:
            self._set = self._stack[0]
            self._stack.clear()
            self._reset_view(method)

    def _reset_view(self, method: str = "pca") -> None:
        """After the point set changed: no selection or marks, the default PCs, and `method` drawn (at once
        when fitted or PCA; else PCA now and `method` fitted in the background, drawn when ready)."""
        self._selected, self._highlight = np.zeros(0, dtype=np.int64), unmarked()
        self.neighbours_info.value = ""
        self._pc_ratio, self.components = None, (1, 2)
        self.color_options = self._color_options()
        key = key_of(method, self.dims)
        if key_of("pca", self.dims) not in self._set.coords:
            self._set.fit(key_of("pca", self.dims))
        shown = method if key in self._set.coords else "pca"
        with self.quietly():
            self.projection_picker.value = method          # the picker keeps asking for it
            self.pc_picker.value = (1, 2)
        self.projection = shown
        self._redraw()
        self._describe_selection()
        where = f"{'isolated: ' if self._stack else ''}{plural(len(self._set.points), 'point')}"
        if shown == method:
            self._set_status(f"{where} · {method_name(key)}", "ok")
        else:
            self._start_fit(key)                           # says "fitting in the background …"; drawn when ready
            self._set_status(f"{where} · showing PCA while {method_name(key)} is fitted on them in the "
                             f"background…", "busy")

    # ------------------------------------------------------------------ static copy
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

    def static_figures(self, selection: bool = False) -> list:
        """The map (at most STATIC_MAX_POINTS points) and the linked views that are open. The selection is
        left out unless asked for: a changed static copy is re-published after the cell, which re-renders the
        live widget, and a selection set since then would be lost from the page."""
        figs = [self.figure_static(STATIC_MAX_POINTS, selection=selection)]
        if self._strip is not None:
            figs += [self._strip.figure_for(self._strip.sequence, self._strip.highlight), self._inspector.figure_for()]
        return figs

    def snapshot_figures(self) -> list:
        """A one-off copy (`show_static`, `static_html`) fades the unselected points, as the live map does."""
        return self.static_figures(selection=True)

    def static_text(self) -> str:
        return (f"ȳ explorer: {len(self.points):,} tokens, {method_name(key_of(self.projection, self.dims))}, "
                f"colour by {self.color_by}")

    # ------------------------------------------------------------------ colour
    def set_color(self, by: str) -> None:
        """Colour points by one of `color_options` (topic/label, position, document, excerpt half)."""
        check_choice("color_by", by, self.color_options)   # the name explore() takes
        with self._lock:
            self.color_by = by
            self._redraw()
        if self.color_picker.value != by:
            with self.quietly():
                self.color_picker.value = by

    def _redraw(self) -> None:
        """Rebuild the traces (colouring, point set or legend grouping changed), keeping the selection."""
        replace_figure(self.figure, self._figure(self.projection))
        # replace_figure updates traces in place, which keeps a property the new trace leaves unset: the
        # old selectedpoints stayed after isolate / show_all (faded points under "No selection")
        if self.figure.data and self.figure.data[0].type != "scatter3d":    # (plotly's 3-D scatter: no selection)
            self._restyle_selection()
        self._clear_outline()
        self._wire_traces()

    # ------------------------------------------------------------------ linked views
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
        new = prepare_sequences_unchecked(self.model, data, labels, boundary, 4, 32, 0, "val")   # the model: checked at open
        self._collection.wait()
        self._set.join()                   # a fit in flight must finish before the point set grows
        ybar_new = A._collect_ybar(self.model, new.inputs, 64)
        seq, pos = A.select_positions(new.lengths, self.positions, new.boundary)
        pts = A.points_at(new, ybar_new, seq, pos, seq_offset=self.seqs.n)
        with self._lock:
            self._set.extend(pts)
            self.seqs = A.concat_sequences(self.seqs, new)
            t = max(self.ybar_full.shape[1], ybar_new.shape[1])
            pad = lambda y: np.pad(y, ((0, 0), (0, t - y.shape[1]), (0, 0)))   # noqa: E731
            self.ybar_full = np.concatenate([pad(self.ybar_full), pad(ybar_new)])
            self.n_total += len(pts)
            self.color_options = self._color_options()
            if self.color_by not in self.color_options:
                self.color_by = "position"
            with self.quietly():
                self.color_picker.options = list(self.color_options)
                self.color_picker.value = self.color_by
            self._selected, self._highlight = np.zeros(0, dtype=np.int64), unmarked()
            self._redraw()
        if self._strip is not None:
            self._strip._set_data(self.seqs, self.ybar_full)            # the explorer's own, checked sequences
            self._inspector._set_data(self.seqs, self.ybar_full)
        if self._pc_ratio is not None:          # chosen components: recomputed on every point
            self.set_components(*self.components)
        return len(pts)
