"""The explorer's selection and marks: which drawn points are selected (box, lasso, search, `select`, or the
browser's own box/lasso and clicks), which categories the legend hides, which points are ringed (search
hits, a point and its nearest neighbours), and the selection as a DataFrame or a CSV file.

`MapSelection` is a mixin of `Explorer` (cgt_viz.widgets.explorer), which provides what it reads:
`figure` and `_groups` (the drawn points of each map trace), `points` and `coords` (waiting for every
point), `_set` (the current point set), `dims`, `color_by`, the text lines `selection_info`,
`neighbours_info`, `status` and the `search_box`, `open_point`, `quietly` and `_set_status`.
"""
from __future__ import annotations

import html
import time

import numpy as np

from .._checks import Choice, Pair, check_array, check_index, check_indices, check_int, checked, describe, refuse
from ..figures import highlight_trace, plural
from ..geometry import cosine_neighbours, in_box, in_polygon
from ._base import html_status
from ._tables import csv_safe, neighbours_html, selection_text

NEIGHBOURS_SHOWN = 8  # neighbours listed under the map after a click
# how long after we remove a box/lasso outline its answering deselect may still arrive (a loaded machine is slow)
_OWN_DESELECT_S = 10.0


def unmarked() -> tuple[np.ndarray, list, str]:
    """No highlight: (points, labels, trace name)."""
    return np.zeros(0, dtype=np.int64), [], "highlighted"


class MapSelection:
    """Selecting, hiding and marking drawn points; the browser's selection and click events (see the module
    docstring for what the explorer provides)."""

    def _init_selection(self) -> None:
        """Nothing selected or marked; called by the explorer before anything is drawn."""
        self._selected = np.zeros(0, dtype=np.int64)
        self._highlight = unmarked()             # (points, labels, trace name) ringed by the overlay
        self._buffer: list[np.ndarray] = []      # one selection event's points, trace by trace
        self._quiet_until = 0.0                  # until then an empty selection event answers our own
        self._opened_by_select: int | None = None

    # ------------------------------------------------------------------ the browser's events
    def _wire_traces(self) -> None:
        """(Re)attach the selection, click and deselect callbacks to every trace (after the traces change)."""
        self._buffer = []
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

    def _on_plotly_click(self, i: int, points) -> None:
        if points.point_inds:
            point = int(self._to_points(i, points.point_inds[:1])[0])
            if self._opened_by_select == point:    # opened by its click-selection already
                self._opened_by_select = None
                return
            self.open_point(point)

    def _clear_outline(self) -> None:
        """Remove a box/lasso outline drawn in the browser. plotly.js keeps it in layout.selections and
        re-applies it on every redraw (overriding selectedpoints set from Python), and the Python side of
        the figure does not know it is there, so the relayout is sent as is."""
        self._quiet_until = time.monotonic() + _OWN_DESELECT_S   # the deselect plotly answers with is ours
        with self.figure.batch_update():
            self.figure.layout.selections = ()
        self._forget_outline()
        self.figure._send_relayout_msg({"selections": []})

    def _forget_outline(self) -> None:
        """Drop the outline the page reported (its relayout) from the figure's layout. plotly.py keeps that
        report apart from `layout.selections` (empty already, so setting it changes nothing), and the
        widget state a reloaded page draws from still held it: a stale outline over the new map, and
        after a switch to 3-D a 2-D plot area behind the scene."""
        self.figure._layout_obj._props.pop("selections", None)

    def _on_plotly_deselect(self) -> None:
        # one deselect answers our own outline removal: ignore it (once), however late a busy machine delivers it
        if time.monotonic() < self._quiet_until:
            self._quiet_until = 0.0
            return
        self.select([])

    def _to_points(self, trace: int, local) -> np.ndarray:
        """Indices within trace `trace` -> indices of drawn points (0..M−1)."""
        local = np.asarray(local, dtype=np.int64)
        return self._groups[trace][local] if self._groups else local

    # ------------------------------------------------------------------ search, neighbours, export
    @checked(field=Choice("any", "token", "label"))
    def search(self, query: str, field: str = "any"):
        """Select the drawn points whose token (field="token"), label ("label"), or either ("any") contains
        `query` (case-insensitive); returns them as a DataFrame like `selection`."""
        if not isinstance(query, str) or not query:
            raise refuse("query", "a non-empty string", describe(query), TypeError)
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
        if len(labels) != len(idx):   # a cross-argument check: one label per point given
            raise refuse("labels", f"one string per point ({len(idx)})", str(len(labels)), verb="have")
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
        self._highlight = unmarked()
        self.select([])
        self._draw_highlight()
        self.neighbours_info.value = ""
        if self.search_box.value:
            with self.quietly():
                self.search_box.value = ""

    def neighbors(self, point: int, k: int = 10):
        """The k drawn points nearest to `point` by cosine similarity of ȳ, most similar first: a DataFrame
        like `selection` with a `cosine` column."""
        m = len(self.points)
        point = check_index("point", point, m)
        k = check_int("k", k, 1, max(m - 1, 1), hint=" (other drawn points)")
        idx, cos = cosine_neighbours(self.points.ybar, point, k)
        df = self._frame(idx).reset_index(drop=True)
        df["cosine"] = cos
        return df

    def _show_neighbours(self, point: int):
        df = self.neighbors(point, min(NEIGHBOURS_SHOWN, len(self.points) - 1))
        hover = self.points.hover
        contexts = [str(hover[int(i)]).split("<br>")[1] if "<br>" in str(hover[int(i)]) else ""
                    for i in df["point"].tolist()]
        self.neighbours_info.value = neighbours_html(df, point, self.points.token[point], contexts)
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
        csv_safe(df).to_csv(target, index=False, lineterminator="\r\n")
        self._set_status(f"wrote {len(df):,} rows to {target.resolve()}", "ok")
        return str(target)

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
            self._forget_outline()
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
        return check_indices("points", points, len(self.points), flatten=True)

    @property
    def hidden_categories(self) -> list[str]:
        """The categories hidden from the map (a click on their legend entry, or `set_hidden`)."""
        if not self._groups:
            return []
        return [html.unescape(t.name) for t in self.figure.data[:self._n_map] if t.visible in ("legendonly", False)]

    def set_hidden(self, categories) -> None:
        """Hide these categories of the current colouring (and show the others); [] shows all."""
        if isinstance(categories, str) or not hasattr(categories, "__iter__"):
            raise refuse("categories", "a list of category names", describe(categories), TypeError)
        if not self._groups:
            raise ValueError(f"categories can only be hidden in a colouring with a legend (one trace per "
                             f"category); colour by {self.color_by!r} has none, got {list(categories)}")
        names = [html.unescape(t.name) for t in self.figure.data[:self._n_map]]   # escaped user strings
        unknown = [c for c in categories if str(c) not in names]
        if unknown:
            raise refuse("categories", f"names of the colouring {self.color_by!r} ({names})", str(unknown))
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

    @checked(x=Pair(), y=Pair())
    def select_box(self, x: tuple[float, float], y: tuple[float, float]) -> None:
        """Select the visible drawn points inside a rectangle of the current projection; x, y: (lo, hi)."""
        self._need_2d("select_box")
        self.select(np.nonzero(in_box(self.coords, x, y) & self._visible_mask())[0])

    def select_lasso(self, xs, ys) -> None:
        """Select the drawn points inside a polygon (vertices xs, ys) of the current projection."""
        xs, ys = check_array("xs", xs, 1), check_array("ys", ys, 1)
        if len(xs) < 3 or xs.shape != ys.shape:
            raise refuse("xs and ys", "two equal-length lists of >= 3 vertices", f"shapes {xs.shape} and {ys.shape}")
        self._need_2d("select_lasso")
        self.select(np.nonzero(in_polygon(self.coords, xs, ys) & self._visible_mask())[0])

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
            if not len(chosen) and self._selected.size and time.monotonic() < self._quiet_until:
                # plotly.js answers a selection sent from Python (selectedpoints, no outline) with an empty
                # plotly_selected; after a click that event names traces (the clicked point's), and plotly.py
                # then sets their selectedpoints to () before calling us: not the user's, so the selection is
                # put back (a restyle: no new event). An empty box in the next seconds is ignored the same way.
                self._restyle_selection()
                return
            self.select(chosen, _from_browser=True)
            if len(chosen) == 1:
                # a click (clickmode "event+select") selects its point and then sends plotly_click in the
                # same instant; with plotly's own page code (CGT_VIZ_EMBED_PLOTLY=1) ipywidgets may merge the
                # two messages and pass on only one: so a one-point selection opens the point itself (a selector
                # may still be attached: plotly repeats the last lasso's outline in the event)
                self._opened_by_select = int(chosen[0])
                self.open_point(int(chosen[0]))

    def _describe_selection(self) -> None:
        if not self._selected.size:
            self.selection_info.value = html_status("No selection. Drag a box or lasso; click a point to open it.")
            return
        points = self._set.points
        label = None if points.label is None else points.label[self._selected]
        self.selection_info.value = html_status(selection_text(points.seq[self._selected], label),
                                                markup=" — <code>explorer.selection</code> has them as a DataFrame")
