"""nbconvert support for the views' static form (see cgt_viz.widgets._static).

    jupyter nbconvert --to html --execute --HTMLExporter.preprocessors=cgt_viz.widgets.export.StaticViews nb.ipynb
    jupyter nbconvert --to notebook --NotebookExporter.preprocessors=cgt_viz.widgets.export.StaticViews nb.ipynb

`StaticViews` drops the outputs that hold a cgt_viz view's live widget and its JupyterLab style (and the
widget entry of a static output, as notebooks saved by older versions had it), so every frontend
(nbconvert's HTML, nbviewer, JupyterLab without the kernel, trusted or not) draws the static plot instead
of looking for a widget model that only a running kernel has; and keeps plotly.js in the first static copy
only (each cell run embeds one). Other widgets are left as they are.

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
from ._static import PLOTLY_JS_START, PLOTLY_MIME, PNG_MIME, WIDGET_MIME


def is_static_view(output) -> bool:
    return bool(output.get("metadata", {}).get("cgt_viz", {}).get("static"))


def is_live_part(output) -> bool:
    """The live widget or the style output of a view (see cgt_viz.widgets._static)."""
    meta = output.get("metadata", {}).get("cgt_viz", {})
    return bool(meta.get("live") or meta.get("style"))


class StaticViews(Preprocessor):
    """Keep the static form of cgt_viz views, drop their widget view (see the module docstring)."""

    png = Bool(None, allow_none=True,
               help="add image/png of each view's main figure (kaleido + Chromium; about a second per "
                    "figure) where the output has none; None: as CGT_STATIC_PNG says").tag(config=True)

    def want_png(self) -> bool:
        return _png.wanted(self.png)

    def preprocess(self, nb, resources):
        self._plotly_js_kept = False
        return super().preprocess(nb, resources)

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
