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

ROOT = Path(__file__).resolve().parents[2]
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
    out = build.site_notebook(nb, StaticViews(), fast="0")                  # at defaults: no note
    assert "widgets" not in out.metadata and "widgets" in nb.metadata          # the input is left alone
    assert out.cells[0].source == "![CGT](../img/cgt.svg)"
    assert len(out.cells) == 2                                                  # the empty cell is gone
    outputs = out.cells[1].outputs
    assert [o["data"].get("text/plain") for o in outputs] == ["view", "100%"]
    assert all(WIDGET_MIME not in o["data"] for o in outputs)


def _page(source: str, outputs=()):
    import nbformat
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(source), nbformat.v4.new_code_cell("run()", outputs=list(outputs))]
    return nb


def test_a_smoke_run_page_says_so_at_its_top():
    from cgt_viz.widgets.export import StaticViews
    nb = _page("# 01 · A title\n\nThe text.")
    for fast, marker in (("1", "A smoke run, not results"), (None, "Settings not recorded")):
        out = build.site_notebook(nb, StaticViews(), fast=fast, name="01_synthetic_icl.ipynb")
        title, rest = out.cells[0].source.split("\n", 1)
        assert title == "# 01 · A title"                                         # the page keeps its title
        assert rest.index(marker) < rest.index("The text.") and "results.md" in rest and "CGT_FAST" in rest
    out = build.site_notebook(nb, StaticViews(), fast="0", name="01_synthetic_icl.ipynb")
    assert out.cells[0].source == nb.cells[0].source


def test_executed_settings_come_from_the_folder(tmp_path):
    assert build.executed_settings(tmp_path) == {}
    (tmp_path / build.SETTINGS_FILE).write_text('{"CGT_FAST": "0"}')
    assert build.executed_settings(tmp_path) == {"CGT_FAST": "0"}
    assert build.smoke_note("01_synthetic_icl.ipynb", "0") is None


def test_outputs_on_the_site_hold_no_build_paths():
    import nbformat

    from cgt_viz.widgets.export import StaticViews
    site_packages = Path(sys.prefix) / "lib" / "python3.11" / "site-packages" / "torch" / "utils" / "_contextlib.py"
    warning = (f"{site_packages}:124: UserWarning: k = 4: below the noise floor\n  return func(*args, **kwargs)\n"
               f"saved to {ROOT}/runs/nb01/compiled\n")
    stream = nbformat.v4.new_output("stream", name="stderr", text=warning)
    result = nbformat.v4.new_output("execute_result", {"text/plain": f"PosixPath('{ROOT}/data/models/x')"}, execution_count=1)
    out = build.site_notebook(_page("# T", [stream, result]), StaticViews(), fast="0", root=ROOT)
    text = out.cells[1].outputs[0]["text"]
    assert text == "UserWarning: k = 4: below the noise floor\nsaved to ./runs/nb01/compiled\n"
    assert out.cells[1].outputs[1]["data"]["text/plain"] == "PosixPath('./data/models/x')"


# ---------------------------------------------------------------------------------------------- API docstrings
def test_name_description_tables_become_parameter_lists():
    import cgt_viz
    lines = build.parameter_lists(inspect.getdoc(cgt_viz.explore).splitlines())
    params = [ln.split(":")[1].split()[1] for ln in lines if ln.startswith(":param ")]
    assert params[:4] == ["data", "labels", "positions", "projection"]       # "projection" fills its column
    assert set(params) <= set(inspect.signature(cgt_viz.explore).parameters)
    mixed = build.parameter_lists(["Intro.", "", "a / b   one", "c d     two", "        more", "", "After."])
    assert mixed == ["Intro.", "", "``a / b``", "    one", "``c d``", "    two more", "", "After."]
    prose = ["A sentence  with two spaces.", "", "name  alone"]               # not a table: left as is
    assert build.parameter_lists(list(prose)) == prose


def test_every_public_docstring_renders_as_rest_not_as_a_code_block():
    """The API reference shows docstrings as prose with parameter lists: none of them falls back to a
    literal block (what every docstring with a "name  description" table or a |norm| used to be)."""
    shown_as_code = []
    for module, _title in build.API_MODULES:
        mod = importlib.import_module(module)
        objs = [(module, mod, "module")]
        for name in build.public_names(module):
            obj = getattr(mod, name)
            objs.append((f"{module}.{name}", obj, "class" if inspect.isclass(obj) else "function" if callable(obj) else "data"))
            if inspect.isclass(obj):
                objs += [(f"{module}.{name}.{k}", v, "method") for k, v in vars(obj).items()
                         if not k.startswith("_") and inspect.isfunction(v)]
        for name, obj, what in objs:
            doc = inspect.getdoc(obj)
            if doc:
                lines = build.docstring_as_written(None, what, name, obj, None, doc.splitlines())
                if lines and lines[0] == "::":
                    shown_as_code.append(name)
    assert not shown_as_code, shown_as_code


def test_inside_a_sphinx_build_docstrings_render_as_prose_with_parameter_lists(tmp_path):
    """The check that decides prose or code block runs inside Sphinx, whose registered roles need its
    environment: there every docstring with a `code` span used to become a highlighted code block."""
    from sphinx.application import Sphinx
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text("extensions = ['sphinx.ext.autodoc']\ndefault_role = 'literal'\n"
                                 f"import sys\nsys.path.insert(0, {str(ROOT / 'docs')!r})\nimport build\n"
                                 "def setup(app):\n    app.connect('autodoc-process-docstring', build.docstring_as_written)\n")
    (src / "index.rst").write_text(".. autofunction:: cgt_viz.widgets.explore\n\n.. autofunction:: cgt_viz.train\n")
    Sphinx(str(src), str(src), str(tmp_path / "out"), str(tmp_path / "doctrees"), "html", status=None,
           warning=None, freshenv=True).build()
    page = (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
    assert "highlight-default" not in page                                     # no code block
    assert page.count("Parameters") == 2 and "<strong>positions</strong>" in page and "<strong>steps</strong>" in page


def test_no_page_title_carries_an_internal_issue_number():
    pages = [p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts]
    titles = [(p.name, line) for p in pages for line in p.read_text(encoding="utf-8").splitlines()
              if line.startswith("#") and re.search(r"\bissue \d+", line, re.I)]
    assert not titles, titles


def test_the_site_names_what_is_missing_when_no_executed_copy_exists(tmp_path, monkeypatch):
    monkeypatch.setenv("CGT_DOCS_EXECUTED", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="01_synthetic_icl.ipynb.*make docs"):
        build.tutorials(ROOT)


# ---------------------------------------------------------------------------------------------- layout page
def test_the_layout_page_lists_every_module_with_its_docstring():
    """docs/layout.md is written from the module docstrings: a stale page, or a module without one, fails here."""
    problems = build.layout_problems()
    assert problems == [], "\n".join(problems)


def test_the_layout_page_names_a_module_without_a_docstring_and_follows_a_new_module(tmp_path):
    package = tmp_path / build.PACKAGE
    (package / "widgets").mkdir(parents=True)
    (package / "__init__.py").write_text('"""The package."""\n')
    (package / "widgets" / "__init__.py").write_text('"""The views."""\n')
    (package / "widgets" / "_new.py").write_text("VALUE = 1\n")
    problems = build.layout_problems(tmp_path)
    assert len(problems) == 1 and f"{build.PACKAGE}/widgets/_new.py has no module docstring" in problems[0]
    assert build.LAYOUT_COMMAND in problems[0]
    (package / "widgets" / "_new.py").write_text('"""What the new module is for. More about it."""\n')
    assert build.layout_problems(tmp_path) == [f"docs/layout.md is not what the module docstrings say now (a "
                                                f"module was added, removed or its docstring changed): run "
                                                f"{build.LAYOUT_COMMAND}"]
    build.write_layout(tmp_path)
    assert build.layout_problems(tmp_path) == []
    page = (tmp_path / "docs" / "layout.md").read_text(encoding="utf-8")
    assert f"## `{build.PACKAGE}/widgets/`" in page and "| `_new.py` | What the new module is for. |" in page


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
            if not callable(obj) and doc == inspect.getdoc(type(obj)):
                # a constant (a str, a dict) shows no docstring of its type ("str(object='') -> str")
                assert "Createanewstringobject" not in re.sub(r"\s", "", _text(body[:3_000])), f"{module}.{name}"
                continue
            if doc and not doc.startswith(f"{name}("):     # (a dataclass without a docstring of its own)
                words = "".join(re.sub(r"[`*]", "", doc).split()[:4])        # compared without white space:
                assert words in re.sub(r"[`*\s]", "", _text(body[:30_000])), (   # markup splits the text anywhere
                    f"{module}.{name}: its docstring is not on the page")


@pytest.mark.docs_site
def test_the_built_pages_hold_no_build_paths_and_the_api_lists_parameters():
    _need_site()
    leaks = []
    for page in SITE.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        for needle in (str(ROOT) + "/", sys.prefix + "/", "/.venv/", "site-packages/"):
            if needle in text:
                leaks.append((str(page.relative_to(SITE)), needle))
        title = re.search(r"<title>(.*?)</title>", text, re.S)
        assert not (title and re.search(r"\bissue \d+", title.group(1), re.I)), (page.name, title.group(1))
    assert not leaks, leaks[:10]
    api = (SITE / "api" / "cgt_viz.widgets.html").read_text(encoding="utf-8")
    entry = api.split('id="cgt_viz.widgets.explore"', 1)[1].split("</dd>", 1)[0]
    assert "Parameters" in entry and "<strong>positions</strong>" in entry and "highlight-" not in entry


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
