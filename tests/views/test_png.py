"""The opt-in PNG of the views' static form (cgt_viz.widgets._png): off by default (nothing added, no
Chromium started), a warning and no PNG without kaleido or a Chromium, and a real PNG from kaleido and
/usr/bin/chromium when both are there: in a view's bundle and from the StaticViews preprocessor, one
kaleido session for both.

The real render is skipped without kaleido (`pip install kaleido`, or the png extra `make env` installs) or
a Chromium, unless CGT_REQUIRE_BROWSER=1 (CI), where that is a failure.
"""
from __future__ import annotations

import base64
import struct
import sys
import warnings

import nbformat
import pytest
import torch

from cgt_viz import explore
from cgt_viz.widgets import StaticPNGWarning, TrainingMonitor, _png, static_png
from cgt_viz.widgets._static import OUTPUT_METADATA, PLOTLY_MIME, PNG_MIME, WIDGET_MIME
from cgt_viz.widgets.export import StaticViews

from helpers import need
from test_analysis import tiny_cgt

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def fresh_png_state(monkeypatch):
    monkeypatch.delenv(_png.ENV, raising=False)
    _png._reset()
    yield
    _png._reset()                    # ends the kaleido session (its Chromium) a test started


def monitor() -> TrainingMonitor:
    m = TrainingMonitor(min_interval=0.0, title="loss <b>&</b> co")
    for step in range(5):
        m({"kind": "step", "step": step, "main": 2.0 / (step + 1), "aux": 0.5, "smooth": 0.1, "total": 2.6})
    return m


def saved_notebook(bundle: dict) -> nbformat.NotebookNode:
    """A notebook holding one view output, as a kernel stores it (widget entry included)."""
    data = {**bundle, WIDGET_MIME: {"model_id": "gone", "version_major": 2, "version_minor": 0}}
    nb = nbformat.v4.new_notebook()
    out = nbformat.v4.new_output("display_data", data=data, metadata=OUTPUT_METADATA)
    nb.cells.append(nbformat.v4.new_code_cell("view", outputs=[out]))
    return nb


def png_size(b64: str) -> tuple[int, int, int]:
    """(width, height, bytes) of a base64 PNG, checking its signature and header chunk."""
    raw = base64.b64decode(b64)
    assert raw[:8] == PNG_SIGNATURE and raw[12:16] == b"IHDR", raw[:16]
    width, height = struct.unpack(">II", raw[16:24])
    return width, height, len(raw)


def need_png() -> None:
    why = _png.missing()
    need(None if why is None else f"the PNG path cannot run: {why}", "`make env`, `make browser-deps`")


def test_off_by_default_adds_no_png_and_starts_nothing():
    m = monitor()
    assert static_png() is False
    bundle = m.static_bundle()
    assert PNG_MIME not in bundle and PLOTLY_MIME in bundle
    nb, _ = StaticViews().preprocess(saved_notebook(bundle), {})
    assert sorted(nb.cells[0].outputs[0].data) == sorted(bundle)           # only the widget entry went
    assert _png._session is None and not _png._warned


def test_without_kaleido_the_opt_in_warns_once_and_adds_no_png(monkeypatch):
    monkeypatch.setitem(sys.modules, "kaleido", None)                       # `import kaleido` fails
    monkeypatch.setenv(_png.ENV, "1")
    m = monitor()
    with pytest.warns(StaticPNGWarning, match=r"pip install kaleido") as caught:
        first = m.static_bundle()
        again = m.static_bundle()
        m.show_static(png=True)                                             # no kernel: printed, no PNG
        nb, _ = StaticViews().preprocess(saved_notebook(first), {})
    assert len([w for w in caught if issubclass(w.category, StaticPNGWarning)]) == 1
    assert PNG_MIME not in first and PNG_MIME not in again and PNG_MIME not in nb.cells[0].outputs[0].data
    assert _png._session is None


def test_without_chromium_the_opt_in_names_it_and_adds_no_png(monkeypatch):
    monkeypatch.setattr(_png, "browser_path", lambda: None)
    static_png(True)
    with pytest.warns(StaticPNGWarning, match=r"no Chromium found .*apt-get install chromium"):
        bundle = monitor().static_bundle()
    assert PNG_MIME not in bundle and _png._session is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")                                      # said once only
        StaticViews(png=True).preprocess(saved_notebook(bundle), {})


@pytest.mark.slow
def test_png_in_a_view_bundle_and_from_the_preprocessor():
    """Two figures, one kaleido session: the monitor's bundle (show_static's png=True, the setting off) and
    an explorer's WebGL map drawn by StaticViews from the plotly JSON a saved notebook holds."""
    need_png()
    with warnings.catch_warnings():
        warnings.simplefilter("error", StaticPNGWarning)
        bundle = monitor().static_bundle(png=True)
        width, height, size = png_size(bundle[PNG_MIME])
        assert (width, height) == (700, 460) and size > 5_000, (width, height, size)
        session = _png._session
        assert session is not None and static_png() is False

        torch.manual_seed(0)
        ex = explore(tiny_cgt(seed=1), torch.randint(0, 256, (6, 20)), labels=["a", "b", "c"] * 2,
                     background=None)
        nb, _ = StaticViews(png=True).preprocess(saved_notebook(ex.static_bundle()), {})
        data = nb.cells[0].outputs[0].data
        assert WIDGET_MIME not in data and PLOTLY_MIME in data
        width, height, size = png_size(data[PNG_MIME])
        assert width >= 300 and height >= 200 and size > 5_000, (width, height, size)
        nbformat.validate(nb)
        assert _png._session is session                                     # the same Chromium drew both
    static_png(False)
    assert _png._session is None
