"""Interactive views (ipywidgets + plotly FigureWidget), each built on a figure function in cgt_viz.figures.

    explore(model, data, labels)          Explorer          ȳ of many tokens in 2-D, selection, linked views
    SmoothnessStrip(model, data)                            ‖ȳ_t − ȳ_t−1‖, cosine, ȳ heatmap, two-model overlay
    TemplateInspector(model, data)                          per-site templates: coefficients, ΔW, ablation
    CompileCompare(model, data)                             prompted / specialized / no-context loss per position
    TrainingMonitor()                                       live loss curves: train(..., callbacks=[monitor])

    static_png(True)                                        also save a PNG of each view (GitHub shows it; slow,
                                                            needs kaleido and a Chromium: the png extra)

These need the notebook extras (plotly, ipywidgets, anywidget, pandas, scikit-learn, umap-learn).
"""
from ._png import StaticPNGWarning, static_png
from .compare import CompileCompare
from .explorer import Explorer, explore
from .monitor import TrainingMonitor
from .smoothness import SmoothnessStrip
from .templates import TemplateInspector

__all__ = ["explore", "Explorer", "SmoothnessStrip", "TemplateInspector", "CompileCompare", "TrainingMonitor",
           "static_png", "StaticPNGWarning"]
