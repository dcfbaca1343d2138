"""Screenshots of every view on a tiny CGT, for a person to look at (not a test; run it by hand).

    python tests/browser/look_views.py --out test-artifacts/look

Writes a notebook that trains a tiny random CGT for a few dozen steps on a made-up text mixture (with
aux_delay, so the monitor marks where the aux term joins) into a TrainingMonitor, then opens explore(...)
coloured by token with a search, SmoothnessStrip, TemplateInspector and CompileCompare; runs it in JupyterLab
as tests/browser/test_browser.py does, clicks a point of the explorer, and saves one PNG per view (and the page).
With --export it also writes the notebook's nbconvert HTML and shoots it in Chromium with the network cut.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

WORDS = {
    "sport": "the striker scored a late goal and the match ended two all after extra time in the cup final",
    "business": "shares fell as the bank reported lower quarterly profits and investors sold the stock",
    "politics": "the minister said the new bill would be debated in parliament before the election",
}

CELLS = [
    """import random, torch, cgt_viz
from pathlib import Path
from cgt_viz import CGT, CGTConfig, train
from cgt_viz.tasks import make_task
from cgt_viz.widgets import TrainingMonitor, SmoothnessStrip, TemplateInspector, CompileCompare
torch.set_num_threads(1)
rng = random.Random(0)
for topic, words in {words!r}.items():
    for k in range(12):
        w = words.split()
        Path("corpus", topic).mkdir(parents=True, exist_ok=True)
        Path("corpus", topic, f"{{k}}.txt").write_text(" ".join(rng.choice(w) for _ in range(200)))
task = make_task("text", source="corpus", block_size=64, min_excerpt=16, tokenizer="bytes", val_fraction=0.34)
torch.manual_seed(0)
cfg = CGTConfig(**task.config_kwargs(), n_layer=3, d_x=32, n_head=2, d_y=16, n_head_y=2, y_layer=1, n_templates=4)
model = CGT(cfg)""",
    """monitor = TrainingMonitor(title="tiny CGT", min_interval=0)
display(monitor)
model, history = train(model, task, steps=48, batch_size=8, lr=3e-3, aux_delay=16, aux_ramp=8, eval_every=12,
                       device="cpu", progress=False, callbacks=[monitor])
model.eval();""",
    """ex = cgt_viz.explore(model, task, n_batches=2, batch_size=12, background=None, color_by="token", seed=0)
ex.search("g", field="token")
ex""",
    """strip = SmoothnessStrip(model, ex.seqs, ybar=ex.ybar_full, sequence=1, highlight=20)
strip""",
    """insp = TemplateInspector(model, ex.seqs, ybar=ex.ybar_full, sequence=1, token=20)
insp.ablate()
insp""",
    """cmp = CompileCompare(model, ex.seqs)
cmp""",
    """print("CELLS-DONE")""",
]
TRACES_JS = """() => JSON.stringify(Array.from(document.querySelectorAll('.js-plotly-plot'))
    .filter(g => String(g.layout.title && g.layout.title.text).startsWith('ȳ of'))
    .map(g => [g.offsetParent !== null, g._fullData.map(t => [t.name, t.type, t.x.length, t.visible, t.showlegend,
               String(t.text && Array.from(t.text).slice(0, 3))])]))"""
NAMES = ["monitor", "explorer", "smoothness", "templates", "compare"]


def build(folder: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c.format(words=WORDS) if i == 0 else c) for i, c in enumerate(CELLS)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = folder / "look.ipynb"
    nbformat.write(nb, path)
    return path


def shoot(url: str, work: Path, out: Path) -> None:
    import test_browser as T
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=T.CHROMIUM, args=T.CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1200, "height": 1000})
        T.open_and_run_all(page, url, "look.ipynb", hide_left=True)
        page.locator(".jp-OutputArea-output", has_text="CELLS-DONE").first.wait_for(timeout=900_000)
        page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length >= 5", timeout=60_000)
        page.wait_for_timeout(2000)
        # click a point of the explorer (its neighbours get ringed)
        cell = page.locator(".jp-Notebook .jp-Cell").nth(2)
        cell.scroll_into_view_if_needed()
        page.wait_for_timeout(500)
        area = page.locator(".jp-Notebook .jp-Cell").nth(2).locator(".jp-OutputArea")
        area.scroll_into_view_if_needed()
        page.wait_for_timeout(500)
        area.locator(".js-plotly-plot").first.screenshot(path=str(out / "explorer-search.png"))
        (out / "explorer-traces-search.txt").write_text(page.evaluate(TRACES_JS))
        pt = page.evaluate("""() => {
            const gd = Array.from(document.querySelectorAll('.js-plotly-plot')).find(g => g.offsetParent !== null
                && String(g.layout.title && g.layout.title.text).startsWith('ȳ of'));
            const t = gd._fullData[0], i = Math.floor(t.x.length / 3), r = gd.querySelector('.nsewdrag').getBoundingClientRect();
            return [r.left + gd._fullLayout.xaxis.l2p(t.x[i]), r.top + gd._fullLayout.yaxis.l2p(t.y[i])]; }""")
        page.mouse.move(pt[0] - 4, pt[1] - 4)
        page.mouse.move(pt[0], pt[1])
        page.wait_for_timeout(300)
        page.mouse.click(pt[0], pt[1])
        page.wait_for_timeout(2500)
        (out / "explorer-traces-click.txt").write_text(page.evaluate(TRACES_JS))
        for i, name in enumerate(NAMES, start=1):
            area = page.locator(".jp-Notebook .jp-Cell").nth(i).locator(".jp-OutputArea")
            area.scroll_into_view_if_needed()
            page.wait_for_timeout(500)
            area.screenshot(path=str(out / f"{name}.png"))
            for k, plot in enumerate(p for p in area.locator(".js-plotly-plot").all() if p.is_visible()):
                plot.scroll_into_view_if_needed()
                plot.screenshot(path=str(out / f"{name}-plot{k}.png"))
        # save (for the export) and check the modebar of the explorer has no cloud button
        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
        page.wait_for_timeout(2000)
        buttons = page.evaluate("() => Array.from(document.querySelectorAll('.modebar-btn')).map(b => b.getAttribute('data-title'))")
        (out / "modebar.txt").write_text("\n".join(sorted(set(map(str, buttons)))))
        browser.close()


def export(work: Path, out: Path) -> None:
    import test_browser as T
    from playwright.sync_api import sync_playwright

    subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", str(work / "look.ipynb"),
                    "--output-dir", str(out)], check=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=T.CHROMIUM, args=T.CHROMIUM_ARGS)
        ctx = browser.new_context(viewport={"width": 1200, "height": 1000}, offline=True)
        page = ctx.new_page()
        page.route("**/*", lambda route: route.abort() if not route.request.url.startswith("file:") else route.continue_())
        page.goto((out / "look.html").resolve().as_uri())
        page.wait_for_timeout(5000)
        n = page.evaluate("document.querySelectorAll('.js-plotly-plot').length")
        print("export: plotly plots drawn:", n)
        page.screenshot(path=str(out / "export-page.png"), full_page=True)
        for i, el in enumerate(page.locator(".js-plotly-plot").all()):
            el.scroll_into_view_if_needed()
            el.screenshot(path=str(out / f"export-{i}.png"))
        browser.close()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("test-artifacts/look"))
    p.add_argument("--export", action="store_true", help="also shoot the nbconvert HTML export, offline")
    args = p.parse_args(argv)
    import test_browser as T

    out = args.out.resolve()
    with tempfile.TemporaryDirectory(prefix="cgt-look-") as tmp:
        nb_path = build(Path(tmp))
        with T.jupyter_lab(Path(tmp), nb_path) as (url, work, _log):
            shoot(url, work, out)
            if args.export:
                export(work, out)


if __name__ == "__main__":
    main()
