"""The ȳ map: many tokens' ȳ embedded in 2-D or 3-D, coloured, selectable, with the highlight overlay."""
from __future__ import annotations

import html
from typing import Any, Sequence

import numpy as np
import plotly.graph_objects as go

from .._checks import Choice, Height, checked
from ._style import (COLOR_KINDS, OTHER, OTHER_COLOR, PALETTE, check_1d, check_shape, color_spec, finish,
                     hover_escape, map_groups, short_token)


@checked(color_kind=Choice(*COLOR_KINDS, none=True), height=Height())
def ybar_map_figure(coords: Any, color: Any = None, hover: Sequence[str] | None = None, *, color_name: str = "label",
                    color_kind: str | None = None, title: str | None = None, note: str | None = None,
                    axis_names: tuple[str, str] = ("dim 1", "dim 2"), marker_size: float | None = None,
                    selected: Any = None, highlight: Any = None, highlight_labels: Sequence[str] | None = None,
                    highlight_name: str = "highlighted", height: int = 520) -> go.Figure:
    """ȳ of many tokens embedded in 2-D as WebGL scatter (Scattergl), or in 3-D (Scatter3d, also WebGL).

    coords (N, 2) or (N, 3) (then axis_names has three names; `selected` is not drawn: plotly's 3-D
    scatter has no selection); color (N,) labels or numbers (None: one colour); hover (N,) plotly hover strings (escape
    user text with `hover_escape`); note: a line under the title (e.g. "showing 20,000 of 100,000 tokens");
    selected: indices of selected points (the others are drawn faint).
    highlight: indices of points to mark (search hits, a point and its nearest neighbours): drawn as one more
    trace, the last, named `highlight_name` (ringed markers over the map, each labelled with its entry of
    highlight_labels, at most HIGHLIGHT_LABELS of them; their full text in the hover). None: no such trace;
    [] an empty one (a widget keeps its trace list fixed).
    Traces: a categorical colouring with ≤ MAX_COLOR_CATEGORIES categories gives one trace per category, in
    sorted order, named by it and listed in the legend (a click hides it); otherwise one trace with points in
    row order (a colour bar for numbers). `map_groups` says which points each trace holds.
    """
    coords = check_shape("coords", coords, "(N, 2) or (N, 3) with N >= 1",
                          lambda shape: len(shape) == 2 and shape[1] in (2, 3) and shape[0] >= 1, finite=True)
    coords = coords.astype(np.float32)   # half the bytes sent to the browser
    n = len(coords)
    if color is not None:
        color = check_1d("color", color, n, numeric=False)
    if hover is not None:
        hover = check_1d("hover", np.asarray(hover, dtype=object), n, numeric=False)
    chosen = None
    if selected is not None:
        chosen = np.zeros(n, bool)
        chosen[check_1d("selected", selected).astype(np.int64)] = True
    three = coords.shape[1] == 3
    if three and len(axis_names) == 2:
        axis_names = (*axis_names, "dim 3")
    base = dict(size=marker_size or (6 if n < 2000 else 4 if n < 20000 else 2.5), opacity=0.8 if n < 20000 else 0.6)
    if three:   # Scatter3d markers are drawn smaller than Scattergl's of the same size
        base = dict(size=marker_size or (4 if n < 2000 else 2.5 if n < 20000 else 1.5), opacity=base["opacity"])
    names, groups = map_groups(color, color_kind)

    def scatter(rows, marker, name, legend):
        if three:
            return go.Scatter3d(x=coords[rows, 0], y=coords[rows, 1], z=coords[rows, 2], mode="markers", marker=marker,
                                hovertext=None if hover is None else hover[rows],
                                hoverinfo="text" if hover is not None else "x+y+z", hoverlabel=dict(align="left"),
                                name=name, showlegend=legend, legendgroup=name if legend else None)
        sel = None if chosen is None else np.nonzero(chosen[rows])[0].tolist()
        return go.Scattergl(x=coords[rows, 0], y=coords[rows, 1], mode="markers", marker=marker,
                            hovertext=None if hover is None else hover[rows],
                            hoverinfo="text" if hover is not None else "x+y", hoverlabel=dict(align="left"),
                            selectedpoints=sel, unselected=dict(marker=dict(opacity=0.15)), name=name,
                            showlegend=legend, legendgroup=name if legend else None)

    fig = go.Figure()
    if names is not None:
        j = 0
        for nm, rows in zip(names, groups):
            if nm == OTHER and len(names) > 1:
                color = OTHER_COLOR
            else:
                color, j = PALETTE[j % len(PALETTE)], j + 1
            fig.add_trace(scatter(rows, dict(base, color=color), hover_escape(nm), True))
    else:
        marker = dict(base)
        if color is not None:
            marker.update(color_spec(color, color_name, color_kind))
        fig.add_trace(scatter(np.arange(n), marker, "tokens", False))
    if highlight is not None:
        fig.add_trace(highlight_trace(coords, check_1d("highlight", highlight).astype(np.int64), highlight_labels,
                                      highlight_name, None if hover is None else hover))
    heading = title or "ȳ embedded in 2-D"
    if note:
        heading += f"<br><sup>{note}</sup>"
    fig.update_layout(title=dict(text=heading, x=0.01), height=height, clickmode="event+select",
                      margin=dict(l=50, r=20, t=70, b=40), hovermode="closest",
                      legend=dict(title=dict(text=hover_escape(color_name)), itemsizing="constant"))
    finish(fig)
    if three:
        fig.update_layout(scene=dict(xaxis_title=axis_names[0], yaxis_title=axis_names[1], zaxis_title=axis_names[2]),
                          margin=dict(l=10, r=10, t=70, b=10))
    else:
        fig.update_layout(dragmode="lasso", xaxis_title=axis_names[0], yaxis_title=axis_names[1])
    return fig


HIGHLIGHT_LABELS = 40        # highlighted points labelled with text on the map (the rest: ring only)
HIGHLIGHT_COLOR = "#111111"
# where a label may sit around its ring, in the order tried, as (plotly textposition, unit offset of the box)
LABEL_PLACES = (("top center", (0, 1)), ("bottom center", (0, -1)), ("middle right", (1, 0)), ("middle left", (-1, 0)),
                ("top right", (1, 1)), ("top left", (-1, 1)), ("bottom right", (1, -1)), ("bottom left", (-1, -1)))
# the map's drawn size and the label font in pixels, estimated (the figure does not know where it is drawn):
# labels need only keep apart from each other relative to the map's extent
MAP_PX, CHAR_PX, LINE_PX, RING_PX = (640.0, 400.0), 6.5, 14.0, 8.0


def _label_places(coords: np.ndarray, rows: np.ndarray, text: list[str]) -> list[str]:
    """A plotly textposition for each point `rows` of a 2-D map, so that the labels of nearby points (a point
    and its nearest neighbours sit close together) keep off each other and off the labelled rings: greedily
    in the given order, each label takes the first place around its ring that is free, else the least
    covered one. Only the labelled points (text not empty) are placed; the rest keep "top center"."""
    labelled = [i for i, label in enumerate(text) if label]
    places = ["top center"] * len(rows)
    if not labelled:
        return places
    span = np.maximum(np.ptp(coords, axis=0), 1e-12)
    at = (coords[rows[labelled]] - coords.min(0)) / span * np.array(MAP_PX)     # pixel positions, y up
    taken = np.concatenate([at - RING_PX, at + RING_PX], axis=1)                 # boxes (x0, y0, x1, y1): the rings
    for i, (x, y) in zip(labelled, at.tolist()):
        w, h = CHAR_PX * len(html.unescape(text[i])) + 4, LINE_PX
        boxes = np.array([(x + dx * (RING_PX + w / 2), y + dy * (RING_PX + h / 2)) for _, (dx, dy) in LABEL_PLACES])
        boxes = np.concatenate([boxes - (w / 2, h / 2), boxes + (w / 2, h / 2)], axis=1)          # (8, 4)
        lo, hi = np.maximum(boxes[:, None, :2], taken[None, :, :2]), np.minimum(boxes[:, None, 2:], taken[None, :, 2:])
        cover = np.clip(hi - lo, 0, None).prod(-1).sum(1)      # (8,) area of each place under what is taken
        best = int(np.argmin(cover))                            # the first of the least covered places
        places[i] = LABEL_PLACES[best][0]
        taken = np.concatenate([taken, boxes[best:best + 1]])
    return places


def highlight_trace(coords: np.ndarray, rows: np.ndarray, labels: Sequence[str] | None = None,
                    name: str = "highlighted", hover: Any = None):
    """The overlay marking points `rows` of a map: ringed markers, the first HIGHLIGHT_LABELS labelled; in
    the legend (its name says what is marked) only while it marks something, and first (a long legend
    scrolls, and the entry was out of sight below twelve token categories)."""
    coords = np.asarray(coords, dtype=np.float32)
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    if labels is None:
        labels = [""] * len(rows)
    text = [hover_escape(short_token(s, 14)) if i < HIGHLIGHT_LABELS else "" for i, s in enumerate(labels)]
    tips = [hover_escape(s) for s in labels] if hover is None else [str(h) for h in np.asarray(hover, dtype=object)[rows]]
    # an open symbol is stroked in marker.color (a transparent colour drew no ring at all); the overlay is never
    # dimmed by a selection (plotly fades the unselected points of every trace, its rings and labels too)
    marker = dict(size=13, color=HIGHLIGHT_COLOR, line=dict(width=2), symbol="circle-open")
    keep = dict(marker=dict(opacity=1), textfont=dict(color=HIGHLIGHT_COLOR))
    places = "top center" if coords.shape[1] == 3 else _label_places(coords, rows, text)   # 3-D: the view turns
    common = dict(mode="markers+text", marker=marker, text=text, hovertext=tips, hoverinfo="text", name=hover_escape(name),
                  showlegend=len(rows) > 0, legendrank=1, textposition=places, customdata=rows,
                  textfont=dict(size=11, color=HIGHLIGHT_COLOR), hoverlabel=dict(align="left"))
    if coords.shape[1] == 3:
        return go.Scatter3d(x=coords[rows, 0], y=coords[rows, 1], z=coords[rows, 2],
                            **{**common, "marker": dict(size=7, color=HIGHLIGHT_COLOR, opacity=0.9,
                                                        symbol="circle-open")})
    return go.Scatter(x=coords[rows, 0], y=coords[rows, 1], selected=keep, unselected=keep, **common)
