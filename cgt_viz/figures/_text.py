"""Figures along one text: the smoothness strip, the step profile, tokens coloured by a value, the
κ-template inspector."""
from __future__ import annotations

import html
from typing import Any, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .._checks import Height, Int, Tokens, check_array, check_int, checked, describe, refuse
from ..analysis import token_smoothness
from ._style import (MODEL_COLORS, NEGATIVE_COLOR, NEUTRAL_COLOR, POSITIVE_COLOR, as_array, check_1d, check_position,
                     check_shape, colorbar, finish, heat_colors, hover_escape, plural, short_token, tokens_axis, vline)


@checked(height=Height())
def smoothness_figure(ybar: Any, tokens: Sequence[str] | None = None, *, boundary: int | None = None,
                      highlight: int | None = None, overlay: dict[str, Any] | None = None, name: str = "model",
                      title: str | None = None, height: int = 560) -> go.Figure:
    """How ȳ moves along one text: ‖ȳ_t − ȳ_{t−1}‖ (row 1), cosine(ȳ_t, ȳ_{t−1}) (row 2), ȳ itself as a
    heatmap t × d_y (row 3). ybar (t, e); tokens (t,) strings for the hover; boundary: first position of
    the second excerpt (a red dashed line); highlight: one position (a grey band); overlay: {name: ybar
    (t, e)} of other models on the same text (rows 1–2 only)."""
    ybar = check_shape("ybar", ybar, "(t, d_y) with t >= 1",
                        lambda shape: len(shape) == 2 and shape[0] >= 1).astype(np.float32)
    t = ybar.shape[0]
    x, hover = tokens_axis(tokens, t)
    boundary, highlight = check_position("boundary", boundary, t), check_position("highlight", highlight, t)
    if overlay is not None and not isinstance(overlay, dict):
        raise refuse("overlay", "None or a dict {name: ybar (t, e)} of other models", describe(overlay), TypeError)
    series = {name: ybar}
    for other, arr in (overlay or {}).items():
        series[other] = check_shape(f"overlay[{other!r}]", arr, f"({t}, e) (the same {t} positions)",
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
        vline(fig, boundary - 0.5, "#d62728", "dash", "boundary")
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
    fig.update_xaxes(tickvals=x[::every], ticktext=[hover_escape(short_token(s, 6)) for s in list(tokens)[::every]],
                     tickangle=-45 if len(x) > 24 else 0, tickfont=dict(size=10), **where)


@checked(height=Height())
def step_profile_figure(profiles: dict[str, Any], *, title: str | None = None, height: int = 380) -> go.Figure:
    """ȳ's mean step per position, with and without a topic switch: profiles {name: `text_step_profile(...)`
    result} (one model or several); solid lines the mixture rows, dotted the no-switch control, the switch
    window shaded."""
    if not isinstance(profiles, dict) or not profiles:
        raise refuse("profiles", "a non-empty dict {name: text_step_profile(...) result}", describe(profiles),
                     TypeError)
    need = ("positions", "step_switch", "step_no_switch", "boundary", "window", "ratio", "ratio_no_switch")
    fig = go.Figure()
    windows = set()
    for i, (name, prof) in enumerate(profiles.items()):
        if not isinstance(prof, dict) or any(k not in prof for k in need):
            raise refuse(f"profiles[{name!r}]", f"a text_step_profile result with keys {list(need)}",
                         str(sorted(prof)) if isinstance(prof, dict) else describe(prof))
        pos = check_1d(f"profiles[{name!r}]['positions']", prof["positions"])
        color, label = MODEL_COLORS[i % len(MODEL_COLORS)], hover_escape(name)
        for key, dash, what in (("step_switch", "solid", "topic switch"), ("step_no_switch", "dot", "no switch")):
            ratio = prof["ratio" if key == "step_switch" else "ratio_no_switch"]
            fig.add_trace(go.Scatter(x=pos, y=check_1d(f"profiles[{name!r}][{key!r}]", prof[key], len(pos)),
                                     mode="lines", line=dict(color=color, dash=dash, width=1.5),
                                     name=f"{label}: {what} (window / elsewhere {ratio:.3f})",
                                     hovertemplate="position %{x}: %{y:.4f}<extra>" + label + f", {what}</extra>"))
        windows.add((int(prof["boundary"]), int(prof["window"])))
    for boundary, window in windows:
        fig.add_vrect(x0=boundary - 0.5, x1=boundary + window - 0.5, fillcolor="#d62728", opacity=0.08, line_width=0)
        vline(fig, boundary - 0.5, "#d62728", "dash", "boundary")
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


@checked(tokens=Tokens(), per_row=Int(1, hint=" (tokens per line)"), start=Int(0))
def token_text_figure(tokens: Sequence[str], values: Any, *, value_name: str = "value", title: str | None = None,
                      per_row: int = 24, highlight: int | None = None, start: int = 0, height: int | None = None,
                      signed: bool | None = None) -> go.Figure:
    """Text coloured token by token by a per-token number (CircuitsVis' colored_tokens): the tokens in
    reading order, `per_row` to a line, each cell coloured by its value (diverging around 0 when the
    values have both signs), the value in the hover. tokens (t,) strings; values (t,) numbers (NaN: no
    colour, e.g. ‖ȳ_t − ȳ_{t−1}‖ at t = 0); start: the position of tokens[0] (for the hover);
    highlight: one position (outlined); signed: the quantity is signed (a difference, a coefficient: the
    diverging scale even when every value has one sign), False: a magnitude, None: guess from the values."""
    t = len(tokens)
    values = check_1d("values", values, t).astype(np.float64)
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


def rgb_triplet(hex_color: str) -> str:
    """"#rrggbb" -> "r,g,b" (decimal, 0..255), for an rgba(...) CSS colour; the colour is one of ours, unchecked."""
    return ",".join(str(int(hex_color[i:i + 2], 16)) for i in (1, 3, 5))


@checked(tokens=Tokens())
def colored_tokens_html(tokens: Sequence[str], values: Any, *, value_name: str = "value") -> str:
    """The same as HTML spans (no plotly needed; each token escaped once, its value in the tooltip)."""
    values = check_1d("values", values, len(tokens)).astype(np.float64)
    _, _, zmin, zmax = _token_colors(values)
    lim = max(abs(zmin), abs(zmax)) or 1.0
    spans = []
    for tok, v in zip(tokens, values):
        a = 0.0 if not np.isfinite(v) else min(abs(v) / lim, 1.0)
        rgb = rgb_triplet(POSITIVE_COLOR if v > 0 else NEGATIVE_COLOR)
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
    coeffs = check_shape("coeffs", coeffs, "(t, K) with t >= 1",
                          lambda shape: len(shape) == 2 and shape[0] >= 1).astype(np.float32)
    t, K = coeffs.shape
    x, hover = tokens_axis(tokens, t)
    boundary, highlight = check_position("boundary", boundary, t), check_position("highlight", highlight, t)
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
        names = [hover_escape(s) for s in (label_names if label_names is not None else range(len(mean_abs)))]
        if mean_abs.shape != (len(names), K):   # a cross-argument check: one row per label name
            raise refuse("mean_abs", f"shape (labels={len(names)}, K={K})", str(mean_abs.shape), verb="have")
    else:
        mean_abs, names = np.zeros((0, K), np.float32), []
    fig.add_trace(go.Heatmap(z=mean_abs, x=ks, y=names, **heat_colors(mean_abs, signed=False), showscale=True,
                             colorbar=colorbar("mean |c_k|", len=0.34, y=0.17, x=0.255, xanchor="left",
                                               thickness=8, nticks=4, side="top"),
                             # between columns 1 and 2; its title on top (on the right it ran into σ_i's ticks)
                             hovertemplate="%{y} · %{x}: %{z:.3f}<extra></extra>"), row=2, col=1)
    sv = np.zeros(0) if singular_values is None else check_1d("singular_values", singular_values)
    fig.add_trace(go.Bar(x=np.arange(1, len(sv) + 1), y=sv, marker_color=NEUTRAL_COLOR,   # ≥ 0: not the signed blue
                         hovertemplate="σ%{x}: %{y:.4f}<extra></extra>"), row=2, col=2)
    abl = np.zeros(0) if ablation is None else check_1d("ablation", ablation, K)
    fig.add_trace(go.Bar(x=ks[:len(abl)], y=abl, marker_color=[POSITIVE_COLOR if v > 0 else NEGATIVE_COLOR for v in abl],
                         hovertemplate="%{x}: Δloss %{y:+.4f}<extra></extra>"), row=2, col=3)
    if ablation is None:
        fig.add_annotation(text="not computed yet:<br>press “Δ loss: ablate each<br>template” or call .ablate()",
                           x=0.5, y=0.5, xref="x4 domain", yref="y4 domain", showarrow=False,
                           font=dict(size=11, color="#777"))
    if boundary is not None:
        vline(fig, boundary - 0.5, "#d62728", "dash", "boundary")
        fig.layout.shapes[-1].update(yref="y domain", y0=0, y1=1)
    if highlight is not None:
        fig.add_vrect(x0=highlight - 0.5, x1=highlight + 0.5, fillcolor="black", opacity=0.15, line_width=0, row=1, col=1)
    _token_ticks(fig, tokens, x, row=1, col=1)
    unit = f" ({loss_unit})" if loss_unit else ""
    fig.update_xaxes(title_text="position (tokens)", row=1, col=1)
    fig.update_yaxes(title_text="template k", row=1, col=1)
    fig.update_xaxes(title_text="template k", row=2, col=1)
    fig.update_yaxes(title_text=hover_escape(label_title), row=2, col=1)
    fig.update_xaxes(title_text="i (largest first)", row=2, col=2)
    fig.update_yaxes(title_text="σ_i", row=2, col=2)
    fig.update_xaxes(title_text="template k ablated", row=2, col=3)
    fig.update_yaxes(title_text="Δ loss" + unit, row=2, col=3)
    fig.update_annotations(font_size=13)
    fig.update_layout(title=dict(text=title or "κ-template inspector", x=0.01), height=height, showlegend=False,
                      margin=dict(l=60, r=20, t=80, b=50))
    return finish(fig)


# ---------------------------------------------------------------------------------------------- token memory
@checked(height=Height())
def memory_figure(weights: Any, written: Sequence[str], positions: Sequence[str], *, read_at: Sequence[str] | None = None,
                  layer: int | None = None, title: str | None = None, height: int = 480) -> go.Figure:
    """A compiled token memory over a text (`CGTLM.memory_reads`): weights (c, m) of each prompt slot (column:
    the token it writes, `written`, after the prompt token it read, `read_at`) at each position of the text
    (row: `positions`). A bright cell: at that position the memory raises that slot's token."""
    weights = as_array("weights", weights, "a (c, m) array of slot weights")
    if weights.ndim != 2:
        raise refuse("weights", "a (c, m) array of slot weights", f"shape {weights.shape}")
    c, m = weights.shape
    written = [str(t) for t in written]
    positions = [str(t) for t in positions]
    if len(written) != m or len(positions) != c or (read_at is not None and len(read_at) != m):
        raise refuse("written, read_at and positions", f"{m} slot tokens and {c} text tokens (the shape of weights)",
                     f"{len(written)}, {None if read_at is None else len(read_at)} and {len(positions)}", verb="hold")
    slots = [f"{j + 1}: {hover_escape(short_token(w))}" for j, w in enumerate(written)]
    full = [f"slot {j + 1}: after {hover_escape(repr(read_at[j]))} writes {hover_escape(repr(w))}" if read_at is not None
            else f"slot {j + 1}: writes {hover_escape(repr(w))}" for j, w in enumerate(written)]
    rows = [f"{i}: {hover_escape(short_token(t))}" for i, t in enumerate(positions)]
    custom = [[f"{full[j]}<br>at {hover_escape(repr(positions[i]))} (pos {i})" for j in range(m)] for i in range(c)]
    colors = heat_colors(weights, signed=True)
    fig = go.Figure(go.Heatmap(z=[[float(v) if np.isfinite(v) else None for v in row] for row in weights],
                               x=list(range(m)), y=list(range(c)), customdata=custom,
                               colorscale=colors["colorscale"], zmid=colors["zmid"], zmin=colors["zmin"],
                               zmax=colors["zmax"], colorbar=colorbar("slot weight"),
                               hovertemplate="%{customdata}<br>weight %{z:.3g}<extra></extra>"))
    fig.update_xaxes(title_text="prompt slot (the token it writes)", tickvals=list(range(m)), ticktext=slots,
                     tickangle=-60, tickfont=dict(size=9))
    fig.update_yaxes(title_text="position in the text", tickvals=list(range(c)), ticktext=rows, autorange="reversed",
                     tickfont=dict(size=9))
    where = f" at layer {layer}" if layer is not None else ""
    fig.update_layout(title=dict(text=hover_escape(title) if title else f"What the compiled memory writes{where}", x=0.01),
                      height=height, template="plotly_white")
    return finish(fig)
