"""How fast the ȳ explorer paints: first paint (ȳ extraction + PCA + figure) on 20k tokens, UMAP on 20k
points once numba is warm, and figure construction for 100k points. Writes benchmarks/results/explorer.json.

    python benchmarks/bench_explorer.py                 # ~1-2 min on one CPU thread (UMAP dominates)
    python benchmarks/bench_explorer.py --skip-umap --tokens 2000 --points 5000 --repeats 1   # smoke run

Targets (from the widgets issue; reported, never asserted): first paint ≤ 2 s, UMAP warm ≤ 6 s,
figure for 100k points ≤ 2 s. The model is a notebook-sized byte-level CGT (untrained: cost does not
depend on the weights). Timings are medians over --repeats after one untimed warm-up run.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import common  # noqa: F401  (puts the repo root on sys.path)
import numpy as np
import torch

from common import DEFAULT_RESULTS, environment, summarize, write_json

TARGETS_S = {"first_paint": 2.0, "umap_warm": 6.0, "figure_100k": 2.0}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=20_000, help="tokens for first paint and UMAP (default 20000)")
    p.add_argument("--points", type=int, default=100_000, help="points for the figure-construction timing")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per measurement (median reported)")
    p.add_argument("--threads", type=int, default=1, help="torch / numba threads (default 1)")
    p.add_argument("--skip-umap", action="store_true", help="skip the UMAP measurement (numba compile ~10-30 s)")
    p.add_argument("--out", type=Path, default=DEFAULT_RESULTS, help="output folder (default benchmarks/results)")
    args = p.parse_args(argv)
    for name in ("tokens", "points", "repeats", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    return args


def timed(fn, repeats: int, warmup: int = 1) -> tuple[dict, object]:
    """summarize() of `repeats` wall-clock timings of fn() after `warmup` untimed calls; also the last result."""
    out = None
    for _ in range(warmup):
        out = fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return summarize(times), out


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    from cgt_viz import CGT, CGTConfig
    from cgt_viz import analysis as A
    from cgt_viz.figures import ybar_map_figure
    from cgt_viz.widgets import explore
    import_s = time.perf_counter() - t0

    cfg = CGTConfig(vocab_size=256, block_size=256, n_layer=4, d_x=128, n_head=4, d_y=64, n_head_y=2, y_layer=2)
    torch.manual_seed(0)
    model = CGT(cfg).eval()
    n_seq = -(-args.tokens // cfg.block_size)
    data = torch.randint(0, 256, (n_seq, cfg.block_size))
    labels = [f"topic {i % 5}" for i in range(n_seq)]
    n_tokens = n_seq * cfg.block_size
    res = {"environment": environment(torch.device("cpu")), "targets_s": TARGETS_S, "import_s": import_s,
           "model": {k: getattr(cfg, k) for k in ("vocab_size", "block_size", "n_layer", "d_x", "d_y", "y_layer")},
           "tokens": n_tokens}

    # 1. first paint: ȳ of every token, PCA, the WebGL scatter figure (the figure function: what any frontend needs)
    def first_paint():
        seqs = A.prepare_sequences(model, data, labels)
        pts = A.collect_points(seqs, A.collect_ybar(model, seqs.inputs))
        coords = A.Projector("pca").fit_transform(pts.ybar)
        return ybar_map_figure(coords, pts.label, pts.hover, color_name="topic")
    stats, fig = timed(first_paint, args.repeats)
    res["first_paint"] = {**stats, "points": sum(len(t.x) for t in fig.data),
                          "what": "prepare_sequences + collect_ybar + collect_points + PCA + ybar_map_figure"}
    seqs = A.prepare_sequences(model, data, labels)
    for name, fn in (("ybar_s", lambda: A.collect_ybar(model, seqs.inputs)),):
        res["first_paint"][name] = timed(fn, args.repeats)[0]["median"]
    stats, ex = timed(lambda: explore(model, data, labels=labels, background=None, linked=False), args.repeats)
    res["first_paint_widget"] = {**stats, "what": "cgt_viz.explore(...) end to end, FigureWidget included"}

    # 2. UMAP on the same points, after one warm-up fit that compiles numba
    if not args.skip_umap:
        X = ex.points.ybar
        t1 = time.perf_counter()
        A.Projector("umap").fit_transform(X[:6000])     # > 4096 points: compiles NN-descent too
        res["umap_warmup_s"] = time.perf_counter() - t1
        stats, _ = timed(lambda: A.Projector("umap").fit_transform(X), max(1, min(args.repeats, 2)), warmup=0)
        res["umap_warm"] = {**stats, "points": len(X), "settings": "analysis.Projector('umap') defaults: n_neighbors=15, "
                            "min_dist=0.1, init='pca', n_epochs=100 (N > 10k), negative_sample_rate=3, random_state=0, n_jobs=1"}

    # 3. figure construction for many points (coordinates, categorical colours, hover text)
    rng = np.random.default_rng(0)
    m = args.points
    coords = rng.normal(size=(m, 2)).astype(np.float32)
    labels_m = np.array([f"topic {i}" for i in range(5)], dtype=object)[rng.integers(0, 5, m)]
    hover = np.array([f"seq {i // 256} · pos {i % 256}<br>…some context <b>[x]</b> around it…<br>label: topic"
                      for i in range(m)], dtype=object)
    stats, fig = timed(lambda: ybar_map_figure(coords, labels_m, hover, color_name="topic"), args.repeats)
    res["figure_100k"] = {**stats, "points": m, "what": "ybar_map_figure (Scattergl, colours, hover text)"}
    widget_class = type(ex.figure)   # the widget class the explorer shows its map in (public API only)
    stats, _ = timed(lambda: widget_class(fig), args.repeats)
    res["figure_widget_100k"] = {**stats, "points": m, "what": f"{widget_class.__name__}(fig) from that figure"}
    stats, _ = timed(lambda: A.stratified_subsample(labels_m, m // 2), args.repeats)
    res["stratified_subsample_half"] = {**stats, "points": m}

    res["summary"] = {
        "first_paint_s": res["first_paint"]["median"],
        "first_paint_widget_s": res["first_paint_widget"]["median"],
        "umap_warm_s": res["umap_warm"]["median"] if "umap_warm" in res else None,
        "figure_100k_s": res["figure_100k"]["median"],
    }
    res["meets_targets"] = {
        "first_paint": res["summary"]["first_paint_s"] <= TARGETS_S["first_paint"],
        "umap_warm": None if res["summary"]["umap_warm_s"] is None else res["summary"]["umap_warm_s"] <= TARGETS_S["umap_warm"],
        "figure_100k": res["summary"]["figure_100k_s"] <= TARGETS_S["figure_100k"],
    }
    out = args.out / "explorer.json"
    write_json(out, res)
    print(f"wrote {out}")
    for k, v in res["summary"].items():
        print(f"  {k:22s} {'—' if v is None else f'{v:.3f} s'}")
    return res


if __name__ == "__main__":
    main()
