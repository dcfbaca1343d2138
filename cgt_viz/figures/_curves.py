"""Loss curves: compile-and-compare per position, loss differences with their interval, training curves."""
from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .._checks import Bool, Float, Height, Int, check_int, checked, describe, refuse
from ..analysis import training_series
from ._style import PALETTE, check_1d, finish, vline


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
    boundary: the topic switch (red dashed line); split: s (black dotted line). A position no row scores
    (NaN: a loss mask leaves it out, e.g. the random inputs u of synthetic ICL) is skipped and the line
    joins the scored ones.
    """
    found = {} if not isinstance(losses, dict) else \
        {name: next((k for k in keys if k in losses), None) for name, keys in CURVE_KEYS.items()}
    if not found or found["position"] is None:
        got = sorted(losses) if isinstance(losses, dict) else type(losses).__name__
        raise refuse("losses", f"a dict with 'position' (or 'positions') and per-position curves "
                               f"{[keys[0] for keys in list(CURVE_KEYS.values())[1:]]}", str(got))
    pos = check_1d(f"losses[{found['position']!r}]", losses[found["position"]])
    fig = go.Figure()
    styles = {"prompted": ("#1f77b4", "solid"), "specialized": ("#d62728", "solid"), "no_context": ("#7f7f7f", "dot")}
    for name, (color, dash) in styles.items():
        key = found[name]
        if key is not None:
            fig.add_trace(go.Scatter(x=pos, y=check_1d(f"losses[{key!r}]", losses[key], len(pos)), mode="lines+markers",
                                     name=name.replace("_", "-"), line=dict(color=color, dash=dash), marker=dict(size=4),
                                     connectgaps=True))
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
        vline(fig, boundary - 0.5, "#d62728", "dash", "boundary")
        fig.add_annotation(x=boundary - 0.5, y=1, yref="paper", text="topic switch", showarrow=False,
                           font=dict(color="#d62728"), xanchor="left")
    if split is not None:
        vline(fig, split - 0.5, "black", "dot", "split")
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
    pos = check_1d("positions", positions)
    mean = check_1d("diff", diff, len(pos))
    err = check_1d("sem", sem, len(pos))
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


def term_weights(weights: Any) -> dict | None:
    """The loss terms' weights of a training-curves figure: None, {term: w}, or a model config (its w_aux and
    w_smooth) -> {term: float w} or None; anything else is a TypeError naming `weights`."""
    if weights is None or isinstance(weights, dict):
        return None if weights is None else {k: float(v) for k, v in weights.items()}
    if hasattr(weights, "w_aux"):
        return {"main": 1.0, "aux": float(weights.w_aux), "smooth": float(getattr(weights, "w_smooth", 0.0))}
    raise refuse("weights", "None, a dict {term: weight} or a model config", describe(weights), TypeError)


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
    weights = term_weights(weights) if weights is not None else term_weights(info.get("weights"))
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
