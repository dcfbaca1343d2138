"""Issue 26 items 3-5: one visual language across the figures, the training monitor, the explorer's marks.

Checked on the plain Figure objects the figure functions (and the widgets' figure_for / figure_static) return.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from cgt_viz import analysis as A
from cgt_viz import figures as Fg
from cgt_viz.widgets import CompileCompare, SmoothnessStrip, TemplateInspector, TrainingMonitor, explore
from cgt_viz.widgets._base import figure_widget
from cgt_viz.widgets.explorer import Explorer
from test_analysis import tiny_cgt

rng = np.random.default_rng(0)


@pytest.fixture(scope="module")
def model():
    return tiny_cgt(seed=1)


@pytest.fixture(scope="module")
def seqs(model):
    return A.prepare_sequences(model, torch.randint(0, 256, (4, 24), generator=torch.Generator().manual_seed(0)),
                               labels=["sport", "tech"] * 2, boundary=12)


def start_record(steps=1000, aux_delay=500, w_aux=1.0, w_smooth=0.0):
    return {"kind": "start", "step": 0, "steps": steps, "aux_delay": aux_delay, "aux_ramp": 0,
            "weights": {"main": 1.0, "aux": w_aux, "smooth": w_smooth}}


def run_records(n=800, aux_delay=500):
    recs = [start_record(aux_delay=aux_delay)]
    for s in range(1, n + 1):
        main = 3 * np.exp(-s / 300) + 0.5
        recs.append({"kind": "step", "step": s, "main": main, "aux": 2.0, "smooth": 0.3,
                     "total": main + (2.0 if s > aux_delay else 0.0), "lr": 1e-3})
        if s % 200 == 0:
            recs.append({"kind": "eval", "step": s, "val_main": main, "val_aux": 2.0, "val_total": main + 2.0})
    return recs


@pytest.fixture(scope="module")
def all_figures(model, seqs):
    """Every view's plain figure: {name: go.Figure}."""
    ybar = A.collect_ybar(model, seqs.inputs)
    strip = SmoothnessStrip(model, seqs, ybar=ybar, sequence=0, highlight=3)
    insp = TemplateInspector(model, seqs, ybar=ybar, sequence=1, token=5)
    cmp = CompileCompare(model, seqs, split=8, sequence=0)
    ex = Explorer(model, seqs, background=None)
    coeffs = rng.normal(size=(20, 4))
    return {
        "map": ex.figure_static(),
        "map_fn": Fg.ybar_map_figure(rng.normal(size=(30, 2)), np.arange(30), color_kind="continuous"),
        "smoothness": strip.figure_for(0, 3),
        "strip_tokens": strip.token_figure_for(0, 3),
        "inspector": insp.figure_for(),
        "inspector_tokens": insp.token_figure_for(),
        "compare": cmp.figure_for(),
        "compare_tokens": cmp.token_figure_for(0),
        "template_fn": Fg.template_figure(coeffs, [f"t{i}" for i in range(20)], label_names=["a", "b"],
                                          mean_abs=np.abs(rng.normal(size=(2, 4))), singular_values=[2.0, 1.0],
                                          ablation=[0.1, -0.2, 0.0, 0.3]),
        "step_profile": Fg.step_profile_figure({"m": {"positions": np.arange(10), "step_switch": np.ones(10),
                                                      "step_no_switch": np.ones(10), "boundary": 4, "window": 2,
                                                      "ratio": 1.0, "ratio_no_switch": 1.0}}),
        "training": Fg.training_curves_figure(run_records()),
    }


def axes_of(fig):
    """Every 2-D axis of a figure that has traces on it: (name, axis object)."""
    layout = fig.layout
    names = [k for k in layout.to_plotly_json() if k.startswith(("xaxis", "yaxis"))]
    return [(k, layout[k]) for k in names]


SIGNED_TITLES = ("ȳ", "c_", "L_spec − L_prompt")   # colour bars of signed quantities (not "mean |c_k|", "‖ȳ_t …")


# ------------------------------------------------------------------------------------------------ item 3
def test_every_heatmap_has_a_colour_bar(all_figures):
    heatmaps = 0
    for name, fig in all_figures.items():
        for tr in fig.data:
            if tr.type == "heatmap":
                heatmaps += 1
                assert tr.showscale is not False, (name, tr.name)
                assert tr.colorbar.title.text, (name, "a colour bar says what it shows")
                assert tr.colorbar.nticks and tr.colorbar.nticks <= 5, (name, "few ticks: they never overlap")
    assert heatmaps >= 7


def test_signed_quantities_use_one_diverging_scale_centred_at_zero(all_figures):
    want = Fg.plotly_scale(Fg.SIGNED_SCALE)
    for name, fig in all_figures.items():
        for tr in fig.data:
            if tr.type != "heatmap":
                continue
            z = np.asarray([[np.nan if v is None else v for v in row] for row in tr.z], float)
            signed = str(tr.colorbar.title.text).startswith(SIGNED_TITLES) or (np.nanmin(z) < 0 < np.nanmax(z))
            if not signed:
                assert Fg.plotly_scale(tr.colorscale) != want, (name, "magnitudes use the sequential scale")
                continue
            assert Fg.plotly_scale(tr.colorscale) == want, (name, tr.colorscale)
            assert tr.zmid == 0 and tr.zmin == -tr.zmax, (name, tr.zmin, tr.zmax)
    # positive is red everywhere: the top of the scale, the ablation bars, the HTML token spans
    assert want[-1][1].replace(" ", "") == "rgb(103,0,31)" and want[0][1].replace(" ", "") == "rgb(5,48,97)"
    bars = all_figures["template_fn"].data[3]
    assert bars.marker.color[0] == Fg.POSITIVE_COLOR and bars.marker.color[1] == Fg.NEGATIVE_COLOR
    html = Fg.colored_tokens_html(["up", "down"], [1.0, -1.0])
    up, down = html.split("</span>")[:2]
    assert Fg.rgb_triplet(Fg.POSITIVE_COLOR) in up and Fg.rgb_triplet(Fg.NEGATIVE_COLOR) in down


def test_robust_range_ignores_a_few_extreme_values():
    z = rng.normal(size=(50, 16))
    z[:, 3] = 40.0                            # one constant, saturating dimension
    r = Fg.robust_range(z, signed=True)
    assert r["zmid"] == 0 and r["zmax"] == -r["zmin"] and r["zmax"] <= 40.0
    fig = Fg.smoothness_figure(np.concatenate([rng.normal(size=(30, 15)), np.full((30, 1), 40.0)], 1))
    heat = fig.data[-1]
    assert heat.zmax < 10 and heat.zmin == -heat.zmax                     # not stretched to ±40 by one dimension


def test_every_axis_has_a_title(all_figures):
    for name, fig in all_figures.items():
        axes = axes_of(fig)
        assert axes, name
        for key, axis in axes:
            if axis.visible is False and name.endswith("tokens"):
                continue                      # the token strips draw text cells, their axes are hidden
            if axis.matches and axis.showticklabels is False:
                continue                      # a shared x axis: titled once, under the bottom panel
            assert axis.title.text, (name, key)


def test_names_not_ids_and_units(all_figures, model, seqs):
    insp = all_figures["inspector"]
    means = insp.data[1]
    assert list(means.y) == ["sport", "tech"] and insp.layout.yaxis2.title.text == "label"
    assert "nats/token" in insp.layout.yaxis4.title.text
    assert "nats/token" in all_figures["compare"].layout.yaxis.title.text
    assert "tokens" in all_figures["smoothness"].layout.xaxis3.title.text


def test_long_tokens_are_cut_with_an_ellipsis_and_whole_in_the_hover():
    long = "internationalisation"
    fig = Fg.token_text_figure(["a", long, "b"], [0.1, -0.5, 0.2])
    cells = [c for row in fig.data[0].text for c in row if c]
    assert "a" in cells and long not in cells and any(c.endswith("…") and len(c) <= Fg.TOKEN_CHARS for c in cells)
    assert any(long in c for row in fig.data[0].customdata for c in row)
    assert fig.data[0].colorbar.orientation == "h"                         # above the strip: ticks have room
    assert Fg.short_token("line\nbreak", 20) == "line⏎break"


def test_no_cloud_share_button(all_figures):
    for name, fig in all_figures.items():
        removed = set(fig.layout.modebar.remove or ())
        assert {"sendDataToCloud", "sendChartToCloud"} <= removed, name
    assert Fg.PLOTLY_CONFIG["showSendToCloud"] is False
    assert "sendDataToCloud" in Fg.PLOTLY_CONFIG["modeBarButtonsToRemove"]
    fw = figure_widget(all_figures["compare"])
    assert fw._config["showSendToCloud"] is False and "sendChartToCloud" in fw._config["modeBarButtonsToRemove"]


def test_plurals():
    assert Fg.plural(1, "point") == "1 point" and Fg.plural(2, "point") == "2 points"
    assert Fg.plural(1000, "sequence") == "1,000 sequences"


def test_one_point_selected_reads_singular(model, seqs):
    ex = Explorer(model, seqs, background=None)
    ex.select([3])
    assert "1 point selected from 1 sequence" in ex.selection_info.value
    ex.select([3, 30])
    assert "2 points selected from 2 sequences" in ex.selection_info.value


# ------------------------------------------------------------------------------------------------ item 4
def test_monitor_figure_drops_zero_weight_terms_and_marks_the_aux_delay():
    fig = Fg.training_curves_figure(run_records())
    names = [t.name for t in fig.data]
    assert "smooth" not in names and {"main", "aux", "total"} <= set(names)           # w_smooth = 0
    assert names.index("main") > names.index("total")                                   # main drawn on top
    marks = [s for s in fig.layout.shapes if s.name == Fg.AUX_MARKER]
    assert marks and all(s.x0 == 500 for s in marks)
    assert any("aux_delay = 500" in a.text for a in fig.layout.annotations)
    assert "step 800 of 1,000" in fig.layout.title.text
    assert fig.layout.yaxis.title.text and fig.layout.xaxis2.title.text


def test_monitor_total_is_defined_as_val_total():
    fig = Fg.training_curves_figure(run_records())
    total = next(t for t in fig.data if t.name == "total")
    main = next(t for t in fig.data if t.name == "main")
    # main + 1·aux at every step (val_total's definition), not the optimised total that jumps at step 500
    assert np.allclose(np.asarray(total.y) - np.asarray(main.y), 2.0)
    assert "total = main + 1·aux" in fig.layout.annotations[0].text
    plain = Fg.training_curves_figure([r for r in run_records() if r["kind"] != "start"])
    assert "total (as optimised)" in [t.name for t in plain.data]                     # weights unknown: named so


def test_monitor_smoothing_and_status():
    fig = Fg.training_curves_figure(run_records(), smoothing=0.9)
    raw = next(t for t in fig.data if t.name == "main (raw)")
    ema = next(t for t in fig.data if t.name == "main")
    assert raw.opacity < 1 and np.std(np.diff(ema.y)) <= np.std(np.diff(raw.y)) + 1e-12
    assert np.allclose(Fg.ema([1.0, 1.0, 1.0], 0.9), 1.0)                             # debiased: no ramp from 0
    monitor = TrainingMonitor(min_interval=0.0)
    for rec in run_records(400):
        monitor(rec)
    monitor.redraw()
    assert "step 400 of 1,000" in monitor.status.value and "ETA" in monitor.status.value
    assert "smooth" not in [t.name for t in monitor.figure.data]
    assert any(s.name == Fg.AUX_MARKER for s in monitor.figure.layout.shapes)
    monitor.smoothing_slider.value = 0.5
    assert monitor.smoothing == 0.5 and "main (raw)" in [t.name for t in monitor.figure.data]


# ------------------------------------------------------------------------------------------------ item 5
def test_search_hits_are_a_highlighted_trace(model, seqs):
    ex = Explorer(model, seqs, background=None)
    tok = str(ex.points.token[5])
    hits = ex.search(tok, field="token")
    overlay = ex.figure.data[-1]
    assert overlay.name.startswith("search") and len(overlay.x) == len(hits) > 0
    assert sorted(overlay.customdata) == sorted(hits["point"])
    xy = ex.coords[np.asarray(overlay.customdata)]
    assert np.allclose(np.column_stack([overlay.x, overlay.y]), xy)
    assert all(t for t in overlay.text[:Fg.HIGHLIGHT_LABELS])                        # labelled
    static = ex.figure_static()                                                       # the plain figure too
    assert static.data[-1].name.startswith("search") and len(static.data[-1].x) == len(hits)
    ex.open_point(2)                                                                  # a point and its neighbours
    overlay = ex.figure.data[-1]
    assert overlay.customdata[0] == 2 and len(overlay.x) == 1 + 8 and overlay.text[0].startswith("▶")
    assert ex.highlighted["point"].tolist()[0] == 2
    ex.set_projection("pca", dims=2)
    ex.set_components(2, 3)                                                           # the rings follow
    assert np.allclose(np.column_stack([ex.figure.data[-1].x, ex.figure.data[-1].y]),
                       ex.coords[np.asarray(ex.figure.data[-1].customdata)])
    ex.select([1, 2])
    ex.clear_button.click()                                                           # Clear: nothing marked
    assert ex.selection.empty and len(ex.figure.data[-1].x) == 0 and ex.neighbours_info.value == ""


def test_colour_by_token_gives_the_top_tokens_colours_and_other_grey(model):
    data = torch.randint(0, 6, (6, 20), generator=torch.Generator().manual_seed(1))
    data[:, ::2] = torch.randint(100, 256, (6, 10), generator=torch.Generator().manual_seed(2))  # many rare ones
    ex = explore(model, data, background=None, color_by="token")
    traces = ex.figure.data[:ex._n_map]
    names = [t.name for t in traces]
    assert names[0] == "other" and traces[0].marker.color == Fg.OTHER_COLOR      # underneath, grey
    assert len(names) == 13 and len({t.marker.color for t in traces[1:]}) == 12   # 12 tokens, 12 colours


def test_isolate_keeps_the_projection(model, seqs):
    ex = Explorer(model, seqs, background=None, projection_params={"tsne": {"max_iter": 250, "perplexity": 5}})
    ex.set_projection("tsne", wait=True)
    assert ex.projection == "tsne"
    ex.search("sport", field="label")
    ex.isolate()                          # t-SNE on the subset, fitted in the background; PCA meanwhile
    assert ex.projection_picker.value == "tsne"
    ex._threads["tsne"].join(timeout=120)
    assert ex.projection == "tsne" and len(ex.points) == len(ex.coords) == 48
    assert "t-SNE" in ex.figure.layout.xaxis.title.text and "isolated" in ex.figure.layout.title.text
    ex.show_all()                         # every point again, in t-SNE (cached from before the isolate)
    assert ex.projection == "tsne" and len(ex.points) == 96 and "t-SNE" in ex.figure.layout.xaxis.title.text
    ex.set_projection("pca")
    ex.search("tech", field="label")
    ex.isolate()
    assert ex.projection == "pca" and len(ex.points) == 48
