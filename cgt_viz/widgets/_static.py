"""The static form every view carries, so that a saved notebook still shows its plots without a kernel.

A view's display is three outputs, one after the other:

    1. text/html: a <style> for JupyterLab / Notebook 7 (below); hides itself
    2. the live widget (`application/vnd.jupyter.widget-view+json`) and a text/plain line
    3. the static copy (display id of its own, refreshed in place), marked with metadata cgt_viz.static:
       application/vnd.plotly.v1+json  the view's main figure; JupyterLab draws it with the plotly extension
                                       that ships inside the plotly package (a safe renderer: also used for
                                       untrusted notebooks, e.g. one executed by nbclient / nbconvert)
       text/html                       every figure of the view, drawn by plotly.js (nbconvert HTML, nbviewer,
                                       VS Code, any HTML frontend); plotly.js itself (from the installed plotly
                                       package, never a CDN; gzip + base64) is embedded in the first
                                       view of every cell run, so an export draws whatever outputs survived
                                       re-runs (the `StaticViews` preprocessor keeps one copy per export)
       text/plain                      one line saying what the view is

Why three: JupyterLab draws an output holding the widget MIME type with the widget renderer (rank -10,
before every other) and, when the widget model is gone (kernel shut down or restarted, notebook reopened),
shows "Error displaying widget: model not found" without falling back to the rest of the bundle. So the
static copy is an output of its own, and the style hides it while a live view is drawn next to it
(`.cgt-viz-view` on the view's root), and hides the failed live output when a static copy is drawn after it.
No JupyterLab extension of our own is involved; the style needs a trusted notebook (a session's own outputs,
or one saved and reopened by the same user); untrusted, the live output shows its text line above the plot.

The widget model itself always holds the current figure (`_base.CurrentState`), so a page reloaded with the
kernel alive draws the latest state of every view.

The static copy follows the view: after every cell that changed a displayed view, the output is refreshed
in place (`update_display`), so a monitor shows the finished training, an explorer its last colouring.
Changes made through a view's controls between cells reach the saved copy with the next cell that runs
(JupyterLab applies display updates only to the cell being run; updating the saved copy straight from a
widget event would need a frontend extension); `view.show_static()` shows the view as it is now.
Big views are thinned in the static copy (the explorer draws at most `STATIC_MAX_POINTS` points).

nbconvert draws the static copy's text/html; where the notebook stores widget state (nbclient and
`jupyter nbconvert --execute` do) it would also try the live widget, which cannot draw without a kernel:
the preprocessor in `cgt_viz.widgets.export` drops the live outputs and keeps one copy of plotly.js:

    jupyter nbconvert --to html --execute --HTMLExporter.preprocessors=cgt_viz.widgets.export.StaticViews nb.ipynb

CGT_VIZ_STATIC=json keeps plotly.js out of the notebook (JupyterLab and VS Code only), CGT_VIZ_STATIC=0
turns the static form off (see `mode`).

GitHub's notebook preview runs no JavaScript and shows only images and text. Opt in and the bundle also holds

    image/png                        the view's main figure, drawn by kaleido in a headless system Chromium
                                     (offline: local plotly.js, no MathJax); slow per figure, so
                                     off by default: `cgt_viz.widgets.static_png(True)`, CGT_STATIC_PNG=1,
                                     `view.show_static(png=True)`, or `--StaticViews.png=True` on the
                                     preprocessor (which draws it from the stored plotly JSON); see `_png`
"""
from __future__ import annotations

import base64
import gzip
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
_PLOTLY_JS_B64: str | None = None

_lock = threading.Lock()
_carriers: set[str] = set()         # display ids whose static HTML embeds plotly.js (one per cell run)
_cell_has_carrier = False           # the running cell has displayed a view that carries plotly.js
_in_cell = False                    # between pre_run_cell and post_run_cell
_shown: dict[str, tuple[weakref.ref, str]] = {}   # display id -> (view, hash of its last published static form)
_hook_installed = False


WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
PLOTLY_JS_START = '<script type="text/javascript" data-cgt-viz="plotly.js">'   # opens the one script that holds plotly.js
OUTPUT_METADATA = {"cgt_viz": {"static": True}}   # marks an output that carries a static form
VIEW_CLASS = "cgt-viz-view"                          # on the live widget's root element
# The first of a view's three outputs: CSS for JupyterLab (and Notebook 7), applied while the notebook is
# trusted (the outputs of a session always are). Scoped to the three outputs of a view (style, live, static),
# it hides the style output itself; the static copy while the live view is drawn; and the live output while
# it has no view (kernel gone: "Loading widget..." / "model not found") and the static copy is drawn.
_TRIPLE = ".jp-NotebookPanel .jp-OutputArea-child:has(.cgt-viz-style)"
LIVE_STYLE = f"""<div class="cgt-viz-style" style="display:none"><style>
{_TRIPLE} {{ display: none; }}
{_TRIPLE} + .jp-OutputArea-child:has(.cgt-viz-view) + .jp-OutputArea-child {{ display: none; }}
{_TRIPLE} + .jp-OutputArea-child:not(:has(.cgt-viz-view)):has(+ .jp-OutputArea-child .jp-RenderedPlotly) {{ display: none; }}
</style></div>"""


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


def _plotly_js_gzip_b64() -> str:
    global _PLOTLY_JS_B64
    if _PLOTLY_JS_B64 is None:
        _PLOTLY_JS_B64 = base64.b64encode(gzip.compress(_PLOTLY_JS_PATH.read_bytes(), 9, mtime=0)).decode("ascii")
    return _PLOTLY_JS_B64


def plotly_js_html() -> str:
    """plotly.js from the installed plotly package (gzip + base64, well under half its size) as one inline
    <script>: the browser inflates it (DecompressionStream), runs it unless window.Plotly is there already
    (also on pages with an AMD loader), then tells every static view waiting for it. Every cell that shows a
    view carries one, so an export draws whichever outputs survive re-runs; `StaticViews` keeps one."""
    return (PLOTLY_JS_START + "window.PlotlyConfig = {MathJaxConfig: 'local'};"
            "(function () { var b64 = \"" + _plotly_js_gzip_b64() + "\";\n"
            "if (window.Plotly) { window.dispatchEvent(new Event('" + _READY_EVENT + "')); return; }\n"
            "var bin = atob(b64), bytes = new Uint8Array(bin.length);\n"
            "for (var i = 0; i < bin.length; i += 1) bytes[i] = bin.charCodeAt(i);\n"
            "new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'))).text()"
            ".then(function (code) {\n"
            "  if (!window.Plotly) new Function('define', 'module', 'exports', code).call(window);\n"
            "  window.dispatchEvent(new Event('" + _READY_EVENT + "'));\n"
            "}).catch(function (err) { console.error('[cgt_viz] could not load plotly.js', err); });\n"
            "})();</script>")


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
    `static_text()`; displaying the view publishes the live widget and the static form (see the module
    docstring), and the static form is re-published after each cell that changed it."""

    def static_figures(self) -> list:                          # pragma: no cover - each view defines it
        raise NotImplementedError

    def snapshot_figures(self) -> list:
        """The figures of a one-off copy (`show_static`, `static_html`): never re-published, so they may show
        what a re-published copy leaves out (the explorer's selection). Default: `static_figures()`."""
        return self.static_figures()

    def static_text(self) -> str:
        return self.live_text()

    def live_text(self) -> str:
        """The live output's text/plain: what a frontend without the widget shows in its place (an export
        without StaticViews, an untrusted notebook). It is never refreshed, so it says what the view is, not
        its state (a monitor's "0 steps recorded" stood above the finished run in exports); the static copy
        after it is refreshed and carries `static_text()`."""
        return f"{type(self).__name__} (an interactive cgt_viz view; run the cell to interact with it)"

    def static_html(self, include_plotlyjs: bool = True) -> str:
        """Every figure of the view as standalone HTML (plotly.js inline unless include_plotlyjs=False)."""
        return figures_html(self.snapshot_figures(), include_plotlyjs=include_plotlyjs)

    def static_bundle(self, include_plotlyjs: bool = False, figures=None, png: bool | None = None) -> dict:
        """The static part of the display bundle (see the module docstring). png: add image/png of the main
        figure (None: as `static_png()` / CGT_STATIC_PNG say, off by default; see `cgt_viz.widgets._png`)."""
        figs = self.static_figures() if figures is None else figures
        main = figure_json(figs[0])
        # JupyterLab's plotly renderer takes the config from the bundle: without it the copy drawn after a
        # restart or reopen had plotly's logo link in its modebar, unlike the live view and the HTML copy
        main["config"] = dict(PLOTLY_CONFIG)
        bundle = {PLOTLY_MIME: main, "text/plain": self.static_text()}
        if mode() != "json":
            bundle["text/html"] = figures_html(figs, include_plotlyjs=include_plotlyjs)
        if _png.wanted(png):
            data = _png.figure_png({k: v for k, v in main.items() if k != "config"})   # None (after one warning) without kaleido / Chromium
            if data is not None:
                bundle[PNG_MIME] = data
        return bundle

    def show_static(self, png: bool | None = None) -> None:
        """Display only the static form (no widget): a plot that survives wherever the notebook goes.
        png=True adds a PNG of the main figure (for GitHub's preview), whatever `static_png()` says."""
        from IPython.display import display
        display(self.static_bundle(include_plotlyjs=True, png=png, figures=self.snapshot_figures()), raw=True,
                metadata=OUTPUT_METADATA)

    def _bundle(self, display_id: str, figures=None) -> tuple[dict, str]:
        """(static bundle, digest of its figures) for the output `display_id`."""
        with _lock:
            carry = display_id in _carriers
        figs = self.static_figures() if figures is None else figures
        return self.static_bundle(include_plotlyjs=carry, figures=figs), _digest(figs)

    def _ipython_display_(self) -> None:
        from IPython.display import display
        if not enabled():
            display(self._repr_mimebundle_(), raw=True)
            return
        global _cell_has_carrier
        self.add_class(VIEW_CLASS)
        display_id = uuid.uuid4().hex
        with _lock:
            if not _cell_has_carrier:              # the first view of each cell run carries plotly.js
                _carriers.add(display_id)
                _cell_has_carrier = _in_cell
        bundle, digest = self._bundle(display_id)
        display({"text/html": LIVE_STYLE}, raw=True, metadata={"cgt_viz": {"style": True}})
        live = self._repr_mimebundle_()            # the widget view, from ipywidgets
        live["text/plain"] = self.live_text()
        display(live, raw=True, metadata={"cgt_viz": {"live": True}})
        display(bundle, raw=True, display_id=display_id, metadata=OUTPUT_METADATA)
        _shown[display_id] = (weakref.ref(self), digest)
        _install_hook()


def _digest(figures) -> str:
    return hashlib.sha1(b"".join(pio.to_json(f, validate=False).encode() for f in figures)).hexdigest()


def refresh_static(*_args) -> int:
    """Re-publish the static form of every displayed view that changed since it was last published (runs
    after each cell; only the static output is replaced, the live widget next to it is not touched).
    Returns the number of outputs updated."""
    global _in_cell
    _in_cell = False
    from IPython.display import update_display
    updated = 0
    for display_id, (ref, digest) in list(_shown.items()):
        view = ref()
        if view is None:
            _shown.pop(display_id, None)
            _carriers.discard(display_id)
            continue
        try:
            figs = view.static_figures()
            now = _digest(figs)
            if now == digest:
                continue
            bundle, digest = view._bundle(display_id, figs)
        except Exception:            # a view in a broken state keeps its last copy
            continue
        update_display(bundle, raw=True, display_id=display_id, metadata=OUTPUT_METADATA)
        _shown[display_id] = (ref, digest)
        updated += 1
    return updated


def cell_started(*_args) -> None:
    """A cell begins: its first view will carry plotly.js (runs before each cell)."""
    global _cell_has_carrier, _in_cell
    _cell_has_carrier = False
    _in_cell = True


def _install_hook() -> None:
    global _hook_installed, _in_cell
    from ._base import kernel_shell
    shell = kernel_shell()
    with _lock:
        if shell is None or _hook_installed:
            return
        shell.events.register("pre_run_cell", cell_started)
        shell.events.register("post_run_cell", refresh_static)
        _hook_installed = True
        _in_cell = True              # the first view of a session is displayed by a cell
