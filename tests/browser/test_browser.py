"""The widgets in a real browser: JupyterLab on 127.0.0.1, Debian's headless Chromium driven by playwright.

Runs tests/browser/widgets.ipynb (copied to a temp dir, so the repo's copy never gets outputs), checks
that the plotly figures render (a `.js-plotly-plot`, a WebGL canvas for the explorer), that changing the
colour-by dropdown reaches the kernel and recolours the points in the page, and that a figure whose
plotly code must be requested from the kernel renders too. The mouse drags a box and a lasso on the map
while the kernel is busy (the selections, and the status line, are read back from the kernel), clicks
Isolate and Show all; after each step every widget's state must be strict JSON, and a page reload at the
end must draw every view live again. Screenshots go to test-artifacts/ (and, with
CGT_SCREENSHOTS=<dir>, small element screenshots of the explorer, the strip and the inspector there).

Skipped when /usr/bin/chromium is missing, unless CGT_REQUIRE_BROWSER=1 (CI), where that is a failure.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from helpers import free_port, need

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "test-artifacts"
NOTEBOOK = ROOT / "tests" / "browser" / "widgets.ipynb"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
BUNDLE_KEY = "__cgt_viz_plotly_widget_"
PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"

pytestmark = pytest.mark.browser


def _need_browser() -> None:
    need(None if Path(CHROMIUM).exists() else f"{CHROMIUM} is missing (Debian's chromium runs the browser tests)",
         "run `make browser-deps` as root")


def _wait_for_server(url: str, proc: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "api/status", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"jupyter lab did not answer within {timeout} s:\n{log.read_text()[-3000:]}")


@contextlib.contextmanager
def jupyter_lab(tmp_path: Path, notebook: Path = NOTEBOOK):
    """A JupyterLab server on a free port serving a temp copy of `notebook`; stopped by its PID on exit.
    Yields (url, work folder, log file)."""
    work = tmp_path / "lab"
    work.mkdir()
    shutil.copy(notebook, work / notebook.name)
    port = free_port()
    settings = tmp_path / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false", "checkForUpdates": false}')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               JUPYTER_CONFIG_DIR=str(tmp_path / "config"), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               IPYTHONDIR=str(tmp_path / "ipython"), JUPYTER_DATA_DIR=str(tmp_path / "data"),
               JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "settings"), JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "ws"),
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", CGT_BROWSER_TEST="1")
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--ServerApp.token=", "--ServerApp.password=", f"--ServerApp.root_dir={work}",
           "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    log = tmp_path / "lab.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=work)
    try:
        url = f"http://127.0.0.1:{port}/"
        _wait_for_server(url, proc, log)
        yield url, work, log
    finally:
        proc.terminate()                       # the server shuts its kernels down on SIGTERM
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@pytest.fixture
def lab(tmp_path):
    _need_browser()
    with jupyter_lab(tmp_path) as running:
        yield running


PICK_POINT_JS = """() => {
    // the explorer's point farthest from its neighbours (so the click picks it), in page pixels; every trace
    const gd = document.querySelectorAll('.js-plotly-plot')[0];
    const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, px = [], py = [], hover = [];
    gd.data.forEach(t => { if (t.visible === 'legendonly') return;
        Array.from(t.x).forEach((x, i) => { px.push(xa.l2p(x)); py.push(ya.l2p(t.y[i])); hover.push(t.hovertext[i]); }); });
    let best = 0, bestGap = -1;
    for (let i = 0; i < px.length; i += 1) {
        let gap = Infinity;
        for (let j = 0; j < px.length; j += 1) {
            const d = Math.hypot(px[j] - px[i], py[j] - py[i]);
            if (j !== i && d > 0 && d < gap) gap = d;
        }
        if (gap > bestGap && gap < Infinity) { bestGap = gap; best = i; }
    }
    const r = gd.querySelector('.nsewdrag').getBoundingClientRect();
    return {px: r.left + px[best], py: r.top + py[best], hover: hover[best]};
}"""
FIND_HOVER_JS = """(needle) => {
    // page pixels of the first explorer point whose hover text contains `needle`
    const gd = document.querySelectorAll('.js-plotly-plot')[0];
    const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, r = gd.querySelector('.nsewdrag').getBoundingClientRect();
    const all = [];
    for (const t of gd.data) for (let i = 0; i < t.x.length; i += 1)
        all.push([xa.l2p(t.x[i]), ya.l2p(t.y[i]), String(t.hovertext[i]).includes(needle)]);
    let best = null, bestGap = -1;      // of the points with the needle, the one farthest from any other
    for (const [x, y, hit] of all) {
        if (!hit) continue;
        let gap = Infinity;
        for (const [u, v] of all) { const d = Math.hypot(u - x, v - y); if (d > 0 && d < gap) gap = d; }
        if (gap > bestGap) { bestGap = gap; best = {px: r.left + x, py: r.top + y}; }
    }
    return best;
}"""
KERNEL_JS = """async (code) => {
    const k = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
    let text = '';
    const f = k.requestExecute({code});
    f.onIOPub = (msg) => { if (msg.content && msg.content.text) text += msg.content.text;
                           if (msg.content && msg.content.ename) text += 'ERROR ' + msg.content.evalue; };
    await f.done;
    return text;
}"""
EXPLORER_JS = "document.querySelectorAll('.js-plotly-plot')[0]"


def _click_a_point(page) -> dict:
    """Hover onto a drawn point of the explorer (PICK_POINT_JS), then click it; returns the point."""
    point = page.evaluate(PICK_POINT_JS)
    page.mouse.move(point["px"] - 4, point["py"] - 4)
    page.mouse.move(point["px"], point["py"])
    page.wait_for_timeout(300)
    page.mouse.click(point["px"], point["py"])
    return point


def _lasso(page, frac=(0.15, 0.85)) -> None:
    """Draw a lasso over the middle of the explorer's plot area with the mouse."""
    r = page.evaluate(f"(() => {{ const b = {EXPLORER_JS}.querySelector('.nsewdrag').getBoundingClientRect(); "
                      "return [b.left, b.top, b.width, b.height]; })()")
    a, b = frac
    corners = [(a, a), (b, a), (b, b), (a, b), (a, a + 0.01)]
    x0, y0 = r[0] + r[2] * a, r[1] + r[3] * a
    page.mouse.move(x0, y0)
    page.mouse.down()
    for fx, fy in corners[1:]:
        page.mouse.move(r[0] + r[2] * fx, r[1] + r[3] * fy, steps=8)
    page.mouse.up()


STATE_JS_CODE = """
import json
from ipywidgets.widgets.widget import _instances, _remove_buffers
bad = []
for w in list(_instances.values()):
    try:
        json.dumps(_remove_buffers(w.get_state())[0], allow_nan=False)
    except (TypeError, ValueError) as err:
        bad.append(f"{type(w).__name__}: {err}")
print("NON-JSON", bad)"""
SELECTED_IN_PAGE_JS = f"""() => {EXPLORER_JS}.data.slice(0, -1).reduce((n, t) =>
    n + (t.selectedpoints ? Array.from(t.selectedpoints).length : 0), 0)"""
BUSY_JS = """(code) => { const k = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
    window.__busy = k.requestExecute({code}).done; }"""


def _states_are_json(page, when: str) -> None:
    """Every widget's state in the kernel passes json.dumps(allow_nan=False) (buffers aside)."""
    out = page.evaluate(KERNEL_JS, STATE_JS_CODE)
    assert out.strip() == "NON-JSON []", f"{when}: {out}"


def _plot_box(page) -> list[float]:
    return page.evaluate(f"(() => {{ const b = {EXPLORER_JS}.querySelector('.nsewdrag').getBoundingClientRect(); "
                         "return [b.left, b.top, b.width, b.height]; })()")


def _busy_drag(page, tool: str, drag) -> int:
    """With the kernel busy (a running cell; in notebook 04 a background UMAP fit holding the GIL), pick
    `tool` in the modebar, hover a point, drag, and hover again (the hover messages that used to overwrite
    the pending selection); returns how many points plotly selected in the page."""
    assert "ERROR" not in page.evaluate(KERNEL_JS, "ex.clear()")          # no outline to start the drag in
    page.wait_for_function(f"({EXPLORER_JS}.layout.selections || []).length === 0", timeout=30_000)
    page.evaluate(f"() => {{ window.__sel = []; {EXPLORER_JS}.on('plotly_selected', "
                  "(d) => window.__sel.push(d ? d.points.length : 0)); }")
    plot = page.locator(".js-plotly-plot").first
    plot.hover()
    plot.locator(f'.modebar-btn[data-val="{tool}"]').click()
    page.evaluate(BUSY_JS, "import time; time.sleep(3)")
    page.wait_for_timeout(300)
    _hover_a_point(page)
    drag(page)
    _hover_a_point(page)
    page.wait_for_function("window.__sel.length > 0 && window.__sel[window.__sel.length - 1] > 0", timeout=10_000)
    page.evaluate("async () => { await window.__busy; return 1; }")   # the cell ends, the kernel reads the queue
    return page.evaluate("window.__sel[window.__sel.length - 1]")


def _hover_a_point(page) -> None:
    point = page.evaluate(PICK_POINT_JS)
    page.mouse.move(point["px"] - 3, point["py"] - 3)
    page.mouse.move(point["px"], point["py"], steps=3)
    page.wait_for_timeout(150)


def _box(page, a=(0.2, 0.25), b=(0.7, 0.75)) -> None:
    r = _plot_box(page)
    page.mouse.move(r[0] + r[2] * a[0], r[1] + r[3] * a[1])
    page.mouse.down()
    page.mouse.move(r[0] + r[2] * b[0], r[1] + r[3] * b[1], steps=10)
    page.mouse.up()


def _selection_in_kernel(page) -> tuple[int, str]:
    out = page.evaluate(KERNEL_JS, "import html, re; print(len(ex.selection)); "
                                   "print(html.unescape(re.sub('<[^>]+>', '', ex.selection_info.value)))")
    n, text = out.strip().split("\n", 1)
    return int(n), text


def _drag_selections_isolate_and_show_all(page) -> None:
    """A box drag and a lasso drag with the mouse reach `ex.selection` and the status line (read back from
    the kernel); Isolate and Show all (mouse clicks) agree with the status line and the page's faded
    points; a selection made in Python is drawn; every widget's state stays JSON."""
    for tool, drag in (("select", _box), ("lasso", _lasso)):
        n_page = _busy_drag(page, tool, drag)
        n, text = _selection_in_kernel(page)
        assert n == n_page and f"{n:,} point" in text, (tool, n_page, n, text)
        page.locator(".widget-html", has_text=f"{n:,} point").first.wait_for(timeout=30_000)
        _states_are_json(page, f"after a {tool} drag")
    page.screenshot(path=str(ARTIFACTS / "browser_lasso_selected.png"), full_page=False)
    # Isolate: only the selection, projected afresh, nothing selected and nothing faded
    page.locator(".widget-button", has_text="Isolate selection").first.click()
    page.wait_for_function(f"String({EXPLORER_JS}.layout.title.text).startsWith('ȳ of {n:,} tokens')", timeout=30_000)
    for button in ("Isolate selection", "Show all"):
        if button == "Show all":
            page.locator(".widget-button", has_text="Show all").first.click()
            page.wait_for_function(f"!String({EXPLORER_JS}.layout.title.text).startsWith('ȳ of {n:,} tokens')",
                                   timeout=30_000)
        page.wait_for_function(f"({SELECTED_IN_PAGE_JS})() === 0 && {EXPLORER_JS}.data.slice(0, -1).every("
                               "t => t.selectedpoints == null)", timeout=30_000)
        n_sel, text = _selection_in_kernel(page)
        assert n_sel == 0 and text.startswith("No selection"), (button, n_sel, text)
        _states_are_json(page, f"after {button}")
    # a box selected from Python is drawn: its points, and only they, keep full colour in the page
    out = page.evaluate(KERNEL_JS, "xy = ex.coords; import numpy as np; "
                                   "ex.select_box((xy[:, 0].min(), np.median(xy[:, 0])), (xy[:, 1].min(), "
                                   "np.median(xy[:, 1]))); print(len(ex.selection))")
    n_py = int(out.strip())
    assert n_py > 0
    page.wait_for_function(f"({SELECTED_IN_PAGE_JS})() === {n_py}", timeout=30_000)
    page.locator(".widget-html", has_text=f"{n_py:,} point").first.wait_for(timeout=30_000)
    page.locator(".js-plotly-plot").first.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "browser_select_box_from_python.png"), full_page=False)
    _states_are_json(page, "after select_box")


def _reload_draws_every_widget_live(page) -> None:
    """Reload the page with the kernel alive: every view draws live again (no "Loading widget...")."""
    n_views = page.evaluate("document.querySelectorAll('.cgt-viz-view').length")
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")   # the outputs the page reopens
    page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=30_000)
    page.reload(wait_until="domcontentloaded")
    page.wait_for_function(WAIT_IDLE_JS, timeout=60_000)
    deadline = time.monotonic() + 60
    while True:
        for cell in page.locator(".jp-Notebook .jp-Cell").all():    # JupyterLab renders outputs in view
            cell.scroll_into_view_if_needed()
        live = page.evaluate("""() => ({views: document.querySelectorAll('.cgt-viz-view').length,
            plots: Array.from(document.querySelectorAll('.cgt-viz-view .js-plotly-plot')).filter(
                gd => gd._fullLayout && gd.data && gd.data.length > 0).length,
            loading: Array.from(document.querySelectorAll('.jp-OutputArea-output')).filter(
                e => e.innerText.includes('Loading widget')).length})""")
        if live["views"] >= n_views and live["plots"] >= 3 and live["loading"] == 0:
            break
        if time.monotonic() > deadline:
            page.screenshot(path=str(ARTIFACTS / "browser_reload_failure.png"), full_page=False)
            raise AssertionError(f"after a reload the widgets are not live: {live} (views before: {n_views})")
        page.wait_for_timeout(500)
    page.locator(".cgt-viz-view .js-plotly-plot").first.scroll_into_view_if_needed()
    # the live map is drawn as it is now, in 3-D, and no lasso outline of an earlier 2-D map comes back with
    # it (an outline kept in the state drew a 2-D plot area behind the scene)
    live_map = "document.querySelector('.cgt-viz-view .js-plotly-plot')"
    assert page.evaluate(f"{live_map}.data.every(t => t.type === 'scatter3d')")
    assert page.evaluate(f"({live_map}.layout.selections || []).length") == 0
    page.screenshot(path=str(ARTIFACTS / "browser_after_reload.png"), full_page=False)



TITLES_JS = ("() => Array.from(document.querySelectorAll('.js-plotly-plot'))"
             ".map(p => String(p.layout && p.layout.title && p.layout.title.text))")
MONITOR_JS = """() => { const m = Array.from(document.querySelectorAll('.js-plotly-plot')).find(
    p => p.layout && p.layout.title && String(p.layout.title.text).startsWith('Live training')); """


def test_widgets_render_and_talk_to_the_kernel(lab):
    from playwright.sync_api import sync_playwright

    url, work, log = lab
    ARTIFACTS.mkdir(exist_ok=True)
    shots = os.environ.get("CGT_SCREENSHOTS")
    console: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.on("console", lambda msg: console.append(f"{msg.type}: {msg.text}"[:300]))
            open_and_run_all(page, url, "widgets.ipynb")
            page.locator(".jp-OutputArea-output", has_text="CELLS-DONE").first.wait_for(timeout=60_000)

            # the last cell feeds a TrainingMonitor in a busy loop: its plot must update while the kernel is busy
            page.wait_for_function(MONITOR_JS + "return m && m.data.length >= 4 && m.data[0].x.length >= 20; }",
                                   timeout=30_000)
            status = page.evaluate("window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status")
            assert status == "busy", f"the monitor should update during training, but the kernel is {status}"
            (work / "stop-training").write_text("")
            page.locator(".jp-OutputArea-output", has_text="TRAINING-DONE").first.wait_for(timeout=30_000)
            sources = page.evaluate(f"Object.keys(globalThis).filter(k => k.startsWith('{BUNDLE_KEY}'))"
                                    ".map(k => globalThis[k].source)")
            assert sources == ["text"], f"the first figures should get plotly's code with the widget, got {sources}"

            # every figure renders: explorer (WebGL scatter), smoothness strip, template inspector
            page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length >= 4", timeout=30_000)
            page.wait_for_function("document.querySelectorAll('.js-plotly-plot canvas').length >= 1", timeout=30_000)
            # every plot takes the width of the notebook, even those drawn while out of view or while busy
            # (the static copy next to each live view is hidden by the views' CSS while the view is drawn, so it
            # has no width to take: only the plots on show count)
            widths = """Array.from(document.querySelectorAll('.js-plotly-plot')).filter(gd => gd.offsetParent !== null)
                .map(gd => [String(gd.layout && gd.layout.title && gd.layout.title.text).slice(0, 40),
                            gd._fullLayout && gd._fullLayout.width, gd.clientWidth])"""
            try:
                page.wait_for_function(f"({widths}).every(([_, w, cw]) => w && Math.abs(w - cw) <= 3)", timeout=15_000)
            except Exception:
                raise AssertionError(f"plots not as wide as the notebook: {page.evaluate(widths)}") from None
            explorer = page.locator(".js-plotly-plot").first
            # coloured by topic: one trace per topic, each in the legend with its own colour (no colour bar)
            # (the last trace is the overlay that rings search hits and neighbours: empty here, not in the legend)
            traces = page.evaluate(f"{EXPLORER_JS}.data.map(t => [t.name, t.x.length, t.marker.color])")
            assert traces[-1][:2] == ["highlighted", 0], traces[-1]
            traces = traces[:-1]
            n_points = sum(n for _, n, _ in traces)
            assert n_points > 100, n_points
            assert sorted(t[0] for t in traces) == ["business", "politics", "sport"] and len({t[2] for t in traces}) == 3
            legend = page.evaluate(f"Array.from({EXPLORER_JS}.querySelectorAll('.legend .traces .legendtext'))"
                                   ".map(e => e.textContent)")
            assert sorted(legend) == ["business", "politics", "sport"], legend
            assert page.evaluate(f"{EXPLORER_JS}.querySelectorAll('.colorbar').length") == 0
            explorer.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "browser_notebook.png"), full_page=False)
            if shots:
                Path(shots).mkdir(parents=True, exist_ok=True)
                for cell, name in ((1, "explorer"), (2, "smoothness"), (3, "templates")):
                    out = page.locator(".jp-Notebook .jp-Cell").nth(cell).locator(".jp-OutputArea-output").first
                    out.scroll_into_view_if_needed()
                    out.screenshot(path=str(Path(shots) / f"{name}.png"))

            # one UI interaction: the colour-by dropdown -> kernel -> figure; the late figure needs a bundle request
            page.evaluate(f"Object.keys(globalThis).filter(k => k.startsWith('{BUNDLE_KEY}'))"
                          ".forEach(k => delete globalThis[k])")
            select = page.locator(".widget-dropdown", has_text="Colour by").locator("select")
            select.scroll_into_view_if_needed()
            select.select_option(label="position")
            page.locator(".widget-label", has_text="colour: position").first.wait_for(timeout=30_000)
            page.wait_for_function(f"""() => {{ const gd = {EXPLORER_JS};
                return gd.data.length === 2 && gd.data[1].name === 'highlighted' /* the ring overlay */ &&
                       new Set(Array.from(gd.data[0].marker.color)).size > 3; }}""",
                                   timeout=30_000)
            page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length >= 5", timeout=30_000)

            # a click on a point opens the linked smoothness strip and template inspector of its sequence
            explorer.scroll_into_view_if_needed()
            point = _click_a_point(page)
            pos = int(point["hover"].split("pos ")[1].split("<")[0])
            page.wait_for_function(f"""() => {{ const t = ({TITLES_JS})();
                return t[1].startsWith('Smoothness of ȳ · sequence') && t[1].endsWith(' · token {pos}'); }}""",
                                   timeout=30_000)
            titles = page.evaluate(TITLES_JS)
            assert titles[1].startswith("Smoothness of ȳ · sequence") and titles[1].endswith(f"token {pos}"), titles
            assert titles[2].startswith("Sequence ") and "how far ȳ moved" in titles[2], titles      # its token view
            assert titles[3].startswith("κ-template inspector") and f"token {pos} " in titles[3], titles
            page.screenshot(path=str(ARTIFACTS / "browser_after_interaction.png"), full_page=False)

            # back to the topic labels from Python; hover text shows the text's quote once-escaped, as a quote
            assert "ERROR" not in page.evaluate(KERNEL_JS, "ex.set_color('label')")
            page.wait_for_function(f"{EXPLORER_JS}.data.length === 3 + 1", timeout=30_000)   # + the ring overlay
            spot = page.evaluate(FIND_HOVER_JS, '"match"')
            assert spot is not None, "a point of the quoted text"
            page.mouse.move(spot["px"] + 3, spot["py"] + 3)
            page.mouse.move(spot["px"], spot["py"])
            page.wait_for_function(f"{EXPLORER_JS}.querySelector('.hoverlayer .hovertext')", timeout=10_000)
            hover = page.evaluate(f"{EXPLORER_JS}.querySelector('.hoverlayer .hovertext').textContent")
            assert '"' in hover and "&quot;" not in hover and "&amp;" not in hover, hover

            # a lasso in the browser, then a click on a point: the click still opens the linked views
            page.mouse.move(5, 5)
            _lasso(page)
            page.locator(".widget-html", has_text="points selected").first.wait_for(timeout=30_000)
            # (the texts repeat, so several points share a place: reset the linked views from Python first and
            # expect the clicked position; KERNEL_JS runs a cell, whose end refreshes the static copies)
            assert "ERROR" not in page.evaluate(KERNEL_JS, "ex.open_sequence(0)")
            page.wait_for_function(f"({TITLES_JS})()[1] === 'Smoothness of ȳ · sequence 0'", timeout=30_000)
            page.locator(".widget-html", has_text="points selected").first.wait_for(timeout=30_000)
            before = page.evaluate(TITLES_JS)[1]
            page.evaluate(f"""() => {{ const gd = {EXPLORER_JS}; window.__cgtEvents = [];
                ['plotly_click', 'plotly_deselect', 'plotly_selected'].forEach(
                    e => gd.on(e, () => window.__cgtEvents.push(e))); }}""")
            point = _click_a_point(page)
            pos = int(point["hover"].split("pos ")[1].split("<")[0])
            seq = int(point["hover"].split("seq ")[1].split(" ")[0])
            want = f" · token {pos}"
            try:
                page.wait_for_function(f"({TITLES_JS})()[1].endsWith({json.dumps(want)})", timeout=30_000)
            except Exception:
                print("events after the click:", page.evaluate("window.__cgtEvents"), "want", want)
                print("page titles:", page.evaluate(TITLES_JS)[:6])
                print("kernel:", page.evaluate(KERNEL_JS, "print(ex.strip.sequence, ex.strip.highlight, "
                                               "ex.strip.figure.layout.title.text, ex.selection.to_dict('records'))"))
                raise
            assert before != want

            # a selection made in Python is drawn in the page (selectedpoints reach every trace)
            out = page.evaluate(KERNEL_JS, "ex.select(list(range(0, len(ex.points), 7))); print(len(ex.selection))")
            n_sel = int(out.strip())
            drawn_js = f"""() => {EXPLORER_JS}.data.reduce((n, t) =>
                n + (t.selectedpoints ? Array.from(t.selectedpoints).length : 0), 0)"""
            try:
                page.wait_for_function(f"({drawn_js})() === {n_sel}", timeout=30_000)
            except Exception:
                print("selected in Python", n_sel, "drawn", page.evaluate(drawn_js),
                      page.evaluate(f"{EXPLORER_JS}.data.map(t => String(t.selectedpoints).slice(0, 80))"))
                raise

            _drag_selections_isolate_and_show_all(page)

            # a lasso's outline belongs to the coordinates it was drawn in: a projection switch removes it
            _lasso(page, (0.3, 0.7))
            page.wait_for_function(f"({EXPLORER_JS}.layout.selections || []).length > 0", timeout=30_000)
            select = page.locator(".widget-dropdown", has_text="Projection").locator("select")
            select.select_option(label="t-SNE")
            page.wait_for_function(f"String({EXPLORER_JS}.layout.xaxis.title.text).startsWith('t-SNE')", timeout=120_000)
            page.wait_for_function(f"({EXPLORER_JS}.layout.selections || []).length === 0", timeout=30_000)
            assert page.evaluate(f"{EXPLORER_JS}.querySelectorAll('.selectionlayer path').length") == 0

            # the legend toggles a category: hidden in the page and in Python
            page.locator(".js-plotly-plot").first.locator(".legend .traces", has_text="sport").click()
            page.wait_for_function(f"{EXPLORER_JS}.data.find(t => t.name === 'sport').visible === 'legendonly'",
                                   timeout=10_000)
            out = page.evaluate(KERNEL_JS, "import time; time.sleep(0.5); print(ex.hidden_categories)")
            assert "sport" in out, out

            # the 2-D/3-D toggle: a WebGL 3-D scene (Scatter3d of PC 1-3) is drawn in the page
            page.locator(".widget-toggle-buttons button", has_text="3-D").first.click()
            page.wait_for_function(f"""() => {{ const gd = {EXPLORER_JS};
                return gd.data.length > 0 && gd.data.every(t => t.type === 'scatter3d') && gd._fullLayout.scene &&
                       gd.querySelector('.gl-container canvas') && String(gd.layout.title.text).includes('3-D'); }}""",
                                   timeout=60_000)
            out = page.evaluate(KERNEL_JS, "import time; time.sleep(0.5); print(ex.dims, ex.coords.shape)")
            assert out.split()[0] == "3", out
            page.screenshot(path=str(ARTIFACTS / "browser_explorer_3d.png"), full_page=False)

            # a reload with the kernel alive after all of that (lassos, boxes, clicks): every widget draws live
            _reload_draws_every_widget_live(page)
        except Exception:
            try:
                page.screenshot(path=str(ARTIFACTS / "browser_failure.png"), full_page=True)
            except Exception:
                pass
            print(page.evaluate("Array.from(document.querySelectorAll('.widget-output, .jp-OutputArea-output'))"
                                ".map(e => e.innerText.slice(0, 200)).join('\\n---\\n')"))
            print("\n".join(console[-40:]))
            print(log.read_text()[-3000:])
            raise
        finally:
            browser.close()
    errors = [c for c in console if c.startswith("error") and "cgt_viz" in c]
    assert not errors, errors


def test_an_onerror_handler_in_a_label_does_not_fire():
    """A topic/label named `<img src=x onerror=...>` in the explorer's selection summary (an ipywidgets.HTML,
    whose view sets innerHTML), in a status line and in an exported figure: the handler must not run. The
    same payload unescaped sets the flag, so the check can fail."""
    _need_browser()
    from playwright.sync_api import sync_playwright

    sys.path.insert(0, str(ROOT / "tests" / "faults"))
    from test_faults import XSS, xss_pages
    pages = xss_pages()
    page = None
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            def fired(markup: str, as_inner_html: bool) -> bool:
                nonlocal page
                page = browser.new_page()   # a fresh window: no flag left from the check before
                page.set_content("<!doctype html><html><body><div id=w></div></body></html>")
                if as_inner_html:   # what the ipywidgets HTML view does with its value
                    page.evaluate("m => { document.getElementById('w').innerHTML = m; }", markup)
                else:
                    page.set_content(markup)
                page.wait_for_timeout(300)
                return bool(page.evaluate("() => window.__xss === 1"))

            assert fired(f"<span>{XSS}</span>", True), "the harness must detect an unescaped payload"
            for name in ("selection summary", "status"):
                assert not fired(pages[name], True), f"the {name} ran the label's onerror handler"
            assert not fired(pages["figure"], False), "the exported figure ran the label's onerror handler"
            assert page.locator(".js-plotly-plot").count() == 1     # and the figure did render
        finally:
            browser.close()


# ---------------------------------------------------------------------------------------------- static form
DRAWN_TITLES_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot'))
    .filter(gd => gd._fullLayout && gd._fullData && gd._fullData.length > 0 && gd.querySelector('.main-svg'))
    .map(gd => String(gd.layout.title && gd.layout.title.text || ''))"""


def _executed_views_notebook(tmp_path: Path):
    """tests/browser/static_views.py's cells run through nbclient (the way nbconvert --execute runs them:
    widget state stored in the notebook), in a fresh kernel."""
    import nbclient
    import nbformat
    sys.path.insert(0, str(ROOT / "tests" / "browser"))
    from static_views import CELLS
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    env_before = dict(os.environ)
    os.environ.update(PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
                      OMP_NUM_THREADS="1")
    try:
        nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                resources={"metadata": {"path": str(tmp_path)}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    return nb


def _configured_nbconvert():
    """The nbconvert config `make env` writes (cgt_viz.widgets.export.install_config), read as nbconvert reads it."""
    import tempfile

    from traitlets.config import JSONFileConfigLoader

    from cgt_viz.widgets.export import install_config
    with tempfile.TemporaryDirectory() as prefix:
        install_config(prefix)
        return JSONFileConfigLoader("jupyter_nbconvert_config.json", str(Path(prefix) / "etc" / "jupyter")).load_config()


def _open_offline(page, path: Path) -> list[str]:
    """Open a file with every non-file request refused (no CDN, no kernel); the URLs that were refused."""
    refused: list[str] = []

    def route(r):
        if r.request.url.startswith("file:"):
            r.continue_()
        else:
            refused.append(r.request.url)
            r.abort()
    page.route("**/*", route)
    page.goto(path.as_uri(), wait_until="load", timeout=60_000)
    return refused


def test_static_export_draws_every_view_without_a_kernel(tmp_path):
    """Execute a notebook with every view, convert it to HTML (with the StaticViews preprocessor, and plainly
    after dropping the stored widget state, as for a notebook JupyterLab saved), open it in Chromium with
    the network cut, and find a drawn plot for every view; plotly.js is in the page once."""
    _need_browser()
    import copy

    import nbformat
    from nbconvert import HTMLExporter
    from playwright.sync_api import sync_playwright

    from cgt_viz.widgets.export import StaticViews

    nb = _executed_views_notebook(tmp_path)
    from static_views import TITLES
    outputs = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "display_data"]
    # every view is its style, the live widget, then one static output per figure it can show
    # (cgt_viz.widgets._static): monitor 1, explorer 3 (map, strip, inspector), strip 2, inspector 2, compare 3
    kinds = [("static" if o["metadata"].get("cgt_viz", {}).get("static") else "style"
              if o["metadata"].get("cgt_viz", {}).get("style") else "live" if WIDGET_MIME in o["data"] else "?")
             for o in outputs]
    assert kinds == [k for slots in (1, 3, 2, 2, 3) for k in ["style", "live"] + ["static"] * slots], kinds
    assert "widgets" in nb.metadata                      # nbclient stored widget state, as nbconvert --execute does
    saved = tmp_path / "saved.ipynb"
    nbformat.write(nb, saved)
    assert 'data-cgt-viz=\\"plotly.js\\"' not in saved.read_text() and saved.stat().st_size < 1_500_000   # no plotly.js

    pages = {}
    exporter = HTMLExporter()
    exporter.register_preprocessor(StaticViews, enabled=True)
    pages["preprocessed"] = exporter.from_notebook_node(copy.deepcopy(nb))[0]
    plain = copy.deepcopy(nb)
    del plain.metadata["widgets"]                        # what a notebook saved from JupyterLab looks like,
    configured = HTMLExporter(config=_configured_nbconvert())     # exported as `jupyter nbconvert` does after make env
    pages["no widget state"] = configured.from_notebook_node(plain)[0]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            for name, body in pages.items():
                marker = 'data-cgt-viz="plotly.js"'
                assert body.count(marker) == 1, name
                path = tmp_path / f"{name.replace(' ', '_')}.html"
                path.write_text(body, encoding="utf-8")
                page = browser.new_page(viewport={"width": 1200, "height": 900})
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                _open_offline(page, path)
                page.wait_for_function(f"({DRAWN_TITLES_JS})().length >= {len(TITLES) + 2}", timeout=60_000)
                titles = page.evaluate(DRAWN_TITLES_JS)
                for want in TITLES:
                    assert any(t.startswith(want) for t in titles), (name, want, titles)
                # the explorer's static copy after its linked views were opened: map, strip, inspector
                assert sum(t.startswith("Smoothness of ȳ") for t in titles) == 2, (name, titles)
                # the monitor's copy is the finished run (refreshed after the cell), log ticks in full
                ticks = page.evaluate("""() => { const gd = Array.from(document.querySelectorAll('.js-plotly-plot'))
                    .find(g => String(g.layout.title.text).startsWith('static-test monitor'));
                    return [gd._fullData[0].x.length, Array.from(gd.querySelectorAll('.ytick text')).map(t => t.textContent)]; }""")
                # losses run 31..130: plotly's bare-digit log labels would include "3"..."9"
                assert ticks[0] == 40 and ticks[1] and all(float(t) >= 10 for t in ticks[1]), ticks
                page.screenshot(path=str(ARTIFACTS / f"static_{name.replace(' ', '_')}.png"), full_page=False)
                assert not errors, (name, errors)
                page.close()
        finally:
            browser.close()


def test_saved_notebook_reopened_in_jupyterlab_draws_every_view(tmp_path):
    """The executed notebook (nbclient: untrusted when opened, its widget models gone with its kernel)
    reopened in JupyterLab: every view's output is drawn from its plotly JSON by plotly's lab extension."""
    _need_browser()
    import nbformat
    from playwright.sync_api import sync_playwright

    (tmp_path / "run").mkdir()
    (tmp_path / "lab-home").mkdir()
    nb = _executed_views_notebook(tmp_path / "run")
    from static_views import TITLES
    saved = tmp_path / "views.ipynb"
    nbformat.write(nb, saved)
    with jupyter_lab(tmp_path / "lab-home", saved) as (url, _work, log), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.goto(url + "lab/tree/views.ipynb", wait_until="domcontentloaded", timeout=60_000)
            page.wait_for_function("document.querySelectorAll('.jp-Notebook .jp-Cell').length >= 5", timeout=60_000)
            # every figure of every view, as the export draws them (the strips' token text, the inspector's,
            # the explorer's linked views: one static output each), not only each view's first
            want = sum(1 for c in nb.cells for o in c.get("outputs", [])
                       if o.get("metadata", {}).get("cgt_viz", {}).get("static") and PLOTLY_MIME in o.get("data", {}))
            assert want > len(TITLES)
            # plotly's lab renderer draws each output as it scrolls into view: visit every output
            for i in range(page.locator(".jp-OutputArea-output").count()):
                page.locator(".jp-OutputArea-output").nth(i).scroll_into_view_if_needed()
                page.wait_for_timeout(200)
            page.wait_for_function(f"document.querySelectorAll('.jp-RenderedPlotly').length >= {want}", timeout=60_000)
            page.wait_for_function(f"""Array.from(document.querySelectorAll('.jp-RenderedPlotly'))
                .filter(el => el.querySelector('.main-svg') || el.querySelector('img.plot-img[src]')).length >= {want}""",
                                   timeout=60_000)
            text = page.evaluate("Array.from(document.querySelectorAll('.jp-OutputArea-output')).map(e => e.innerText).join(' ')")
            assert "TrainingMonitor(children=" not in text and "Explorer(children=" not in text
            page.screenshot(path=str(ARTIFACTS / "static_jupyterlab_reopened.png"), full_page=False)
        except Exception:
            print(log.read_text()[-2000:])
            raise
        finally:
            browser.close()


def test_three_d_static_copy_is_drawn_offline(tmp_path):
    """The explorer's static form in 3-D (what a saved notebook shows): plotly.js draws a WebGL 3-D scene
    from the page alone, with the network cut."""
    _need_browser()
    import torch
    from playwright.sync_api import sync_playwright

    sys.path.insert(0, str(ROOT / "tests" / "model"))
    from test_analysis import tiny_cgt

    import cgt_viz
    torch.manual_seed(0)
    ex = cgt_viz.explore(tiny_cgt(seed=1), torch.randint(0, 256, (6, 20)), labels=["a", "b", "c"] * 2,
                         background=None, linked=False, dims=3)
    path = tmp_path / "explorer_3d.html"
    path.write_text(f"<!doctype html><html><body>{ex.static_html()}</body></html>", encoding="utf-8")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1000, "height": 800})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            refused = _open_offline(page, path)
            page.wait_for_function("""() => { const gd = document.querySelector('.js-plotly-plot');
                return gd && gd._fullData && gd._fullData.length === 4 && gd._fullData.every(t => t.type === 'scatter3d')
                       && gd._fullData[3].name === 'highlighted' && gd._fullData[3].x.length === 0 /* the ring overlay */
                       && gd._fullLayout.scene && gd.querySelector('.gl-container canvas'); }""", timeout=60_000)
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "static_explorer_3d.png"), full_page=False)
            assert not errors and not refused, (errors, refused)
        finally:
            browser.close()


# ---------------------------------------------------------------------------------------------- view state
VIEW_STATE_JS = """([where, latest]) => {
    // {view: does its main figure show the latest state?} for the drawn, visible plots: 'live' ones (in a
    // widget view), 'static' ones (a static copy) or any
    const out = {};
    for (const gd of document.querySelectorAll('.js-plotly-plot')) {
        if (!gd._fullLayout || !gd.data || gd.offsetParent === null) continue;
        const live = !!gd.closest('.cgt-viz-view');
        if ((where === 'live' && !live) || (where === 'static' && live)) continue;
        const title = String(gd.layout.title && gd.layout.title.text || '');
        for (const [name, [prefix, test]] of Object.entries(latest))
            if (title.startsWith(prefix) && out[name] !== true) out[name] = new Function('gd', 'return ' + test)(gd);
    }
    return out; }"""
WAIT_IDLE_JS = """() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    return w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel &&
           w.sessionContext.session.kernel.status === 'idle' && document.querySelector('.jp-Notebook .jp-Cell'); }"""
RUN_CELL_JS = """async (i) => { const app = window.jupyterapp, panel = app.shell.currentWidget;
    panel.content.activeCellIndex = i; await app.commands.execute('notebook:run-cell'); }"""


def open_and_run_all(page, url: str, notebook: str, hide_left: bool = False) -> None:
    """Open a notebook of the lab's folder, wait for its kernel, and start 'run all' without awaiting it (the
    caller waits for what the cells print)."""
    page.goto(url + "lab/tree/" + notebook, wait_until="domcontentloaded", timeout=60_000)
    page.wait_for_function(WAIT_IDLE_JS, timeout=60_000)
    if hide_left:
        page.evaluate("() => window.jupyterapp.commands.execute('application:toggle-left-area')")
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")   # no await


def _views_at_latest(page, where: str, latest: dict, label: str, timeout: float = 60_000) -> None:
    """Wait until every view's main figure is drawn at its latest state (`where`: live / static / any)."""
    deadline = time.monotonic() + timeout / 1000
    while True:
        for cell in page.locator(".jp-Notebook .jp-Cell").all():   # plotly's lab renderer draws when in view
            cell.scroll_into_view_if_needed()
        state = page.evaluate(VIEW_STATE_JS, [where, latest])
        if len(state) == len(latest) and all(state.values()):
            return
        if time.monotonic() > deadline:
            page.screenshot(path=str(ARTIFACTS / f"view_state_failure_{label}.png"), full_page=False)
            raise AssertionError(f"{label}: views not at their latest state ({where}): {state}")
        page.wait_for_timeout(500)


def test_views_show_their_latest_state_after_reload_restart_shutdown_and_export(tmp_path):
    """One JupyterLab: run a notebook whose last cell changes every view, re-run the first view's cell and
    that cell, save. Then each view is drawn at its latest state: live after a page reload (kernel alive),
    after a kernel restart (the same page keeps its drawings; reloaded, the static copies show instead of
    "model not found") and after a shutdown (reloaded: static copies), and
    in the HTML of the saved notebook (plain nbconvert and with StaticViews), opened offline."""
    _need_browser()
    import nbformat
    from nbconvert import HTMLExporter
    from playwright.sync_api import sync_playwright

    from cgt_viz.widgets.export import StaticViews
    sys.path.insert(0, str(ROOT / "tests" / "browser"))
    from view_state import CELLS, LATEST

    ARTIFACTS.mkdir(exist_ok=True)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    source = tmp_path / "state.ipynb"
    nbformat.write(nb, source)
    (tmp_path / "home").mkdir()
    with jupyter_lab(tmp_path / "home", source) as (url, work, log), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        try:
            open_and_run_all(page, url, "state.ipynb")
            page.locator(".jp-OutputArea-output", has_text="CHANGED").first.wait_for(timeout=60_000)
            page.wait_for_function(WAIT_IDLE_JS, timeout=60_000)
            for i in (1, 5):              # re-run the cell of the first view (in a session's first output
                page.evaluate(RUN_CELL_JS, i)      # plotly.js used to be embedded once), then the changes
                page.wait_for_function(WAIT_IDLE_JS, timeout=60_000)
            page.wait_for_timeout(500)
            _views_at_latest(page, "live", LATEST, "live")
            hidden = page.evaluate("Array.from(document.querySelectorAll('.jp-RenderedPlotly'))"
                                   ".filter(e => e.offsetParent !== null).length")
            assert hidden == 0, f"{hidden} static copies shown next to their live views"
            page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
            page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=30_000)
            saved = nbformat.read(work / "state.ipynb", as_version=4)

            page.reload(wait_until="domcontentloaded")           # kernel alive: the widget models' state
            page.wait_for_function(WAIT_IDLE_JS, timeout=60_000)
            _views_at_latest(page, "live", LATEST, "reload")
            page.screenshot(path=str(ARTIFACTS / "view_state_reload.png"), full_page=False)

            page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.restart()")
            page.wait_for_function(WAIT_IDLE_JS, timeout=60_000)
            # the same page keeps the last drawing of each view (ipywidgets marks it disconnected)
            _views_at_latest(page, "any", LATEST, "restart")
            page.reload(wait_until="domcontentloaded")
            page.wait_for_function(WAIT_IDLE_JS, timeout=60_000)
            _views_at_latest(page, "static", LATEST, "restart-reload")
            text = page.evaluate("Array.from(document.querySelectorAll('.jp-OutputArea-child'))"
                                 ".filter(e => e.offsetParent !== null).map(e => e.innerText).join(' ')")
            assert "model not found" not in text and "Loading widget" not in text, text[:500]
            page.screenshot(path=str(ARTIFACTS / "view_state_restart.png"), full_page=False)

            page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.shutdown()")
            page.wait_for_timeout(1000)
            page.reload(wait_until="domcontentloaded")
            page.wait_for_function("document.querySelectorAll('.jp-Notebook .jp-Cell').length >= 6", timeout=60_000)
            _views_at_latest(page, "static", LATEST, "shutdown")
            text = page.evaluate("Array.from(document.querySelectorAll('.jp-OutputArea-child'))"
                                 ".filter(e => e.offsetParent !== null).map(e => e.innerText).join(' ')")
            assert "model not found" not in text and "Loading widget" not in text, text[:500]
            page.screenshot(path=str(ARTIFACTS / "view_state_shutdown.png"), full_page=False)

            exporter = HTMLExporter()
            exporter.register_preprocessor(StaticViews, enabled=True)
            pages = {"configured": HTMLExporter(config=_configured_nbconvert()).from_notebook_node(saved)[0],
                     "StaticViews": exporter.from_notebook_node(saved)[0]}
            for name, body in pages.items():
                path = tmp_path / f"export_{name}.html"
                path.write_text(body, encoding="utf-8")
                export = browser.new_page(viewport={"width": 1200, "height": 900})
                errors: list[str] = []
                export.on("pageerror", lambda exc: errors.append(str(exc)))
                _open_offline(export, path)
                deadline = time.monotonic() + 60
                while True:
                    state = export.evaluate(VIEW_STATE_JS, ["any", LATEST])
                    if (len(state) == len(LATEST) and all(state.values())) or time.monotonic() > deadline:
                        break
                    export.wait_for_timeout(300)
                export.screenshot(path=str(ARTIFACTS / f"view_state_export_{name}.png"), full_page=True)
                assert len(state) == len(LATEST) and all(state.values()), (name, state)
                assert not errors, (name, errors)
                export.close()
            marker = 'data-cgt-viz="plotly.js"'     # (nbconvert reorders the attributes)
            assert pages["StaticViews"].count(marker) == 1 == pages["configured"].count(marker)
            assert 'data-cgt-viz=\\"plotly.js\\"' not in (work / "state.ipynb").read_text()   # the saved notebook: none
        except Exception:
            print(log.read_text()[-3000:])
            raise
        finally:
            browser.close()
