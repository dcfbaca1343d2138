"""The run report (`python -m cgt_viz report RUN`): one self-contained HTML page, readable offline.

It holds: a title from the task and the run, training curves and the learning rate, the evaluation table
(columns in reading order: k, the losses, the accuracies, G), and, for a CGT whose task can draw
sequences, the views as static figures: the ȳ map (PCA of the tokens of a few sequences, coloured by
their labels), the smoothness strip and the template inspector of one sequence. plotly.js (from the
installed plotly package) is embedded once; every figure follows the page width.
"""
from __future__ import annotations

import errno
import html
import json
import math
import os
import stat
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

EVAL_ORDER = ("k", "n_scored", "loss_prompted", "loss_specialized", "loss_no_context", "loss_baseline",
              "acc_prompted", "acc_specialized", "acc_no_context", "acc_baseline", "gap_closed", "gap_closed_acc",
              "gap_closed_note", "spec_merge_max_diff")
VIEW_SEQUENCES = 16            # sequences whose tokens go into the report's ȳ map
VIEW_MAX_POINTS = 5000

CSS = ("body{font-family:sans-serif;margin:1.5em auto;max-width:1100px;padding:0 1em;color:#222}"
       "h1{font-size:1.5em;margin-bottom:.2em}.sub{color:#666;margin-top:0}"
       ".scroll{overflow-x:auto;max-width:100%}table{border-collapse:collapse;font-size:13px}"
       "td,th{padding:2px 10px;border-bottom:1px solid #eee;font-family:monospace;text-align:right;white-space:nowrap}"
       "th{background:#f6f6f6}td.note{white-space:normal;text-align:left;min-width:20em}"
       ".plot{width:100%;max-width:100%}.note{color:#666;font-size:13px}")


def eval_columns(rows: list[dict]) -> list[str]:
    """The evaluation table's columns: the known ones in reading order, then any others as they come."""
    seen = list(dict.fromkeys(k for row in rows for k in row))
    return [c for c in EVAL_ORDER if c in seen] + [c for c in seen if c not in EVAL_ORDER]


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def table_html(rows: list[dict]) -> str:
    cols = eval_columns(rows)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(
        f"<td{' class=note' if c.endswith('_note') else ''}>{html.escape(_cell(row.get(c, '')))}</td>" for c in cols)
        + "</tr>" for row in rows)
    return f"<div class='scroll'><table><tr>{head}</tr>{body}</table></div>"


def title_of(run: Path, info: dict, history: dict) -> tuple[str, str]:
    """(title, subtitle): the task and model first, the run folder and its progress after."""
    settings = info.get("settings", {})
    task = str(settings.get("task", "?"))
    args = settings.get("task_arg") or {}
    if isinstance(args, dict) and args:
        task += " (" + ", ".join(f"{k}={v}" for k, v in args.items()) + ")"
    steps = len(history.get("step", []))
    title = f"{info.get('model_class', 'model')} on {task} · {steps:,} steps"
    sub = (f"run folder {run.resolve()} · {history.get('seconds', 0):.1f} s"
           + (" · interrupted" if history.get("interrupted") else ""))
    return title, sub


def view_figures(model, task, seed: int = 0) -> list:
    """The ȳ map, smoothness strip and template inspector as static figures, for a CGT whose task draws
    sequences (raises otherwise; the caller reports why)."""
    from . import analysis as A
    from .figures import smoothness_figure, template_figure, ybar_map_figure

    A.require_cgt(model)
    seqs = A.prepare_sequences(model, task, n_batches=1, batch_size=VIEW_SEQUENCES, seed=seed)
    ybar = A.collect_ybar(model, seqs.inputs)
    pts = A.collect_points(seqs, ybar)
    strata = pts.label.astype(str) if pts.label is not None else pts.seq
    keep = A.stratified_subsample(strata, VIEW_MAX_POINTS, seed)
    pts = pts.take(keep)
    coords = A.Projector("pca", seed=seed).fit_transform(pts.ybar)
    by = seqs.label_name if pts.label is not None else "position"
    colour = pts.label.astype(str) if pts.label is not None else pts.pos
    figs = [ybar_map_figure(coords, colour, pts.hover, color_name=by, title=f"ȳ of {len(pts):,} tokens · PCA",
                            note=f"{len(np.unique(pts.seq))} sequences drawn with seed {seed}")]
    i = 0
    length = int(seqs.lengths[i])
    labels = None if seqs.token_labels is None else seqs.token_labels[i]
    boundary = int(seqs.boundary[i]) if seqs.boundary is not None and 0 <= seqs.boundary[i] < length else \
        A.label_boundary(labels, length)
    tokens = seqs.token_text[i]
    figs.append(smoothness_figure(ybar[i, :length], tokens, boundary=boundary, title=f"Smoothness of ȳ · sequence {i}"))
    layer, name = model.template_sites[0]
    site = f"{layer}.{name}"
    valid = np.arange(seqs.t)[None, :] < seqs.lengths[:, None]
    group = (seqs.token_labels[valid].astype(str) if seqs.token_labels is not None
             else np.full(int(valid.sum()), "all tokens"))
    names, means = A.mean_abs_by_label(A.site_coefficients(model, ybar[valid], site), group)
    figs.append(template_figure(A.site_coefficients(model, ybar[i, :length], site), tokens, site=site,
                                boundary=boundary, highlight=length - 1, label_names=names, mean_abs=means,
                                singular_values=A.delta_w_singular_values(model, ybar[i, length - 1], site),
                                title=f"κ-template inspector · site {site} · sequence {i} · token {length - 1}"))
    return figs


def _loss_weight(run: Path, cfg: dict, name: str) -> float:
    """config[name] of a run's run.json as a loss weight: a finite number ≥ 0 (absent or null: 0), else refused
    naming the file and the field (a hand-edited run.json is data, not a traceback)."""
    from ._checks import refuse
    value = cfg.get(name)
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise refuse(f"config.{name} in {str(Path(run) / 'run.json')!r}", "a finite number >= 0", repr(value))
    return float(value)


def build_report(run: Path, info: dict, history: dict, load_model: Callable[[], tuple] | None = None,
                 evaluation: list[dict] | None = None) -> str:
    """The report page as a string. load_model() -> (model, task, info) gives the views (None: none)."""
    import plotly.graph_objects as go
    import plotly.io as pio

    from .figures import PLOTLY_CONFIG, training_curves_figure

    sections: list[tuple[str, list, str]] = []          # (heading, figures, note)
    cfg, settings = info.get("config") or {}, info.get("settings") or {}
    weights = ({"main": 1.0, "aux": _loss_weight(run, cfg, "w_aux"), "smooth": _loss_weight(run, cfg, "w_smooth")}
               if isinstance(cfg, dict) and "w_aux" in cfg else None)
    delay = settings.get("aux_delay") if isinstance(settings, dict) else None
    sections.append(("Training", [training_curves_figure(
        history, weights=weights, aux_delay=delay if isinstance(delay, int) and delay > 0 else None)], ""))
    if history.get("lr"):
        lr = go.Figure(go.Scatter(x=history["step"], y=history["lr"], mode="lines", name="lr"))
        lr.update_layout(title="Learning rate", height=260, template="plotly_white", margin=dict(l=50, r=20, t=50, b=40))
        sections[0][1].append(lr)
    views_note = ""
    views: list = []
    if load_model is not None:
        try:
            model, task, _ = load_model()
            views = view_figures(model, task)
        except Exception as err:     # the report still has everything else; it says why the views are missing
            views_note = f"No ȳ views: {type(err).__name__}: {err}"
    parts, js = [], [True]   # plotly.js goes with the first figure of the page (js is emptied then)

    def figures_html(figs) -> list[str]:
        return [pio.to_html(fig, full_html=False, include_plotlyjs=bool(js and js.pop()), default_width="100%",
                            config={**PLOTLY_CONFIG, "responsive": True}) for fig in figs]

    for heading, figs, note in sections:
        parts.append(f"<h2>{html.escape(heading)}</h2>")
        parts += figures_html(figs)
    if evaluation:
        parts.append("<h2>Evaluation</h2>" + table_html(evaluation))
    parts.append("<h2>What ȳ looks like</h2>")
    if views:
        parts += figures_html(views)
    else:
        parts.append(f"<p class='note'>{html.escape(views_note or 'No ȳ views for this run.')}</p>")
    esc = html.escape
    settings_rows = "".join(f"<tr><td style='text-align:left'>{esc(str(k))}</td><td style='text-align:left'>"
                            f"{esc(json.dumps(v))}</td></tr>"
                            for k, v in {**info.get("settings", {}), **info.get("config", {})}.items())
    title, sub = title_of(run, info, history)
    return (f"<!doctype html><html><head><meta charset='utf-8'><meta name='viewport' content='width=device-width'>"
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
            f"<h1>{esc(title)}</h1><p class='sub'>{esc(sub)}</p>{''.join(parts)}"
            f"<h2>Settings</h2><div class='scroll'><table>{settings_rows}</table></div></body></html>")


HISTORY_SERIES = ("step", "main", "aux", "smooth", "total", "lr", "grad_norm")


def _damaged(path: Path, what: str, field: str, want: str, value: Any) -> ValueError:
    from ._checks import describe
    return ValueError(f"{str(path)!r} is not {what} written by cgt_viz: {field} must be {want}, got {describe(value)}")


def check_history(history: Any, path: Path) -> dict:
    """history.json as the report reads it (a dict of per-step lists of numbers, `evals` a list of dicts,
    `seconds` a number); a ValueError naming the file and the field otherwise."""
    from ._checks import is_number
    what = "a training history"
    if not isinstance(history, dict):
        raise _damaged(path, what, "the file", "a JSON object of per-step lists", history)
    for name in HISTORY_SERIES:
        values = history.get(name, [])
        if not isinstance(values, list):
            raise _damaged(path, what, f"{name!r}", "a list of numbers (one per step)", values)
        bad = [v for v in values if not is_number(v)]          # NaN is a number: json writes it as NaN
        if bad:
            raise _damaged(path, what, f"{name!r}", "a list of numbers (one per step)", bad[0])
    lengths = {k: len(history[k]) for k in ("step", "main", "aux", "smooth", "total") if history.get(k)}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"{str(path)!r} is not a training history written by cgt_viz: its per-step lists must "
                         f"have one length, got lengths {lengths}")
    evals = history.get("evals", [])
    if not isinstance(evals, list) or any(not isinstance(e, dict) for e in evals):
        raise _damaged(path, what, "'evals'", "a list of JSON objects (one per evaluation)", evals)
    if not is_number(history.get("seconds", 0.0)):
        raise _damaged(path, what, "'seconds'", "a number", history["seconds"])
    return history


def check_evaluation(rows: Any, path: Path) -> list[dict]:
    """evaluation.json as the report reads it: a list of rows, each a JSON object (column: value)."""
    what = "an evaluation"
    if not isinstance(rows, list):
        raise _damaged(path, what, "the file", "a list of rows (JSON objects, one per prompt size)", rows)
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise _damaged(path, what, f"row {i}", "a JSON object (column: value)", row)
    return rows


def check_output(out: Path, flag: str = "--output", dash: bool = True) -> None:
    """The report's output path (or another command's `flag`) must be a regular file or a new path: anything
    else (a directory, a symbolic link, a FIFO, a device, a socket) would be replaced by a regular file or written
    through. dash: "-" (stdout) is allowed too (the caller handles it)."""
    try:
        mode = os.lstat(out).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISREG(mode):
        return
    kind = ("a directory" if stat.S_ISDIR(mode) else
            f"a symbolic link (to {os.readlink(out)!r})" if stat.S_ISLNK(mode) else
            "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else
            "a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode) else
            "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
    code = errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL
    allowed = "a regular file, a new path or - (stdout)" if dash else "a regular file or a new path"
    raise OSError(code, f"{flag} must be {allowed}, got {kind}", str(out))


def write_report(run, output, *, load_run: Callable, history_of: Callable, read_run: Callable) -> int:
    """What `python -m cgt_viz report` does (the CLI passes its run loaders, which check the run folder and
    name what is wrong with it): write the page, print where. output "-" writes the page to stdout."""
    from .io import atomic_write, read_json

    run = Path(run)
    out = None if output == "-" else Path(output) if output else run / "report.html"
    if out is not None:              # before the page is built: the flags first
        check_output(out)
    info = read_run(run)
    history = history_of(run)
    path = run / "evaluation.json"
    evaluation = check_evaluation(read_json(path), path) if path.is_file() else None
    page = build_report(run, info, history, load_model=lambda: load_run(run), evaluation=evaluation)
    if out is None:
        sys.stdout.write(page)
        sys.stdout.flush()
        return 0
    atomic_write(out, lambda tmp: Path(tmp).write_text(page, encoding="utf-8"))
    print(f"report written to {out}")
    return 0
