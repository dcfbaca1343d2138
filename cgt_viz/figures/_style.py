"""The visual language every figure shares (colours, scales, the modebar, how a token is cut and user text
escaped), the argument checks of the figure functions, and how points are coloured and grouped."""
from __future__ import annotations

import html
from typing import Any, Callable, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.colors import qualitative

from .._checks import Choice, check_array, check_int, checked, describe, refuse


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


def hover_escape(text: Any) -> str:
    """User text for plotly hover labels and titles: <, > and & escaped once (plotly shows &quot; literally)."""
    return html.escape(str(text), quote=False)


def tokens_axis(tokens: Sequence[str] | None, t: int) -> tuple[np.ndarray, list[str]]:
    """x positions (t,) and per-position hover strings 'pos: token'."""
    x = np.arange(t)
    if tokens is None:
        return x, [str(p) for p in x]
    if len(tokens) != t:   # a cross-argument check: the tokens against the values drawn
        raise refuse("tokens", f"one string per position ({t})", str(len(tokens)), verb="have")
    return x, [f"{p}: {hover_escape(s)}" for p, s in zip(x, tokens)]


def vline(fig: go.Figure, x: float, color: str, dash: str, name: str) -> None:
    """A vertical line over every subplot, as a layout shape (keeps the trace list fixed)."""
    fig.add_shape(type="line", x0=x, x1=x, y0=0, y1=1, xref="x", yref="paper",
                  line=dict(color=color, dash=dash, width=1.5), name=name)


def check_shape(name: str, value: Any, want: str, fits: Callable[[tuple], bool], *,
                finite: bool = False) -> np.ndarray:
    """A numeric array (check_array: any type of array-like, no strings) whose shape passes `fits`;
    `want` says the shape in the message, e.g. "(N, 2) with N >= 1"."""
    arr = check_array(name, value, range(8), finite=False, what=want.split(" with")[0])
    if not fits(arr.shape):
        raise refuse(name, f"shape {want}", f"shape {arr.shape}", verb="have")
    return check_array(name, arr, arr.ndim) if finite else arr


def check_1d(name: str, a: Any, n: int | None = None, *, numeric: bool = True) -> np.ndarray:
    """One value per entry: shape (n,) (or any 1-D when n is None); numeric=False keeps labels/strings."""
    want = f"({n},)" if n is not None else "(m,)"
    fits = lambda shape: len(shape) == 1 and (n is None or shape[0] == n)   # noqa: E731
    if numeric:
        return check_shape(name, a, want, fits)
    arr = as_array(name, a, f"have shape {want} (one per point)")
    if not fits(arr.shape):
        raise refuse(name, f"shape {want} (one per point)", describe(a) if arr.ndim == 0 else f"shape {arr.shape}",
                     verb="have")
    return arr


def check_position(name: str, value: Any, t: int) -> int | None:
    """None or a position 0..t-1 of the drawn sequence."""
    return check_int(name, value, 0, t - 1, allow_none=True, hint=" (a position in the sequence)")


def as_array(name: str, a: Any, want: str) -> np.ndarray:
    """np.asarray(a); ragged nesting is a TypeError "name must <want>" (want starts with its verb)."""
    try:
        return np.asarray(a)
    except ValueError:
        verb, _, what = want.partition(" ")
        raise refuse(name, what, describe(a), TypeError, verb=verb) from None


# ---------------------------------------------------------------------------------------------- colours
def _color_values(values: Any, name: str = "colour values") -> np.ndarray:
    values = as_array(name, values, "be 1-D (one per point)")
    if values.ndim != 1:
        raise refuse(name, "1-D (one per point)", f"shape {values.shape}")
    return values


@checked(kind=Choice(*COLOR_KINDS, none=True))
def color_kind(values: Any, kind: str | None = None) -> str:
    """"categorical" or "continuous" for colour values (N,): kind as given (checked), else numbers with more
    than 12 distinct values are continuous and everything else (labels, few numbers) categorical."""
    values = _color_values(values)
    numeric = np.issubdtype(values.dtype, np.number) and values.dtype != np.bool_
    if kind == "continuous" and not numeric:   # a cross-argument check: the kind against the values
        raise refuse("kind", "'categorical' or None for colour values that are not numbers",
                     f"kind='continuous' and values of dtype {values.dtype}", hint="'continuous' needs numbers")
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
                    colorbar=colorbar(hover_escape(name), tickvals=None, ticktext=None))
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
