"""What the site generates before Sphinx reads its sources (called from docs/conf.py).

- tutorials/*.ipynb: the executed copies of notebooks/ (`_executed/`, written by `make test`'s nbmake run or by
  `make docs` when absent), passed through cgt_viz.widgets.export.StaticViews so every view is its static
  plot (plotly.js once per page, from the installed plotly package) and no output asks for a widget model;
  the stored widget state is dropped (it would make myst-nb load a widget manager from a CDN).
- api/*.rst: one page per public module, every public name with its signature and docstring.
- results.md and the README's table: benchmarks/results_pages.py, from the result files.
- layout.md: every module of cgt_viz with the first sentence of its docstring (also `python docs/build.py --layout`).

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
    write_layout(root)
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
    fast = executed_settings(source).get("CGT_FAST")
    for name in names:
        nb = nbformat.read(source / name, as_version=4)
        nb = site_notebook(nb, StaticViews(), fast=fast, name=name, root=root)
        _write_if_changed(out / name, nbformat.writes(nb) + "\n")


SETTINGS_FILE = "settings.json"     # written beside the executed copies by the Makefile: {"CGT_FAST": "1"}


def executed_settings(source: Path) -> dict:
    """The settings the executed copies ran with ({} when the folder does not say)."""
    import json
    path = source / SETTINGS_FILE
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return settings if isinstance(settings, dict) else {}


# what a smoke run's page shows instead of results, per notebook (the note at the top of the page)
SMOKE_WHAT = {
    "01_synthetic_icl.ipynb": "the CGT and the baseline GPT train for a small fraction of the notebook's steps, so "
                              "they are barely trained: accuracies near chance, G undefined (NaN) or noisy, a probe "
                              "that may sit below chance",
    "02_linear_regression.ipynb": "the model trains for a small fraction of the notebook's steps, so gap closed and "
                                  "the probe's R² are a barely trained model's",
    "03_text_mixture.ipynb": "the shipped reference text model is loaded, but the evaluations use short excerpts "
                             "and a handful of sequences, and the model with the smoothness term trains for a few "
                             "dozen steps",
    "04_y_explorer.ipynb": "the shipped reference text model is loaded, but the map holds one batch of sequences "
                           "and no UMAP is fitted",
    "05_pretrained_lm.ipynb": "the shipped head and its measurement files (the tables read from them) are the real "
                              "ones; the live comparison, the map, the generations and the layer read-out use one "
                              "or a few windows",
}


def smoke_note(name: str, fast) -> str | None:
    """The note a tutorial page opens with when its executed copy is not a run at the notebook's defaults."""
    if str(fast) == "0":
        return None
    what = SMOKE_WHAT.get(name, "the heavy settings are shrunk")
    if fast is None:
        head = ("**Settings not recorded.** The executed copy this page shows does not say how it was run "
                "(`make test` and `make docs` run the notebooks with `CGT_FAST=1`, the fast settings CI uses); "
                f"if it was such a run, {what}.")
    else:
        head = ("**A smoke run, not results.** This page was executed with `CGT_FAST=1`, the fast settings CI uses "
                f"to check that every cell runs: {what}.")
    return (":::{note}\n" + head + " Its numbers show that the code runs, not how well CGT works: the measured "
            "numbers are on the [results page](../results.md); `make lab` runs the notebook at its defaults.\n:::")


_WARNING_AT = re.compile(r"^(?:/|[A-Za-z]:\\)\S*?\.py:\d+: (?=\w*Warning: )", re.M)


def clean_text(text: str, root: Path | None = None) -> str:
    """An output's text without the machine that built the site: a warning's "file:line: " prefix (an
    install path, and the source line printed under it) goes, the repository and the Python environment
    become relative names."""
    lines, out, skip = text.split("\n"), [], False
    for line in lines:
        if skip and line.startswith("  "):
            skip = False
            continue
        skip = False
        if _WARNING_AT.match(line):
            line, skip = _WARNING_AT.sub("", line), True
        out.append(line)
    text = "\n".join(out)
    for prefix, name in ((sys.prefix, "<env>"), (str(root) if root else None, "."), (str(Path.home()), "~")):
        if prefix and len(prefix) > 1:
            text = text.replace(prefix.rstrip("/") + "/", name + "/").replace(prefix, name)
    return text


def site_notebook(nb, static_views, fast="1", name: str = "", root: Path | None = None):
    """An executed notebook as the site shows it: static views, no widget state, links that resolve, no
    build paths in its outputs, and a note at the top unless it ran at the notebook's defaults."""
    import nbformat
    root = DOCS.parent if root is None else root
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
        for output in cell.get("outputs", []):
            if "text" in output:
                output["text"] = clean_text(output["text"], root)
            data = output.get("data", {})
            if isinstance(data.get("text/plain"), str):
                data["text/plain"] = clean_text(data["text/plain"], root)
    nb.cells = [c for c in nb.cells if not (c.cell_type == "code" and not c.source.strip())]
    note = smoke_note(name, fast)
    if note:
        # after the title: the page's heading stays its first line (the toctree reads it)
        at = 1 if nb.cells and nb.cells[0].cell_type == "markdown" and nb.cells[0].source.lstrip().startswith("# ") else 0
        if at and "\n" in nb.cells[0].source.strip():
            title, _, rest = nb.cells[0].source.partition("\n")
            nb.cells[0].source = title + "\n\n" + note + "\n\n" + rest.lstrip("\n")
        else:
            nb.cells.insert(at, nbformat.v4.new_markdown_cell(note))
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


# ---------------------------------------------------------------------------------------------- layout
LAYOUT_PAGE = "docs/layout.md"             # from the repository root
LAYOUT_COMMAND = "python docs/build.py --layout"
PACKAGE = "cgt_viz"
# what lives outside the package: no docstring to read, so declared here
LAYOUT_OUTSIDE = [
    ("benchmarks/", "common.py (FLOP model, step timing), bench_*.py, gpu_check.py, tasks_results.py, "
                    "train_text_reference.py, hf_topic_knn.py (JSON, never asserted in tests); ship.py: every "
                    "model under data/models/ trained and measured by its name, with the flags it was made with"),
    ("benchmarks/results_pages.py", "the README's results table and docs/results.md, written from the result files"),
    ("notebooks/", "01–05, stored without outputs"),
    ("tests/", "unit, property, audit (bad-argument cases, partly generated from declarations), fault, device, "
               "notebook and browser tests, in folders by subject: model/, training/, hf/, views/, browser/, "
               "faults/, project/ (tests/README.md)"),
    ("docs/", "this site: conf.py (Sphinx), build.py (tutorials, API pages, results page, this page), the pages"),
    ("docs/make_images.py", "redraws the view pictures (README, views guide) from the shipped reference text model"),
    ("docs/RELIABILITY.md", "what is guaranteed (bad input, checkpoints, resume, NaN, devices) and which test "
                            "holds it"),
]
LAYOUT_CLOSING = ("Data flows one way: tasks → model → analysis → figures → widgets. `docs/CGT.md` explains the "
                  "model as\nimplemented here: both streams, the three passes, the algebra of specialisation, the "
                  "losses, the config.\n")


def module_summary(docstring: str) -> str:
    """A module's line on the layout page: the first sentence of its docstring, on one line. A first sentence
    that is a question ("Why not just train a LoRA?") keeps the sentence that answers it."""
    paragraph = " ".join(docstring.split("\n\n")[0].split())
    sentences = re.split(r"(?<=[.?!])\s+", paragraph)
    summary = sentences[0]
    if summary.endswith("?") and len(sentences) > 1:
        summary += " " + sentences[1]
    return summary


def module_docstrings(root: Path) -> dict[str, str | None]:
    """{path relative to root: docstring or None} of every module of the package under root, read from the
    source (nothing is imported: the hf modules need their extra), in folder order, each folder's
    __init__.py first."""
    import ast

    def order(path: Path):
        return (path.parent.relative_to(root).parts, path.name != "__init__.py", path.name)
    files = sorted((p for p in (root / PACKAGE).rglob("*.py") if "__pycache__" not in p.parts), key=order)
    return {p.relative_to(root).as_posix(): ast.get_docstring(ast.parse(p.read_text(encoding="utf-8")))
            for p in files}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def layout_page(root: Path = DOCS.parent) -> str:
    """docs/layout.md: every module of the package with the first sentence of its docstring, one table per
    folder, then what lives outside the package. ValueError naming the modules that have no docstring."""
    docstrings = module_docstrings(root)
    undocumented = [path for path, doc in docstrings.items() if not (doc or "").strip()]
    if undocumented:
        one = len(undocumented) == 1
        raise ValueError(f"{', '.join(undocumented)} {'has' if one else 'have'} no module docstring: give "
                         f"{'it' if one else 'each'} one whose first sentence says what the module is for (it is "
                         f"the module's line on {LAYOUT_PAGE}), then run {LAYOUT_COMMAND}")
    lines = ["# Where the code lives", "",
             f"<!-- written by `{LAYOUT_COMMAND}` (and `make docs`) from each module's docstring: edit the "
             f"docstrings, not this page -->", ""]
    folders: dict[str, list[tuple[str, str]]] = {}
    for path, doc in docstrings.items():
        folder, _, name = path.rpartition("/")
        folders.setdefault(folder + "/", []).append((name, module_summary(doc)))
    for folder, modules in folders.items():
        lines += [f"## `{folder}`", "", "| module | what it is for |", "| --- | --- |"]
        lines += [f"| `{name}` | {_cell(summary)} |" for name, summary in modules]
        lines.append("")
    lines += ["## Outside the package", "", "| path | what it holds |", "| --- | --- |"]
    lines += [f"| `{path}` | {_cell(what)} |" for path, what in LAYOUT_OUTSIDE]
    return "\n".join(lines) + "\n\n" + LAYOUT_CLOSING


def layout_problems(root: Path = DOCS.parent) -> list[str]:
    """What keeps the layout page from being what layout_page writes: modules without a docstring, a stale page."""
    try:
        page = layout_page(root)
    except ValueError as err:
        return [str(err)]
    layout = root / LAYOUT_PAGE
    if not layout.exists() or layout.read_text(encoding="utf-8") != page:
        return [f"{LAYOUT_PAGE} is not what the module docstrings say now (a module was added, removed or its "
                f"docstring changed): run {LAYOUT_COMMAND}"]
    return []


def write_layout(root: Path = DOCS.parent) -> None:
    _write_if_changed(root / LAYOUT_PAGE, layout_page(root))


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
    from docutils.parsers.rst import directives, roles
    from docutils.utils import Reporter
    stream = io.StringIO()
    # plain docutils: inside a Sphinx build the roles and directives Sphinx registered need its environment,
    # so every docstring with a `code` span failed here and was shown as a code block
    saved = dict(roles._roles), dict(directives._directives)
    roles._roles.clear()
    directives._directives.clear()
    try:
        publish_doctree(".. default-role:: literal\n\n" + text,
                        settings_overrides={"warning_stream": stream, "report_level": Reporter.WARNING_LEVEL,
                                            "halt_level": Reporter.SEVERE_LEVEL + 1, "file_insertion_enabled": False,
                                            "raw_enabled": False})
    except Exception:  # noqa: BLE001 - any parser failure means: show it as written
        return True
    finally:
        roles._roles.clear()
        roles._roles.update(saved[0])
        directives._directives.clear()
        directives._directives.update(saved[1])
    return bool(stream.getvalue().strip())


_ROW = re.compile(r"^(?P<name>[`*\w][\w`*.,/|()\[\]' =-]{0,40}?)(?P<gap> {2,})(?P<desc>\S.*)$")
_IDENT = re.compile(r"^\**[A-Za-z_]\w*$")


def _rows(lines: list[str], start: int):
    """The "name  description" table starting at lines[start] (rows at column 0, continuation lines
    indented), as (end, [(name, description)]), or None when it is not one: fewer than two rows, or
    rows whose descriptions do not mostly start at one column."""
    rows, cols, i = [], [], start
    while i < len(lines):
        m = _ROW.match(lines[i])
        if m and len(m.group("name").split()) <= 4:
            name, desc, col = m.group("name"), [m.group("desc")], m.start("desc")
        elif cols and re.match(r"^[\w, ]+:$", lines[i]) and i + 1 < len(lines) and lines[i + 1].startswith("  "):
            name, desc, col = lines[i][:-1], [], cols[-1]      # names too long for the column: on a line of their own
        else:
            # a name that fills its column leaves one space: "projection the first paint"
            col = max(set(cols), key=cols.count) if cols else 0
            head = lines[i][:col]
            if not (col and len(lines[i]) > col and head.endswith(" ") and head.strip() and " " not in head.strip()
                    and lines[i][col] != " "):
                break
            name, desc = head, [lines[i][col:]]
        cols.append(col)
        i += 1
        while i < len(lines) and lines[i].startswith(" ") and lines[i].strip():
            desc.append(lines[i].strip())
            i += 1
        rows.append((name.strip(), " ".join(desc)))
    if len(rows) < 2 or max(cols.count(c) for c in set(cols)) * 2 < len(cols):
        return None
    return i, rows


def parameter_lists(lines: list[str]) -> list[str]:
    """Our docstrings list arguments, fields and values as a table of "name  description" rows (the
    description column aligned, continuation lines indented). As reST that is one run-on paragraph, so
    each such table becomes a list: Sphinx's parameter list (`:param name:`) when every name is a
    Python name, else a definition list (``name`` then its description)."""
    out, i = [], 0
    while i < len(lines):
        found = _rows(lines, i) if (i == 0 or not lines[i - 1].strip()) else None
        if found is None:
            out.append(lines[i])
            i += 1
            continue
        i, rows = found
        names = [n.strip("`") for n, _ in rows]
        # "config / settings": one row for two arguments; the first names it, the others are said
        parts = [[p.strip() for p in re.split(r" / |, ", n)] for n in names]
        if all(_IDENT.match(p) for ps in parts for p in ps):
            out += [f":param {ps[0].lstrip('*')}: " + (f"(also `{', '.join(ps[1:])}`) " if ps[1:] else "") + d
                    for ps, (_, d) in zip(parts, rows)]
        else:
            for (name, desc), bare in zip(rows, names):
                out += [f"``{bare}``", f"    {desc}"]
        if i < len(lines) and lines[i].strip():
            out.append("")              # a list ends with a blank line
    return out


def _escape_bars(line: str) -> str:
    """|x| in prose is a norm or an absolute value, never a reST substitution: escaped outside `code`."""
    parts = re.split(r"(``.*?``|`[^`]*`)", line)
    out = []
    for k, part in enumerate(parts):
        if part.startswith("`"):
            # a code span followed by a letter ("`FigureWidget`s") ends only with an escaped space after it
            out.append(part + ("\\ " if k + 1 < len(parts) and parts[k + 1][:1].isalnum() else ""))
        else:   # "root/<topic>/*.txt": a star beside a path is not emphasis
            out.append(re.sub(r"(?<=/)\*|\*(?=[./])", r"\\*", part.replace("|", "\\|")))
    return "".join(out)


def docstring_as_written(app, what, name, obj, options, lines):
    """The docstrings are plain prose with `code` spans and "name  description" tables, not always valid
    reST: the tables become parameter lists (`parameter_lists`); one that would still make docutils warn
    is shown as written (a literal block) rather than mangled or failing the -W build."""
    text = "\n".join(lines)
    if not text.strip():
        return lines
    if what in ("data", "attribute") and obj is not None and text.strip() == (inspect.getdoc(type(obj)) or "").strip():
        lines[:] = []           # a dict or tuple constant: its type's docstring ("dict() -> new empty dictionary")
        return lines
    converted = [_escape_bars(ln) for ln in parameter_lists(list(lines))]
    if not _rst_problems("\n".join(converted)):
        lines[:] = converted
        return lines
    if not _rst_problems(text):
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


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Write the generated pages that need no Sphinx build (the rest: "
                                                 "make docs).")
    parser.add_argument("--layout", action="store_true", help="docs/layout.md, from each module's docstring")
    if not parser.parse_args().layout:
        parser.error("name a page to write (--layout)")
    write_layout()
    print(f"wrote {LAYOUT_PAGE}")
