"""Issue 34 item 4, small notebooks: a view's static form is one output per figure (so JupyterLab, which draws
the plotly JSON, shows every figure a reopened notebook holds) and never plotly.js; an export through
`StaticViews` carries plotly.js once; a saved notebook 01 with every view stays small; the tracked notebooks
have no outputs and the metadata JupyterLab writes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch

from cgt_viz import explore
from cgt_viz.widgets import SmoothnessStrip
from cgt_viz.widgets._static import OUTPUT_METADATA, PLOTLY_JS_START, PLOTLY_MIME, live_style
from cgt_viz.widgets.export import StaticViews, install_config

from test_analysis import tiny_cgt

ROOT = Path(__file__).resolve().parents[2]
SAVED_LIMIT = 2_000_000          # the bound on a saved notebook 01 with every view


@pytest.fixture(scope="module")
def ex():
    torch.manual_seed(0)
    return explore(tiny_cgt(seed=1), torch.randint(0, 256, (6, 20)), labels=["a", "b", "c"] * 2, background=None)


def _titles(bundle) -> str:
    return bundle[PLOTLY_MIME]["layout"]["title"]["text"]


def test_each_figure_of_a_view_is_an_output_of_its_own_without_plotly_js(ex):
    empty = ex.static_bundles()
    assert len(empty) == ex.static_slots == 3
    assert PLOTLY_MIME in empty[0] and all(PLOTLY_MIME not in b for b in empty[1:])   # map only: two empty slots
    ex.open_point(3)
    bundles = ex.static_bundles()
    want = [f.layout.title.text for f in ex.static_figures()]
    assert len(want) == 3 and [_titles(b) for b in bundles] == want                  # map, strip, inspector
    for bundle in bundles:
        assert PLOTLY_JS_START not in bundle["text/html"] and 'class="cgt-viz-static"' in bundle["text/html"]
    strip = SmoothnessStrip(ex.model, ex.seqs, ybar=ex.ybar_full, sequence=1)
    assert [_titles(b) for b in strip.static_bundles()] == [f.layout.title.text for f in strip.static_figures()]


def test_figures_beyond_the_last_slot_join_its_html(ex):
    ex.open_point(2)
    (only,) = ex.static_bundles(slots=1)
    assert only["text/html"].count('class="cgt-viz-static-plot"') == 3 and _titles(only) == ex.static_figures()[0].layout.title.text


def test_the_style_hides_every_static_output_of_its_view():
    style = live_style(3)
    rules = [line for line in style.splitlines() if ":has(.cgt-viz-view)" in line and ":not(" not in line]
    # one selector per static output: the live output followed by 1, 2, 3 outputs
    assert [r.count("+ .jp-OutputArea-child") for r in rules] == [2, 3, 4]


def _notebook(outputs_per_cell):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("view", outputs=outs) for outs in outputs_per_cell]
    return nb


def _static(html: str):
    return nbformat.v4.new_output("display_data", {"text/html": html, "text/plain": "v"}, metadata=OUTPUT_METADATA)


def test_an_export_carries_plotly_js_once(ex):
    bundles = ex.static_bundles()
    outs = [nbformat.v4.new_output("display_data", b, metadata=OUTPUT_METADATA) for b in bundles]
    nb = _notebook([outs, [_static(bundles[0]["text/html"])]])
    text = json.dumps(nb)
    assert PLOTLY_JS_START not in text
    out, _ = StaticViews().preprocess(nb, {})
    pages = [o["data"]["text/html"] for c in out.cells for o in c.outputs]
    assert [p.count(PLOTLY_JS_START) for p in pages] == [1, 0, 0, 0]             # the first static output
    # a notebook saved with CGT_VIZ_STATIC=embed (or by an older version) keeps the first of its copies
    old = _notebook([[_static(PLOTLY_JS_START + "</script>a")], [_static(PLOTLY_JS_START + "</script>b")]])
    out, _ = StaticViews().preprocess(old, {})
    assert [o["data"]["text/html"] for c in out.cells for o in c.outputs] == [PLOTLY_JS_START + "</script>a", "b"]


def test_install_config_makes_static_views_the_html_exporters_preprocessor(tmp_path):
    etc = tmp_path / "etc" / "jupyter"
    etc.mkdir(parents=True)
    (etc / "jupyter_server_config.json").write_text(json.dumps({"ServerApp": {"port": 9}}))
    written = install_config(str(tmp_path))
    assert sorted(Path(p).name for p in written) == ["jupyter_nbconvert_config.json", "jupyter_server_config.json"]
    server = json.loads((etc / "jupyter_server_config.json").read_text())
    assert server["ServerApp"] == {"port": 9}                                    # other settings kept
    name = "cgt_viz.widgets.export.StaticViews"
    assert server["HTMLExporter"]["preprocessors"] == [name]
    assert install_config(str(tmp_path)) == []                                   # once
    # nbconvert, run in that environment, reads it
    from nbconvert import HTMLExporter
    from traitlets.config import JSONFileConfigLoader
    config = JSONFileConfigLoader("jupyter_nbconvert_config.json", str(etc)).load_config()
    assert name in HTMLExporter(config=config).preprocessors


# ---------------------------------------------------------------------------------------------- the notebooks
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
STRIP = ["--keep-id", "--extra-keys", "metadata.language_info.version"]     # the Makefile's filter


def _tracked_notebooks() -> list[Path]:
    tracked = subprocess.run(["git", "ls-files", "*.ipynb"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    return [ROOT / p for p in tracked] or sorted(ROOT.glob("notebooks/*.ipynb"))


def test_tracked_notebooks_have_no_outputs_and_the_metadata_jupyterlab_writes():
    from ipykernel.ipkernel import IPythonKernel
    language = {k: v for k, v in IPythonKernel.language_info.items() if k != "version"}   # the version: per Python
    paths = _tracked_notebooks()
    assert any(p.parent.name == "notebooks" for p in paths)
    for path in paths:
        nb = json.loads(path.read_text(encoding="utf-8"))
        assert nb["metadata"]["kernelspec"] == KERNELSPEC, path.name
        assert nb["metadata"]["language_info"] == language, path.name
        assert "widgets" not in nb["metadata"], path.name
        for cell in nb["cells"]:
            if cell["cell_type"] == "code":
                assert cell["outputs"] == [] and cell["execution_count"] is None, path.name
            assert isinstance(cell["source"], list), path.name                   # as JupyterLab writes it


def test_tracked_notebooks_are_what_the_git_filter_writes():
    """`make lab` installs nbstripout as the notebooks' git filter: a tracked notebook must come out of it
    unchanged, else git would show every notebook as modified once the filter is set up."""
    pytest.importorskip("nbstripout")
    for path in _tracked_notebooks():
        out = subprocess.run([sys.executable, "-m", "nbstripout", *STRIP, "-t", str(path)], capture_output=True,
                             text=True, check=True).stdout
        assert out == path.read_text(encoding="utf-8"), f"{path.name} changes under nbstripout {' '.join(STRIP)}"
    assert " ".join(STRIP[1:]) in (ROOT / "Makefile").read_text() or all(
        s in (ROOT / "Makefile").read_text() for s in ("--keep-id", "metadata.language_info.version"))


@pytest.mark.slow
def test_saved_notebook_01_holds_no_plotly_js_and_its_export_one(tmp_path):
    """Notebook 01 executed as nbconvert --execute does it (nbclient, widget state stored; CGT_FAST=1), saved
    and weighed; its HTML export through StaticViews carries plotly.js once and every view's figures."""
    import nbclient
    from nbconvert import HTMLExporter

    nb = nbformat.read(ROOT / "notebooks" / "01_synthetic_icl.ipynb", as_version=4)
    env = dict(os.environ)
    os.environ.update(CGT_FAST="1", OMP_NUM_THREADS="1",
                      PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    try:
        nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                                resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(env)
    saved = tmp_path / "01.ipynb"
    nbformat.write(nb, saved)
    text = saved.read_text(encoding="utf-8")
    statics = [o for c in nb.cells for o in c.get("outputs", []) if o.get("metadata", {}).get("cgt_viz", {}).get("static")]
    figures = sum(PLOTLY_MIME in o["data"] for o in statics)
    assert figures >= 8                                  # monitor, compare (+ LoRA), strips, inspector: every figure
    assert text.count(PLOTLY_JS_START) <= 1 and saved.stat().st_size <= SAVED_LIMIT, saved.stat().st_size
    exporter = HTMLExporter()
    exporter.register_preprocessor(StaticViews, enabled=True)
    page = exporter.from_notebook_node(nb)[0]
    assert page.count('data-cgt-viz="plotly.js"') == 1
    assert page.count('class="cgt-viz-static-plot"') >= figures


def test_embed_mode_puts_plotly_js_in_the_first_output_of_a_view_only(ex, monkeypatch):
    from cgt_viz.widgets import _static
    monkeypatch.setenv("CGT_VIZ_STATIC", "embed")
    assert _static.mode() == "embed"
    ex.open_point(1)
    bundles = ex.static_bundles(include_plotlyjs=True)
    assert [b["text/html"].count(PLOTLY_JS_START) for b in bundles] == [1, 0, 0]
    monkeypatch.setenv("CGT_VIZ_STATIC", "json")
    assert all("text/html" not in b for b in ex.static_bundles())
