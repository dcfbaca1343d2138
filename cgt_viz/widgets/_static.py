"""The static form every view carries, so that a saved notebook still shows its plots without a kernel.

A view's display is its style, its live widget, then one static output per figure it can show:

    1. text/html: a <style> for JupyterLab / Notebook 7 (below); hides itself
    2. the live widget (`application/vnd.jupyter.widget-view+json`) and a text/plain line
    3. `static_slots` static outputs (display ids of their own, refreshed in place), marked with metadata
       cgt_viz.static; output i holds the view's figure i (a slot the view does not fill now is empty):
       application/vnd.plotly.v1+json  the figure; JupyterLab draws it with the plotly extension that ships
                                       inside the plotly package (a safe renderer: also used for untrusted
                                       notebooks, e.g. one executed by nbclient / nbconvert), VS Code with
                                       its own. One output per figure, so a notebook reopened without its
                                       kernel shows every figure of a view (the strip's token text, the
                                       LoRA plot), as an export does, not only the first.
       text/html                       the same figure drawn by plotly.js (nbconvert HTML, nbviewer, any HTML
                                       frontend) once plotly.js is on the page
       text/plain                      one line saying what the view is

plotly.js (4.8 MB; 2 MB gzip + base64) is not in the notebook: a saved notebook stays small whatever number
of views it shows. Whoever draws the HTML brings it: exports go through the `StaticViews` preprocessor
(`cgt_viz.widgets.export`), which puts one copy, from the installed plotly package (never a CDN), into the
first static output, so the page draws offline; `make env` configures it for `jupyter nbconvert --to html`
and for JupyterLab's "Save and Export Notebook As > HTML". CGT_VIZ_STATIC=embed stores one copy in the
first view of every cell run instead, for HTML frontends that run no preprocessor (the notebook then grows
by 2 MB per such cell).

Why separate outputs: JupyterLab draws an output holding the widget MIME type with the widget renderer (rank
-10, before every other) and, when the widget model is gone (kernel shut down or restarted, notebook
reopened), shows "Error displaying widget: model not found" without falling back to the rest of the bundle.
So the static copies are outputs of their own, and the style hides them while a live view is drawn next
to them (`.cgt-viz-view` on the view's root), and hides the failed live output when a static copy is drawn
after it. No JupyterLab extension of our own is involved; the style needs a trusted notebook (a session's
own outputs, or one saved and reopened by the same user); untrusted, the live output shows its text line
above the plots.

The widget model itself always holds the current figure (`_base.CurrentState`), so a page reloaded with the
kernel alive draws the latest state of every view.

The static copy follows the view: after every cell that changed a displayed view, the outputs are refreshed
in place (`update_display`), so a monitor shows the finished training, an explorer its last colouring.
Changes made through a view's controls between cells reach the saved copy with the next cell that runs
(JupyterLab applies display updates only to the cell being run; updating the saved copy straight from a
widget event would need a frontend extension); `view.show_static()` shows the view as it is now.
Big views are thinned in the static copy (the explorer draws at most `STATIC_MAX_POINTS` points).

nbconvert draws the static copies' text/html; where the notebook stores widget state (nbclient and
`jupyter nbconvert --execute` do) it would also try the live widget, which cannot draw without a kernel:
the preprocessor drops the live outputs and adds plotly.js once:

    jupyter nbconvert --to html --execute --HTMLExporter.preprocessors=cgt_viz.widgets.export.StaticViews nb.ipynb

CGT_VIZ_STATIC=json keeps the HTML out of the notebook (JupyterLab and VS Code only), CGT_VIZ_STATIC=0
turns the static form off (see `mode`).

GitHub's notebook preview runs no JavaScript and shows only images and text. Opt in and the main figure's
output also holds

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
from . import _cells, _png

STATIC_MAX_POINTS = 5000            # points in an explorer's static copy (a saved notebook grows by these only)
PLOTLY_MIME = "application/vnd.plotly.v1+json"
PNG_MIME = "image/png"
_READY_EVENT = "cgt-viz-plotly-ready"
_PLOTLY_JS_PATH = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
_PLOTLY_JS_B64: str | None = None

_lock = threading.Lock()
_carriers: set[str] = set()         # CGT_VIZ_STATIC=embed: views (first display id) whose HTML embeds plotly.js
_cell_has_carrier = False           # the running cell has displayed a view that carries plotly.js
_shown: dict[str, tuple[weakref.ref, list[str], str]] = {}   # first display id -> (view, its display ids, hash of its last published figures)


WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
PLOTLY_JS_START = '<script type="text/javascript" data-cgt-viz="plotly.js">'   # opens the one script that holds plotly.js
OUTPUT_METADATA = {"cgt_viz": {"static": True}}   # marks an output that carries a static form
VIEW_CLASS = "cgt-viz-view"                          # on the live widget's root element
# The first of a view's three outputs: CSS for JupyterLab (and Notebook 7), applied while the notebook is
# trusted (the outputs of a session always are). Scoped to the three outputs of a view (style, live, static),
# it hides the style output itself; the static copy while the live view is drawn; and the live output while
# it has no view (kernel gone: "Loading widget..." / "model not found") and the static copy is drawn.
_FIRST = ".jp-NotebookPanel .jp-OutputArea-child:has(.cgt-viz-style)"
_NEXT = " + .jp-OutputArea-child"


def live_style(slots: int = 1) -> str:
    """The style output of a view with `slots` static outputs: hides itself, the static outputs while the
    live view is drawn (its root has `.cgt-viz-view`), and the failed live output (no view: "Loading
    widget..." / "model not found") when the first static copy is drawn after it."""
    # only a drawn figure in a static slot: text the cell prints after the view (a training log) stays visible
    hide_static = ",\n".join(f"{_FIRST}{_NEXT}:has(.cgt-viz-view){_NEXT * (i + 1)}:has(.jp-RenderedPlotly)"
                              for i in range(slots))
    return f"""<div class="cgt-viz-style" style="display:none"><style>
{_FIRST} {{ display: none; }}
{hide_static} {{ display: none; }}
{_FIRST}{_NEXT}:not(:has(.cgt-viz-view)):has(+ .jp-OutputArea-child .jp-RenderedPlotly) {{ display: none; }}
</style></div>"""


LIVE_STYLE = live_style(1)     # a view with one figure


def mode() -> str:
    """CGT_VIZ_STATIC: "1" (default) plotly JSON + HTML, plotly.js left to the exporter (`StaticViews`);
    "embed" the same with plotly.js in the first view of every cell run (for HTML frontends that run no
    preprocessor; 2 MB per such cell); "json" the plotly JSON only (JupyterLab and VS Code draw it,
    nbconvert HTML does not); "0" no static form."""
    value = os.environ.get("CGT_VIZ_STATIC", "1")
    return value if value in ("0", "1", "json", "embed") else "1"


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
    (also on pages with an AMD loader), then tells every static view waiting for it. It is needed on a page
    once: `StaticViews` adds it to an export (CGT_VIZ_STATIC=embed: to every cell run)."""
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
    `static_text()`; displaying the view publishes the live widget and one static output per figure (see
    the module docstring), re-published after each cell that changed them."""

    static_slots = 1              # the most figures `static_figures()` returns: one static output each

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
        """The bundle of the first static output: the main figure (see `static_bundles`)."""
        return self.static_bundles(include_plotlyjs, figures, png, slots=1)[0]

    def static_bundles(self, include_plotlyjs: bool = False, figures=None, png: bool | None = None,
                       slots: int | None = None) -> list[dict]:
        """One bundle per static output (see the module docstring): `slots` of them (default
        `static_slots`), figure i in bundle i, an empty bundle where the view has no figure i now; figures
        beyond the last slot join its HTML. png: add image/png of the main figure (None: as `static_png()`
        / CGT_STATIC_PNG say, off by default; see `cgt_viz.widgets._png`)."""
        figs = list(self.static_figures() if figures is None else figures)
        slots = max(1, self.static_slots if slots is None else slots)
        groups = [figs[i:i + 1] for i in range(slots - 1)] + [figs[slots - 1:]]
        bundles = []
        for i, group in enumerate(groups):
            if not group:
                bundles.append({"text/html": "", "text/plain": ""})
                continue
            main = figure_json(group[0])
            # JupyterLab's plotly renderer takes the config from the bundle: without it the copy drawn after a
            # restart or reopen had plotly's logo link in its modebar, unlike the live view and the HTML copy
            main["config"] = dict(PLOTLY_CONFIG)
            text = self.static_text() if i == 0 else f"{self.static_text()} (figure {i + 1})"
            bundle = {PLOTLY_MIME: main, "text/plain": text}
            if mode() != "json":
                bundle["text/html"] = figures_html(group, include_plotlyjs=include_plotlyjs and i == 0)
            if i == 0 and _png.wanted(png):
                data = _png.figure_png({k: v for k, v in main.items() if k != "config"})   # None (after one warning) without kaleido / Chromium
                if data is not None:
                    bundle[PNG_MIME] = data
            bundles.append(bundle)
        return bundles

    def show_static(self, png: bool | None = None) -> None:
        """Display only the static form (no widget), one output per figure: a plot that survives wherever
        the notebook goes. png=True adds a PNG of the main figure (for GitHub's preview), whatever
        `static_png()` says."""
        from IPython.display import display
        figs = self.snapshot_figures()
        for bundle in self.static_bundles(include_plotlyjs=mode() == "embed", png=png, figures=figs,
                                          slots=max(1, len(figs))):
            display(bundle, raw=True, metadata=OUTPUT_METADATA)

    def _bundles(self, display_id: str, figures=None) -> tuple[list[dict], str]:
        """(static bundles, digest of their figures) for the view whose first static output is `display_id`."""
        with _lock:
            carry = display_id in _carriers
        figs = self.static_figures() if figures is None else figures
        return self.static_bundles(include_plotlyjs=carry, figures=figs), _digest(figs)

    def _ipython_display_(self) -> None:
        from IPython.display import display
        if not enabled():
            display(self._repr_mimebundle_(), raw=True)
            return
        global _cell_has_carrier
        self.add_class(VIEW_CLASS)
        display_ids = [uuid.uuid4().hex for _ in range(max(1, self.static_slots))]
        with _lock:
            if mode() == "embed" and not _cell_has_carrier:   # the first view of each cell run carries plotly.js
                _carriers.add(display_ids[0])
                _cell_has_carrier = _cells.cell_running()
        bundles, digest = self._bundles(display_ids[0])
        display({"text/html": live_style(len(display_ids))}, raw=True, metadata={"cgt_viz": {"style": True}})
        live = self._repr_mimebundle_()            # the widget view, from ipywidgets
        live["text/plain"] = self.live_text()
        display(live, raw=True, metadata={"cgt_viz": {"live": True}})
        for display_id, bundle in zip(display_ids, bundles):
            display(bundle, raw=True, display_id=display_id, metadata=OUTPUT_METADATA)
        _shown[display_ids[0]] = (weakref.ref(self), display_ids, digest)
        _cells.follow_cells()


def _digest(figures) -> str:
    return hashlib.sha1(b"".join(pio.to_json(f, validate=False).encode() for f in figures)).hexdigest()


def refresh_static(*_args) -> int:
    """Re-publish the static outputs of every displayed view that changed since they were last published
    (runs after each cell; only the static outputs are replaced, the live widget next to them is not
    touched). Returns the number of outputs updated."""
    from IPython.display import update_display
    updated = 0
    for key, (ref, display_ids, digest) in list(_shown.items()):
        view = ref()
        if view is None:
            _shown.pop(key, None)
            _carriers.discard(key)
            continue
        try:
            figs = view.static_figures()
            now = _digest(figs)
            if now == digest:
                continue
            bundles, digest = view._bundles(key, figs)
        except Exception:            # a view in a broken state keeps its last copy
            continue
        for display_id, bundle in zip(display_ids, bundles):
            update_display(bundle, raw=True, display_id=display_id, metadata=OUTPUT_METADATA)
            updated += 1
        _shown[key] = (ref, display_ids, digest)
    return updated


def cell_started(*_args) -> None:
    """A cell begins: its first view will carry plotly.js (runs before each cell)."""
    global _cell_has_carrier
    _cell_has_carrier = False


_cells.on_cell_start(cell_started)
_cells.on_cell_end(refresh_static)
