"""Shared pieces of the widgets: a FigureWidget that keeps plotly's 5 MB JavaScript out of saved notebooks,
in-place figure replacement, and small UI helpers.

Why `LeanFigureWidget`: plotly's `FigureWidget` is an anywidget whose synced `_esm` trait is the whole
plotly.js widget bundle (~5 MB). Every saved copy of widget state (nbclient/nbconvert store it by default,
JupyterLab when "save widget state" is on) then carries 5 MB per figure. Here `_esm` is a 2 KB loader.
The bundle still reaches the browser with each widget made in a cell (in its first message, as with
plotly's own widget, so it also works while the kernel is busy training), but in a `_bundle` trait that
is emptied when the cell finishes, so saved state stays small; a page opened later asks for it with one
custom message. The browser loads it once and keeps the module in `globalThis` for every later figure.
Trade-off: a saved notebook reopened without its kernel shows no plots (plain FigureWidget state would
need 5 MB per figure); the figure functions in `cgt_viz.figures` are the way to static HTML.
Set the environment variable CGT_VIZ_EMBED_PLOTLY=1 to use plain `go.FigureWidget` instead.

The loader also sends each click and box/lasso selection to the kernel as a message of its own, and no
hovers: through plotly's synced trait, a selection made while the kernel was busy waited in ipywidgets'
pending update and the next hover replaced it (notebook 04's background UMAP fit, which holds the GIL,
made the kernel slow to answer).
"""
from __future__ import annotations

import contextlib
import html
import inspect
import os
import weakref
from pathlib import Path

import numpy as np
import plotly
import plotly.graph_objects as go
import traitlets

from .. import analysis as A
from .._checks import refuse
from ..contracts import check_inputs, check_ybar_array
from ..sequences import prepare_sequences_unchecked
from ..figures import PLOTLY_CONFIG
from . import _cells

_BUNDLE_PATH = Path(plotly.__file__).parent / "package_data" / "widgetbundle.js"
_BUNDLE_TEXT: str | None = None

_LOADER = """
const KEY = "__cgt_viz_plotly_widget_%(version)s__";
function fromText(text) {
  const url = URL.createObjectURL(new Blob([text], { type: "text/javascript" }));
  return import(url).finally(() => URL.revokeObjectURL(url));
}
function bundle(model) {
  const have = globalThis[KEY];
  const text = model.get("_bundle");
  if (have && (have.source === "text" || !text)) return have.promise;
  let promise;
  if (text) {
    promise = fromText(text);
  } else {
    promise = new Promise((resolve, reject) => {
      const onMsg = (msg) => {
        if (!msg || msg.type !== "cgt_viz_bundle") return;
        model.off("msg:custom", onMsg);
        fromText(msg.text).then(resolve, reject);
      };
      model.on("msg:custom", onMsg);
      model.send({ type: "cgt_viz_bundle_request" });
    });
  }
  const entry = { promise, source: text ? "text" : "request" };
  globalThis[KEY] = entry;
  promise.catch(() => { if (globalThis[KEY] === entry) delete globalThis[KEY]; });
  return promise;
}
// plotly's view reports a point event (hover, click, selection) by setting the synced trait
// _js2py_pointsCallback; while the kernel has not answered the previous message (busy: a background fit
// holding the GIL, a running cell), ipywidgets merges further changes into one pending update, so the
// hover that follows a lasso overwrote the selection before it was sent. Here a click or selection goes
// to the kernel as a custom message of its own (never merged), and hovers, which no Python code listens
// to, are not sent at all.
const POINTS = "_js2py_pointsCallback";
function pointsAsMessages(model) {
  let skipSave = false;
  return new Proxy(model, {
    get(target, prop) {
      if (prop === "set") {
        return (key, value, ...rest) => {
          if (key === POINTS && value) {
            skipSave = true;
            const kind = value.event_type;
            if (kind !== "plotly_hover" && kind !== "plotly_unhover") {
              target.send({ type: "cgt_viz_points", data: JSON.parse(JSON.stringify(value)) });
            }
            return undefined;
          }
          skipSave = false;
          return target.set(key, value, ...rest);
        };
      }
      if (prop === "save_changes") {
        return (...args) => {
          if (skipSave) { skipSave = false; return undefined; }
          return target.save_changes(...args);
        };
      }
      const value = Reflect.get(target, prop);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
}
export default () => {
  let ready = null;
  return {
    initialize({ model }) {
      model = pointsAsMessages(model);
      ready = bundle(model).then((mod) => {
        const inner = mod.default();
        inner.initialize({ model });
        return inner;
      });
      ready.catch((err) => console.error("[cgt_viz] could not load plotly's widget code", err));
    },
    async render({ model, el }) {
      model = pointsAsMessages(model);
      el.textContent = "loading plot…";
      const slow = setTimeout(() => {
        el.textContent = "loading plot… (plotly's code comes from the kernel that made this widget: if that " +
          "kernel is gone, re-run the cell)";
      }, 10000);
      const inner = await ready;
      clearTimeout(slow);
      el.textContent = "";
      const cleanup = inner.render({ model, el });
      // plotly sizes a plot from its container when it draws it; one drawn while hidden gets 700 px and
      // anywidget sends no resize messages: follow the container's width instead
      const fit = () => {
        const full = el._fullLayout;
        if (full && el.clientWidth > 0 && Math.abs(full.width - el.clientWidth) > 2 && el._responsiveChartHandler) {
          el._responsiveChartHandler();
        }
      };
      const drawn = (event) => { if (event.detail && event.detail.element === el) fit(); };
      document.addEventListener("plotlywidget-after-render", drawn);
      const observer = new ResizeObserver(fit);
      observer.observe(el);
      return () => {
        observer.disconnect();
        document.removeEventListener("plotlywidget-after-render", drawn);
        if (typeof cleanup === "function") cleanup();
      };
    },
  };
};
""" % {"version": plotly.__version__.replace(".", "_")}

_carriers: list[weakref.ref] = []   # widgets still holding the bundle (FigureWidget is unhashable: no WeakSet)


def _bundle_text() -> str:
    global _BUNDLE_TEXT
    if _BUNDLE_TEXT is None:
        _BUNDLE_TEXT = _BUNDLE_PATH.read_text(encoding="utf-8")
    return _BUNDLE_TEXT


def _drop_bundles(*_args) -> None:
    """After a cell: the frontend has the bundle by now (comm_open came first); empty the traits."""
    while _carriers:
        widget = _carriers.pop()()
        if widget is not None:
            widget._bundle = ""


_cells.on_cell_end(_drop_bundles)


def _send_code_now(shell) -> bool:
    """Ship plotly's code with a new figure? In a cell, yes (the page may be new, and the kernel may stay
    busy); from a widget callback between cells (a click opening linked views), no: the page that sent the
    click has the code already (or asks for it), and 5 MB per figure would stall the answer."""
    if shell is None:
        return False
    _cells.follow_cells(shell)
    return _cells.cell_running()


def json_state(value):
    """A copy of widget state that JSON can carry (ipywidgets sends it with allow_nan=False): plotly's
    `Undefined` sentinel (an unset field) is dropped, a float NaN or infinity becomes None (null), numpy
    arrays stay as they are (they travel as binary buffers)."""
    from plotly.basedatatypes import Undefined
    if isinstance(value, dict):
        return {k: json_state(v) for k, v in value.items() if v is not Undefined}
    if isinstance(value, (list, tuple)):
        return [None if v is Undefined else json_state(v) for v in value]
    if isinstance(value, (float, np.floating)) and not np.isfinite(value):
        return None
    if isinstance(value, np.ndarray):
        return value.copy()
    if value is Undefined:
        return None
    return value


def _without_unset(value):
    """`value` from the page without the fields plotly's frontend marks unset ("_undefined_")."""
    if isinstance(value, dict):
        return {k: _without_unset(v) for k, v in value.items() if v != "_undefined_"}
    if isinstance(value, list):
        return [None if v == "_undefined_" else _without_unset(v) for v in value]
    return value


class CurrentState:
    """Mixin for `go.FigureWidget`: the widget state a frontend reads (`_widget_data`, `_widget_layout`) is
    the figure as it is now. plotly sets those traits only when the widget is made or displayed; later
    changes travel as restyle/relayout messages that a page already open applies to its copy, so a page
    reloaded with the kernel alive (or a second view) asked for the state and drew the first figure
    (a monitor's empty axes, an explorer's preview). Here every state request (ipywidgets' `request_state`
    and `get_state` for the control comm, embedding, saved state) is answered with the current figure;
    the traits are refreshed without a message, so updates cost nothing extra.

    The comm opens only once the figure is set up (`open_with_figure`, at the end of the constructor), so the
    first state the page receives already holds it. ipywidgets opens a widget's comm inside its constructor,
    before plotly has set the figure, so the figure then came in update messages right after the open; anywidget
    drops every message to a model whose code did not start within its time limit (a page busy loading
    plotly's code for the figure before it), and such a figure drew as empty axes until a page reload
    (notebook 01's LoRA plot, the second figure of its view)."""

    _figure_set = True            # False while the constructor runs: the comm waits for the figure

    def __init__(self, *args, **kwargs):
        self._figure_set = False
        super().__init__(*args, **kwargs)

    def open(self):
        if self._figure_set:
            super().open()

    def open_with_figure(self) -> None:
        """Open the comm now that the figure is set (the end of the constructor)."""
        self._figure_set = True
        self.open()

    def get_state(self, key=None, drop_defaults=False):
        keys = [key] if isinstance(key, str) else key
        if keys is None or "_widget_data" in keys or "_widget_layout" in keys:
            self.sync_widget_state()
        return super().get_state(key=key, drop_defaults=drop_defaults)

    def sync_widget_state(self) -> None:
        """Make the synced traits hold the current figure, without sending them (an open page has it)."""
        if getattr(self, "_layout_obj", None) is None:      # the comm opens before plotly has set the figure up
            return
        self._trait_values["_widget_data"] = json_state(self._data)
        self._trait_values["_widget_layout"] = json_state(self._layout_obj._props)

    def set_state(self, sync_data):
        # plotly.js reports a box/lasso outline with `undefined` fields (its opacity, line colour), sent as the
        # string "_undefined_"; plotly's deserialiser turns that into the Python sentinel `Undefined`, which
        # plotly.py then stored in the layout: the widget state was no longer JSON, and a page reloaded after
        # one lasso hung on "Loading widget..." for every widget of the kernel. Unset fields are dropped
        # before the layout takes them (an unset field is what plotly.js meant).
        msg = sync_data.get("_js2py_relayout") if isinstance(sync_data, dict) else None
        if isinstance(msg, dict) and isinstance(msg.get("relayout_data"), dict):
            sync_data = {**sync_data, "_js2py_relayout": {**msg, "relayout_data": _without_unset(msg["relayout_data"])}}
        return super().set_state(sync_data)


class PlainFigureWidget(CurrentState, go.FigureWidget):
    """plotly's own FigureWidget (CGT_VIZ_EMBED_PLOTLY=1) with the current figure in its state. Its page
    code is plotly's, so a click or selection travels in the synced trait, where a busy kernel can lose it
    under a later hover (see `_LOADER`, which the lean widget uses instead)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._config = {**self._config, **PLOTLY_CONFIG}
        self.open_with_figure()


class LeanFigureWidget(CurrentState, go.FigureWidget):
    """`go.FigureWidget` with a small `_esm` loader (see the module docstring); behaves the same in Python."""

    _esm = _LOADER
    _bundle = traitlets.Unicode("").tag(sync=True)

    def __init__(self, *args, send_code: bool | None = None, **kwargs):
        """send_code: ship plotly's code with the widget (default: when a cell of a Jupyter kernel makes it,
        see `_send_code_now`); False makes the browser ask for it unless it has it already (what a page
        opened later does)."""
        shell = _cells.kernel_shell()
        self._send_code = _send_code_now(shell) if send_code is None else bool(send_code)
        super().__init__(*args, **kwargs)
        self._config = {**self._config, **PLOTLY_CONFIG, "responsive": True}   # follow the width of the notebook
        if self._send_code:
            _carriers.append(weakref.ref(self))
            if shell is not None:
                _cells.follow_cells(shell)
        self.on_msg(self._on_custom_msg)
        self.open_with_figure()

    @traitlets.default("_bundle")
    def _default_bundle(self) -> str:
        # read when the comm opens, so the code is in the first message: the frontend reads it in
        # `initialize`, before any later update could reach the model
        return _bundle_text() if getattr(self, "_send_code", False) else ""

    def _on_custom_msg(self, _widget, content, _buffers) -> None:
        """The page's own messages: a request for plotly's code, or a click / selection (see the loader)."""
        if not isinstance(content, dict):
            return
        if content.get("type") == "cgt_viz_bundle_request":
            self.send({"type": "cgt_viz_bundle", "text": _bundle_text()})
        elif content.get("type") == "cgt_viz_points" and isinstance(content.get("data"), dict):
            # what plotly's trait handler does with the same event: the trace callbacks run
            self._handler_js2py_pointsCallback({"new": content["data"]})



def figure_widget(fig: go.Figure, **kwargs) -> go.FigureWidget:
    """A FigureWidget showing `fig`: lean by default, plain plotly with CGT_VIZ_EMBED_PLOTLY=1."""
    if os.environ.get("CGT_VIZ_EMBED_PLOTLY") == "1":
        return PlainFigureWidget(fig)
    return LeanFigureWidget(fig, **kwargs)


def replace_figure(fw: go.FigureWidget, fig: go.Figure) -> None:
    """Make `fw` show `fig`: update traces in place when the trace list has the same types, else rebuild."""
    same = len(fw.data) == len(fig.data) and all(a.type == b.type for a, b in zip(fw.data, fig.data))
    if not same:
        fw.data = []
        fw.add_traces(list(fig.data))
    with fw.batch_update():
        if same:
            for old, new in zip(fw.data, fig.data):
                old.update(new.to_plotly_json(), overwrite=True)
        fw.layout.shapes = fig.layout.shapes
        fw.layout.annotations = fig.layout.annotations
        fw.update_layout(fig.layout.to_plotly_json(), overwrite=True)


def html_status(text: str, kind: str = "info", markup: str = "") -> str:
    """A status line for an `ipywidgets.HTML` (whose view sets innerHTML): `text` is escaped, so a label,
    a topic folder name or an exception message can never inject markup or script; `markup` is appended as
    is and must be the widget's own fixed HTML, never a user's string."""
    colors = {"info": "#555", "busy": "#b26b00", "ok": "#2a7a2a", "error": "#b00020"}
    return (f"<span style='color:{colors.get(kind, '#555')};font-size:12px'>"
            f"{html.escape(str(text), quote=False)}{markup}</span>")



class Controls:
    """Mixin for a view whose controls both take the user's input and follow changes made from Python: a
    control set by the view itself (`with self.quietly():`) does not call back into the view."""

    _syncing = False          # True while the view sets its own controls

    @contextlib.contextmanager
    def quietly(self):
        """Set controls inside this block without their `on_user` actions running."""
        was, self._syncing = self._syncing, True
        try:
            yield
        finally:
            self._syncing = was

    def on_user(self, control, action, name: str = "value") -> None:
        """Call action(new value) when the user changes `control`'s trait `name` (not inside `quietly`)."""
        control.observe(lambda change: None if self._syncing else action(change["new"]), names=name)


# ---------------------------------------------------------------------------------------------- data
def sequences_of(model, data, labels=None, boundary=None, name: str = "data", **prepare_kw) -> A.Sequences:
    """`data` as analysis.Sequences for a model the view's door checked: prepared (its ids checked once), or
    already-prepared Sequences, whose ids are checked against this model once. Nothing behind it checks again."""
    if isinstance(data, A.Sequences):
        check_inputs(model.config, data.inputs, name)
        return data
    return prepare_sequences_unchecked(model, data, labels, boundary, **_prepare_settings(prepare_kw))


def _prepare_settings(prepare_kw: dict) -> dict:
    """A view's extra keywords: prepare_sequences' keyword-only settings, checked by its declarations, with its
    defaults for those not given."""
    params = inspect.signature(A.prepare_sequences).parameters
    names = [p for p, param in params.items() if param.kind is inspect.Parameter.KEYWORD_ONLY]
    unknown = sorted(set(prepare_kw) - set(names))
    if unknown:
        raise refuse("the extra keywords", f"settings of prepare_sequences {names}", str(unknown), TypeError, verb="be")
    contracts = A.prepare_sequences.__contracts__
    return {p: contracts[p].check(p, prepare_kw.get(p, params[p].default)) for p in names}


def boundary_of(seqs: A.Sequences, i: int) -> int | None:
    """The excerpt boundary of row i among its input positions: given, else where the per-token label first
    changes, else None (also when the second excerpt starts only in the targets, boundary == length)."""
    length = int(seqs.lengths[i])
    if seqs.boundary is not None and seqs.boundary[i] >= 0:
        b = int(seqs.boundary[i])
        return b if b < length else None
    labels = None if seqs.token_labels is None else seqs.token_labels[i]
    return A.label_boundary(labels, length)


def check_view_ybar(ybar, seqs: A.Sequences, model) -> np.ndarray:
    """Precomputed ȳ of `seqs`: (n, t, d_y) as float32 (no copy when it already is)."""
    return check_ybar_array(model.config, ybar, "ybar", range(8), "(n, t, d_y)", want=(seqs.n, seqs.t, model.config.d_y),
                            finite=False)
