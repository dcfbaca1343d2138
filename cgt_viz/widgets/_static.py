"""The static form every view carries, so that a saved notebook still shows its plots without a kernel.

A view's display is one output whose MIME bundle holds, next to the live widget
(`application/vnd.jupyter.widget-view+json`, which a frontend with the kernel prefers):

    application/vnd.plotly.v1+json   the view's main figure; JupyterLab draws it with the plotly extension
                                     that ships inside the plotly package (a safe renderer: it is also used
                                     for untrusted notebooks, e.g. one executed by nbclient / nbconvert)
    text/html                        every figure of the view, drawn by plotly.js (nbconvert HTML, nbviewer,
                                     VS Code, any HTML frontend); plotly.js itself (from the installed plotly
                                     package, never a CDN) is embedded once per kernel session: in the first
                                     view displayed, which keeps it on later refreshes
    text/plain                       one line saying what the view is

The static copy follows the view: after every cell that changed a displayed view, the output is refreshed
in place (`update_display`), so a monitor shows the finished training, an explorer its last colouring.
Interactions in the browser between cells reach the saved copy with the next cell that runs.
Big views are thinned in the static copy (the explorer draws at most `STATIC_MAX_POINTS` points).

nbconvert picks the widget view over text/html whenever the notebook stores widget state, which
`jupyter nbconvert --execute` and nbclient do by default (JupyterLab does not); then the static form needs
the preprocessor in `cgt_viz.widgets.export`:

    jupyter nbconvert --to html --execute --HTMLExporter.preprocessors=cgt_viz.widgets.export.StaticViews nb.ipynb

Where it does not help: JupyterLab draws a *trusted* notebook's widget output with the widget renderer
even when the widget model is gone ("model not found"), ignoring the rest of the bundle (the renderer is
chosen by MIME-type rank, the widget's -10 beats every other, before the model is looked up, and
@jupyter-widgets/jupyterlab-manager's renderModel does not fall back; the order of keys in the bundle
plays no part); there `view.show_static()` in a cell of its own, or the preprocessor above with
`--to notebook`, gives plots that survive. CGT_VIZ_STATIC=json keeps plotly.js out of the notebook
(JupyterLab and VS Code only), CGT_VIZ_STATIC=0 turns the static form off (see `mode`).

GitHub's notebook preview runs no JavaScript and shows only images and text. Opt in and the bundle also holds

    image/png                        the view's main figure, drawn by kaleido in a headless system Chromium
                                     (offline: local plotly.js, no MathJax); about a second per figure, so
                                     off by default: `cgt_viz.widgets.static_png(True)`, CGT_STATIC_PNG=1,
                                     `view.show_static(png=True)`, or `--StaticViews.png=True` on the
                                     preprocessor (which draws it from the stored plotly JSON); see `_png`
"""
from __future__ import annotations

import hashlib
import html
import json
import os
import threading
import uuid
import weakref
from pathlib import Path

import plotly
import plotly.io as pio

from ..figures import PLOTLY_CONFIG
from . import _png

STATIC_MAX_POINTS = 5000            # points in an explorer's static copy (a saved notebook grows by these only)
PLOTLY_MIME = "application/vnd.plotly.v1+json"
PNG_MIME = "image/png"
_READY_EVENT = "cgt-viz-plotly-ready"
_PLOTLY_JS_PATH = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"

_lock = threading.Lock()
_carrier_id: str | None = None      # the display id whose static HTML embeds plotly.js in this process
_shown: dict[str, tuple[weakref.ref, str]] = {}   # display id -> (view, hash of its last published static form)
_hook_installed = False
_before_cell: dict[str, str] = {}  # display id -> hash of a page-state view's static form when the cell began


WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
OUTPUT_METADATA = {"cgt_viz": {"static": True}}   # marks an output that carries a static form


def mode() -> str:
    """CGT_VIZ_STATIC: "1" (default) plotly JSON + HTML, "json" the plotly JSON only (no plotly.js in the
    notebook: JupyterLab and VS Code still draw it, nbconvert HTML does not), "0" no static form."""
    value = os.environ.get("CGT_VIZ_STATIC", "1")
    return value if value in ("0", "1", "json") else "1"


def enabled() -> bool:
    return mode() != "0"


def figure_json(fig) -> dict:
    """A figure as plain JSON (numpy arrays become lists), the way plotly's own renderers send it."""
    return json.loads(pio.to_json(fig, validate=False, remove_uids=True))


def _script_json(obj) -> str:
    """JSON safe inside a <script> element."""
    return json.dumps(obj).replace("</", "<\\/").replace("<!--", "<\\!--")


def plotly_js_html() -> str:
    """plotly.js from the installed plotly package as one inline <script> that sets window.Plotly (also
    on pages with an AMD loader) and then tells every static view waiting for it."""
    code = _PLOTLY_JS_PATH.read_text(encoding="utf-8")
    return ("<script type=\"text/javascript\">window.PlotlyConfig = {MathJaxConfig: 'local'};</script>"
            "<script type=\"text/javascript\">if (!window.Plotly) { (function (define, module, exports) {\n"
            f"{code}\n}}).call(window); }}\nwindow.dispatchEvent(new Event('{_READY_EVENT}'));</script>")


def figures_html(figures, *, include_plotlyjs: bool = False, title: str | None = None) -> str:
    """Static HTML of several figures: one div each, drawn by plotly.js when it is on the page (now or
    later: a view shown before the one that carries plotly.js waits for it)."""
    key = uuid.uuid4().hex[:12]
    specs = [figure_json(f) for f in figures]
    divs = "".join(f'<div id="cgt-{key}-{i}" class="cgt-viz-static-plot" style="width:100%"></div>'
                   for i in range(len(specs)))
    head = f"<div class='cgt-viz-static-title' style='font:12px sans-serif;color:#555'>{html.escape(title)}</div>" \
        if title else ""
    draw = f"""<script type="application/json" id="cgt-{key}-data">{_script_json(specs)}</script>
<script type="text/javascript">(function () {{
  function draw() {{
    var specs = JSON.parse(document.getElementById("cgt-{key}-data").textContent);
    specs.forEach(function (f, i) {{
      var el = document.getElementById("cgt-{key}-" + i);
      if (el && !el.dataset.drawn) {{
        el.dataset.drawn = "1";
        window.Plotly.newPlot(el, f.data, f.layout, Object.assign({{responsive: true}}, {_script_json(PLOTLY_CONFIG)}, f.config || {{}}));
      }}
    }});
  }}
  if (window.Plotly) draw(); else window.addEventListener("{_READY_EVENT}", draw);
}})();</script>"""
    js = plotly_js_html() if include_plotlyjs else ""
    return f'<div class="cgt-viz-static" data-figures="{len(specs)}">{head}{js}{divs}{draw}</div>'


class StaticForm:
    """Mixin for the widget views: `static_figures()` (the figures a saved copy shows, main one first) and
    `static_text()`; displaying the view publishes the live widget and the static form in one bundle.

    refresh_after_cells: re-publish the static form after each cell that changed it. Re-publishing re-renders
    the live widget from its model, which loses what only the page holds (a selection made since); views
    whose state lives in the page set it False: their static form is re-published only for changes a cell
    made, not for what the page did between cells."""

    refresh_after_cells = True

    def static_figures(self) -> list:                          # pragma: no cover - each view defines it
        raise NotImplementedError

    def static_text(self) -> str:
        return f"{type(self).__name__} (an interactive cgt_viz view; run the cell to interact with it)"

    def static_html(self, include_plotlyjs: bool = True) -> str:
        """Every figure of the view as standalone HTML (plotly.js inline unless include_plotlyjs=False)."""
        return figures_html(self.static_figures(), include_plotlyjs=include_plotlyjs)

    def static_bundle(self, include_plotlyjs: bool = False, figures=None, png: bool | None = None) -> dict:
        """The static part of the display bundle (see the module docstring). png: add image/png of the main
        figure (None: as `static_png()` / CGT_STATIC_PNG say, off by default; see `cgt_viz.widgets._png`)."""
        figs = self.static_figures() if figures is None else figures
        main = figure_json(figs[0])
        bundle = {PLOTLY_MIME: main, "text/plain": self.static_text()}
        if mode() != "json":
            bundle["text/html"] = figures_html(figs, include_plotlyjs=include_plotlyjs)
        if _png.wanted(png):
            data = _png.figure_png(main)            # None (after one warning) without kaleido / Chromium
            if data is not None:
                bundle[PNG_MIME] = data
        return bundle

    def show_static(self, png: bool | None = None) -> None:
        """Display only the static form (no widget): a plot that survives wherever the notebook goes.
        png=True adds a PNG of the main figure (for GitHub's preview), whatever `static_png()` says."""
        from IPython.display import display
        display(self.static_bundle(include_plotlyjs=True, png=png), raw=True, metadata=OUTPUT_METADATA)

    def _bundle(self, display_id: str, figures=None) -> tuple[dict, str]:
        """(display bundle, digest of its figures) for the output `display_id`."""
        global _carrier_id
        with _lock:
            if _carrier_id is None:
                _carrier_id = display_id
            carry = _carrier_id == display_id
        figs = self.static_figures() if figures is None else figures
        bundle = self.static_bundle(include_plotlyjs=carry, figures=figs)
        bundle.update(self._repr_mimebundle_())          # the widget view, from ipywidgets
        bundle["text/plain"] = self.static_text()
        return bundle, _digest(figs)

    def _ipython_display_(self) -> None:
        from IPython.display import display
        if not enabled():
            display(self._repr_mimebundle_(), raw=True)
            return
        display_id = uuid.uuid4().hex
        bundle, digest = self._bundle(display_id)
        display(bundle, raw=True, display_id=display_id, metadata=OUTPUT_METADATA)
        _shown[display_id] = (weakref.ref(self), digest)
        _install_hook()


def _digest(figures) -> str:
    return hashlib.sha1(b"".join(pio.to_json(f, validate=False).encode() for f in figures)).hexdigest()


def refresh_static(*_args) -> int:
    """Re-publish the static form of every displayed view that changed since it was last published (runs
    after each cell). Returns the number of outputs updated."""
    from IPython.display import update_display
    updated = 0
    for display_id, (ref, digest) in list(_shown.items()):
        view = ref()
        if view is None:
            _shown.pop(display_id, None)
            continue
        try:
            figs = view.static_figures()
            now = _digest(figs)
            # a page-state view is re-published only for what this cell changed, not for what the page did
            # between cells (the page shows that already, and re-rendering it would lose the page's state);
            # one displayed by this cell has no earlier state: what changed since its display is this cell's
            if now == digest or (not view.refresh_after_cells and display_id in _before_cell
                                 and _before_cell[display_id] == now):
                continue
            bundle, digest = view._bundle(display_id, figs)
        except Exception:            # a view in a broken state keeps its last copy
            continue
        update_display(bundle, raw=True, display_id=display_id, metadata=OUTPUT_METADATA)
        _shown[display_id] = (ref, digest)
        updated += 1
    return updated


def note_before_cell(*_args) -> None:
    """Remember the static form of each page-state view as the cell starts (runs before each cell)."""
    _before_cell.clear()
    for display_id, (ref, _digest_shown) in list(_shown.items()):
        view = ref()
        if view is not None and not view.refresh_after_cells:
            try:
                _before_cell[display_id] = _digest(view.static_figures())
            except Exception:
                pass


def _install_hook() -> None:
    global _hook_installed
    from ._base import kernel_shell
    shell = kernel_shell()
    with _lock:
        if shell is None or _hook_installed:
            return
        shell.events.register("pre_run_cell", note_before_cell)
        shell.events.register("post_run_cell", refresh_static)
        _hook_installed = True
