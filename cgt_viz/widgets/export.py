"""nbconvert support for the views' static form (see cgt_viz.widgets._static).

    jupyter nbconvert --to html --execute --HTMLExporter.preprocessors=cgt_viz.widgets.export.StaticViews nb.ipynb
    jupyter nbconvert --to notebook --NotebookExporter.preprocessors=cgt_viz.widgets.export.StaticViews nb.ipynb

`StaticViews` drops the outputs that hold a cgt_viz view's live widget and its JupyterLab style (and the
widget entry of a static output, as notebooks saved by older versions had it), so every frontend
(nbconvert's HTML, nbviewer, JupyterLab without the kernel, trusted or not) draws the static plot instead
of looking for a widget model that only a running kernel has; and puts plotly.js, from the installed plotly
package, once on the page: in the first static copy (a notebook stores none; one saved with
CGT_VIZ_STATIC=embed, or by an older version, one per cell run: the first is kept, the others dropped).
Other widgets are left as they are.

`make env` makes it the HTML exporter's preprocessor for this environment (`install_config`), so
`jupyter nbconvert --to html nb.ipynb` and JupyterLab's "Save and Export Notebook As > HTML" draw every view.

With `--StaticViews.png=True` (or CGT_STATIC_PNG=1 in the environment of nbconvert) it also adds image/png
of each view's main figure, drawn by kaleido from the plotly JSON the output stores, to outputs that have
none: a notebook exported `--to notebook` this way shows its views on GitHub, which runs no JavaScript.
One kaleido session (one Chromium) draws every figure of the run; without kaleido or a Chromium it warns
once and adds nothing (see cgt_viz.widgets._png).

    jupyter nbconvert --to notebook --execute --StaticViews.png=True \\
        --NotebookExporter.preprocessors=cgt_viz.widgets.export.StaticViews --output saved.ipynb nb.ipynb
"""
from __future__ import annotations

from nbconvert.preprocessors import Preprocessor
from traitlets import Bool

from . import _png
from ._static import PLOTLY_JS_START, PLOTLY_MIME, PNG_MIME, WIDGET_MIME, plotly_js_html


def is_static_view(output) -> bool:
    return bool(output.get("metadata", {}).get("cgt_viz", {}).get("static"))


def is_live_part(output) -> bool:
    """The live widget or the style output of a view (see cgt_viz.widgets._static)."""
    meta = output.get("metadata", {}).get("cgt_viz", {})
    return bool(meta.get("live") or meta.get("style"))


def _html(output) -> str:
    page = output.get("data", {}).get("text/html", "")
    return "".join(page) if isinstance(page, list) else page


class StaticViews(Preprocessor):
    """Keep the static form of cgt_viz views, drop their widget view (see the module docstring)."""

    png = Bool(None, allow_none=True,
               help="add image/png of each view's main figure (kaleido + Chromium; about a second per "
                    "figure) where the output has none; None: as CGT_STATIC_PNG says").tag(config=True)

    def want_png(self) -> bool:
        return _png.wanted(self.png)

    def preprocess(self, nb, resources):
        self._plotly_js_kept = False
        nb, resources = super().preprocess(nb, resources)
        if not self._plotly_js_kept:
            first = next((o for c in nb.cells for o in c.get("outputs", []) if is_static_view(o)
                          and "cgt-viz-static" in _html(o)), None)
            if first is not None:
                first["data"]["text/html"] = plotly_js_html() + _html(first)
                self._plotly_js_kept = True
        return nb, resources

    def preprocess_cell(self, cell, resources, index):
        png = self.want_png()
        if "outputs" in cell:
            cell.outputs = [o for o in cell.outputs if not is_live_part(o)]
        for output in cell.get("outputs", []):
            if not is_static_view(output):
                continue
            data = output.get("data", {})
            data.pop(WIDGET_MIME, None)
            page = data.get("text/html")
            if isinstance(page, list):
                page = "".join(page)
            if isinstance(page, str):
                kept = getattr(self, "_plotly_js_kept", False)
                start = page.find(PLOTLY_JS_START)
                if start >= 0 and kept:
                    end = page.index("</script>", start) + len("</script>")
                    data["text/html"] = page[:start] + page[end:]
                elif start >= 0:
                    self._plotly_js_kept = True
            if png and PNG_MIME not in data and PLOTLY_MIME in data:
                image = _png.figure_png(data[PLOTLY_MIME])
                if image is not None:
                    data[PNG_MIME] = image
        return cell, resources


CONFIG_FILES = ("jupyter_nbconvert_config.json", "jupyter_server_config.json")


def install_config(prefix: str | None = None) -> list[str]:
    """Make `StaticViews` the HTML exporter's preprocessor in this environment's Jupyter config
    (`<prefix>/etc/jupyter`, default `sys.prefix`): `jupyter nbconvert --to html` reads
    jupyter_nbconvert_config.json, JupyterLab's export (the server's nbconvert handler) the server's config.
    Other settings in those files are kept. Returns the files written."""
    import json
    import sys
    from pathlib import Path

    folder = Path(sys.prefix if prefix is None else prefix) / "etc" / "jupyter"
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{StaticViews.__module__}.{StaticViews.__name__}"
    written = []
    for file in CONFIG_FILES:
        path = folder / file
        config = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        if not isinstance(config, dict):
            raise ValueError(f"{path} holds no JSON object: set HTMLExporter.preprocessors there by hand")
        section = config.setdefault("HTMLExporter", {})
        listed = list(section.get("preprocessors", []))
        if name not in listed:
            section["preprocessors"] = listed + [name]
            path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
            written.append(str(path))
    return written


if __name__ == "__main__":      # `python -m cgt_viz.widgets.export`: what `make env` runs
    for path in install_config():
        print(f"StaticViews set as the HTML exporter's preprocessor in {path}")
