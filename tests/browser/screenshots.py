"""Take the README's widget screenshots in headless Chromium (not a test; run it by hand).

    python tests/browser/screenshots.py --model runs/text/model --out docs/img

Builds a notebook that loads a saved text-mixture CGT, opens the explorer (UMAP, coloured by topic), the
smoothness strip and the template inspector (with the ablation computed) for one sequence, runs it in
JupyterLab exactly as tests/browser/test_browser.py does, and saves one PNG per widget.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

CELLS = [
    """import torch
from cgt_viz import CGT, explore
from cgt_viz.tasks import task_from_config
from cgt_viz.widgets import SmoothnessStrip, TemplateInspector
torch.set_num_threads(1)
model = CGT.from_pretrained({model!r}).eval()
task = task_from_config(model.config)""",
    """ex = explore(model, task, n_batches={batches}, batch_size=32, background=None, seed=0, color_by={color!r})
ex.set_projection("umap", wait=True)
ex""",
    """i = int(ex.seqs.boundary.argsort()[len(ex.seqs.boundary) // 2])   # a row with a middling boundary
SmoothnessStrip(model, ex.seqs, ybar=ex.ybar_full, sequence=i, height=480)""",
    """insp = TemplateInspector(model, ex.seqs, ybar=ex.ybar_full, sequence=i, site={site!r}, height=560)
insp.ablate()
insp""",
    """print("CELLS-DONE")""",
]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a folder written by model.save_pretrained (text task)")
    p.add_argument("--out", type=Path, default=Path("docs/img"))
    p.add_argument("--batches", type=int, default=8, help="batches of 32 sequences for the explorer")
    p.add_argument("--site", default=None, help="template site for the inspector (default: the first)")
    p.add_argument("--color-by", default="topic", help="the explorer's colouring (topic, position, document, ...)")
    args = p.parse_args(argv)

    import test_browser as T

    site = args.site
    if site is None:
        from cgt_viz import CGT
        layer, name = CGT.from_pretrained(args.model).template_sites[0]
        site = f"{layer}.{name}"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c.format(model=str(Path(args.model).resolve()), batches=args.batches,
                                                   site=site, color=args.color_by)) for c in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    with tempfile.TemporaryDirectory(prefix="cgt-shots-") as tmp:
        nb_path = Path(tmp) / "shots.ipynb"
        nbformat.write(nb, nb_path)
        with T.jupyter_lab(Path(tmp), nb_path) as (url, _work, _log):
            shoot(url, args.out)


def shoot(url: str, out: Path) -> None:
    import test_browser as T
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=T.CHROMIUM, args=T.CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1080, "height": 900})
        try:
            T.open_and_run_all(page, url, "shots.ipynb", hide_left=True)
        except Exception:
            page.screenshot(path=str(out / "failure.png"))
            raise
        page.locator(".jp-OutputArea-output", has_text="CELLS-DONE").first.wait_for(timeout=600_000)
        page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length >= 3", timeout=60_000)
        page.wait_for_timeout(1500)
        for cell, name in ((1, "explorer"), (2, "smoothness"), (3, "templates")):
            area = page.locator(".jp-Notebook .jp-Cell").nth(cell).locator(".jp-OutputArea-output").first
            area.scroll_into_view_if_needed()
            path = out / f"{name}.png"
            area.screenshot(path=str(path))
            print(f"{path}: {path.stat().st_size / 1024:.0f} KB")
        browser.close()

if __name__ == "__main__":
    main()
