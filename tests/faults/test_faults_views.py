"""Faults from the third reliability round (issue 23) in the views, their exports and the report command:
a background import racing the notebook's next figure, formula injection in the CSV export, local files in
the PNG export, special files behind `report --output`, a one-point isolate, damaged run files, and status
lines escaped twice. Each test failed on the code before its fix (see docs/RELIABILITY.md)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from cgt_viz import CGT, CGTConfig
from helpers import record_png_renders

TESTS = Path(__file__).resolve().parents[1]   # tests/ (this file is in tests/faults/)
ROOT = TESTS.parent
TINY = ("CGT(CGTConfig(vocab_size=256, block_size=32, n_layer=2, d_x=16, n_head=2, d_y=8, n_head_y=1, y_layer=1, "
        "n_templates=2)).eval()")


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


def _tiny_cgt() -> CGT:
    torch.manual_seed(0)
    return eval(TINY)


# ------------------------------------------------------------------------ 1. no import on a background thread
@pytest.mark.slow
def test_a_notebook_draws_a_view_while_the_explorer_fits_in_the_background(tmp_path):
    """explore() and then, in the next cell, a template inspector, in a fresh kernel as `jupyter nbconvert
    --execute` runs them. The UMAP thread used to import umap (and with it pandas) while the inspector's
    figure was built, and plotly found pandas half-imported. The second cell draws inspectors for 3 s so
    that it spans the import every time (one inspector alone hit it now and then)."""
    import nbclient
    import nbformat
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
                    f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nimport time, torch, cgt_viz\n"
                    f"from cgt_viz import CGT, CGTConfig\ntorch.manual_seed(0)\nmodel = {TINY}\n"
                    "idx = torch.randint(0, 256, (8, 16))\nlabels = ['a', 'b'] * 4\n"
                    "ex = cgt_viz.explore(model, idx, labels=labels)"),
                nbformat.v4.new_code_cell(
                    "t0 = time.perf_counter()\nwhile time.perf_counter() - t0 < 3:\n"
                    "    inspector = cgt_viz.TemplateInspector(model, idx, labels=labels)")]
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute(env=_env())
    errors = [f"{o.ename}: {o.evalue}" for cell in nb.cells for o in cell.outputs if o.output_type == "error"]
    assert not errors, errors


@pytest.mark.slow
def test_the_explorers_threads_import_nothing():
    """Every module a fit or the ȳ collection needs is imported before its thread starts (a fresh process,
    so nothing is imported already; the preview path starts the collector, which starts the UMAP fit)."""
    code = textwrap.dedent(f"""
        import sys, threading, torch
        seen = []
        class Spy:
            def find_spec(self, name, path=None, target=None):
                if threading.current_thread() is not threading.main_thread():
                    seen.append((threading.current_thread().name, name))
        import cgt_viz
        from cgt_viz import CGT, CGTConfig
        from cgt_viz.widgets.explorer import Explorer
        torch.manual_seed(0)
        model = {TINY}
        sys.meta_path.insert(0, Spy())
        ex = cgt_viz.explore(model, torch.randint(0, 256, (8, 16)), background="tsne")
        Explorer.preview_tokens = 8         # 40 x 16 tokens: a preview, the rest collected in a thread
        big = cgt_viz.explore(model, torch.randint(0, 256, (40, 16)), labels=["a", "b"] * 20, background="umap")
        big.wait()
        for view in (ex, big):
            for thread in list(view._threads.values()):
                thread.join()
        assert "umap" in big._coords and "tsne" in ex._coords, (big.status.value, ex.status.value)
        print("imported on a thread:", seen)
        assert not seen
        """)
    proc = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def hostile_ex():
    """An explorer whose labels a spreadsheet would run as formulas, and one with a '<' (no fit thread)."""
    from cgt_viz import explore
    data = torch.randint(0, 256, (len(HOSTILE_LABELS), 6), generator=torch.Generator().manual_seed(0))
    return explore(_tiny_cgt(), data, labels=HOSTILE_LABELS, background=None)


HOSTILE_LABELS = ['=HYPERLINK("http://evil.example","click")', "+1", "-2", "@x", "\tx", "\rx", "plain", "a<b", "x\r=1+1"]


# ------------------------------------------------------------------------ 3. no formulas in the CSV export
def test_the_csv_export_quotes_cells_a_spreadsheet_would_run(hostile_ex, tmp_path):
    import csv
    ex = hostile_ex
    ex.select([])
    path = ex.export(tmp_path / "all.csv")
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(ex.points)
    assert {r["label"] for r in rows} == {"'" + lab for lab in HOSTILE_LABELS[:6]} | {"plain", "a<b", "x\r=1+1"}
    for r, token in zip(rows, ex.points.token.astype(str)):                 # tokens follow the same rule
        assert r["token"] == ("'" + token if token[:1] in ("=", "+", "-", "@", "\t", "\r") else token)
    for col in ("point", "sequence", "position", "token_id", "x", "y"):    # numbers untouched, minus signs too
        assert all(not r[col].startswith("'") for r in rows) and [float(r[col]) for r in rows]
    assert any(r["x"].startswith("-") for r in rows)
    ex.search("@x", field="label")                                          # the selection: the same rule
    with open(ex.export(tmp_path / "sel.csv"), newline="", encoding="utf-8") as f:
        assert {r["label"] for r in csv.DictReader(f)} == {"'@x"}
    assert set(ex.selection["label"]) == {"@x"}                             # Python gets the text as it is
    ex.select([])


# ------------------------------------------------------------------------ 11. a one-point isolate is refused
def test_isolating_one_point_is_refused_and_the_explorer_stays_usable(hostile_ex):
    ex = hostile_ex
    ex.select([5])                                                          # what a click selects
    with pytest.raises(ValueError, match=r"at least 2 points .*got 1 point \(point 5"):
        ex.isolate()
    ex.isolate_button.click()                                               # the button: said in the status line
    assert "at least 2 points" in ex.status.value
    assert ex.coords.shape == (len(ex.points), 2) and len(ex.selection) == 1
    assert ex.figure_static() is not None and "cgt-viz-static" in ex.static_html(include_plotlyjs=False)
    ex.select([1, 2, 3])                                                    # a real isolate still works after it
    ex.isolate()
    assert len(ex.points) == 3
    ex.show_all()
    assert len(ex.coords) == len(ex.points) > 3


# ------------------------------------------------------------------------ 15. status lines escaped once
def test_status_lines_escape_a_message_once(hostile_ex, tmp_path, monkeypatch):
    ex = hostile_ex
    ex._ui(lambda: ex.set_hidden(["<x>"]))                                  # how every button reports a refusal
    assert "&lt;x&gt;" in ex.status.value and "&amp;" not in ex.status.value, ex.status.value
    folder = tmp_path / "a<b"
    folder.mkdir()
    monkeypatch.chdir(folder)
    ex.export_button.click()                                                # writes ybar_selection.csv here
    assert "a&lt;b" in ex.status.value and "&amp;" not in ex.status.value, ex.status.value
    ex.search_box.value = "<nothing"                                        # the search box's "no match" line
    assert "&lt;nothing" in ex.selection_info.value and "&amp;" not in ex.selection_info.value
    ex.search_box.value = ""


# ------------------------------------------------------------------------ the report command
TINY_RUN = ["--task", "icl", "--task-arg", "n_pairs=4", "--task-arg", "P=5", "--n-layer", "2", "--d-x", "16",
            "--n-head", "2", "--d-y", "8", "--n-head-y", "1", "--y-layer", "1", "--n-templates", "2",
            "--mlp-ratio", "2", "--no-progress", "--device", "cpu"]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A finished two-step icl run (copied with _copy_run before a test changes it)."""
    from cgt_viz.__main__ import main
    out = tmp_path_factory.mktemp("report") / "run"
    assert main(["train", *TINY_RUN, "--out", str(out), "--steps", "2", "--batch-size", "4", "--eval-every", "0"]) == 0
    return out


def _copy_run(run: Path, dest: Path) -> Path:
    import shutil
    shutil.copytree(run, dest)
    return dest


def _report(capsys, *argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `python -m cgt_viz report ...` run through main() in this process; an
    exception escaping main() is what the user would see as a traceback, so it fails the test."""
    from cgt_viz.__main__ import main
    capsys.readouterr()
    code = main(["report", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("note: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


# ------------------------------------------------------------------------ 6. report --output: files only
def _fifo(path: Path) -> str:
    os.mkfifo(path)
    return "a FIFO"


def _symlink(path: Path) -> str:
    (path.parent / "target.html").write_text("keep me")
    path.symlink_to(path.parent / "target.html")
    return "a symbolic link"


def _directory(path: Path) -> str:
    path.mkdir()
    return "a directory"


SPECIAL = [_fifo, _symlink, _directory]


@pytest.mark.parametrize("make", SPECIAL, ids=[m.__name__[1:] for m in SPECIAL])
def test_report_output_refuses_anything_but_a_regular_file(trained_run, tmp_path, capsys, make):
    import stat
    path = tmp_path / "out.html"
    kind = make(path)
    before = os.lstat(path).st_mode
    code, out, err = _report(capsys, str(trained_run), "--output", str(path))
    line = _one_error_line(err)
    assert code == 3 and kind in line and repr(str(path)) in line and ".tmp" not in line, line
    assert "report written" not in out
    assert stat.S_IFMT(os.lstat(path).st_mode) == stat.S_IFMT(before)      # still what it was
    if make is _symlink:
        assert (tmp_path / "target.html").read_text() == "keep me"


def test_report_output_dash_writes_the_page_to_stdout(trained_run, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = _report(capsys, str(trained_run), "--output", "-")
    assert code == 0 and out.startswith("<!doctype html>") and out.rstrip().endswith("</html>"), (out[:200], err)
    assert "report written" not in out and not (tmp_path / "-").exists()


# ------------------------------------------------------------------------ 12. damaged run files
def _write(path: Path, obj) -> None:
    import json
    path.write_text(json.dumps(obj))


def _history_with(run: Path, **changes) -> None:
    import json
    history = json.loads((run / "history.json").read_text())
    history.update(changes)
    _write(run / "history.json", history)


DAMAGE = {
    "evaluation is a dict": (lambda run: _write(run / "evaluation.json", {"k": 4, "loss_prompted": 1.0}),
                             "evaluation.json", "the file"),
    "evaluation rows are strings": (lambda run: _write(run / "evaluation.json", ["k", "loss"]),
                                    "evaluation.json", "row 0"),
    "history step is an int": (lambda run: _history_with(run, step=3), "history.json", "'step'"),
    "history is a list": (lambda run: _write(run / "history.json", [1, 2]), "history.json", "the file"),
    "history loss is text": (lambda run: _history_with(run, main=["x", "y"]), "history.json", "'main'"),
    "history evals are numbers": (lambda run: _history_with(run, evals=[1]), "history.json", "'evals'"),
    "history seconds is text": (lambda run: _history_with(run, seconds="soon"), "history.json", "'seconds'"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_run_file_is_one_line_naming_the_file_and_the_field(trained_run, tmp_path, capsys, case):
    damage, file, field = DAMAGE[case]
    run = _copy_run(trained_run, tmp_path / "run")
    damage(run)
    code, out, err = _report(capsys, str(run))
    line = _one_error_line(err)
    assert code == 2 and file in line and field in line, line
    assert not (run / "report.html").exists()


# ------------------------------------------------------------------------ 4. the PNG draws no local file
PIXEL = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="


def _figure_with_urls() -> dict:
    """A stored plotly JSON whose images, image trace, map layers and geojson point at files and URLs."""
    return {"data": [{"type": "image", "source": "file:///etc/hostname"},
                     {"type": "choropleth", "geojson": "file:///home/user/secret.geojson", "locations": ["a"]},
                     {"type": "choroplethmap", "geojson": {"type": "FeatureCollection", "features": []}},
                     {"type": "sankey", "link": {"source": [0, 1], "target": [1, 2], "value": [1, 1]}}],
            "layout": {"images": [{"source": "file:///etc/passwd", "x": 0, "y": 0},
                                  {"source": " FILE:///etc/shadow"}, {"source": "secret.png"},
                                  {"source": "https://example.com/a.png"}, {"source": PIXEL}],
                       "template": {"layout": {"images": [{"source": "file:///root/logo.png"}]}},
                       "map": {"style": "file:///tmp/style.json",
                               "layers": [{"source": ["file:///tiles/{z}/{x}/{y}.png"], "sourcetype": "raster"}]},
                       "mapbox2": {"style": "open-street-map"}, "font": {"style": "italic"},
                       "title": {"text": "see file:///etc/passwd"}},
            "config": {"topojsonURL": "file:///topo/"}}


def test_the_png_sanitiser_keeps_only_inline_image_and_map_data():
    import json

    from cgt_viz.widgets import _png
    spec = _figure_with_urls()
    original = json.dumps(spec)
    safe, dropped = _png.safe_spec(spec)
    assert json.dumps(spec) == original                                     # the input is left alone
    text = json.dumps(safe["data"]) + json.dumps({k: v for k, v in safe["layout"].items() if k != "title"})
    assert "file:" not in text.lower() and "secret.png" not in text and "https:" not in text
    assert "topojsonURL" not in safe["config"]
    assert [im.get("source") for im in safe["layout"]["images"]] == [None] * 4 + [PIXEL]   # data: kept
    assert safe["data"][2]["geojson"]["type"] == "FeatureCollection"                       # inline JSON kept
    assert safe["data"][3]["link"]["source"] == [0, 1]                                     # sankey indices kept
    assert safe["layout"]["mapbox2"]["style"] == "open-street-map" and safe["layout"]["font"]["style"] == "italic"
    assert safe["layout"]["title"]["text"] == "see file:///etc/passwd"                    # text is not loaded
    assert len(dropped) == 10 and any("layout.images[0].source = 'file:///etc/passwd'" in d for d in dropped)


def test_the_png_render_entry_point_never_hands_chromium_a_file_url(monkeypatch):
    """figure_png (what a view's bundle and `--StaticViews.png=True` call) with a session that records
    the spec kaleido would draw: no browser needed."""
    import json
    import warnings

    import nbformat

    from cgt_viz.widgets import StaticPNGWarning, _png
    from cgt_viz.widgets._static import OUTPUT_METADATA, PLOTLY_MIME, PNG_MIME
    from cgt_viz.widgets.export import StaticViews
    drawn = record_png_renders(monkeypatch)
    try:
        with pytest.warns(StaticPNGWarning, match="file:///etc/passwd"):
            assert _png.figure_png(_figure_with_urls()) is not None
        nb = nbformat.v4.new_notebook()                                     # the nbconvert preprocessor path
        spec = _figure_with_urls()
        spec["layout"]["images"].append({"source": "file:///other"})        # not cached: drawn again
        out = nbformat.v4.new_output("display_data", data={PLOTLY_MIME: spec, "text/plain": "view"},
                                     metadata=OUTPUT_METADATA)
        nb.cells.append(nbformat.v4.new_code_cell("view", outputs=[out]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", StaticPNGWarning)
            StaticViews(png=True).preprocess(nb, {})
        assert PNG_MIME in nb.cells[0].outputs[0].data
    finally:
        _png._reset()
    assert len(drawn) == 2
    for spec in drawn:
        sent = json.dumps({"data": spec["data"], "layout": {k: v for k, v in spec["layout"].items() if k != "title"},
                           "config": spec["config"]})
        assert "file:" not in sent.lower() and PIXEL in sent
