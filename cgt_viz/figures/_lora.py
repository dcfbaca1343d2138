"""The LoRA study's figure: quality G against update time, compiling a prompt beside training a LoRA for it.

It draws `cgt_viz.lora_baseline.compare_methods`' results, for benchmarks/bench_lora_vs_compile.py, notebook 05
and the LoRA plot under `CompileCompare(lora=...)`."""
from __future__ import annotations

import html
import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .._checks import Constraint, checked, describe, refuse
from ..lora_baseline import METHOD_LABELS, check_lora_results
from ._style import finish

# one colour per method of compare_methods, the same in every panel (and in the legend, drawn once)
LORA_METHOD_COLORS = {"prompted": "#7f7f7f", "prompted_kv": "#1f77b4", "compile": "#d62728", "lora": "#2ca02c",
                      "lora_from_compile": "#9467bd", "no_context": "#000000"}


class _LoraResults(Constraint):
    """compare_methods' result or {task name: result} -> {task name: result} (`check_lora_results`)."""

    def check(self, name, value, args=None):
        return check_lora_results(value, name)

    def bad_values(self):
        return [["results"], {"icl": {"rows": []}}, 5]

    def shown(self, value):
        return "['icl']" if isinstance(value, dict) else type(value).__name__


class _Title(Constraint):
    def check(self, name, value, args=None):
        if value is not None and not isinstance(value, str):
            raise refuse(name, "None or a str", describe(value), TypeError)
        return value

    def bad_values(self):
        return [5, b"title"]


@checked(results=_LoraResults(), title=_Title())
def lora_compile_figure(results: dict[str, dict], title: str | None = None) -> go.Figure:
    """Quality G against update time (log x), one panel per task, one curve per method.

    results: {task name: {"summary": rows as `lora_baseline.summarize` gives them (optionally with a "prompted_kv"
    row)}}, or one `compare_methods` result. Methods with no update (prompting, no context) are horizontal
    reference lines at their G; the LoRA methods are curves over N (labelled), the compile and the KV-cache
    prefill single points."""
    names = list(results)
    # task names and the title are the caller's text: escaped as the views escape user text (plotly reads tags)
    fig = make_subplots(rows=1, cols=len(names), subplot_titles=[html.escape(str(n), quote=False) for n in names],
                        shared_yaxes=True)
    shown = set()
    for col, task in enumerate(names, start=1):
        rows = results[task]["summary"]
        for method in METHOD_LABELS:
            pts = sorted((r for r in rows if r["method"] == method), key=lambda r: (r["steps"] or 0))
            if not pts:
                continue
            legend = method not in shown
            shown.add(method)
            color = LORA_METHOD_COLORS[method]
            kw = dict(name=METHOD_LABELS[method], legendgroup=method, showlegend=legend,
                      line={"color": color}, marker={"color": color})
            if method in ("prompted", "no_context"):
                g = pts[0]["G"]
                if g is not None and math.isfinite(g):
                    fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", **kw), row=1, col=col)
                    fig.add_hline(y=g, line={"color": color, "dash": "dot"}, row=1, col=col)
                continue
            xs = [max(r["update_seconds"], 1e-6) * 1e3 for r in pts]
            text = [f"N={r['steps']}" if r["steps"] is not None else "" for r in pts]
            hover = [f"{METHOD_LABELS[method]} {t}<br>G {r['G']:.3f}, loss {r['loss']:.4f}<br>update "
                     f"{x:.2f} ms" for r, t, x in zip(pts, text, xs)]
            # an undefined G (a prompt that gains nothing over no context) is a gap in the curve: NaN is no JSON,
            # and a figure widget's state must be
            ys = [r["G"] if r["G"] is not None and math.isfinite(r["G"]) else None for r in pts]
            fig.add_trace(go.Scatter(x=xs, y=ys, text=text, hovertext=hover, hoverinfo="text",
                                     mode="lines+markers+text" if len(pts) > 1 else "markers",
                                     textposition="top center", marker_size=9, **kw), row=1, col=col)
        fig.update_xaxes(type="log", title_text="update latency per prompt (ms, log)", row=1, col=col)
    fig.update_yaxes(title_text="gap closed G (loss)", row=1, col=1)
    fig.update_layout(title=html.escape(title, quote=False) if title else
                      "Compiling a prompt vs training a LoRA for it: quality against update time",
                      height=480, width=520 * len(names) + 200)
    return finish(fig)      # the template and modebar of every other view
