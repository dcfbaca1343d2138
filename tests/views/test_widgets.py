"""cgt_viz.widgets without a browser: state round trips, linked views, bad data, saved-state size."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import ipywidgets as W
import numpy as np
import pytest
import torch

from cgt_viz import CGT, CGTConfig, explore
from cgt_viz import analysis as A
from cgt_viz.widgets import CompileCompare, Explorer, SmoothnessStrip, TemplateInspector, TrainingMonitor
from cgt_viz.widgets import _base

from test_analysis import TopicTask, tiny_cgt

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model():
    return tiny_cgt(seed=1)


@pytest.fixture
def ex(model):
    torch.manual_seed(0)
    data = torch.randint(0, 256, (6, 20))
    return explore(model, data, labels=["a", "b", "c"] * 2, background=None)


def map_traces(ex):
    """The traces that draw the explorer's points (the last trace of its figure is the highlight overlay)."""
    return ex.figure.data[:ex._n_map]


def colors(fig):
    return np.asarray(fig.data[0].marker.color, dtype=float)


def drawn_xy(ex):
    """The coordinates the figure draws, back in point order (M, 2)."""
    out = np.zeros((len(ex.points), 2))
    for t, rows in zip(map_traces(ex), ex._groups or [np.arange(len(ex.points))]):
        out[rows] = np.column_stack([t.x, t.y])
    return out


def widget_tree(w):
    """w and every widget below it (children, figures, linked views)."""
    out, todo = [], [w]
    while todo:
        cur = todo.pop()
        out.append(cur)
        todo += [c for c in getattr(cur, "children", ()) if isinstance(c, W.Widget)]
    return out


def embed_size(w) -> tuple[int, dict]:
    state = W.Widget.get_manager_state(widgets=widget_tree(w))["state"]
    return len(json.dumps(state)), state


# ---------------------------------------------------------------------------------------------- explorer
def trace_points(ex):
    """{trace name: the drawn points it holds} (the explorer's own mapping) and the points' colours."""
    groups = ex._groups or [np.arange(len(ex.points))]
    return {t.name: g for t, g in zip(map_traces(ex), groups)}


def test_colour_by_changes_trace_colours(ex):
    assert ex.color_by == "label" and len(ex.points) == 120
    # a categorical colouring: one trace per category, in the legend, each its own colour, no colour bar
    by = trace_points(ex)
    assert list(by) == ["a", "b", "c"] and all(t.showlegend for t in map_traces(ex))
    assert len({t.marker.color for t in map_traces(ex)}) == 3
    for name, rows in by.items():
        assert set(ex.points.label[rows]) == {name}
        trace = next(t for t in map_traces(ex) if t.name == name)
        assert np.allclose(np.column_stack([trace.x, trace.y]), ex.coords[rows])
    assert sorted(np.concatenate(list(by.values())).tolist()) == list(range(120))
    ex.color_picker.value = "position"                                 # the UI path: dropdown -> figure
    assert ex.color_by == "position" and len(map_traces(ex)) == 1 and np.array_equal(colors(ex.figure), ex.points.pos)
    assert ex.figure.data[0].marker.colorbar.title.text == "position" and ex.figure.data[0].marker.showscale
    ex.set_color("document")
    assert [t.name for t in map_traces(ex)] == [str(i) for i in range(6)]
    ex.set_color("excerpt half")
    assert [t.name for t in map_traces(ex)] == ["first", "second"]
    ex.set_color("token")                                               # the most frequent tokens, the rest "other"
    names = [t.name for t in map_traces(ex)]
    assert "other" in names and len(names) <= 13


def test_ybar_map_figure_numeric_ids_sort_as_numbers():
    from cgt_viz.figures import ybar_map_figure
    fig = ybar_map_figure(np.zeros((4, 2)), [10, 2, 10, 1], color_kind="categorical", selected=[0])
    assert [t.name for t in fig.data] == ["1", "2", "10"]
    assert [list(t.selectedpoints) for t in fig.data] == [[], [], [0]]


def test_programmatic_selection_gives_the_right_rows(ex):
    ex.select([3, 25, 3, 64])
    df = ex.selection
    assert df["point"].tolist() == [3, 25, 64]
    for _, row in df.iterrows():
        p = int(row["point"])
        assert (row["sequence"], row["position"]) == (ex.points.seq[p], ex.points.pos[p])
        assert row["token_id"] == ex.seqs.inputs[row["sequence"], row["position"]].item()
        assert row["label"] == ["a", "b", "c"][row["sequence"] % 3]
        assert (row["x"], row["y"]) == pytest.approx(tuple(ex.coords[p]))
    drawn = {t.name: list(t.selectedpoints) for t in map_traces(ex)}     # the map shows it: per-trace indices
    by = trace_points(ex)
    assert sorted(int(by[n][i]) for n, sel in drawn.items() for i in sel) == [3, 25, 64]
    assert "3 points selected" in ex.selection_info.value
    xy = ex.coords
    ex.select_box((0, xy[:, 0].max()), (0, xy[:, 1].max()))
    inside = np.nonzero((xy[:, 0] >= 0) & (xy[:, 1] >= 0))[0]
    assert ex.selection["point"].tolist() == inside.tolist()
    big = 10 * np.abs(xy).max()
    ex.select_lasso([-big, big, big, -big], [-big, -big, 0, 0])       # the lower half plane
    assert set(ex.selection["point"]) == set(np.nonzero(xy[:, 1] < 0)[0])
    ex.select([])
    assert ex.selection.empty


def test_browser_selection_and_click_messages_reach_python(ex):
    """What plotly's frontend sends on a lasso and on a click (the js2py points callback message)."""
    def message(event, inds):
        return {"new": {"event_type": event, "points": {"trace_indexes": [0] * len(inds), "point_indexes": inds,
                                                        "xs": [0.0] * len(inds), "ys": [0.0] * len(inds)},
                        "device_state": None, "selector": None}}
    def message2(event, pairs):   # (trace, index in that trace) pairs
        return {"new": {"event_type": event, "points": {"trace_indexes": [t for t, _ in pairs],
                                                        "point_indexes": [i for _, i in pairs],
                                                        "xs": [0.0] * len(pairs), "ys": [0.0] * len(pairs)},
                        "device_state": None, "selector": None}}
    groups = ex._groups
    ex.figure._handler_js2py_pointsCallback(message2("plotly_selected", [(0, 1), (2, 3), (2, 0)]))
    assert ex.selection["point"].tolist() == sorted([groups[0][1], groups[2][3], groups[2][0]])
    ex.figure._handler_js2py_pointsCallback(message2("plotly_click", [(1, 4)]))
    seq, pos = int(ex.points.seq[groups[1][4]]), int(ex.points.pos[groups[1][4]])
    assert ex.strip.sequence == seq and ex.strip.highlight == pos
    # a click selects its point (no selector) and opens it even when the click message itself is lost
    ex.figure._handler_js2py_pointsCallback(message2("plotly_selected", [(2, 5)]))
    assert ex.selection["point"].tolist() == [groups[2][5]] and ex.strip.highlight == int(ex.points.pos[groups[2][5]])
    assert ex.strip.sequence == int(ex.points.seq[groups[2][5]])
    ex.figure._handler_js2py_pointsCallback(message2("plotly_click", [(1, 4)]))
    assert ex.strip is not None and ex.strip.sequence == seq and ex.strip.highlight == pos
    assert ex.inspector.sequence == seq and ex.inspector.token == pos
    assert list(ex.linked.children) == [ex.strip, ex.inspector]
    ex.open_point(0)                                                    # a second click updates in place
    assert ex.strip.sequence == int(ex.points.seq[0]) and list(ex.linked.children) == [ex.strip, ex.inspector]
    ex.figure._handler_js2py_pointsCallback(message2("plotly_deselect", []))
    assert ex.selection.empty


def test_switching_projection_changes_coordinates(ex):
    ex.projection_params["tsne"] = {"max_iter": 250}                     # the test needs a layout, not a good one
    pca = ex.coords.copy()
    ex.set_projection("tsne", wait=True)
    assert ex.projection == "tsne" and ex.projection_picker.value == "tsne"
    tsne = drawn_xy(ex)
    assert tsne.shape == pca.shape and not np.allclose(tsne, pca) and np.allclose(tsne, ex.coords)
    assert "t-SNE" in ex.figure.layout.xaxis.title.text and "ready" in ex.status.value
    ex.projection_picker.value = "pca"                                  # cached: no refit, coordinates back
    assert np.allclose(drawn_xy(ex), pca)
    assert "% of variance" in ex.figure.layout.xaxis.title.text


def test_background_fit_reports_status_and_applies_when_wanted(model, monkeypatch):
    ex = explore(model, torch.randint(0, 256, (3, 10)), background=None, projection_params={"tsne": {"max_iter": 250}})
    gate, fit = threading.Event(), A.Projector.fit_transform

    def held(self, *args, **kw):     # the fit waits until the test has looked at the state while it runs
        gate.wait(60)
        return fit(self, *args, **kw)
    monkeypatch.setattr(A.Projector, "fit_transform", held)
    ex.projection_picker.value = "tsne"                                 # UI pick: fits in a thread
    thread = ex._threads["tsne"]
    assert thread.is_alive() and "fitting in the background" in ex.status.value and ex.projection == "pca"
    gate.set()
    thread.join()
    assert ex.projection == "tsne" and "t-SNE ready" in ex.status.value


@pytest.mark.slow
def test_umap_fits_in_the_background_and_waits_to_be_picked(model):
    ex = explore(model, torch.randint(0, 256, (10, 20)), background="umap")
    assert ex.projection == "pca" and ex.coords.shape == (200, 2)      # first paint does not wait for UMAP
    ex._threads["umap"].join(timeout=600)
    assert "UMAP ready" in ex.status.value and "pick it under Projection" in ex.status.value
    assert ex.projection == "pca"                                        # not switched behind the user's back
    pca = ex.coords.copy()
    ex.projection_picker.value = "umap"                                  # cached: shown at once
    assert ex.projection == "umap" and "UMAP" in ex.figure.layout.xaxis.title.text
    assert not np.allclose(drawn_xy(ex), pca)


def test_subsampling_beyond_the_cap_is_stratified_and_visible(model):
    data = torch.randint(0, 256, (8, 40))
    ex = explore(model, data, labels=["x"] * 6 + ["rare"] * 2, max_points=50, background=None)
    assert len(ex.points) == 50 and ex.n_total == 320 and sum(len(t.x) for t in map_traces(ex)) == 50
    assert "showing 50 of 320 tokens" in ex.figure.layout.title.text and "stratified by label" in ex.figure.layout.title.text
    kept = dict(zip(*np.unique(ex.points.label, return_counts=True)))
    assert kept == {"rare": 12, "x": 38} or kept == {"rare": 13, "x": 37}


def test_add_places_new_points_with_the_cached_reducer(ex, model):
    reducer = ex.projectors["pca"]
    old = ex.coords.copy()
    new = torch.randint(0, 256, (2, 10))
    assert ex.add(new, labels=["new", "new"]) == 20
    assert len(ex.points) == 140 and sum(len(t.x) for t in map_traces(ex)) == 140 and ex.projectors["pca"] is reducer
    assert np.allclose(ex.coords[:120], old)
    expected = reducer.transform(A.collect_ybar(model, new).reshape(20, -1))
    assert np.allclose(ex.coords[120:], expected, atol=1e-5)
    assert ex.points.seq[120:].min() == 6 and "new" in set(ex.points.label)


def test_positions_option(model):
    data = torch.randint(0, 256, (4, 12))
    ex = explore(model, data, positions=3, background=None, linked=False)
    assert set(ex.points.pos) == {2, 5, 8, 11} and ex.color_by == "position"
    ex.open_sequence(0)                                                 # linked views off: nothing opens
    assert ex.strip is None


def test_explorer_from_a_task_colours_by_topic(model):
    ex = explore(model, TopicTask(), n_batches=1, batch_size=4, background=None)
    assert ex.label_name == "topic" and set(ex.points.label) == {"low", "high"}
    assert np.array_equal(ex.points.half, (ex.points.pos >= 10).astype(np.int8))


def test_saved_widget_state_stays_small(model):
    """A few thousand points: the state a notebook would save holds the drawn points, not ȳ or plotly.js."""
    data = torch.randint(0, 256, (100, 40))
    ex = explore(model, data, labels=[str(i % 5) for i in range(100)], background=None)
    ex.open_point(0)
    size, state = embed_size(ex)
    assert len(ex.points) == 4000 and size < 1_500_000, size
    ybar_bytes = ex.ybar_full.nbytes
    for model_state in state.values():
        s = model_state["state"]
        assert len(s.get("_esm", "")) < 10_000 and s.get("_bundle", "") == ""
        assert len(json.dumps(model_state)) < max(ybar_bytes, 1_000_000)


# ---------------------------------------------------------------------------------------------- smoothness
def test_smoothness_strip_shows_sequences_and_overlays(model):
    seqs = A.prepare_sequences(model, ["first text here", "the second text", "x"])
    other = tiny_cgt(seed=5)
    strip = SmoothnessStrip(model, seqs, other=other, names=("plain", "smooth"), sequence=1, highlight=2)
    lines = [t for t in strip.figure.data if t.type == "scatter"]
    assert [t.name for t in lines] == ["plain", "plain", "smooth", "smooth"]
    step, _ = A.token_smoothness(A.collect_ybar(model, seqs.inputs)[1, :15])
    assert np.allclose(np.asarray(lines[0].y, float)[1:], step[1:], atol=1e-5)
    strip.picker.value = 0                                               # UI: another sequence
    assert strip.sequence == 0 and strip.highlight is None and "sequence 0" in strip.figure.layout.title.text
    strip.show(2)                                                         # a one-token text still draws
    assert len(strip.figure.data[0].x) == 1


# ---------------------------------------------------------------------------------------------- templates
def test_template_inspector_site_token_and_ablation(model):
    data = torch.randint(0, 256, (4, 16))
    insp = TemplateInspector(model, data, labels=["p", "q", "p", "q"], sequence=2, token=5)
    heat = insp.figure.data[0]
    ybar = A.collect_ybar(model, data)
    assert np.allclose(np.asarray(heat.z), A.site_coefficients(model, ybar[2], "2.attn_in").T, atol=1e-5)
    insp.site_picker.value = "3.mlp_in"                                  # UI: another site
    assert insp.site == "3.mlp_in"
    assert np.allclose(np.asarray(insp.figure.data[0].z), A.site_coefficients(model, ybar[2], "3.mlp_in").T, atol=1e-5)
    assert list(insp.figure.data[1].y) == ["p", "q"]
    insp.token_slider.value = 9
    sv = A.delta_w_singular_values(model, ybar[2, 9], "3.mlp_in")
    assert insp.token == 9 and np.allclose(insp.figure.data[2].y, sv, atol=1e-5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = insp.ablate()
    assert np.allclose(insp.figure.data[3].y, result["delta"]) and "base loss" in insp.status.value
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    insp.show(sequence=0)
    assert insp.token == 15 and insp.seq_picker.value == 0


# ---------------------------------------------------------------------------------------------- compare
def test_compile_compare_slider_and_sequence(model):
    task = TopicTask()
    cmp = CompileCompare(model, task.get_batch(4, generator=torch.Generator().manual_seed(0)))
    assert cmp.split == 5                                                # half of the boundary at 10
    assert list(cmp.figure.data[0].x)[0] == 5 and [t.name for t in cmp.figure.data] == ["prompted", "specialized", "no-context"]
    cmp.slider.value = 12                                                # UI: the split slider
    assert list(cmp.figure.data[0].x) == list(range(12, 24))
    expected = A.compare_losses(model, cmp.seqs.inputs, cmp.targets, 12)
    assert np.allclose(cmp.figure.data[1].y, expected["specialized"], atol=1e-5)
    cmp.picker.value = 2
    one = A.compare_losses(model, cmp.seqs.inputs[2:3], cmp.targets[2:3], 12)
    assert np.allclose(cmp.figure.data[0].y, one["prompted"], atol=1e-5) and "sequence 2" in cmp.figure.layout.title.text


# ---------------------------------------------------------------------------------------------- monitor
def test_training_monitor_is_a_trainer_callback():
    from cgt_viz import train
    from cgt_viz.tasks import SyntheticICL
    task = SyntheticICL(family="shift", P=5, n_pairs=6)
    model = CGT(CGTConfig(**{**task.config_kwargs(), "n_layer": 2, "d_x": 16, "n_head": 2, "d_y": 8, "n_head_y": 2,
                             "y_layer": 1, "n_templates": 2}))
    monitor = TrainingMonitor(min_interval=0.0)
    train(model, task, steps=6, batch_size=4, eval_every=3, eval_batches=1, callbacks=[monitor], device="cpu",
          progress=False)
    kinds = [r["kind"] for r in monitor.history]
    assert kinds[0] == "start" and kinds.count("step") == 6 and kinds[-1] == "end" and "eval" in kinds
    names = [t.name for t in monitor.figure.data]
    # w_smooth = 0 (the start record says so): no smooth curve; the total underneath, main on top
    assert names[:3] == ["total", "aux", "main"] and any(n.startswith("val") for n in names[3:])
    assert len(monitor.figure.data[0].x) == 6 and "done" in monitor.status.value and "step 6 of 6" in monitor.status.value


def test_training_monitor_throttles_redraws():
    monitor = TrainingMonitor(min_interval=60.0)
    for step in range(3000):
        monitor({"kind": "step", "step": step, "main": 1.0, "aux": 1.0, "smooth": 0.0, "total": 2.0, "lr": 1e-3})
    assert monitor.redraws == 1 and len(monitor.figure.data[0].x) == 1      # only the first step drew
    monitor({"kind": "eval", "step": 3000, "val_main": 0.5})               # evaluations always draw
    drawn = monitor.figure.data[0].x                                          # thinned, the last step kept
    assert monitor.redraws == 2 and 1000 < len(drawn) <= monitor.max_points + 1 and drawn[-1] == 2999


# ---------------------------------------------------------------------------------------------- lean figure
def test_lean_figure_widget_ships_plotly_code_only_on_demand(monkeypatch):
    import plotly.graph_objects as go
    fw = _base.figure_widget(go.Figure(go.Scatter(x=[1, 2], y=[3, 4])))
    assert isinstance(fw, go.FigureWidget) and len(fw._esm) < 10_000 and fw._bundle == ""   # no kernel here
    sent = []
    monkeypatch.setattr(fw, "send", lambda content, buffers=None: sent.append(content))
    fw._on_custom_msg(fw, {"type": "cgt_viz_bundle_request"}, [])
    fw._on_custom_msg(fw, {"type": "something else"}, [])
    assert len(sent) == 1 and sent[0]["type"] == "cgt_viz_bundle" and len(sent[0]["text"]) > 1_000_000
    carrier = _base.LeanFigureWidget(go.Figure(), send_code=True)
    assert len(carrier.get_state()["_bundle"]) > 1_000_000                 # in the comm_open state
    _base._drop_bundles()                                                  # what runs after each cell
    assert carrier._bundle == ""
    monkeypatch.setenv("CGT_VIZ_EMBED_PLOTLY", "1")
    plain = _base.figure_widget(go.Figure())
    assert isinstance(plain, go.FigureWidget) and not isinstance(plain, _base.LeanFigureWidget)


def test_one_hook_on_the_kernel_follows_the_cells_for_figures_and_static_copies(monkeypatch):
    """_cells owns "which cell is running": a figure widget and a displayed view register one pair of hooks on
    the shell between them, and both read the same answer (a kernel faked here: no Jupyter in these tests)."""
    from types import SimpleNamespace

    import plotly.graph_objects as go

    from cgt_viz.widgets import _cells, _static
    hooks: dict[str, list] = {}
    shell = SimpleNamespace(kernel=object(),
                            events=SimpleNamespace(register=lambda event, fn: hooks.setdefault(event, []).append(fn)))
    monkeypatch.setattr(_cells, "kernel_shell", lambda: shell)
    monkeypatch.setattr(_cells, "_following", False)
    monkeypatch.setattr(_cells, "_running", False)
    monkeypatch.setattr(_static, "_shown", {})           # no view of another test is refreshed
    assert _base._send_code_now(shell)                    # the first figure of a session is made by a cell
    assert _cells.follow_cells()                          # a view displayed next asks too: nothing added
    assert {event: len(fns) for event, fns in hooks.items()} == {"pre_run_cell": 1, "post_run_cell": 1}
    carrier = _base.LeanFigureWidget(go.Figure())         # made in the cell: ships plotly's code
    assert carrier._send_code and len(carrier._bundle) > 1_000_000
    monkeypatch.setattr(_static, "_cell_has_carrier", True)
    hooks["post_run_cell"][0](None)
    assert not _cells.cell_running() and carrier._bundle == ""   # after the cell: the code dropped
    assert not _base._send_code_now(shell)                # a widget callback between cells ships no code
    hooks["pre_run_cell"][0](None)
    assert _cells.cell_running() and _base._send_code_now(shell) and not _static._cell_has_carrier


@pytest.mark.slow
def test_saved_notebook_with_an_explorer_is_small(tmp_path):
    """Run a notebook with an explorer (4,000 points) and a smoothness strip through nbclient, which stores
    widget state in the saved file like `jupyter nbconvert --execute` does, and weigh the file."""
    import nbclient
    import nbformat
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "import sys, torch\nsys.path.insert(0, %r)\nsys.path.insert(0, %r)\n"
        "from test_analysis import tiny_cgt\nfrom cgt_viz import explore, SmoothnessStrip\n"
        "torch.manual_seed(0)\nmodel = tiny_cgt()\ndata = torch.randint(0, 256, (100, 40))\n"
        "ex = explore(model, data, labels=[str(i %% 5) for i in range(100)], background=None)\nex"
        % (str(ROOT), str(ROOT / "tests" / "model"))),
        nbformat.v4.new_code_cell("SmoothnessStrip(model, ex.seqs, ybar=ex.ybar_full)")]
    client = nbclient.NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    path = tmp_path / "saved.ipynb"
    nbformat.write(nb, path)
    states = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    figures = [s for s in states.values() if s["model_name"] == "AnyModel"]
    assert len(figures) == 3 and all(s["state"].get("_bundle", "") == "" for s in figures)   # map, strip + its token view
    # the static form holds no plotly.js (exports add it once, cgt_viz.widgets.export.StaticViews); the
    # widgets add none either
    from cgt_viz.widgets._static import PLOTLY_JS_START
    plotly_js = (Path(__import__("plotly").__file__).parent / "package_data" / "plotly.min.js").stat().st_size
    html_outputs = [o["data"].get("text/html", "") for c in nb.cells for o in c.outputs if "data" in o]
    assert sum(h.count(PLOTLY_JS_START) for h in html_outputs) == 0
    assert "* plotly.js v" not in path.read_text()                                       # never uncompressed
    # widget state (~1 MB for 4,000 points) plus the static copy (plotly JSON + HTML, ≤ 5,000 points each)
    assert path.stat().st_size < 2_500_000 < plotly_js, path.stat().st_size   # not 5 MB per figure


# ---------------------------------------------------------------------------------------------- projector features
def test_search_neighbours_isolate_components_and_export(ex, tmp_path):
    df = ex.search("b", field="label")                                  # search by label
    assert len(df) == 40 and set(df["label"]) == {"b"} and len(ex.selection) == 40
    tok = str(ex.points.token[0])
    hits = ex.search(tok, field="token")
    assert len(hits) and all(tok.lower() in t.lower() for t in hits["token"])
    ex.search_box.value = "c"                                           # the UI path
    assert set(ex.selection["label"]) >= {"c"}
    nb = ex.neighbors(5, k=4)                                           # cosine in ȳ space, best first
    Y = ex.points.ybar.astype(float)
    cos = Y @ Y[5] / (np.linalg.norm(Y, axis=1) * np.linalg.norm(Y[5]))
    cos[5] = -np.inf
    assert nb["point"].tolist() == np.argsort(-cos)[:4].tolist() and np.allclose(nb["cosine"], np.sort(cos)[::-1][:4])
    ex.open_point(5)
    assert "nearest in ȳ" in ex.neighbours_info.value
    ex.set_components(2, 3)                                             # PC choice
    assert ex.components == (2, 3) and ex.figure.layout.xaxis.title.text.startswith("PC 2 (")
    centered = Y - Y.mean(0)
    assert np.isclose(np.var(ex.coords[:, 0], ddof=1), np.sort(np.linalg.eigvalsh(np.cov(centered.T)))[::-1][1], rtol=1e-3)
    ex.pc_picker.value = (1, 2)
    assert ex.components == (1, 2)
    ex.search("a", field="label")
    ex.isolate()                                                        # re-project the selection only
    assert len(ex.points) == 40 and set(ex.points.label) == {"a"} and "isolated" in ex.figure.layout.title.text
    with pytest.raises(ValueError, match="add needs every point shown"):
        ex.add(torch.randint(0, 256, (1, 4)))
    ex.show_all()
    assert len(ex.points) == 120 and ex.selection.empty
    with pytest.raises(ValueError, match="isolate needs a selection"):
        ex.isolate()
    ex.select([1, 2])
    path = ex.export(tmp_path / "sel.csv")
    assert open(path).read().splitlines()[0].startswith("point,sequence,position,token")
    ex.set_hidden(["b"])                                                # legend toggle from Python
    assert ex.hidden_categories == ["b"]
    xy = ex.coords
    ex.select_box((xy[:, 0].min(), xy[:, 0].max()), (xy[:, 1].min(), xy[:, 1].max()))
    assert "b" not in set(ex.selection["label"])                        # hidden points are not selected


def test_token_coloured_text_in_strip_inspector_and_compare(model):
    from cgt_viz.figures import colored_tokens_html, token_text_figure
    seqs = A.prepare_sequences(model, ["a <b>bold</b> text", "second one here"])
    strip = SmoothnessStrip(model, seqs, sequence=0, highlight=2)
    step, _ = A.token_smoothness(A.collect_ybar(model, seqs.inputs)[0, :int(seqs.lengths[0])])
    z = np.asarray(strip.tokens_figure.data[0].z, float).ravel()[:len(step)]
    assert np.allclose(z[1:], step[1:], atol=1e-5) and np.isnan(z[0])
    assert "&lt;b&gt;" in "".join(np.asarray(strip.tokens_figure.data[0].text).ravel())   # escaped once for plotly
    strip.show(1)
    assert "Sequence 1" in strip.tokens_figure.layout.title.text
    json.dumps(strip.tokens_figure.data[0].to_plotly_json()["z"], allow_nan=False)   # a widget sends z as JSON
    insp = TemplateInspector(model, seqs, sequence=0, token=3)
    insp.show(template=1)
    c = A.site_coefficients(model, A.collect_ybar(model, seqs.inputs)[0, :int(seqs.lengths[0])], insp.site)[:, 1]
    assert np.allclose(np.asarray(insp.tokens_figure.data[0].z, float).ravel()[:len(c)], c, atol=1e-5)
    assert len(insp.static_figures()) == 2
    fig = token_text_figure(["x", "y", "z"], [1.0, -2.0, 0.5], per_row=2, value_name="Δ")
    assert np.asarray(fig.data[0].z).shape == (2, 2) and fig.data[0].zmid == 0
    assert "&lt;a&gt;" in colored_tokens_html(["<a>"], [1.0])


def test_big_data_first_paints_a_preview_and_python_sees_every_point(model, monkeypatch):
    """Collecting ȳ of many tokens: the first paint shows some sequences (stratified by label), a
    background thread collects the rest; every attribute and method waits for it, so the results are the
    same as without a preview."""
    torch.manual_seed(0)
    data = torch.randint(0, 256, (24, 20))
    labels = ["a", "b", "c"] * 8
    full = explore(model, data, labels=labels, background=None, linked=False)
    assert not full.collecting
    monkeypatch.setattr(Explorer, "preview_tokens", 60)       # 480 tokens > 2 × 60: a preview of 3 sequences
    gate, collect = threading.Event(), A.collect_ybar

    def held(m, x, **kw):      # the background part waits until the test has looked at the preview
        if len(x) > 3:
            gate.wait(30)
        return collect(m, x, **kw)
    monkeypatch.setattr(A, "collect_ybar", held)
    ex = explore(model, data, labels=labels, background=None, linked=False)
    assert ex.collecting and len(ex._points) == 60 and sorted(labels[r] for r in ex._preview_rows) == ["a", "b", "c"]
    assert "preview" in ex.figure.layout.title.text and sum(len(t.x) for t in map_traces(ex)) == 60
    gate.set()
    assert len(ex.points) == 480 and not ex.collecting          # waits for the collection
    np.testing.assert_array_equal(ex.ybar_full, full.ybar_full)
    np.testing.assert_allclose(ex.coords, full.coords, atol=1e-5)
    assert (ex.points.hover == full.points.hover).all()
    assert sum(len(t.x) for t in map_traces(ex)) == 480 and "preview" not in ex.figure.layout.title.text
    assert ex.wait() is ex and ex.selection.empty


def test_three_d_map_from_python_and_the_toggle(ex):
    """set_projection(..., dims=3): a Scatter3d of PC 1-3 (the same first two PCs as the 2-D map); the
    selection lists z; box selection is refused; the toggle goes back to 2-D; the static copy is 3-D too."""
    flat = ex.coords.copy()
    ex.set_projection("pca", dims=3)
    assert ex.dims == 3 and ex.dims_picker.value == 3 and ex.coords.shape == (len(ex.points), 3)
    assert {t.type for t in map_traces(ex)} == {"scatter3d"} and len(map_traces(ex)) == 3     # one per label
    np.testing.assert_allclose(ex.coords[:, :2], flat, atol=1e-5)
    assert ex.figure.layout.scene.zaxis.title.text.startswith("PC 3") and "PCA 3-D" in ex.figure.layout.title.text
    xyz = np.zeros((len(ex.points), 3))
    for t, rows in zip(map_traces(ex), ex._groups):
        xyz[rows] = np.column_stack([t.x, t.y, t.z])
    np.testing.assert_allclose(xyz, ex.coords, atol=1e-6)
    ex.select([0, 3, 9])
    assert ex.selection.z.tolist() == pytest.approx(ex.coords[[0, 3, 9], 2].tolist())
    with pytest.raises(ValueError, match="2-D map"):
        ex.select_box((0, 1), (0, 1))
    static = ex.static_figures()[0]
    assert static.data[0].type == "scatter3d" and "PCA 3-D" in ex.static_text()
    ex.dims_picker.value = 2                                   # the toggle
    assert ex.dims == 2 and {t.type for t in map_traces(ex)} == {"scattergl"}
    np.testing.assert_allclose(drawn_xy(ex), flat, atol=1e-6)
    ex.set_projection("pca", dims=3)
    ex.set_components(2, 3)                                    # a pair of PCs is a 2-D map
    assert ex.dims == 2 and ex.dims_picker.value == 2 and ex.figure.data[0].type == "scattergl"


def test_three_d_from_explore_and_the_figure_function(model):
    torch.manual_seed(0)
    ex = explore(model, torch.randint(0, 256, (4, 20)), background=None, dims=3, linked=False)
    assert ex.figure.data[0].type == "scatter3d" and ex.coords.shape == (80, 3)
    ex.set_color("position")                                   # one trace with a colour bar, still 3-D
    assert len(map_traces(ex)) == 1 and map_traces(ex)[0].type == "scatter3d"
    assert A.Projector("pca", dims=3).fit_transform(ex.points.ybar).shape == (80, 3)
    from cgt_viz.figures import ybar_map_figure
    fig = ybar_map_figure(np.random.default_rng(0).normal(size=(10, 3)), ["a", "b"] * 5,
                          axis_names=("u", "v", "w"))
    assert [t.type for t in fig.data] == ["scatter3d"] * 2 and fig.layout.scene.zaxis.title.text == "w"


def test_a_one_off_static_copy_fades_the_unselected_points(ex):
    """show_static / static_html draw the selection as the live map does (the unselected points faint); the
    copy re-published after each cell leaves it out (see Explorer.static_figures)."""
    ex.select([3, 25, 64])
    snap = ex.snapshot_figures()[0]
    chosen = sorted(int(rows[i]) for t, rows in zip(snap.data, ex._groups) for i in (t.selectedpoints or ()))
    assert chosen == [3, 25, 64] and all(t.unselected.marker.opacity < 0.5 for t in snap.data[:ex._n_map])
    assert all(t.selectedpoints is None for t in ex.static_figures()[0].data[:ex._n_map])
    assert '"selectedpoints"' in ex.static_html(include_plotlyjs=False)


# ---------------------------------------------------------------------------------------------- widget state is JSON
def from_frontend(widget, method: str, payload: dict) -> None:
    """A comm message as the page sends it: "update" (synced traits, through the widget's deserialisers:
    plotly's turns the string "_undefined_" into its `Undefined` sentinel) or "custom" (`model.send`)."""
    data = {"method": "update", "state": payload, "buffer_paths": []} if method == "update" else \
        {"method": "custom", "content": payload}
    widget._handle_msg({"content": {"data": data}, "buffers": []})


def non_json_states() -> list[str]:
    """Every live widget whose state (what a reloaded page asks for) is not strict JSON, with the reason:
    numpy arrays travel as binary buffers; everything else must pass json.dumps(allow_nan=False)."""
    from ipywidgets.widgets.widget import _instances, _remove_buffers
    bad = []
    for w in list(_instances.values()):
        state, _paths, _buffers = _remove_buffers(w.get_state())
        try:
            json.dumps(state, allow_nan=False)
        except (TypeError, ValueError) as err:
            bad.append(f"{type(w).__name__}: {err}")
    return bad


def points_message(event: str, pairs, selector=None) -> dict:
    """plotly's points callback payload for (trace, index in that trace) pairs."""
    return {"event_type": event, "device_state": {"alt": False, "ctrl": False, "meta": False, "shift": False,
                                                  "button": 0, "buttons": 0},
            "points": {"trace_indexes": [t for t, _ in pairs], "point_indexes": [i for _, i in pairs],
                       "xs": [0.0] * len(pairs), "ys": [0.0] * len(pairs)}, "selector": selector}


def test_widget_state_stays_json_through_selections_isolate_and_show_all(ex):
    """The messages the page sends on a lasso (recorded from plotly.js in JupyterLab: the outline's opacity
    and line colour come as undefined), a click, a selection from Python, Isolate and Show all: after each,
    every widget's state is strict JSON, and the map's faded points follow the selection."""
    assert non_json_states() == []
    fig, groups = ex.figure, ex._groups
    outline = {"xref": "x", "yref": "y", "opacity": "_undefined_", "line": {"color": "_undefined_", "width": 1,
               "dash": "dot"}, "type": "path", "path": "M-1,0.7L1.8,0.7L1.8,-1.2L-1,-1.2Z"}
    lasso = [(0, 1), (1, 2), (2, 0), (2, 3)]
    selector = {"type": "lasso", "selector_state": {"xs": [-1, 1.8, 1.8, -1], "ys": [0.7, 0.7, -1.2, -1.2]}}
    # the trait path, the selection and the outline in one merged update (what a busy kernel receives)
    from_frontend(fig, "update", {"_js2py_pointsCallback": points_message("plotly_selected", lasso, selector),
                                  "_js2py_relayout": {"relayout_data": {"selections": [outline]},
                                                      "source_view_id": "v1"}})
    want = sorted(int(groups[t][i]) for t, i in lasso)
    assert ex.selection["point"].tolist() == want and "4 points selected" in ex.selection_info.value
    kept = fig.get_state("_widget_layout")["_widget_layout"]["selections"]      # what a reloaded page draws
    assert kept == [{"xref": "x", "yref": "y", "line": {"width": 1, "dash": "dot"}, "type": "path",
                     "path": outline["path"]}]
    assert non_json_states() == [], "after a lasso"
    # the loader's own message (a selection sent apart from the synced traits), then a click opening views
    box = [(0, 0), (1, 0)]
    from_frontend(fig, "custom", {"type": "cgt_viz_points", "data": points_message("plotly_selected", box)})
    assert ex.selection["point"].tolist() == sorted(int(groups[t][i]) for t, i in box)
    from_frontend(fig, "custom", {"type": "cgt_viz_points", "data": points_message("plotly_click", [(1, 3)])})
    assert ex.strip is not None and ex.strip.sequence == int(ex.points.seq[groups[1][3]])
    assert non_json_states() == [], "after a click opened the linked views"
    # a selection made in Python is drawn (selectedpoints per trace); Isolate and Show all leave none faded
    xy = ex.coords
    ex.select_box((xy[:, 0].min(), np.median(xy[:, 0])), (xy[:, 1].min(), np.median(xy[:, 1])))
    chosen = ex.selection["point"].tolist()
    assert len(chosen) >= 2
    drawn = sorted(int(rows[i]) for t, rows in zip(map_traces(ex), groups) for i in (t.selectedpoints or ()))
    assert drawn == chosen and non_json_states() == []
    for action in (ex.isolate, ex.show_all):
        action()
        assert ex.selection.empty and "No selection" in ex.selection_info.value
        assert [t.selectedpoints for t in map_traces(ex)] == [None] * ex._n_map, action.__name__
        assert non_json_states() == [], action.__name__
    # a lasso in the isolated set and back
    ex.select(chosen[:2])
    ex.isolate()
    from_frontend(fig, "update", {"_js2py_relayout": {"relayout_data": {"selections": [outline]},
                                                      "source_view_id": "v1"}})
    ex.show_all()
    assert non_json_states() == [] and ex.selection.empty
    # the outline the page reported is gone from the state a reload draws (it belonged to the isolated map)
    assert "selections" not in fig.get_state("_widget_layout")["_widget_layout"]


def test_json_state_drops_plotly_sentinels_and_non_finite_numbers():
    from plotly.basedatatypes import Undefined
    state = {"a": Undefined, "b": [1.0, float("nan"), Undefined, {"c": float("inf"), "d": "x"}],
             "e": np.array([np.nan, 1.0])}
    out = _base.json_state(state)
    assert "a" not in out and out["b"] == [1.0, None, None, {"c": None, "d": "x"}]
    assert np.isnan(out["e"][0])                     # an array travels as a binary buffer: NaN is fine there
    json.dumps({k: v for k, v in out.items() if k != "e"}, allow_nan=False)
