"""Every figure draws the first time: the state a page receives when a figure widget's comm opens already
holds the figure. (The figure used to follow in update messages right after the open, and anywidget drops
the messages to a model whose code has not started within its time limit: on a busy page the second figure
of a view, the LoRA plot under compile-and-compare, drew as empty axes until a reload.)"""
from __future__ import annotations

import json

import ipywidgets.widgets.widget as widget_module
import plotly.graph_objects as go
import plotly.io as pio
import pytest
import torch

import cgt_viz
from cgt_viz import lora_baseline as lb
from cgt_viz.figures import lora_compile_figure
from cgt_viz.widgets import _base


@pytest.fixture()
def opened(monkeypatch):
    """The state of every comm opened while the test runs: [(widget class name, state)]."""
    seen = []
    create = widget_module.comm.create_comm

    def spy(**kwargs):
        state = kwargs.get("data", {}).get("state", {})
        seen.append((state.get("_model_name"), state))
        return create(**kwargs)

    monkeypatch.setattr(widget_module.comm, "create_comm", spy)
    return seen


@pytest.mark.parametrize("embed", ["0", "1"])          # the lean widget, and plotly's own (CGT_VIZ_EMBED_PLOTLY=1)
def test_a_figure_widgets_first_state_is_its_figure(opened, monkeypatch, embed):
    monkeypatch.setenv("CGT_VIZ_EMBED_PLOTLY", embed)
    fig = go.Figure([go.Scatter(x=[1, 2], y=[3, 4], name="a"), go.Bar(x=[1], y=[2], name="b")])
    fig.add_hline(y=1)
    fig.update_layout(title="first")
    fw = _base.figure_widget(fig)
    figures = [state for name, state in opened if "_widget_data" in state]
    assert len(figures) == 1 and fw.comm is not None
    state = figures[0]
    assert [t["name"] for t in state["_widget_data"]] == ["a", "b"]
    assert [t["uid"] for t in state["_widget_data"]] == [t.uid for t in fw.data]   # the uids Python knows them by
    assert state["_widget_layout"]["title"]["text"] == "first" and len(state["_widget_layout"]["shapes"]) == 1
    assert state["_config"]["displaylogo"] is False


def _tiny_cgt():
    from cgt_viz import CGT, CGTConfig
    torch.manual_seed(0)
    return CGT(CGTConfig(vocab_size=20, block_size=32, n_layer=2, d_x=16, n_head=2, d_y=8, n_head_y=1, y_layer=1,
                         n_templates=2, mlp_ratio=2)).eval()


def test_the_lora_plot_of_compile_and_compare_opens_with_its_traces_in_the_white_template(opened):
    model = _tiny_cgt()
    rows = torch.randint(0, 20, (3, 16), generator=torch.Generator().manual_seed(0))
    case = lb.PromptCase(rows[0, :8], lb.Continuations(rows[1:, :4], rows[1:, 1:5], torch.ones(2, 4, dtype=torch.bool)),
                         lambda m, p: lb.Continuations(rows[1:, 4:8], rows[1:, 5:9], torch.ones(2, 4, dtype=torch.bool),
                                                       lb.teacher_outputs(m, p, rows[1:, 4:8])))
    res = lb.compare_methods(model, [case], steps=(0, 2), timing_repeats=1)
    view = cgt_viz.CompileCompare(model, rows, split=8, lora=res)
    first = [state for name, state in opened if "_widget_data" in state]
    assert len(first) == 2                                   # the losses, then the LoRA plot
    lora_state = first[1]
    assert len(lora_state["_widget_data"]) == len(view.lora_figure.data) >= 3
    assert json.loads(json.dumps(lora_state["_widget_data"], allow_nan=False))      # JSON as it travels: no NaN
    white = pio.templates["plotly_white"].layout.plot_bgcolor
    assert view.lora_figure.layout.template.layout.plot_bgcolor == white      # the template of every other view
    assert lora_state["_widget_layout"]["template"]["layout"]["plot_bgcolor"] == white
    assert lora_compile_figure({"x": res}).layout.template.layout.plot_bgcolor == white   # notebook 05's plot
