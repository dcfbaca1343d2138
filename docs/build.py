"""What the site generates before Sphinx reads its sources (called from docs/conf.py).

- tutorials/*.ipynb: the executed copies of notebooks/ (`_executed/`, written by `make test`'s nbmake run or by
  `make docs` when absent), passed through cgt_viz.widgets.export.StaticViews so every view is its static
  plot (plotly.js once per page, from the installed plotly package) and no output asks for a widget model;
  the stored widget state is dropped (it would make myst-nb load a widget manager from a CDN).
- api/*.rst: one page per public module, every public name with its signature and docstring.
- results.md and the README's table: benchmarks/results_pages.py, from the result files.

Nothing here downloads anything.
"""
from __future__ import annotations

import copy
import importlib
import inspect
import io
import os
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
PLOTLY_MIME = "application/vnd.plotly.v1+json"
# (module, title): the modules whose public names the API reference lists
API_MODULES = [("cgt_viz", "cgt_viz: the model, training, the views"), ("cgt_viz.hf", "cgt_viz.hf: a CGT over a pretrained LM"),
               ("cgt_viz.tasks", "cgt_viz.tasks: the tasks"), ("cgt_viz.widgets", "cgt_viz.widgets: the views"),
               ("cgt_viz.figures", "cgt_viz.figures: every view as a plotly Figure")]


def version() -> str:
    import tomllib
    return tomllib.loads((DOCS.parent / "pyproject.toml").read_text())["project"]["version"]


def executed_dir(root: Path) -> Path:
    return Path(os.environ.get("CGT_DOCS_EXECUTED", root / "_executed"))


def prepare(root: Path) -> None:
    tutorials(root)
    api_pages()
    sys.path.insert(0, str(root / "benchmarks"))
    import results_pages
    results_pages.write(root)


def _write_if_changed(path: Path, text: str) -> None:
    """Leave unchanged files alone, so an incremental build re-reads only what changed."""
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


# ---------------------------------------------------------------------------------------------- tutorials
def tutorials(root: Path) -> None:
    import nbformat

    from cgt_viz.widgets.export import StaticViews

    source = executed_dir(root)
    names = sorted(p.name for p in (root / "notebooks").glob("*.ipynb"))
    missing = [n for n in names if not (source / n).exists()]
    if missing:
        raise FileNotFoundError(f"no executed copy of {', '.join(missing)} in {source}: `make docs` executes the "
                                "notebooks there first (or set CGT_DOCS_EXECUTED to a folder of executed copies)")
    out = DOCS / "tutorials"
    for name in names:
        nb = nbformat.read(source / name, as_version=4)
        nb = site_notebook(nb, StaticViews())
        _write_if_changed(out / name, nbformat.writes(nb) + "\n")


def site_notebook(nb, static_views):
    """An executed notebook as the site shows it: static views, no widget state, links that resolve."""
    nb = copy.deepcopy(nb)
    nb, _ = static_views.preprocess(nb, {})
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            # the stored notebooks link ../docs/img/...; the rendered copy sits in docs/tutorials/
            cell.source = cell.source.replace("](../docs/", "](../")
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if WIDGET_MIME in data and len(data) > 1:     # e.g. a tqdm bar: its text stays, its dead widget goes
                del data[WIDGET_MIME]
            if PLOTLY_MIME in data:
                # myst-nb renders no plotly JSON: a plain figure (fig.show() under nbclient stores only that)
                # becomes the same static HTML a view carries; a view's own HTML is already there
                if "text/html" not in data:
                    data["text/html"] = _figure_html(data[PLOTLY_MIME])
                del data[PLOTLY_MIME]
    nb.cells = [c for c in nb.cells if not (c.cell_type == "code" and not c.source.strip())]
    _ensure_plotly_js(nb)
    return nb


def _figure_html(spec: dict) -> str:
    import json

    import plotly.io as pio

    from cgt_viz.widgets._static import figures_html
    return figures_html([pio.from_json(json.dumps(spec), skip_invalid=True)])


def _ensure_plotly_js(nb) -> None:
    """plotly.js once on the page: StaticViews keeps it in the first view; a notebook whose figures are all
    plain ones gets it in its first figure."""
    from cgt_viz.widgets._static import PLOTLY_JS_START, plotly_js_html
    pages = [o["data"] for c in nb.cells for o in c.get("outputs", []) if "cgt-viz-static" in _html(o)]
    if pages and not any(PLOTLY_JS_START in _html({"data": d}) for d in pages):
        pages[0]["text/html"] = plotly_js_html() + _html({"data": pages[0]})


def _html(output) -> str:
    page = output.get("data", {}).get("text/html", "")
    return "".join(page) if isinstance(page, list) else page


# ---------------------------------------------------------------------------------------------- API
def public_names(module_name: str) -> list[str]:
    """`__all__` where the module declares it; else every function and class the module itself defines."""
    mod = importlib.import_module(module_name)
    if hasattr(mod, "__all__"):
        return list(mod.__all__)
    return [n for n, obj in vars(mod).items() if not n.startswith("_")
            and (inspect.isfunction(obj) or inspect.isclass(obj)) and getattr(obj, "__module__", None) == module_name]


def api_pages() -> None:
    index = ["API reference", "=============", "",
             "Generated from the docstrings: every public name of each module, its signature and docstring.", "",
             ".. toctree::", "   :maxdepth: 1", ""]
    index += [f"   {m}" for m, _ in API_MODULES]
    _write_if_changed(DOCS / "api" / "index.rst", "\n".join(index) + "\n")
    for module_name, title in API_MODULES:
        names = public_names(module_name)
        mod = importlib.import_module(module_name)
        lines = [title, "=" * len(title), "", f".. module:: {module_name}", ""]
        doc = inspect.getdoc(mod)
        if doc:
            lines += docstring_as_written(None, "module", module_name, mod, None, doc.splitlines()) or doc.splitlines()
            lines += [""]
        lines += [".. autosummary::", ""] + [f"   {n}" for n in names] + [""]
        for n in names:
            obj = getattr(mod, n)
            if inspect.isclass(obj):
                lines += [f".. autoclass:: {module_name}.{n}", "   :members:", ""]
            elif callable(obj):
                lines += [f".. autofunction:: {module_name}.{n}", ""]
            else:
                lines += [f".. autodata:: {module_name}.{n}", "   :annotation:", ""]
        _write_if_changed(DOCS / "api" / f"{module_name}.rst", "\n".join(lines) + "\n")


def _rst_problems(text: str) -> bool:
    """Whether docutils reports anything (warning or worse) for this text as reStructuredText."""
    from docutils.core import publish_doctree
    from docutils.utils import Reporter
    stream = io.StringIO()
    try:
        publish_doctree(".. default-role:: literal\n\n" + text,
                        settings_overrides={"warning_stream": stream, "report_level": Reporter.WARNING_LEVEL,
                                            "halt_level": Reporter.SEVERE_LEVEL + 1, "file_insertion_enabled": False,
                                            "raw_enabled": False})
    except Exception:  # noqa: BLE001 - any parser failure means: show it as written
        return True
    return bool(stream.getvalue().strip())


def docstring_as_written(app, what, name, obj, options, lines):
    """The docstrings are plain prose with `code` spans, not always valid reST: one that would make docutils
    warn is shown as written (a literal block) rather than mangled or failing the -W build."""
    text = "\n".join(lines)
    if not text.strip() or not _rst_problems(text):
        return lines
    shown = ["::", ""] + [("    " + ln) if ln.strip() else "" for ln in lines] + [""]
    lines[:] = shown
    return lines


def class_signature(app, what, name, obj, options, signature, return_annotation):
    """A widget class (traitlets' `__new__(cls, *args, **kwargs)`) is shown with its `__init__`'s arguments,
    the signature Python itself reports for it."""
    if what == "class" and signature and "*args" in signature:
        try:
            sig = inspect.signature(obj)
        except (TypeError, ValueError):
            return None
        if "args" not in sig.parameters:
            return str(sig.replace(return_annotation=inspect.Signature.empty)), return_annotation
    return None
