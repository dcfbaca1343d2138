"""cgt_viz: train, compile and look inside Contextually Guided Transformers (arXiv 2506.05672)."""
import os as _os
import sys as _sys

try:
    from .config import SITES, CGTConfig
    from .model import CGT, GPT
    from .paths import shipped_path
    from .train import TrainHistory, TrainingDiverged, train
except KeyboardInterrupt:
    # Ctrl-C while torch imports (seconds), when started as the command line (`python -m cgt_viz` sets argv[0]
    # to "-m" while it imports the package; the console script is cgt-viz): one line and exit code 130, as every
    # other Ctrl-C of the command line. Imported as a library, the interrupt is the caller's.
    if _sys.argv[:1] == ["-m"] or (_sys.argv[:1] and _os.path.basename(_sys.argv[0]) == "cgt-viz"):
        print("error: interrupted (Ctrl-C) while starting", file=_sys.stderr)
        raise SystemExit(130) from None
    raise

__version__ = "0.1.0"

# The widgets need the notebook extras (plotly, ipywidgets, ...): import them only when first asked for.
_WIDGETS = ("explore", "Explorer", "SmoothnessStrip", "TemplateInspector", "CompileCompare", "TrainingMonitor")


def __getattr__(name):
    if name in _WIDGETS:
        from . import widgets
        return getattr(widgets, name)
    raise AttributeError(f"module 'cgt_viz' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_WIDGETS))


# the widget names stay out of __all__ so that `from cgt_viz import *` works without the notebook extras
__all__ = ["CGTConfig", "CGT", "GPT", "SITES", "train", "TrainHistory", "TrainingDiverged", "shipped_path",
           "__version__"]
