"""Opt-in PNG of a view's main figure in its static form, for frontends that run no JavaScript.

GitHub's notebook preview (and any other viewer without JavaScript) shows only images and text, so the
plotly JSON and the plotly.js HTML of a saved view show nothing there. With the PNG path on, the static
bundle also holds `image/png` of the view's main figure (the first of `static_figures()`):

    cgt_viz.widgets.static_png(True)      in the kernel: every view displayed or refreshed from now on
    CGT_STATIC_PNG=1                      the same, from the environment (read at each display)
    view.show_static(png=True)            one static copy, whatever the setting
    --StaticViews.png=True                the nbconvert preprocessor, from each view's stored plotly JSON
                                          (see cgt_viz.widgets.export; the kernel needs no setting)

It is off by default because it is slow: the PNG is drawn by kaleido (>= 1.5) in a headless Chromium,
slow to start and slow per figure (docs/guides/views.md says how to turn it on). One
kaleido session (one Chromium) serves every figure of the process; it starts on the first PNG and ends
with the process or `static_png(False)`. The page kaleido renders in loads only local files: plotly.js
from the installed plotly package and no MathJax, and Chromium gets a proxy that does not exist, so
nothing reaches the network. The Chromium is a system one (BROWSER_PATH, else chromium / chromium-browser
/ google-chrome on PATH or in /usr/bin); kaleido's own browser download is never used.

The figure is data too: Chromium loads file:// URLs, so a stored plotly JSON whose image or map source
names a local file would put that file into the PNG. Before rendering, every field that plotly.js loads
from a URL (`source` of layout images, image traces and map layers, `geojson`, a map `style` given as a
URL, `topojsonURL`) keeps only inline data: a `data:` URI or a JSON object. A map `style` given inline as a
MapLibre style object keeps no string MapLibre would fetch (`sprite`, `glyphs`, a source's `url`, `tiles`,
`data` or `urls`) and none that looks like a URL or a path (a `background-pattern`). Anything else is dropped,
with a warning naming it (`safe_spec`).

Without kaleido or a Chromium the PNG path warns once (`StaticPNGWarning`, naming what to install) and the
views are shown without a PNG; a figure that fails to render warns once too. Nothing here raises.
"""
from __future__ import annotations

import asyncio
import atexit
import base64
import hashlib
import json
import os
import re
import shutil
import threading
import warnings
from collections import OrderedDict
from pathlib import Path

from .._checks import refuse

ENV = "CGT_STATIC_PNG"
BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
START_TIMEOUT_S = 60.0               # starting Chromium and loading plotly.js into its page
RENDER_TIMEOUT_S = 60.0              # one figure
SCALE = 1                            # pixels per CSS pixel of the figure (2 doubles the size of the notebook)
_CACHE_SIZE = 32                     # PNGs kept by the hash of their figure (an unchanged figure is not redrawn)
_NO_PROXY = "127.0.0.1:9"            # a proxy nobody listens on: any request other than file:// fails

_enabled: bool | None = None         # set by static_png(); None: the environment decides
_lock = threading.RLock()
_session: "_Session | None" = None
_unavailable: str | None = None     # why no session can start in this process (said once)
_warned: set[str] = set()
_cache: "OrderedDict[str, str]" = OrderedDict()
_atexit_registered = False


class StaticPNGWarning(UserWarning):
    """The opt-in PNG of a view could not be made (kaleido or Chromium missing, a render failed)."""


def static_png(on: bool | None = None) -> bool:
    """Turn the PNG in every view's static form on (True) or off (False); returns whether it is on (with
    no argument it only says so; before any call CGT_STATIC_PNG decides). Turning it off also ends the
    kaleido session (its Chromium). See the module docstring for what it costs."""
    global _enabled
    if on is not None and not isinstance(on, bool):
        raise refuse("on", "True, False or nothing (static_png() only says whether it is on)", repr(on), TypeError)
    if on is not None:
        _enabled = on
        if not _enabled:
            close()
    return enabled()


def enabled() -> bool:
    if _enabled is not None:
        return _enabled
    return os.environ.get(ENV, "0").strip().lower() in ("1", "true", "yes", "on")


def wanted(png: bool | None) -> bool:
    """A caller's png choice: True / False as given, None as `enabled()` says."""
    return enabled() if png is None else bool(png)


def browser_path() -> str | None:
    """The system Chromium kaleido drives: BROWSER_PATH, else the first of BROWSER_NAMES on PATH or in
    /usr/bin. None when there is none (kaleido's downloaded browser is not looked for)."""
    explicit = os.environ.get("BROWSER_PATH")
    if explicit:
        return explicit if Path(explicit).is_file() else None
    for name in BROWSER_NAMES:
        found = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").is_file() else None)
        if found:
            return found
    return None


def missing() -> str | None:
    """What is missing for the PNG path, as the words of the warning (None when kaleido and a Chromium are
    there; whether they work shows only when the session starts)."""
    needs = []
    try:
        import kaleido  # noqa: F401
    except Exception:               # ImportError, or a broken install
        needs.append("kaleido is not installed (pip install kaleido, or pip install 'cgt_viz[png]')")
    if browser_path() is None:
        needs.append("no Chromium found (install a system Chromium, e.g. `apt-get install chromium` on Debian, "
                     "or set BROWSER_PATH to one; kaleido's own browser download is not used)")
    return "; ".join(needs) or None


def warn_once(key: str, message: str) -> None:
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(f"cgt_viz: {message}", StaticPNGWarning, stacklevel=3)


class _Session:
    """One kaleido.Kaleido (one Chromium tab) on an asyncio loop of its own, in a daemon thread, so that
    it works the same inside a Jupyter kernel (whose loop is already running) and outside one."""

    def __init__(self, chromium: str):
        import kaleido
        import plotly
        plotly_js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="cgt-viz-kaleido", daemon=True)
        self.thread.start()

        async def start():
            k = kaleido.Kaleido(n=1, timeout=RENDER_TIMEOUT_S, plotlyjs=plotly_js, mathjax=False,
                                path=chromium, proxy_server=_NO_PROXY)
            await k.open()
            return k
        try:
            self.kaleido = self._run(start(), START_TIMEOUT_S)
        except BaseException:
            self._stop_loop()
            raise

    def _run(self, coro, timeout: float):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def render(self, spec: dict) -> bytes:
        opts = {"format": "png", "scale": SCALE}
        return self._run(self.kaleido.calc_fig(spec, opts=opts), RENDER_TIMEOUT_S + 5)

    def close(self) -> None:
        try:
            self._run(self.kaleido.close(), 10)
        except Exception:
            pass
        self._stop_loop()

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def _get_session() -> _Session | None:
    global _session, _unavailable, _atexit_registered
    if _session is not None:
        return _session
    if _unavailable is None:
        _unavailable = missing()
    if _unavailable is None:
        try:
            _session = _Session(browser_path())
            if not _atexit_registered:
                _atexit_registered = True
                atexit.register(close)
            return _session
        except Exception as e:       # Chromium does not start, kaleido too old, a timeout
            _unavailable = f"kaleido could not start Chromium ({type(e).__name__}: {e})"
    warn_once("unavailable", f"views are saved without a PNG (GitHub's notebook preview shows none): "
                             f"{_unavailable}")
    return None


URL_KEYS = ("source", "geojson", "topojson", "topojsonURL")   # fields plotly.js fetches when given a string
MAP_LAYOUTS = ("mapbox", "map")                                # their `style` may be a URL too
# A map `style` may also be a MapLibre style given inline as an object; MapLibre fetches these of its fields
# (`sprite`, `glyphs`, a source's TileJSON `url`, its `tiles`, a GeoJSON source's `data`, a video source's
# `urls`). Any other string in the style that starts like a URL or a path (`background-pattern`, an `image`
# expression) is dropped too: inside a style nothing legitimate looks like one, and a file:// there is read.
STYLE_URL_KEYS = ("sprite", "glyphs", "url", "urls", "tiles", "data")
_URL_LIKE = re.compile(r"^\s*(?:[a-z][a-z0-9+.-]*:|/|\\|\.{1,2}[/\\]|~)", re.I)


def _inline(value: str) -> bool:
    return value.strip().lower().startswith("data:")


def _fetched(key: str, value: str, parent: str) -> bool:
    """Would plotly.js (in kaleido's file:// page) load this string from somewhere? Inline data is kept."""
    if key in URL_KEYS:
        return not _inline(value)   # a relative path resolves to a local file
    return _map_style(key, parent) and (":" in value or "/" in value)


def _map_style(key: str, parent: str) -> bool:
    return key == "style" and parent.rstrip("0123456789") in MAP_LAYOUTS


def _style_fetched(key: str, value: str) -> bool:
    """Would MapLibre load this string of an inline style object?"""
    if _inline(value):
        return False
    return key in STYLE_URL_KEYS or bool(_URL_LIKE.match(value))


def safe_spec(spec: dict) -> tuple[dict, list[str]]:
    """(a copy of a figure's JSON without the strings plotly.js would fetch, what was dropped as
    "path = value"). See the module docstring; the input is not changed."""
    dropped: list[str] = []

    def walk(node, path: str, parent: str, style: bool = False):
        """style: inside a map's inline style object, where MapLibre's rules apply instead of plotly's."""
        if isinstance(node, dict):
            out = {}
            for key, value in node.items():
                key_s = str(key)
                where = f"{path}.{key}" if path else key_s
                fetched = (lambda v: _style_fetched(key_s, v)) if style else (lambda v: _fetched(key_s, v, parent))
                if isinstance(value, str) and fetched(value):
                    dropped.append(f"{where} = {value[:80]!r}")
                    continue
                if isinstance(value, list) and (style or key in URL_KEYS):   # tile lists, sprite lists, expressions
                    urls = [v for v in value if isinstance(v, str) and fetched(v)]
                    dropped.extend(f"{where}[] = {v[:80]!r}" for v in urls)
                    value = [v for v in value if not (isinstance(v, str) and fetched(v))]
                out[key] = walk(value, where, key_s, style or (_map_style(key_s, parent) and isinstance(value, dict)))
            return out
        if isinstance(node, list):
            return [walk(v, f"{path}[{i}]", parent, style) for i, v in enumerate(node)]
        return node

    return walk(spec, "", ""), dropped


def _key(spec: dict) -> str:
    return hashlib.sha1(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()


def figure_png(fig) -> str | None:
    """PNG of a figure (a plotly Figure or its JSON dict) as base64 text, the form `image/png` takes in a
    MIME bundle; None (after one warning) when it cannot be made. Never raises."""
    try:
        spec = fig if isinstance(fig, dict) else json.loads(fig.to_json())
        spec, dropped = safe_spec(spec)
        key = _key(spec)
    except Exception as e:
        warn_once("figure", f"a view's figure could not be read for its PNG ({type(e).__name__}: {e})")
        return None
    if dropped:
        warnings.warn(f"cgt_viz: a view's PNG is drawn without {len(dropped)} field(s) that would load a file or "
                      f"URL (only data: URIs and inline JSON are kept): {'; '.join(dropped[:3])}"
                      + (" ..." if len(dropped) > 3 else ""), StaticPNGWarning, stacklevel=2)
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
        session = _get_session()
        if session is None:
            return None
        try:
            png = session.render(spec)
        except Exception as e:
            warn_once("render", f"kaleido failed to draw a view's PNG, saved without one ({type(e).__name__}: {e})")
            return None
        if not isinstance(png, (bytes, bytearray)) or not bytes(png[:8]) == b"\x89PNG\r\n\x1a\n":
            warn_once("render", "kaleido returned something that is not a PNG; the view is saved without one")
            return None
        data = base64.b64encode(png).decode("ascii")
        _cache[key] = data
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
        return data


def close() -> None:
    """End the kaleido session (its Chromium), if one runs; the next PNG starts a new one."""
    global _session
    with _lock:
        session, _session = _session, None
    if session is not None:
        session.close()


def _reset() -> None:
    """Forget what this process found out (for tests)."""
    global _unavailable, _enabled
    close()
    _unavailable = None
    _enabled = None
    _warned.clear()
    _cache.clear()
