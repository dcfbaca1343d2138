"""What the views draw: arrays in, plotly Figures out (static HTML export, reports, non-widget frontends).

Each function returns a `plotly.graph_objects.Figure`; the widgets in `cgt_viz.widgets` wrap the same
functions in `FigureWidget`s and add interaction. Trace structure is fixed per call signature (markers
for the highlighted token and the boundary are layout shapes), so a widget can update a figure in place.

Every name is imported from here (`from cgt_viz.figures import ybar_map_figure`); the code lives in

    _style    the visual language (colours, scales, modebar, token cuts, escaping), argument checks, colouring
    _map      the ȳ map and its highlight overlay
    _text     along one text: strip, step profile, coloured tokens, template inspector, token memory
    _curves   compile-and-compare, loss differences, training curves
    _lora     the LoRA study: quality against update time, compiling a prompt beside training a LoRA for it
"""
from ._curves import (AUX_MARKER, CURVE_KEYS, TERM_COLORS, compare_figure, drawn_series, ema, loss_difference_figure,
                      run_info, term_weights, thin, total_of, training_curves_figure)
from ._lora import LORA_METHOD_COLORS, lora_compile_figure
from ._map import HIGHLIGHT_COLOR, HIGHLIGHT_LABELS, highlight_trace, ybar_map_figure
from ._style import (CLOUD_BUTTONS, COLOR_KINDS, MAX_COLOR_CATEGORIES, MODEL_COLORS, NEGATIVE_COLOR, NEUTRAL_COLOR,
                     OTHER, OTHER_COLOR, PALETTE, PLOTLY_CONFIG, POSITIVE_COLOR, ROBUST_PERCENTILES, SEQUENTIAL_SCALE,
                     SIGNED_SCALE, TOKEN_CHARS, color_categories, color_kind, color_spec, colorbar, finish, heat_colors,
                     hover_escape, map_groups, natural_key, plotly_scale, plural, robust_range, short_token)
from ._text import (colored_tokens_html, memory_figure, rgb_triplet, smoothness_figure, step_profile_figure,
                    template_figure, token_text_figure)

__all__ = ["PALETTE", "MAX_COLOR_CATEGORIES", "MODEL_COLORS", "OTHER", "OTHER_COLOR", "COLOR_KINDS", "SIGNED_SCALE",
           "SEQUENTIAL_SCALE", "POSITIVE_COLOR", "NEGATIVE_COLOR", "NEUTRAL_COLOR", "ROBUST_PERCENTILES",
           "CLOUD_BUTTONS", "PLOTLY_CONFIG", "TOKEN_CHARS", "plural", "short_token", "robust_range", "heat_colors",
           "plotly_scale", "colorbar", "finish", "hover_escape", "color_kind", "natural_key", "color_categories",
           "color_spec", "map_groups", "ybar_map_figure", "HIGHLIGHT_LABELS", "HIGHLIGHT_COLOR", "highlight_trace",
           "smoothness_figure", "step_profile_figure", "token_text_figure", "colored_tokens_html", "template_figure",
           "memory_figure",
           "CURVE_KEYS", "compare_figure", "loss_difference_figure", "TERM_COLORS", "AUX_MARKER", "drawn_series",
           "run_info", "ema", "total_of", "training_curves_figure", "thin",
           "LORA_METHOD_COLORS", "lora_compile_figure"]

# The functions' public home is this package, as numpy does for the functions of its submodules: their
# reprs and pickles name cgt_viz.figures, and tests/faults/test_audit.py finds them here.
for _name in __all__ + ["term_weights", "rgb_triplet"]:
    if getattr(globals()[_name], "__module__", "").startswith(__name__ + "."):
        globals()[_name].__module__ = __name__
del _name
