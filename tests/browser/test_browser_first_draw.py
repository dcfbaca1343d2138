"""Every figure draws the first time, in JupyterLab in headless Chromium: the compile-and-compare view with its
LoRA plot (notebook 01) and the plain LoRA figure (notebook 05) have every trace in the page (`gd.data`) right
after the cell runs, with no reload. On cf282c5 the LoRA plot under compile-and-compare drew its axes and
title with no trace: the figure reached the page only in messages sent after the widget's comm opened.

Skipped without /usr/bin/chromium, unless CGT_REQUIRE_BROWSER=1 (CI)."""
from __future__ import annotations

import json

import nbformat
import pytest

from test_browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, _need_browser, jupyter_lab, open_and_run_all

pytestmark = pytest.mark.browser

CELL = r'''
import torch, cgt_viz
from cgt_viz import lora_baseline as lb, CGT, CGTConfig
from cgt_viz.figures import lora_compile_figure
torch.manual_seed(0)
model = CGT(CGTConfig(vocab_size=20, block_size=32, n_layer=2, d_x=16, n_head=2, d_y=8, n_head_y=1, y_layer=1,
                      n_templates=2, mlp_ratio=2)).eval()
rows = torch.randint(0, 20, (3, 16), generator=torch.Generator().manual_seed(0))
case = lb.PromptCase(rows[0, :8], lb.Continuations(rows[1:, :4], rows[1:, 1:5], torch.ones(2, 4, dtype=torch.bool)),
                     lambda m, p: lb.Continuations(rows[1:, 4:8], rows[1:, 5:9], torch.ones(2, 4, dtype=torch.bool),
                                                   lb.teacher_outputs(m, p, rows[1:, 4:8])))
res = lb.compare_methods(model, [case], steps=(0, 2), timing_repeats=1)
view = cgt_viz.CompileCompare(model, rows, split=8, lora=res)
view
'''
PLAIN = 'lora_compile_figure({"plain": res}, title="plain LoRA figure")'
COUNT_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot'))   // a mime-rendered plot is the output itself
    .filter(p => p.closest('.jp-OutputArea-output') && !p.closest('.cgt-viz-static'))
    .map(p => [String(p.layout && p.layout.title && p.layout.title.text), p.data ? p.data.length : -1])"""


def test_the_lora_plots_draw_their_traces_the_first_time(tmp_path):
    from playwright.sync_api import sync_playwright

    _need_browser()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(CELL), nbformat.v4.new_code_cell("print(len(view.lora_figure.data))"),
                nbformat.v4.new_code_cell(PLAIN), nbformat.v4.new_code_cell("print('CELLS-' + 'DONE')")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "first_draw.ipynb"
    nbformat.write(nb, path)
    with jupyter_lab(tmp_path, path) as (url, _work, _log), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            open_and_run_all(page, url, path.name)
            page.locator(".jp-OutputArea-output", has_text="CELLS-DONE").first.wait_for(timeout=180_000)
            in_python = int(page.evaluate("() => Array.from(document.querySelectorAll('.jp-OutputArea-output pre'))"
                                          ".map(e => e.textContent.trim()).find(t => /^[0-9]+$/.test(t))"))   # cell 2
            want = {"Compile and compare": None, "Compiling a prompt vs training a LoRA": in_python,
                    "plain LoRA figure": in_python}
            drawn = {}
            for _ in range(60):                  # the plots draw once plotly's code has loaded
                for cell in page.locator(".jp-Notebook .jp-Cell").all():
                    cell.scroll_into_view_if_needed()
                drawn = {key: n for title, n in page.evaluate(COUNT_JS) for key in want if title.startswith(key)}
                if len(drawn) == len(want) and all(n > 0 for n in drawn.values()):
                    break
                page.wait_for_timeout(500)
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "first_draw.png"), full_page=True)
        finally:
            browser.close()
    assert in_python >= 3
    assert set(drawn) == set(want), json.dumps(drawn)
    assert drawn["Compiling a prompt vs training a LoRA"] == in_python, json.dumps(drawn)   # every trace, at once
    assert drawn["plain LoRA figure"] == in_python and drawn["Compile and compare"] > 0, json.dumps(drawn)
