"""cgt_viz.figures: every figure function on tiny arrays (what is drawn, and errors for bad shapes)."""
from __future__ import annotations

import json

import numpy as np
import plotly.graph_objects as go

from cgt_viz import analysis as A
from cgt_viz import figures as Fg

rng = np.random.default_rng(0)


def shapes_at(fig: go.Figure) -> list[float]:
    return sorted(float(s.x0) for s in fig.layout.shapes if s.type == "line")


def test_ybar_map_categorical_and_continuous():
    coords = rng.normal(size=(50, 2))
    labels = np.array(["sport", "tech", "politics"] * 16 + ["sport", "tech"], dtype=object)
    fig = Fg.ybar_map_figure(coords, labels, [f"tok {i}" for i in range(50)], color_name="topic", note="50 tokens")
    assert [t.name for t in fig.data] == ["politics", "sport", "tech"]        # one trace per category, sorted
    assert all(t.type == "scattergl" and t.showlegend for t in fig.data) and sum(len(t.x) for t in fig.data) == 50
    assert len({t.marker.color for t in fig.data}) == 3 and fig.layout.legend.title.text == "topic"
    names, groups = Fg.map_groups(labels)
    sport = fig.data[1]
    assert np.allclose(np.column_stack([sport.x, sport.y]), coords[groups[1]].astype(np.float32))
    assert list(sport.hovertext[:2]) == ["tok 0", "tok 3"] and "50 tokens" in fig.layout.title.text
    cont = Fg.ybar_map_figure(coords, np.arange(50), color_kind="continuous", color_name="position").data[0]
    assert cont.marker.colorscale[0][1] != cont.marker.colorscale[-1][1] and np.allclose(cont.marker.color, np.arange(50))
    json.loads(fig.to_json())                                       # serialisable as is (static export)


def test_training_curves_skip_zero_terms_and_label_log_ticks():
    hist = {"step": [0, 1, 2], "main": [70.0, 60.0, 50.0], "aux": [3.0, 2.0, 1.0], "smooth": [0.0, 0.0, 0.0],
            "total": [73.0, 62.0, 51.0]}
    fig = Fg.training_curves_figure(hist)
    # w_smooth = 0: no flat curve; the total is drawn first (underneath), main last (on top); weights unknown:
    # the trainer's total, named as such
    assert [t.name for t in fig.data] == ["total (as optimised)", "aux", "main"]
    assert "smooth = 0 throughout" in fig.layout.annotations[0].text
    assert fig.layout.yaxis.type == "log" and fig.layout.yaxis.tickformat == "~g"  # 70, not a bare 7


def test_hover_escape_escapes_once_without_entities_plotly_cannot_show():
    assert Fg.hover_escape('say "hi" <b> & it\'s') == 'say "hi" &lt;b&gt; &amp; it\'s'


def test_color_spec_many_categories_hide_the_bar():
    spec = Fg.color_spec(np.arange(40) % 40, "document", "categorical")
    assert spec["showscale"] is False and spec["cmax"] == 39.5


def test_smoothness_figure_rows_overlay_boundary_highlight():
    ybar, other = rng.normal(size=(12, 4)), rng.normal(size=(12, 4))
    tokens = list("abcdefghijkl")
    fig = Fg.smoothness_figure(ybar, tokens, boundary=6, highlight=3, overlay={"smooth": other}, name="plain")
    lines = [t for t in fig.data if t.type == "scatter"]
    assert [t.name for t in lines] == ["plain", "plain", "smooth", "smooth"]
    step, cos = A.token_smoothness(ybar)
    assert np.allclose(np.asarray(lines[0].y, float)[1:], step[1:]) and np.allclose(np.asarray(lines[1].y, float)[1:], cos[1:])
    heat = [t for t in fig.data if t.type == "heatmap"][0]
    assert np.asarray(heat.z).shape == (4, 12)
    assert shapes_at(fig) == [5.5]                                  # boundary between tokens 5 and 6
    assert any(s.type == "rect" and s.x0 == 2.5 and s.x1 == 3.5 for s in fig.layout.shapes)
    assert list(fig.layout.xaxis3.ticktext) == tokens


def test_template_figure_panels():
    coeffs = rng.normal(size=(9, 4))
    fig = Fg.template_figure(coeffs, list("abcdefghi"), site="3.attn_in", boundary=4, highlight=2,
                             label_names=["x", "y"], mean_abs=np.ones((2, 4)), singular_values=np.array([3.0, 1.0]),
                             ablation=np.array([0.1, -0.2, 0.0, 0.3]))
    heat, means, sv, abl = fig.data
    assert np.allclose(np.asarray(heat.z), coeffs.T) and list(heat.y) == ["k0", "k1", "k2", "k3"]
    assert list(means.y) == ["x", "y"] and np.allclose(sv.y, [3.0, 1.0]) and np.allclose(abl.y, [0.1, -0.2, 0.0, 0.3])
    assert abl.marker.color[3] == Fg.POSITIVE_COLOR and abl.marker.color[1] == Fg.NEGATIVE_COLOR   # hurts red, helps blue
    assert "3.attn_in" in fig.layout.annotations[0].text
    empty = Fg.template_figure(coeffs)                                 # panels exist, empty, before anything is computed
    assert len(empty.data) == 4 and len(empty.data[3].y) == 0


def test_compare_figure_lines():
    losses = {"position": np.arange(5, 10), "prompted": np.ones(5), "specialized": np.full(5, 2.0),
              "no_context": np.full(5, 3.0)}
    fig = Fg.compare_figure(losses, boundary=7, split=5)
    assert [t.name for t in fig.data] == ["prompted", "specialized", "no-context"]
    assert np.allclose(fig.data[2].y, 3.0) and list(fig.data[0].x) == [5, 6, 7, 8, 9]
    assert shapes_at(fig) == [4.5, 6.5]
    theirs = {"positions": np.arange(3), "loss_prompted": np.ones(3), "loss_specialized": np.zeros(3), "split": 1}
    assert [t.name for t in Fg.compare_figure(theirs).data] == ["prompted", "specialized"]   # evaluate's spelling


def test_training_curves_figure_and_thinning():
    records = [{"kind": "step", "step": s, "main": 3.0 / (s + 1), "aux": 1.0, "smooth": 0.1, "total": 4.0, "lr": 1e-3}
               for s in range(5000)] + [{"kind": "eval", "step": 100, "val_main": 1.0, "gap_closed": 0.5}]
    fig = Fg.training_curves_figure(records, max_points=500)
    names = [t.name for t in fig.data]
    # lr is not a loss curve; the total first (drawn underneath), main last of the train curves (on top)
    assert names == ["total (as optimised)", "smooth", "aux", "main", "val_main", "gap_closed"]
    assert len(fig.data[0].x) <= 501 and fig.data[0].x[-1] == 4999 and fig.layout.yaxis.type == "log"
    assert len(Fg.thin(np.arange(10), 3)) <= 4 and Fg.thin(np.arange(10), 3)[-1] == 9
    assert np.array_equal(Fg.thin(np.arange(3), 10), np.arange(3))


def test_loss_difference_figure_has_band_switch_and_intervals():
    from cgt_viz.figures import loss_difference_figure
    pos = np.arange(10, 40)
    diff = np.where(pos < 25, -0.4, 0.6)
    sem = np.full(len(pos), 0.05)
    rng = np.random.default_rng(0)
    before, after = rng.normal(-0.4, 0.1, 64), rng.normal(0.6, 0.1, 64)
    fig = loss_difference_figure(pos, diff, sem, boundary=25, split=10, before=before, after=after)
    band, line = fig.data[0], fig.data[1]
    assert band.fill == "toself" and len(band.x) == 2 * len(pos)
    z = 1.959963984540054
    np.testing.assert_allclose(np.asarray(band.y)[: len(pos)], diff + z * 0.05)       # upper edge, then lower
    np.testing.assert_allclose(np.asarray(band.y)[len(pos):], (diff - z * 0.05)[::-1])
    np.testing.assert_allclose(np.asarray(line.y), diff)
    names = [t.name for t in fig.data]
    assert any(n.startswith("before the switch: -0.") and n.endswith("(helps)") for n in names), names
    assert any(n.startswith("after the switch: +0.6") and n.endswith("(hurts)") for n in names), names
    shapes = {s.name: s for s in fig.layout.shapes}
    assert shapes["boundary"].x0 == 24.5 and shapes["split"].x0 == 9.5
    assert any(a.text == "topic switch" for a in fig.layout.annotations)
    # a zero line: the sign is the answer
    assert any(s.y0 == 0 and s.y1 == 0 for s in fig.layout.shapes)


def test_loss_difference_figure_says_when_the_interval_straddles_zero():
    from cgt_viz.figures import loss_difference_figure
    pos = np.arange(5)
    fig = loss_difference_figure(pos, np.zeros(5), np.ones(5), boundary=2, before=[-1.0, 1.0, 0.5], after=[0.1])
    names = [t.name for t in fig.data]
    assert any("no clear effect" in n for n in names), names
    assert not any(n.startswith("after") for n in names)      # one row: no interval, no claim


def test_labels_of_points_close_together_take_different_places():
    """A point and its neighbours sit close together on the map: their labels go round their rings instead
    of all above them (where they overlapped); labels of points far apart stay above."""
    rng = np.random.default_rng(0)
    xy = rng.normal(size=(300, 2))
    xy[:8] = xy[0] + rng.normal(scale=1e-3, size=(8, 2))            # eight points on one spot
    xy[8], xy[9] = (-50.0, -50.0), (50.0, 50.0)                      # two far apart (the map's extent)
    trace = Fg.highlight_trace(xy, np.arange(10), ["▶ open"] + [f"{i}. tok{i}" for i in range(1, 10)])
    places = list(trace.textposition)
    assert len(set(places[:8])) == 8                                 # eight labels, eight places round the spot
    assert places[8:] == ["top center", "top center"]
    unlabelled = Fg.highlight_trace(xy, np.arange(3), ["", "", ""])
    assert list(unlabelled.textposition) == ["top center"] * 3
    three = Fg.highlight_trace(rng.normal(size=(5, 3)), np.arange(2), ["a", "b"])
    assert three.textposition == "top center"                        # 3-D: the view turns, no fixed place
