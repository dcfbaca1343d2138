"""The README and the documentation site (`make docs`).

Without a built site: the README's results table and the results page say what the result files say, every
local link of the README resolves, and a tutorial is turned into its site form (static views, no widget state).
With the site (marker docs_site; `make test` builds it, then runs these with CGT_REQUIRE_DOCS=1): the API
reference lists every public name with its signature and docstring, and each tutorial page, opened from
file:// in Chromium with every other request refused, draws every view it holds.
"""
from __future__ import annotations

import html
import importlib
import inspect
import json
import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "docs" / "_build" / "html"
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "docs"))

import build  # noqa: E402  (docs/build.py)
import results_pages  # noqa: E402

from cgt_viz.widgets._static import WIDGET_MIME  # noqa: E402


def _need_site() -> None:
    if (SITE / "index.html").exists():
        return
    if os.environ.get("CGT_REQUIRE_DOCS") == "1":
        pytest.fail(f"{SITE} has no index.html and CGT_REQUIRE_DOCS=1 (run `make docs`)")
    pytest.skip("the site is not built (make docs)")


# ---------------------------------------------------------------------------------------------- README
def test_the_results_sections_say_what_the_result_files_say():
    assert results_pages.stale() == [], "run python benchmarks/results_pages.py"


def test_every_results_row_names_a_command_and_an_existing_file():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- results:begin -->")[1].split("<!-- results:end -->")[0]
    rows = [ln for ln in block.splitlines() if ln.startswith("| ") and not ln.startswith("| measured")]
    assert len(rows) >= 5
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert cells[2].startswith("`python "), row
        path = re.search(r"\(([^)]+\.json)\)", cells[3])
        assert path and (ROOT / path.group(1)).is_file(), row


def test_the_results_table_follows_a_changed_result_file(tmp_path):
    """The generator reads the file: a changed number in tasks.json changes the README row (no copy anywhere)."""
    for rel in (results_pages.TASKS, results_pages.TEXT_METRICS):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((ROOT / rel).read_text())
    data = json.loads((tmp_path / results_pages.TASKS).read_text())
    before = results_pages.table_cell(data["table"], "icl (k = 8, acc)", "gap closed G")
    data["table"] = data["table"].replace(f"| {before} |", "| 0.123 ± 0.456 |", 1)
    (tmp_path / results_pages.TASKS).write_text(json.dumps(data))
    table = results_pages.glance(tmp_path)
    assert "0.123 ± 0.456" in table and before not in table.split("Synthetic ICL")[1].split("\n")[0]


def test_every_local_link_of_the_readme_resolves():
    text = (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" not in target:
            assert (ROOT / target).exists(), target


def test_the_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    for heading in ("## Install", "## Two commands", "## The API", "## The notebooks", "## Results at a glance"):
        assert heading in text


# ---------------------------------------------------------------------------------------------- tutorials
def test_a_tutorial_becomes_static_views_without_widget_state():
    import nbformat

    from cgt_viz.widgets.export import StaticViews
    nb = nbformat.v4.new_notebook()
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    style = nbformat.v4.new_output("display_data", {"text/html": "<style></style>"}, metadata={"cgt_viz": {"style": True}})
    live = nbformat.v4.new_output("display_data", {WIDGET_MIME: {"model_id": "x"}, "text/plain": "view"},
                                  metadata={"cgt_viz": {"live": True}})
    static = nbformat.v4.new_output("display_data", {"text/html": "<div>plot</div>", "text/plain": "view"},
                                    metadata={"cgt_viz": {"static": True}})
    bar = nbformat.v4.new_output("display_data", {WIDGET_MIME: {"model_id": "y"}, "text/plain": "100%"})
    cell = nbformat.v4.new_code_cell("view", outputs=[style, live, static, bar])
    md = nbformat.v4.new_markdown_cell("![CGT](../docs/img/cgt.svg)")
    nb.cells = [md, cell, nbformat.v4.new_code_cell("   ")]
    out = build.site_notebook(nb, StaticViews())
    assert "widgets" not in out.metadata and "widgets" in nb.metadata          # the input is left alone
    assert out.cells[0].source == "![CGT](../img/cgt.svg)"
    assert len(out.cells) == 2                                                  # the empty cell is gone
    outputs = out.cells[1].outputs
    assert [o["data"].get("text/plain") for o in outputs] == ["view", "100%"]
    assert all(WIDGET_MIME not in o["data"] for o in outputs)


def test_the_site_names_what_is_missing_when_no_executed_copy_exists(tmp_path, monkeypatch):
    monkeypatch.setenv("CGT_DOCS_EXECUTED", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="01_synthetic_icl.ipynb.*make docs"):
        build.tutorials(ROOT)


# ---------------------------------------------------------------------------------------------- the site
@pytest.mark.docs_site
def test_the_api_reference_lists_every_public_name_with_signature_and_docstring():
    _need_site()
    for module, _title in build.API_MODULES:
        page = (SITE / "api" / f"{module}.html").read_text(encoding="utf-8")
        for name in build.public_names(module):
            anchor = f'id="{module}.{name}"'
            assert anchor in page, f"{module}.{name} is missing from api/{module}.html"
            entry = page.split(anchor, 1)[1]
            head, body = entry.split("</dt>", 1)
            obj = getattr(importlib.import_module(module), name)
            if callable(obj) and not (isinstance(obj, type) and issubclass(obj, BaseException)):
                shown = _text(head).replace(" ", "")
                params = [p for p in inspect.signature(obj).parameters if p not in ("self", "cls")]
                assert all(p in shown for p in params) and ("(" in shown or not params), f"{module}.{name}: {shown}"
            doc = inspect.getdoc(obj)
            if doc and not doc.startswith(f"{name}("):     # (a dataclass without a docstring of its own)
                words = "".join(re.sub(r"[`*]", "", doc).split()[:4])        # compared without white space:
                assert words in re.sub(r"[`*\s]", "", _text(body[:30_000])), (   # markup splits the text anywhere
                    f"{module}.{name}: its docstring is not on the page")


def _text(markup: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", markup)).replace("¶", " ").split())


VIEWS_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => ({
    drawn: !!(gd._fullLayout && gd.querySelector('.main-svg')),
    traces: (gd._fullData || []).length,
    points: (gd._fullData || []).reduce((n, t) => n + ['x', 'y', 'z', 'values', 'cells']
        .map(k => t[k] && t[k].length ? t[k].length : 0).reduce((a, b) => Math.max(a, b), 0), 0),
    title: String(gd.layout && gd.layout.title && gd.layout.title.text || '')}))"""


def _expected_plots(nb_path: Path) -> int:
    """How many plotly figures the site's copy of a notebook must draw: every figure of every static output
    (a view's static copy may hold several; a plain figure is turned into one by docs/build.py)."""
    nb = json.loads(nb_path.read_text())
    pages = ["".join(o.get("data", {}).get("text/html", "")) for c in nb["cells"] for o in c.get("outputs", [])]
    return sum(int(n) for page in pages for n in re.findall(r'class="cgt-viz-static" data-figures="(\d+)"', page))


@pytest.mark.docs_site
@pytest.mark.browser
def test_every_tutorial_page_draws_every_view_offline():
    _need_site()
    from test_browser import CHROMIUM, CHROMIUM_ARGS, _need_browser, _open_offline
    _need_browser()
    from playwright.sync_api import sync_playwright

    pages = sorted((SITE / "tutorials").glob("0*.html"))
    assert [p.stem for p in pages] == sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            for path in pages:
                want = _expected_plots(ROOT / "docs" / "tutorials" / f"{path.stem}.ipynb")
                page = browser.new_page(viewport={"width": 1200, "height": 900})
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                refused = _open_offline(page, path)
                if want:
                    page.wait_for_function(f"() => ({VIEWS_JS})().filter(v => v.drawn).length >= {want}",
                                           timeout=90_000)
                views = page.evaluate(VIEWS_JS)
                text = page.inner_text("body")
                assert len(views) >= want, (path.name, want, views)
                empty = [v for v in views if not (v["drawn"] and v["traces"] and v["points"])]
                assert not empty, (path.name, empty)
                for phrase in ("model not found", "Error displaying widget", "Loading widget"):
                    assert phrase not in text, (path.name, phrase)
                assert not refused, (path.name, refused)                    # nothing asked of the network
                assert not errors, (path.name, errors)
                page.close()
        finally:
            browser.close()
