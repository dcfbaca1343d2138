"""nbconvert support for the views' static form (see cgt_viz.widgets._static).

    jupyter nbconvert --to html --execute --HTMLExporter.preprocessors=cgt_viz.widgets.export.StaticViews nb.ipynb
    jupyter nbconvert --to notebook --NotebookExporter.preprocessors=cgt_viz.widgets.export.StaticViews nb.ipynb

`StaticViews` drops the live-widget entry from every output that carries a cgt_viz static form, so every
frontend (nbconvert's HTML, nbviewer, JupyterLab without the kernel, trusted or not) draws the static plot
instead of looking for a widget model that only a running kernel has. Other widgets are left as they are.
"""
from __future__ import annotations

from nbconvert.preprocessors import Preprocessor

from ._static import WIDGET_MIME


def is_static_view(output) -> bool:
    return bool(output.get("metadata", {}).get("cgt_viz", {}).get("static"))


class StaticViews(Preprocessor):
    """Keep the static form of cgt_viz views, drop their widget view (see the module docstring)."""

    def preprocess_cell(self, cell, resources, index):
        for output in cell.get("outputs", []):
            if is_static_view(output) and WIDGET_MIME in output.get("data", {}):
                del output["data"][WIDGET_MIME]
        return cell, resources
