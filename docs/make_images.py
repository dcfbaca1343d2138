"""Redraw the README's view pictures (docs/img/explorer.png, smoothness.png, templates.png) from the shipped
reference text model, with the same figures the widgets show (their static copies), rendered by kaleido.

    python docs/make_images.py            # needs the png extra (kaleido) and a Chromium; ~2 min on one thread

The explorer picture is UMAP of ȳ for every token of 64 validation rows (16,384 tokens), coloured by topic;
the strip and the inspector (with its template ablation) show the first of those rows, its topic switch marked.
"""
from __future__ import annotations

import argparse
import base64
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(ROOT / "data" / "models" / "text-bbc5"))
    p.add_argument("--out", default=str(ROOT / "docs" / "img"))
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    import torch
    torch.set_num_threads(args.threads)
    from cgt_viz import CGT, SmoothnessStrip, TemplateInspector, explore
    from cgt_viz.tasks import task_from_config
    from cgt_viz.widgets._png import figure_png

    model = CGT.from_pretrained(args.model).eval()
    task = task_from_config(model.config)
    batch = task.get_batch(args.rows, part="val", generator=torch.Generator().manual_seed(0))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def save(fig, name: str, width: int, height: int) -> None:
        fig.update_layout(width=width, height=height)
        png = figure_png(fig)
        if png is None:
            raise SystemExit("kaleido or Chromium is missing: install the png extra (see README)")
        (out / name).write_bytes(base64.b64decode(png))
        print("wrote", out / name, flush=True)

    ex = explore(model, batch, background=None)
    ex.set_projection("umap", wait=True)
    save(ex.figure_static(selection=False), "explorer.png", 900, 560)
    strip = SmoothnessStrip(model, batch, sequence=0)
    save(strip.figure_for(0, None), "smoothness.png", 900, 520)
    inspector = TemplateInspector(model, batch, sequence=0)
    inspector.ablate()
    save(inspector.figure_for(), "templates.png", 900, 620)


if __name__ == "__main__":
    main()
