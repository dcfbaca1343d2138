"""What the views draw: arrays in, plotly Figures out (static HTML export, reports, non-widget frontends).

Each function returns a `plotly.graph_objects.Figure`; the widgets in `cgt_viz.widgets` wrap the same
functions in `FigureWidget`s and add interaction. Trace structure is fixed per call signature (markers
for the highlighted token and the boundary are layout shapes), so a widget can update a figure in place.
"""
from __future__ import annotations

import html
from typing import Any, Callable, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from ._checks import Bool, Choice, Float, Height, Int, check_array, check_int, checked, describe
from .analysis import token_smoothness, training_series

# well-separated colours first (Tableau 10: no two neighbours alike), then more
PALETTE = qualitative.T10 + qualitative.Dark24
MAX_COLOR_CATEGORIES = 30     # more categories (e.g. documents) than this get no legend bar
MODEL_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")
OTHER = "other"               # the catch-all category (e.g. colour by token: the tokens not among the most frequent)
OTHER_COLOR = "#c7c7c7"       # drawn first (underneath) and grey, so the named categories stand out
COLOR_KINDS = ("categorical", "continuous")


# ---------------------------------------------------------------------------------------------- one visual language
# Every view draws with these: one diverging scale for signed quantities (the same sign is the same colour in
# every figure: positive red, negative blue, white at 0), one sequential scale for magnitudes, colour ranges
# from percentiles (one or two extreme cells do not wash the rest out), and no cloud-share button.
SIGNED_SCALE = "RdBu_r"            # signed values: negative blue, 0 white, positive red (zmid = 0, symmetric range)
SEQUENTIAL_SCALE = "Viridis"       # magnitudes (≥ 0) and continuous labels
POSITIVE_COLOR, NEGATIVE_COLOR = "#b2182b", "#2166ac"   # the ends of SIGNED_SCALE (bars, HTML token spans)
NEUTRAL_COLOR = "#7f7f7f"          # bars of magnitudes (≥ 0), so blue only ever means negative
ROBUST_PERCENTILES = (2.0, 98.0)   # colour range of a heatmap: these percentiles of its values
CLOUD_BUTTONS = ("sendDataToCloud", "sendChartToCloud", "editInChartStudio")   # old and new names of "share"
PLOTLY_CONFIG = {"displaylogo": False, "showSendToCloud": False, "modeBarButtonsToRemove": list(CLOUD_BUTTONS)}   # for FigureWidgets, write_html and static copies
TOKEN_CHARS = 8                    # a token drawn in a cell or tick longer than this is cut with "…"


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 point', '2 points', '1,000 points' (many: an irregular plural)."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


def short_token(text: Any, width: int = TOKEN_CHARS) -> str:
    """A token for a cell or a tick: newlines as ⏎, cut to `width` characters with an ellipsis (the full
    text goes in the hover)."""
    s = str(text).replace("\n", "⏎")
    return s if len(s) <= width else s[:max(width - 1, 1)] + "…"


def robust_range(values: Any, signed: bool | None = None) -> dict:
    """Colour range for values drawn on a colour scale: {"zmin", "zmax", "zmid", "signed"}.

    signed (None: values of both signs are signed): a symmetric range ±(ROBUST_PERCENTILES[1] percentile of
    |v|) around zmid = 0; else [p2, p98] of the values. NaNs are ignored; a constant range is widened a hair."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return dict(zmin=-1.0 if signed else 0.0, zmax=1.0, zmid=0.0 if signed else None, signed=bool(signed))
    if signed is None:
        signed = bool(v.min() < 0 < v.max())
    lo_p, hi_p = ROBUST_PERCENTILES
    if signed:
        lim = float(np.percentile(np.abs(v), hi_p)) or float(np.abs(v).max()) or 1.0
        return dict(zmin=-lim, zmax=lim, zmid=0.0, signed=True)
    lo, hi = float(np.percentile(v, lo_p)), float(np.percentile(v, hi_p))
    if hi <= lo:
        lo, hi = float(v.min()), float(v.max())
        hi = hi if hi > lo else lo + 1e-9
    return dict(zmin=lo, zmax=hi, zmid=None, signed=False)


def heat_colors(values: Any, signed: bool | None = None) -> dict:
    """Heatmap keywords for values: SIGNED_SCALE centred at 0 (symmetric robust range) for signed data,
    SEQUENTIAL_SCALE over [p2, p98] otherwise: {"colorscale", "zmin", "zmax", "zmid"}."""
    r = robust_range(values, signed)
    return dict(colorscale=SIGNED_SCALE if r["signed"] else SEQUENTIAL_SCALE, zmin=r["zmin"], zmax=r["zmax"],
                zmid=r["zmid"])


def plotly_scale(scale: Any) -> list:
    """A colour scale (a name such as SIGNED_SCALE, or plotly's [[pos, colour], ...]) as [[pos, colour], ...]."""
    if isinstance(scale, str):
        from plotly.colors import get_colorscale
        return [[round(float(p), 6), str(c).replace(" ", "")] for p, c in get_colorscale(scale)]
    return [[round(float(p), 6), str(c).replace(" ", "")] for p, c in scale]


def colorbar(title: str, side: str = "right", **kw) -> dict:
    """A colour bar: a title (on its `side`: "right" or "top"), few ticks (they never overlap), thin; kw:
    placement (len, y, x, ...)."""
    return dict(dict(title=dict(text=title, side=side), thickness=10, nticks=5, outlinewidth=0), **kw)


def finish(fig: go.Figure) -> go.Figure:
    """What every figure of cgt_viz shares: no cloud-share / Chart Studio buttons in its modebar (a layout
    setting, so it holds wherever the figure is drawn) and the white template."""
    fig.update_layout(modebar=dict(remove=list(CLOUD_BUTTONS)), template="plotly_white")
    return fig


def _esc(text: Any) -> str:
    """A user's string (token, label, topic name) as text in plotly's pseudo-HTML: never markup."""
    return html.escape(str(text), quote=False)


def _tokens_axis(tokens: Sequence[str] | None, t: int) -> tuple[np.ndarray, list[str]]:
    """x positions (t,) and per-position hover strings 'pos: token'."""
    x = np.arange(t)
    if tokens is None:
        return x, [str(p) for p in x]
    if len(tokens) != t:
        raise ValueError(f"tokens must have one string per position ({t}), got {len(tokens)}")
    return x, [f"{p}: {_esc(s)}" for p, s in zip(x, tokens)]


def _vline(fig: go.Figure, x: float, color: str, dash: str, name: str) -> None:
    """A vertical line over every subplot, as a layout shape (keeps the trace list fixed)."""
    fig.add_shape(type="line", x0=x, x1=x, y0=0, y1=1, xref="x", yref="paper",
                  line=dict(color=color, dash=dash, width=1.5), name=name)


def _check_shape(name: str, value: Any, want: str, fits: Callable[[tuple], bool], *,
                 finite: bool = False) -> np.ndarray:
    """A numeric array (check_array: any type of array-like, no strings) whose shape passes `fits`;
    `want` says the shape in the message, e.g. "(N, 2) with N >= 1"."""
    arr = check_array(name, value, range(8), finite=False, what=want.split(" with")[0])
    if not fits(arr.shape):
        raise ValueError(f"{name} must have shape {want}, got shape {arr.shape}")
    return check_array(name, arr, arr.ndim) if finite else arr


def _check_1d(name: str, a: Any, n: int | None = None, *, numeric: bool = True) -> np.ndarray:
    """One value per entry: shape (n,) (or any 1-D when n is None); numeric=False keeps labels/strings."""
    want = f"({n},)" if n is not None else "(m,)"
    fits = lambda shape: len(shape) == 1 and (n is None or shape[0] == n)   # noqa: E731
    if numeric:
        return _check_shape(name, a, want, fits)
    arr = _as_array(name, a, f"have shape {want} (one per point)")
    if not fits(arr.shape):
        got = describe(a) if arr.ndim == 0 else f"shape {arr.shape}"
        raise ValueError(f"{name} must have shape {want} (one per point), got {got}")
    return arr


def _check_position(name: str, value: Any, t: int) -> int | None:
    """None or a position 0..t-1 of the drawn sequence."""
    return check_int(name, value, 0, t - 1, allow_none=True, hint=" (a position in the sequence)")


def _as_array(name: str, a: Any, want: str) -> np.ndarray:
    """np.asarray(a); ragged nesting is a TypeError "name must <want>"."""
    try:
        return np.asarray(a)
    except ValueError:
        raise TypeError(f"{name} must {want}, got {describe(a)}") from None


# ---------------------------------------------------------------------------------------------- colours
def _color_values(values: Any, name: str = "colour values") -> np.ndarray:
    values = _as_array(name, values, "be 1-D (one per point)")
    if values.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one per point), got shape {values.shape}")
    return values


@checked(kind=Choice(*COLOR_KINDS, none=True))
def color_kind(values: Any, kind: str | None = None) -> str:
    """"categorical" or "continuous" for colour values (N,): kind as given (checked), else numbers with more
    than 12 distinct values are continuous and everything else (labels, few numbers) categorical."""
    values = _color_values(values)
    numeric = np.issubdtype(values.dtype, np.number) and values.dtype != np.bool_
    if kind == "continuous" and not numeric:
        raise ValueError(f"kind='continuous' needs numeric colour values, got dtype {values.dtype}; "
                         f"use kind='categorical' for labels")
    if kind is None:
        kind = "continuous" if (numeric and len(np.unique(values)) > 12) else "categorical"
    return kind


def natural_key(name: str):
    """Sort key that puts "2" before "10" and numbers before words."""
    try:
        return (0, float(name), "")
    except ValueError:
        return (1, 0.0, name)


def color_categories(values: Any) -> tuple[list[str], np.ndarray]:
    """Category names (sorted, numbers numerically) and each point's code: values (N,) -> (names, (N,) int)."""
    values = _color_values(values)
    keys = values.astype(str)
    distinct, which = np.unique(keys, return_inverse=True)          # one Python step per category, not per point
    names = sorted(distinct.tolist(), key=natural_key)
    lookup = {nm: i for i, nm in enumerate(names)}
    rank = np.array([lookup[k] for k in distinct.tolist()], dtype=np.int64)
    return names, rank[which.reshape(-1)]


def color_spec(values: Any, name: str = "label", kind: str | None = None) -> dict:
    """Marker settings colouring one trace by `values` (N,): continuous -> Viridis with a colour bar;
    categorical -> one distinct colour per category (no colour bar: the map puts categories in a legend).
    kind: None (guess, see color_kind), "categorical", "continuous". Returns a dict for `marker=`."""
    kind = color_kind(values, kind)
    values = _color_values(values)
    if kind == "continuous":
        vals = values.astype(np.float32)
        r = robust_range(vals)        # signed numbers: the one diverging scale, centred at 0
        return dict(color=vals, colorscale=SIGNED_SCALE if r["signed"] else SEQUENTIAL_SCALE,
                    cmin=r["zmin"] if r["signed"] else None, cmax=r["zmax"] if r["signed"] else None,
                    cmid=0.0 if r["signed"] else None, showscale=True,
                    colorbar=colorbar(_esc(name), tickvals=None, ticktext=None))
    names, codes = color_categories(values)
    n = len(names)
    scale = []
    for i in range(n):   # a flat band per category: codes i map to [i/n, (i+1)/n]
        c = PALETTE[i % len(PALETTE)]
        scale += [[i / n, c], [(i + 1) / n, c]]
    return dict(color=codes.astype(np.int32), colorscale=scale, cmin=-0.5, cmax=n - 0.5, showscale=False)


def map_groups(color: Any, kind: str | None = None) -> tuple[list[str] | None, list[np.ndarray]]:
    """How `ybar_map_figure` splits points into traces: (category names or None, point indices per trace).
    A categorical colouring with at most MAX_COLOR_CATEGORIES categories gets one trace per category
    (a legend entry each, click to hide/show); anything else is one trace."""
    if color is None:
        return None, []
    color = _color_values(color, "color")
    if color_kind(color, kind) == "categorical":
        names, codes = color_categories(color)
        if len(names) <= MAX_COLOR_CATEGORIES:
            order = np.argsort(codes, kind="stable")
            bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
            groups = [order[bounds[j]:bounds[j + 1]] for j in range(len(names))]
            if OTHER in names and len(names) > 1:          # the catch-all first: drawn underneath the others
                j = names.index(OTHER)
                names, groups = [names[j]] + names[:j] + names[j + 1:], [groups[j]] + groups[:j] + groups[j + 1:]
            return names, groups
    return None, []


# ---------------------------------------------------------------------------------------------- ȳ map
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
    coords = _check_shape("coords", coords, "(N, 2) or (N, 3) with N >= 1",
                          lambda shape: len(shape) == 2 and shape[1] in (2, 3) and shape[0] >= 1, finite=True)
    coords = coords.astype(np.float32)   # half the bytes sent to the browser
    n = len(coords)
    if color is not None:
        color = _check_1d("color", color, n, numeric=False)
    if hover is not None:
        hover = _check_1d("hover", np.asarray(hover, dtype=object), n, numeric=False)
    chosen = None
    if selected is not None:
        chosen = np.zeros(n, bool)
        chosen[_check_1d("selected", selected).astype(np.int64)] = True
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
            fig.add_trace(scatter(rows, dict(base, color=color), _esc(nm), True))
    else:
        marker = dict(base)
        if color is not None:
            marker.update(color_spec(color, color_name, color_kind))
        fig.add_trace(scatter(np.arange(n), marker, "tokens", False))
    if highlight is not None:
        fig.add_trace(highlight_trace(coords, _check_1d("highlight", highlight).astype(np.int64), highlight_labels,
                                      highlight_name, None if hover is None else hover))
    heading = title or "ȳ embedded in 2-D"
    if note:
        heading += f"<br><sup>{note}</sup>"
    fig.update_layout(title=dict(text=heading, x=0.01), height=height, clickmode="event+select",
                      margin=dict(l=50, r=20, t=70, b=40), hovermode="closest",
                      legend=dict(title=dict(text=_esc(color_name)), itemsizing="constant"))
    finish(fig)
    if three:
        fig.update_layout(scene=dict(xaxis_title=axis_names[0], yaxis_title=axis_names[1], zaxis_title=axis_names[2]),
                          margin=dict(l=10, r=10, t=70, b=10))
    else:
        fig.update_layout(dragmode="lasso", xaxis_title=axis_names[0], yaxis_title=axis_names[1])
    return fig


HIGHLIGHT_LABELS = 40        # highlighted points labelled with text on the map (the rest: ring only)
HIGHLIGHT_COLOR = "#111111"


def highlight_trace(coords: np.ndarray, rows: np.ndarray, labels: Sequence[str] | None = None,
                    name: str = "highlighted", hover: Any = None):
    """The overlay marking points `rows` of a map: ringed markers, the first HIGHLIGHT_LABELS labelled; in
    the legend (its name says what is marked) only while it marks something, and first (a long legend
    scrolls, and the entry was out of sight below twelve token categories)."""
    coords = np.asarray(coords, dtype=np.float32)
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    if labels is None:
        labels = [""] * len(rows)
    text = [_esc(short_token(s, 14)) if i < HIGHLIGHT_LABELS else "" for i, s in enumerate(labels)]
    tips = [_esc(s) for s in labels] if hover is None else [str(h) for h in np.asarray(hover, dtype=object)[rows]]
    # an open symbol is stroked in marker.color (a transparent colour drew no ring at all); the overlay is never
    # dimmed by a selection (plotly fades the unselected points of every trace, its rings and labels too)
    marker = dict(size=13, color=HIGHLIGHT_COLOR, line=dict(width=2), symbol="circle-open")
    keep = dict(marker=dict(opacity=1), textfont=dict(color=HIGHLIGHT_COLOR))
    common = dict(mode="markers+text", marker=marker, text=text, hovertext=tips, hoverinfo="text", name=_esc(name),
                  showlegend=len(rows) > 0, legendrank=1, textposition="top center", customdata=rows,
                  textfont=dict(size=11, color=HIGHLIGHT_COLOR), hoverlabel=dict(align="left"))
    if coords.shape[1] == 3:
        return go.Scatter3d(x=coords[rows, 0], y=coords[rows, 1], z=coords[rows, 2],
                            **{**common, "marker": dict(size=7, color=HIGHLIGHT_COLOR, opacity=0.9,
                                                        symbol="circle-open")})
    return go.Scatter(x=coords[rows, 0], y=coords[rows, 1], selected=keep, unselected=keep, **common)


def hover_escape(text: Any) -> str:
    """User text for plotly hover labels and titles: <, > and & escaped once (plotly shows &quot; literally)."""
    return html.escape(str(text), quote=False)


# ---------------------------------------------------------------------------------------------- smoothness
@checked(height=Height())
def smoothness_figure(ybar: Any, tokens: Sequence[str] | None = None, *, boundary: int | None = None,
                      highlight: int | None = None, overlay: dict[str, Any] | None = None, name: str = "model",
                      title: str | None = None, height: int = 560) -> go.Figure:
    """How ȳ moves along one text: ‖ȳ_t − ȳ_{t−1}‖ (row 1), cosine(ȳ_t, ȳ_{t−1}) (row 2), ȳ itself as a
    heatmap t × d_y (row 3). ybar (t, e); tokens (t,) strings for the hover; boundary: first position of
    the second excerpt (a red dashed line); highlight: one position (a grey band); overlay: {name: ybar
    (t, e)} of other models on the same text (rows 1–2 only)."""
    ybar = _check_shape("ybar", ybar, "(t, d_y) with t >= 1",
                        lambda shape: len(shape) == 2 and shape[0] >= 1).astype(np.float32)
    t = ybar.shape[0]
    x, hover = _tokens_axis(tokens, t)
    boundary, highlight = _check_position("boundary", boundary, t), _check_position("highlight", highlight, t)
    if overlay is not None and not isinstance(overlay, dict):
        raise TypeError(f"overlay must be None or a dict {{name: ybar (t, e)}} of other models, got {describe(overlay)}")
    series = {name: ybar}
    for other, arr in (overlay or {}).items():
        series[other] = _check_shape(f"overlay[{other!r}]", arr, f"({t}, e) (the same {t} positions)",
                                     lambda shape: len(shape) == 2 and shape[0] == t).astype(np.float32)
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.07, row_heights=[0.3, 0.25, 0.45],
                        subplot_titles=("‖ȳ_t − ȳ_t−1‖", "cos(ȳ_t, ȳ_t−1)", "ȳ_t (t × d_y)"))
    for i, (nm, arr) in enumerate(series.items()):
        step, cos = token_smoothness(arr)
        color = MODEL_COLORS[i % len(MODEL_COLORS)]
        for row, vals in ((1, step), (2, cos)):
            fig.add_trace(go.Scatter(x=x, y=vals, mode="lines+markers" if t <= 200 else "lines", name=nm,
                                     legendgroup=nm, showlegend=row == 1, line=dict(color=color, width=1.5),
                                     marker=dict(size=4), text=hover,
                                     hovertemplate="%{text}<br>%{y:.3f}<extra>" + nm + "</extra>"),
                          row=row, col=1)
    # the colour range comes from the dimensions that vary along the text: one or two (near-)constant
    # dimensions of large magnitude would otherwise set it and wash the rest out (they saturate instead)
    spread = ybar.std(0) if t > 1 else np.ones(ybar.shape[1], np.float32)
    flat = spread < 0.05 * max(float(np.median(spread)), 1e-12)
    ranged = ybar[:, ~flat] if (~flat).any() else ybar
    bar_title = "ȳ" + (f"<br><sup>{plural(int(flat.sum()), 'constant dim')}<br>saturate</sup>" if flat.any() else "")
    fig.add_trace(go.Heatmap(z=ybar.T, x=x, **heat_colors(ranged, signed=True), showscale=True, name=f"ȳ {name}",
                             colorbar=colorbar(bar_title, len=0.4, y=0, yanchor="bottom"),
                             hovertemplate="pos %{x}, dim %{y}: %{z:.3f}<extra></extra>"), row=3, col=1)
    if boundary is not None:
        _vline(fig, boundary - 0.5, "#d62728", "dash", "boundary")
        fig.add_annotation(x=boundary - 0.5, y=0, yref="paper", yanchor="bottom", xanchor="left", text=" boundary",
                           showarrow=False, font=dict(color="#d62728", size=11), bgcolor="rgba(255,255,255,0.75)")
    if highlight is not None:
        fig.add_vrect(x0=highlight - 0.5, x1=highlight + 0.5, fillcolor="grey", opacity=0.25, line_width=0,
                      row="all", col=1)
    _token_ticks(fig, tokens, x, row=3, col=1)
    fig.update_yaxes(title_text="‖Δȳ‖ (ȳ units)", row=1, col=1)
    fig.update_yaxes(title_text="cosine", row=2, col=1)
    fig.update_yaxes(title_text="ȳ dimension", row=3, col=1)
    fig.update_xaxes(title_text="position (tokens)", row=3, col=1)
    fig.update_layout(title=dict(text=title or "Smoothness of ȳ along the text", x=0.01), height=height,
                      margin=dict(l=60, r=20, t=70, b=40), legend=dict(orientation="h", y=1.08, x=1, xanchor="right"))
    return finish(fig)


def _token_ticks(fig: go.Figure, tokens: Sequence[str] | None, x: np.ndarray, **where) -> None:
    """Tokens as the x tick labels of a short sequence (≤ 80 positions), cut to fit (short_token); every
    n-th one when there are many."""
    if tokens is None or len(x) > 80:
        return
    every = 1 if len(x) <= 40 else 2
    fig.update_xaxes(tickvals=x[::every], ticktext=[_esc(short_token(s, 6)) for s in list(tokens)[::every]],
                     tickangle=-45 if len(x) > 24 else 0, tickfont=dict(size=10), **where)


@checked(height=Height())
def step_profile_figure(profiles: dict[str, Any], *, title: str | None = None, height: int = 380) -> go.Figure:
    """ȳ's mean step per position, with and without a topic switch: profiles {name: `text_step_profile(...)`
    result} (one model or several); solid lines the mixture rows, dotted the no-switch control, the switch
    window shaded."""
    if not isinstance(profiles, dict) or not profiles:
        raise TypeError(f"profiles must be a non-empty dict {{name: text_step_profile(...) result}}, got {describe(profiles)}")
    need = ("positions", "step_switch", "step_no_switch", "boundary", "window", "ratio", "ratio_no_switch")
    fig = go.Figure()
    windows = set()
    for i, (name, prof) in enumerate(profiles.items()):
        if not isinstance(prof, dict) or any(k not in prof for k in need):
            raise ValueError(f"profiles[{name!r}] must be a text_step_profile result with keys {list(need)}, "
                             f"got {sorted(prof) if isinstance(prof, dict) else describe(prof)}")
        pos = _check_1d(f"profiles[{name!r}]['positions']", prof["positions"])
        color, label = MODEL_COLORS[i % len(MODEL_COLORS)], _esc(name)
        for key, dash, what in (("step_switch", "solid", "topic switch"), ("step_no_switch", "dot", "no switch")):
            ratio = prof["ratio" if key == "step_switch" else "ratio_no_switch"]
            fig.add_trace(go.Scatter(x=pos, y=_check_1d(f"profiles[{name!r}][{key!r}]", prof[key], len(pos)),
                                     mode="lines", line=dict(color=color, dash=dash, width=1.5),
                                     name=f"{label}: {what} (window / elsewhere {ratio:.3f})",
                                     hovertemplate="position %{x}: %{y:.4f}<extra>" + label + f", {what}</extra>"))
        windows.add((int(prof["boundary"]), int(prof["window"])))
    for boundary, window in windows:
        fig.add_vrect(x0=boundary - 0.5, x1=boundary + window - 0.5, fillcolor="#d62728", opacity=0.08, line_width=0)
        _vline(fig, boundary - 0.5, "#d62728", "dash", "boundary")
    fig.update_layout(title=dict(text=title or "‖ȳ_p − ȳ_p−1‖, mean over rows: after the switch vs the same rows "
                                 "without one", x=0.01),
                      height=height, xaxis_title="position p (tokens)", yaxis_title="mean ‖Δȳ‖ (ȳ units)",
                      margin=dict(l=50, r=20, t=60, b=40), legend=dict(orientation="h", y=-0.2, x=0))
    return finish(fig)


# ---------------------------------------------------------------------------------------------- token text
def _token_colors(values: np.ndarray, signed: bool | None = None) -> tuple[str, float | None, float, float]:
    """(colour scale, zmid, zmin, zmax) of `heat_colors`: SIGNED_SCALE around 0 for signed values,
    SEQUENTIAL_SCALE otherwise, robust ranges."""
    c = heat_colors(values, signed)
    return c["colorscale"], c["zmid"], c["zmin"], c["zmax"]


@checked(per_row=Int(1, hint=" (tokens per line)"), start=Int(0))
def token_text_figure(tokens: Sequence[str], values: Any, *, value_name: str = "value", title: str | None = None,
                      per_row: int = 24, highlight: int | None = None, start: int = 0, height: int | None = None,
                      signed: bool | None = None) -> go.Figure:
    """Text coloured token by token by a per-token number (CircuitsVis' colored_tokens): the tokens in
    reading order, `per_row` to a line, each cell coloured by its value (diverging around 0 when the
    values have both signs), the value in the hover. tokens (t,) strings; values (t,) numbers (NaN: no
    colour, e.g. ‖ȳ_t − ȳ_{t−1}‖ at t = 0); start: the position of tokens[0] (for the hover);
    highlight: one position (outlined); signed: the quantity is signed (a difference, a coefficient: the
    diverging scale even when every value has one sign), False: a magnitude, None: guess from the values."""
    if isinstance(tokens, (str, bytes)) or not hasattr(tokens, "__len__"):
        raise TypeError(f"tokens must be a list of strings (one per position), got {describe(tokens)}")
    t = len(tokens)
    if t == 0:
        raise ValueError("tokens must hold at least one token, got an empty list")
    values = _check_1d("values", values, t).astype(np.float64)
    highlight = check_int("highlight", highlight, start, start + t - 1, allow_none=True,
                          hint=" (a position of these tokens)")
    rows = -(-t // per_row)
    z = np.full((rows, per_row), np.nan)
    text = np.full((rows, per_row), "", dtype=object)
    custom = np.full((rows, per_row), "", dtype=object)
    for i, (tok, v) in enumerate(zip(tokens, values)):
        r, c = divmod(i, per_row)
        z[r, c], text[r, c] = v, hover_escape(short_token(tok))   # long tokens cut: the hover has them whole
        custom[r, c] = f"pos {start + i}: {hover_escape(repr(str(tok)))}"
    scale, zmid, zmin, zmax = _token_colors(values, signed)
    # None, not NaN, for the empty cells: a widget sends z as JSON, which has no NaN
    z = [[None if not np.isfinite(v) else float(v) for v in row] for row in z]
    # a horizontal colour bar above the strip: a strip of one or two lines is too short for a vertical one
    bar = colorbar(value_name, orientation="h", x=1, xanchor="right", y=1.0, yanchor="bottom", len=0.3,
                   thickness=8, nticks=4)
    bar["title"]["side"] = "top"
    fig = go.Figure(go.Heatmap(z=z, text=text, customdata=custom, texttemplate="%{text}", textfont=dict(size=11),
                               colorscale=scale, zmid=zmid, zmin=zmin, zmax=zmax, xgap=1, ygap=3, colorbar=bar,
                               hovertemplate="%{customdata}<br>" + value_name + ": %{z:.4g}<extra></extra>"))
    if highlight is not None:
        r, c = divmod(highlight - start, per_row)
        fig.add_shape(type="rect", x0=c - 0.5, x1=c + 0.5, y0=r - 0.5, y1=r + 0.5, line=dict(color="black", width=2))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False, autorange="reversed")
    fig.update_xaxes(title_text="token in line")      # hidden axes, titled for the record
    fig.update_yaxes(title_text="line")
    # the title in the top margin (plotly's default place): y=0.98 with yanchor="top" put its baseline 4 px
    # from the top edge of so short a figure, and the title was cut off, invisible
    fig.update_layout(title=dict(text=title or f"Tokens coloured by {value_name}", x=0.01),
                      height=height or (90 + 34 * rows), margin=dict(l=10, r=10, t=60, b=10))
    return finish(fig)


def _rgb(hex_color: str) -> str:
    return ",".join(str(int(hex_color[i:i + 2], 16)) for i in (1, 3, 5))


def colored_tokens_html(tokens: Sequence[str], values: Any, *, value_name: str = "value") -> str:
    """The same as HTML spans (no plotly needed; each token escaped once, its value in the tooltip)."""
    if isinstance(tokens, (str, bytes)) or not hasattr(tokens, "__len__") or not len(tokens):
        raise TypeError(f"tokens must be a non-empty list of strings, got {describe(tokens)}")
    values = _check_1d("values", values, len(tokens)).astype(np.float64)
    _, _, zmin, zmax = _token_colors(values)
    lim = max(abs(zmin), abs(zmax)) or 1.0
    spans = []
    for tok, v in zip(tokens, values):
        a = 0.0 if not np.isfinite(v) else min(abs(v) / lim, 1.0)
        rgb = _rgb(POSITIVE_COLOR if v > 0 else NEGATIVE_COLOR)
        spans.append(f"<span title='{html.escape(value_name)}: {v:.4g}' style='background:rgba({rgb},{a:.2f});"
                     f"white-space:pre;font-family:monospace'>{html.escape(str(tok))}</span>")
    return "<div style='line-height:1.8'>" + "".join(spans) + "</div>"


# ---------------------------------------------------------------------------------------------- templates
@checked(height=Height())
def template_figure(coeffs: Any, tokens: Sequence[str] | None = None, *, site: str = "", boundary: int | None = None,
                    highlight: int | None = None, label_names: Sequence[str] | None = None, mean_abs: Any = None,
                    singular_values: Any = None, ablation: Any = None, title: str | None = None,
                    label_title: str = "label", loss_unit: str = "", height: int = 620) -> go.Figure:
    """The K templates of one site κ: coefficients c_k(ȳ_t) over a sequence (row 1, K × t heatmap);
    mean |c_k| per label (row 2 left, L × K, rows in the order given); singular values of ΔW(ȳ) at the highlighted token (middle);
    Δ loss when template k is ablated (right; empty until computed).

    coeffs (t, K); mean_abs (L, K) with label_names (L,) (names, e.g. topics: the y axis is titled
    label_title); singular_values (m,); ablation (K,) or None; loss_unit: e.g. "nats/token" (axis title).
    c_k uses the one signed scale (SIGNED_SCALE, centred at 0, robust symmetric range); Δ loss bars the same
    colours (positive red).
    """
    coeffs = _check_shape("coeffs", coeffs, "(t, K) with t >= 1",
                          lambda shape: len(shape) == 2 and shape[0] >= 1).astype(np.float32)
    t, K = coeffs.shape
    x, hover = _tokens_axis(tokens, t)
    boundary, highlight = _check_position("boundary", boundary, t), _check_position("highlight", highlight, t)
    ks = [f"k{k}" for k in range(K)]
    at = f" at {highlight}" if highlight is not None else ""
    fig = make_subplots(rows=2, cols=3, specs=[[{"colspan": 3}, None, None], [{}, {}, {}]],
                        row_heights=[0.5, 0.5], vertical_spacing=0.16, horizontal_spacing=0.13,
                        subplot_titles=(f"c_k(ȳ_t) over the sequence · {site}", "mean |c_k| by label",
                                        f"σ_i of ΔW(ȳ){at}", "Δ loss, k ablated"))
    fig.add_trace(go.Heatmap(z=coeffs.T, x=x, y=ks, **heat_colors(coeffs, signed=True),
                             colorbar=colorbar("c_k", len=0.42, y=0.79),
                             customdata=np.array(hover)[None].repeat(K, 0),
                             hovertemplate="%{customdata}<br>%{y}: %{z:.3f}<extra></extra>"), row=1, col=1)
    if mean_abs is not None:
        mean_abs = check_array("mean_abs", mean_abs, 2, finite=False, what="(labels, K)").astype(np.float32)
        names = [_esc(s) for s in (label_names if label_names is not None else range(len(mean_abs)))]
        if mean_abs.shape != (len(names), K):
            raise ValueError(f"mean_abs must have shape (labels={len(names)}, K={K}), got {mean_abs.shape}")
    else:
        mean_abs, names = np.zeros((0, K), np.float32), []
    fig.add_trace(go.Heatmap(z=mean_abs, x=ks, y=names, **heat_colors(mean_abs, signed=False), showscale=True,
                             colorbar=colorbar("mean |c_k|", len=0.34, y=0.17, x=0.255, xanchor="left",
                                               thickness=8, nticks=4, side="top"),
                             # between columns 1 and 2; its title on top (on the right it ran into σ_i's ticks)
                             hovertemplate="%{y} · %{x}: %{z:.3f}<extra></extra>"), row=2, col=1)
    sv = np.zeros(0) if singular_values is None else _check_1d("singular_values", singular_values)
    fig.add_trace(go.Bar(x=np.arange(1, len(sv) + 1), y=sv, marker_color=NEUTRAL_COLOR,   # ≥ 0: not the signed blue
                         hovertemplate="σ%{x}: %{y:.4f}<extra></extra>"), row=2, col=2)
    abl = np.zeros(0) if ablation is None else _check_1d("ablation", ablation, K)
    fig.add_trace(go.Bar(x=ks[:len(abl)], y=abl, marker_color=[POSITIVE_COLOR if v > 0 else NEGATIVE_COLOR for v in abl],
                         hovertemplate="%{x}: Δloss %{y:+.4f}<extra></extra>"), row=2, col=3)
    if ablation is None:
        fig.add_annotation(text="not computed yet:<br>press “Δ loss: ablate each<br>template” or call .ablate()",
                           x=0.5, y=0.5, xref="x4 domain", yref="y4 domain", showarrow=False,
                           font=dict(size=11, color="#777"))
    if boundary is not None:
        _vline(fig, boundary - 0.5, "#d62728", "dash", "boundary")
        fig.layout.shapes[-1].update(yref="y domain", y0=0, y1=1)
    if highlight is not None:
        fig.add_vrect(x0=highlight - 0.5, x1=highlight + 0.5, fillcolor="black", opacity=0.15, line_width=0, row=1, col=1)
    _token_ticks(fig, tokens, x, row=1, col=1)
    unit = f" ({loss_unit})" if loss_unit else ""
    fig.update_xaxes(title_text="position (tokens)", row=1, col=1)
    fig.update_yaxes(title_text="template k", row=1, col=1)
    fig.update_xaxes(title_text="template k", row=2, col=1)
    fig.update_yaxes(title_text=_esc(label_title), row=2, col=1)
    fig.update_xaxes(title_text="i (largest first)", row=2, col=2)
    fig.update_yaxes(title_text="σ_i", row=2, col=2)
    fig.update_xaxes(title_text="template k ablated", row=2, col=3)
    fig.update_yaxes(title_text="Δ loss" + unit, row=2, col=3)
    fig.update_annotations(font_size=13)
    fig.update_layout(title=dict(text=title or "κ-template inspector", x=0.01), height=height, showlegend=False,
                      margin=dict(l=60, r=20, t=80, b=50))
    return finish(fig)


# ---------------------------------------------------------------------------------------------- compare
CURVE_KEYS = {   # analysis.compare_losses names the curves by mode; evaluate.text_position_curves adds "loss_"
    "position": ("position", "positions"),
    "prompted": ("prompted", "loss_prompted"),
    "specialized": ("specialized", "loss_specialized"),
    "no_context": ("no_context", "loss_no_context"),
}


@checked(boundary=Float(none=True), split=Int(none=True), height=Height())
def compare_figure(losses: dict, *, boundary: float | None = None, split: int | None = None,
                   title: str | None = None, ylabel: str = "loss", height: int = 420) -> go.Figure:
    """Per-position loss after the split: prompted, specialized (ȳ frozen at the split), no context.

    losses: {"position": (m,), "prompted": (m,), "specialized": (m,), "no_context": (m,)} as returned by
    `analysis.compare_losses` (or the "positions" / "loss_<mode>" dict of `evaluate.text_position_curves`);
    boundary: the topic switch (red dashed line); split: s (black dotted line).
    """
    found = {} if not isinstance(losses, dict) else \
        {name: next((k for k in keys if k in losses), None) for name, keys in CURVE_KEYS.items()}
    if not found or found["position"] is None:
        got = sorted(losses) if isinstance(losses, dict) else type(losses).__name__
        raise ValueError(f"losses must be a dict with 'position' (or 'positions') and per-position curves "
                         f"{[keys[0] for keys in list(CURVE_KEYS.values())[1:]]}, got {got}")
    pos = _check_1d(f"losses[{found['position']!r}]", losses[found["position"]])
    fig = go.Figure()
    styles = {"prompted": ("#1f77b4", "solid"), "specialized": ("#d62728", "solid"), "no_context": ("#7f7f7f", "dot")}
    for name, (color, dash) in styles.items():
        key = found[name]
        if key is not None:
            fig.add_trace(go.Scatter(x=pos, y=_check_1d(f"losses[{key!r}]", losses[key], len(pos)), mode="lines+markers",
                                     name=name.replace("_", "-"), line=dict(color=color, dash=dash), marker=dict(size=4)))
    _mark_switch_and_split(fig, boundary, split)
    fig.update_layout(title=dict(text=title or "Compile and compare: loss per position", x=0.01), height=height,
                      xaxis_title="position (tokens)", yaxis_title=ylabel,
                      margin=dict(l=50, r=20, t=60, b=40), legend=dict(orientation="h", y=1.1, x=1, xanchor="right"))
    return finish(fig)


def _interval(values: np.ndarray, level: float) -> tuple[float, float]:
    """(mean, half-width of its normal-approximation interval at `level`) of a 1-D sample."""
    from statistics import NormalDist
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if len(v) == 0:
        return float("nan"), float("nan")
    z = NormalDist().inv_cdf(0.5 + level / 2)
    half = z * v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else float("nan")
    return float(v.mean()), float(half)


def _mark_switch_and_split(fig: go.Figure, boundary: float | None, split: int | None) -> None:
    """The topic switch (red dashed) and the split s (black dotted) as labelled vertical lines."""
    if boundary is not None:
        _vline(fig, boundary - 0.5, "#d62728", "dash", "boundary")
        fig.add_annotation(x=boundary - 0.5, y=1, yref="paper", text="topic switch", showarrow=False,
                           font=dict(color="#d62728"), xanchor="left")
    if split is not None:
        _vline(fig, split - 0.5, "black", "dot", "split")
        fig.add_annotation(x=split - 0.5, y=0.93, yref="paper", text=f"s = {split}", showarrow=False, xanchor="left")


def loss_difference_figure(positions, diff, sem, *, boundary: float | None = None, split: int | None = None,
                           before=None, after=None, level: float = 0.95, title: str | None = None,
                           ylabel: str = "Δ loss (nats)", height: int = 420) -> go.Figure:
    """Specialised − no-context loss per position, with an interval band: below 0 the frozen ȳ helps.

    positions, diff, sem: (m,) positions, the mean paired difference over rows and its standard error
    (`evaluate.text_position_curves` returns them as "positions", "diff_specialized_no_context",
    "sem_specialized_no_context"); boundary: the topic switch (red dashed line); split: s (dotted line);
    before / after: per-row mean differences before / after the switch ("diff_rows_before" / "_after"),
    summarised in the legend as mean ± half-width of the `level` interval (normal approximation)."""
    level = float(Float(0.5, 0.999).check("level", level))
    pos = _check_1d("positions", positions)
    mean = _check_1d("diff", diff, len(pos))
    err = _check_1d("sem", sem, len(pos))
    from statistics import NormalDist
    half = NormalDist().inv_cdf(0.5 + level / 2) * err
    pct = f"{100 * level:g} %"
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=np.concatenate([pos, pos[::-1]]), y=np.concatenate([mean + half, (mean - half)[::-1]]),
                             fill="toself", fillcolor="rgba(214,39,40,0.18)", line=dict(width=0), hoverinfo="skip",
                             name=f"{pct} interval (rows)"))
    fig.add_trace(go.Scatter(x=pos, y=mean, mode="lines", name="specialised − no context",
                             line=dict(color="#d62728", width=2),
                             hovertemplate="position %{x}<br>Δ %{y:.3f} nats<extra></extra>"))
    fig.add_hline(y=0, line=dict(color="#444", width=1))
    for name, rows, side in (("before", before, -1), ("after", after, 1)):
        if rows is None or boundary is None:
            continue
        m, h = _interval(rows, level)
        xs = pos[pos < boundary] if side < 0 else pos[pos >= boundary]
        if len(xs) == 0 or not (np.isfinite(m) and np.isfinite(h)):
            continue
        word = "helps" if m + h < 0 else "hurts" if m - h > 0 else "no clear effect"
        fig.add_trace(go.Scatter(x=[xs[0], xs[-1]], y=[m, m], mode="lines", line=dict(color="black", dash="dash"),
                                 name=f"{name} the switch: {m:+.3f} ± {h:.3f} ({word})",
                                 hovertemplate=f"{name} the switch: mean over rows {m:+.3f} ± {h:.3f}<extra></extra>"))
    _mark_switch_and_split(fig, boundary, split)
    fig.update_layout(title=dict(text=title or "What the frozen ȳ is worth: specialised − no context, per position",
                                 x=0.01), height=height, xaxis_title="position (tokens)", yaxis_title=ylabel,
                      margin=dict(l=50, r=20, t=60, b=40),
                      legend=dict(orientation="h", y=-0.18, x=0, xanchor="left"))
    return finish(fig)


# ---------------------------------------------------------------------------------------------- training
TERM_COLORS = {"main": "#1f77b4", "aux": "#ff7f0e", "smooth": "#2ca02c", "total": "#444444"}
AUX_MARKER = "aux_delay"      # the name of the shape marking where the aux term joins the objective


def drawn_series(steps: dict, weights: dict | None = None) -> tuple[dict, list[str]]:
    """The training terms worth a curve: ({name: (steps, values)} without the terms whose weight is 0
    (they are not in the total, e.g. "smooth" when w_smooth = 0; weights {term: w} when known) or that are
    exactly 0 at every step so far, and the names left out."""
    weights = weights or {}
    kept = {k: v for k, v in steps.items()
            if not (len(v[1]) and np.all(np.asarray(v[1]) == 0)) and not (k in weights and weights[k] == 0)}
    return kept, [k for k in steps if k not in kept]


def run_info(history: Any) -> dict:
    """What the trainer's {"kind": "start"} record says about a run (steps, aux_delay, aux_ramp, weights), or {}."""
    if isinstance(history, (list, tuple)):
        for rec in history:
            if isinstance(rec, dict) and rec.get("kind") == "start":
                return {k: rec[k] for k in ("steps", "aux_delay", "aux_ramp", "weights") if k in rec}
    return {}


def _weights_of(weights: Any) -> dict | None:
    """weights: None, {term: w}, or a model config (its w_aux and w_smooth) -> {term: w} or None."""
    if weights is None or isinstance(weights, dict):
        return None if weights is None else {k: float(v) for k, v in weights.items()}
    if hasattr(weights, "w_aux"):
        return {"main": 1.0, "aux": float(weights.w_aux), "smooth": float(getattr(weights, "w_smooth", 0.0))}
    raise TypeError(f"weights must be None, a dict {{term: weight}} or a model config, got {describe(weights)}")


def ema(values: Any, smoothing: float) -> np.ndarray:
    """Exponential moving average with TensorBoard's debiasing: smoothing 0 returns the values; 0.9 averages
    over about the last 10 points."""
    v = np.asarray(values, dtype=np.float64)
    if smoothing <= 0 or v.size == 0:
        return v
    out, acc = np.empty_like(v), 0.0
    for i, x in enumerate(v):
        acc = smoothing * acc + (1 - smoothing) * x
        out[i] = acc / (1 - smoothing ** (i + 1))
    return out


def total_of(steps: dict, weights: dict) -> np.ndarray | None:
    """main + Σ w_k · term_k at every step (validation's definition of the total: full weights from step 1)."""
    if "main" not in steps:
        return None
    total = np.asarray(steps["main"][1], dtype=np.float64).copy()
    for k, w in weights.items():
        if k not in ("main", "total") and w and k in steps:
            total = total + w * np.asarray(steps[k][1], dtype=np.float64)
    return total


def _total_formula(weights: dict) -> str:
    return "main" + "".join(f" + {w:g}·{k}" for k, w in weights.items() if k not in ("main", "total") and w)


@checked(log_y=Bool(), max_points=Int(2, hint=" (points drawn per curve)"),
         smoothing=Float(0, 0.999, hint=" (EMA weight: 0 = raw curves)"), height=Height())
def training_curves_figure(history: Any, *, log_y: bool = True, title: str | None = None, max_points: int = 2000,
                           weights: Any = None, aux_delay: int | None = None, steps: int | None = None,
                           smoothing: float = 0.0, height: int = 460) -> go.Figure:
    """Loss curves (main, aux, smooth, total; row 1) and evaluation metrics (row 2) of a training run.

    history: a TrainHistory, a dict of lists, or a list of callback records (see analysis.training_series;
    the trainer's {"kind": "start"} record gives steps, aux_delay and the loss weights).
    weights: {term: weight} or the model's config (default: from the start record). With them, a term of
    weight 0 gets no curve (it is not in the total), and "total" is main + Σ w·term with the full weights
    at every step, the same definition as val_total (before aux_delay the trainer optimises less than that).
    Without them the trainer's own total is drawn as "total (as optimised)".
    aux_delay: where the aux term joins the objective (a labelled dashed line, shape name AUX_MARKER).
    steps: the run's length (the title says "step N of M"). smoothing: EMA of the train curves (0..0.999;
    the raw curves stay, faint). A term that is 0 at every step gets no curve either. Long curves are
    thinned to max_points per trace (every k-th step; the last step always kept). On the log axis every tick
    is labelled with its full value (70, 60, 50; not plotly's bare digits 7, 6, 5). The total is drawn
    first, dashed: main, drawn over it, stays visible where the two coincide.
    """
    info = run_info(history)
    weights = _weights_of(weights) if weights is not None else _weights_of(info.get("weights"))
    aux_delay = info.get("aux_delay") if aux_delay is None else check_int("aux_delay", aux_delay, 0)
    steps_total = info.get("steps") if steps is None else check_int("steps", steps, 1)
    series, evals = training_series(history)
    if weights is not None:
        full = total_of(series, weights)
        if full is not None and "total" in series:
            series["total"] = (series["total"][0], full)
    series, left_out = drawn_series(series, weights)
    why = []
    zero_w = [k for k in left_out if weights is not None and weights.get(k) == 0]
    if zero_w:
        why.append(f"{', '.join(zero_w)}: weight 0, not in the total, not drawn")
    flat = [k for k in left_out if k not in zero_w]
    if flat:
        why.append(f"{', '.join(flat)} = 0 throughout: not drawn")
    total_name = "total" if weights is not None else "total (as optimised)"
    top = "training losses" + (f" · total = {_total_formula(weights)}" if weights is not None else "")
    if why:
        top += f"<br><sup>{'; '.join(why)}</sup>"
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12, row_heights=[0.62, 0.38],
                        subplot_titles=(top, "evaluation (validation batches)"))
    order = sorted(series, key=lambda k: {"total": 0, "smooth": 1, "aux": 2, "main": 4}.get(k, 3))   # main on top
    rank = {k: i for i, k in enumerate(("main", "aux", "smooth", "total"))}
    for name in order:
        s, v = series[name]
        color = TERM_COLORS.get(name, PALETTE[len(rank) % len(PALETTE)])
        label = total_name if name == "total" else name
        dash = "dash" if name == "total" else "solid"
        xs = thin(s, max_points)
        if smoothing > 0:
            fig.add_trace(go.Scatter(x=xs, y=thin(v, max_points), mode="lines", name=f"{label} (raw)",
                                     line=dict(color=color, width=1, dash=dash), opacity=0.25, showlegend=False,
                                     legendgroup=label, hoverinfo="skip"), row=1, col=1)
            v = ema(v, smoothing)
        fig.add_trace(go.Scatter(x=xs, y=thin(v, max_points), mode="lines", name=label, legendgroup=label,
                                 legendrank=100 + rank.get(name, 9), line=dict(color=color, dash=dash,
                                                                                width=1.5 if name == "total" else 2)),
                      row=1, col=1)
    for i, (name, (s, v)) in enumerate(evals.items()):
        term = name[4:] if name.startswith("val_") else None
        color = TERM_COLORS.get(term, PALETTE[(i + 4) % len(PALETTE)])
        fig.add_trace(go.Scatter(x=s, y=v, mode="lines+markers", name=name, legendrank=200 + i,
                                 line=dict(color=color, dash="dash" if term == "total" else "solid")), row=2, col=1)
    aux_w = None if weights is None else weights.get("aux")
    if aux_delay and (aux_w is None or aux_w > 0):
        fig.add_vline(x=aux_delay, line=dict(color="#ff7f0e", dash="dash", width=1.5), name=AUX_MARKER)
        fig.add_annotation(x=aux_delay, y=0.98, xref="x", yref="y domain", yanchor="top", xanchor="left",
                           text=f" aux joins the objective (aux_delay = {aux_delay:,})", showarrow=False,
                           font=dict(color="#ff7f0e", size=11), name=AUX_MARKER)
    if log_y:
        fig.update_yaxes(type="log", tickformat="~g", row=1, col=1)
    fig.update_yaxes(title_text="loss" + (" (log scale)" if log_y else ""), row=1, col=1)
    fig.update_yaxes(title_text="metric", row=2, col=1)
    fig.update_xaxes(title_text="step (optimizer updates)", row=2, col=1)
    last = max((int(s[-1]) for s, _ in list(series.values()) + list(evals.values()) if len(s)), default=0)
    heading = title or "Training"
    if steps_total:
        heading += f" · step {last:,} of {steps_total:,}"
    fig.update_layout(title=dict(text=heading, x=0.01), height=height, margin=dict(l=60, r=20, t=80, b=40))
    if steps_total:
        fig.update_xaxes(range=[0, steps_total * 1.01])
    return finish(fig)


def thin(a: np.ndarray, max_points: int) -> np.ndarray:
    """Every k-th entry so that at most max_points remain, always keeping the last one."""
    a = np.asarray(a)
    if len(a) <= max_points:
        return a
    k = int(np.ceil(len(a) / max_points))
    idx = np.arange(0, len(a), k)
    if idx[-1] != len(a) - 1:
        idx = np.append(idx, len(a) - 1)
    return a[idx]
