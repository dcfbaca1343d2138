"""The run report: title, evaluation columns, the views as static figures, offline."""
from __future__ import annotations

import math
import re

from cgt_viz.__main__ import main
from cgt_viz.report import eval_columns, table_html


def test_eval_columns_in_reading_order():
    rows = [{"acc_prompted": 1.0, "gap_closed": 0.5, "k": 4, "loss_no_context": 2.0, "loss_prompted": 1.0,
             "n_scored": 10, "loss_specialized": 1.5, "extra": 3}]
    assert eval_columns(rows) == ["k", "n_scored", "loss_prompted", "loss_specialized", "loss_no_context",
                                  "acc_prompted", "gap_closed", "extra"]
    page = table_html([{"k": 1, "gap_closed": math.nan, "gap_closed_note": "<b>why</b>"}])
    assert "NaN" in page and "&lt;b&gt;why&lt;/b&gt;" in page and "class='scroll'" in page   # scrolls, not overflows


def test_report_of_an_icl_run_has_title_table_and_views(tmp_path, capsys):
    out = tmp_path / "run"                      # a generic folder name: the title comes from the task
    assert main(["train", "--task", "icl", "--task-arg", "n_pairs=6", "--task-arg", "P=5", "--out", str(out),
                 "--steps", "4", "--batch-size", "4", "--n-layer", "2", "--d-x", "16", "--n-head", "2",
                 "--d-y", "8", "--n-head-y", "2", "--y-layer", "1", "--n-templates", "2", "--eval-every", "2",
                 "--no-progress"]) == 0
    assert main(["evaluate", str(out), "--k", "2", "--n-batches", "1", "--batch-size", "4"]) == 0
    assert main(["report", str(out)]) == 0
    page = (out / "report.html").read_text()
    title = re.search(r"<h1>(.*?)</h1>", page).group(1)
    assert title.startswith("CGT on icl (") and "4 steps" in title and "Run run" not in page
    head = re.findall(r"<th>(.*?)</th>", page)
    assert head[:5] == ["k", "n_scored", "loss_prompted", "loss_specialized", "loss_no_context"]
    assert "loss_baseline" not in head                   # no baseline given: no NaN columns
    # the views, as static figures (plotly's JSON writes ȳ and κ as \u escapes)
    for words in (" tokens \\u00b7 PCA", "Smoothness of \\u0233", "-template inspector"):
        assert words in page, words
    assert page.count("Plotly.newPlot") >= 5 and "cdn.plot.ly" not in page.split("/*")[0]
    assert page.count("* plotly.js v") == 1 and len(page) < 4_815_814 + 2_000_000   # plotly.js once
