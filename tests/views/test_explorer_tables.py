"""Issue 34 (low): the neighbour table shows each neighbour in its text (a BPE fragment alone says little),
escaped; the explorer's status has a line of its own and its control rows wrap whole controls."""
from __future__ import annotations

import re

import torch

import cgt_viz

from test_analysis import tiny_cgt


def _explorer():
    torch.manual_seed(0)
    texts = ["The <b>match</b> ended two all.", "Shares fell as profits dropped."] * 2
    return cgt_viz.explore(tiny_cgt(seed=1), texts, labels=["a", "b"] * 2, background=None)


def test_the_neighbour_table_shows_each_neighbour_in_its_text_escaped():
    ex = _explorer()
    ex.open_point(5)
    table = ex.neighbours_info.value
    df = ex.neighbors(5, min(len(ex.points) - 1, 8))
    rows = re.findall(r"<tr><td>(\d+)</td>.*?</tr>", table)
    assert [int(r) for r in rows] == df["point"].tolist()[:len(rows)] and rows
    assert "<th>in context</th>" in table
    for point in df["point"].tolist()[:len(rows)]:
        context = str(ex.points.hover[point]).split("<br>")[1]
        assert f"<td>{context}</td>" in table and f"[{ex.points.token[point]}]" in re.sub(r"<[^>]+>", "", context).replace("&lt;", "<").replace("&gt;", ">")
    assert "<b>match</b>" not in table                 # the document's own markup stays text


def test_the_status_has_a_line_of_its_own_and_the_controls_wrap():
    ex = _explorer()
    assert ex.status in ex.children and all(ex.status not in getattr(c, "children", ()) for c in ex.children)
    rows = [c for c in ex.children if ex.color_picker in getattr(c, "children", ()) or ex.search_box in getattr(c, "children", ())]
    assert len(rows) == 2 and all(r.layout.flex_flow == "row wrap" for r in rows)


def test_a_background_fits_status_counts_from_when_it_was_asked_for(monkeypatch):
    """The status said the fit's own time ("UMAP ready (12.0 s)") while the map switched much later (the
    fit waited for ȳ and shared the CPU): it now says both, timed by the explorer's clock (replaced here)."""
    from cgt_viz.widgets import _projections
    ex = _explorer()
    now = [100.0]
    monkeypatch.setattr(_projections.time, "perf_counter", lambda: now[0])
    key = "umap"                                   # not what the pickers ask for: the status says how to show it
    ex._fit_asked = {key: 40.0}
    ex._fit_done(ex._set, key, 12.0)
    text = re.sub(r"<[^>]+>", "", ex.status.value)
    assert "60.0 s after it was asked for" in text and "the fit itself 12.0 s" in text and "pick it" in text
