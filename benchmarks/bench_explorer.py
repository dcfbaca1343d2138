"""How fast the ȳ explorer paints: first paint on 20k and 100k tokens (with and without collecting ȳ),
UMAP on 20k points once numba is warm, and figure construction for 100k points. Writes
benchmarks/results/explorer.json.

    python benchmarks/bench_explorer.py                 # ~3-4 min on one CPU thread (UMAP, 100k tokens)
    python benchmarks/bench_explorer.py --skip-umap --tokens 2000 --paint-tokens 2000 --points 5000 --repeats 1

First paint, per size in --paint-tokens (`first_paint_<n>`):
    explorer_s            cgt_viz.explore(model, data, labels) until it returns with its map built: what a
                          notebook shows first. Above 2 × Explorer.preview_tokens tokens that map is a preview
                          (ȳ of some sequences); the rest is collected in a background thread.
    explorer_complete_s   the same until every point is drawn (explore(...).wait())
    explorer_ybar_given_s Explorer(model, seqs, ybar): ȳ already collected (e.g. precomputed), no model pass
    collect_ybar_s        analysis.collect_ybar alone (the model's layers 1..ℓ over every token)
    pipeline_s            prepare_sequences + collect_ybar + collect_points + PCA + ybar_map_figure

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
    p = common.parser(__doc__)
    p.add_argument("--tokens", type=int, default=20_000, help="tokens for first paint and UMAP (default 20000)")
    p.add_argument("--paint-tokens", default="20000,100000",
                   help="comma-separated token counts for the first-paint timings (default 20000,100000)")
    p.add_argument("--points", type=int, default=100_000, help="points for the figure-construction timing")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per measurement (median reported)")
    p.add_argument("--threads", type=int, default=1, help="torch / numba threads (default 1)")
    p.add_argument("--skip-umap", action="store_true", help="skip the UMAP measurement (numba compile ~10-30 s)")
    p.add_argument("--out", type=Path, default=DEFAULT_RESULTS, help="output folder (default benchmarks/results)")
    args = p.parse_args(argv)
    try:
        args.paint_tokens = [int(v) for v in str(args.paint_tokens).split(",") if v.strip()]
    except ValueError:
        p.error(f"--paint-tokens must be comma-separated ints, got {args.paint_tokens!r}")
    if not args.paint_tokens or min(args.paint_tokens) < 2:
        p.error(f"--paint-tokens must be ints >= 2, got {args.paint_tokens}")
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
    from cgt_viz.widgets import Explorer, explore
    import_s = time.perf_counter() - t0

    cfg = CGTConfig(vocab_size=256, block_size=256, n_layer=4, d_x=128, n_head=4, d_y=64, n_head_y=2, y_layer=2)
    torch.manual_seed(0)
    model = CGT(cfg).eval()

    def dataset(tokens: int):
        n_seq = -(-tokens // cfg.block_size)
        return torch.randint(0, 256, (n_seq, cfg.block_size)), [f"topic {i % 5}" for i in range(n_seq)]

    res = {"environment": environment(torch.device("cpu")), "targets_s": TARGETS_S, "import_s": import_s,
           "model": {k: getattr(cfg, k) for k in ("vocab_size", "block_size", "n_layer", "d_x", "d_y", "y_layer")},
           "preview_tokens": getattr(Explorer, "preview_tokens", None)}

    def finished(ex):
        if hasattr(ex, "wait"):          # a preview: its background collection must not overlap the next run
            ex.wait()
        return ex

    # 1. first paint: ȳ of every token (or of a preview), PCA, the WebGL scatter figure
    for tokens in args.paint_tokens:
        data, labels = dataset(tokens)
        seqs = A.prepare_sequences(model, data, labels)
        entry = {"tokens": int(data.numel())}
        times = []
        for i in range(args.repeats + 1):        # the first run is the untimed warm-up
            t0 = time.perf_counter()
            ex = explore(model, data, labels=labels, background=None, linked=False)
            took = time.perf_counter() - t0
            if i == 0:
                entry["preview"] = bool(getattr(ex, "collecting", False))
                entry["first_frame_points"] = int(sum(len(t.x) for t in ex.figure.data))
            finished(ex)                         # a background collection must not overlap the next run
            times += [took] if i else []
        entry["explorer_s"] = summarize(times)["median"]
        entry["explorer_complete_s"] = timed(lambda: finished(explore(model, data, labels=labels, background=None,
                                                                       linked=False)), args.repeats)[0]["median"]
        ybar = A.collect_ybar(model, seqs.inputs)
        entry["explorer_ybar_given_s"] = timed(lambda: Explorer(model, seqs, ybar, background=None, linked=False),
                                               args.repeats)[0]["median"]
        entry["collect_ybar_s"] = timed(lambda: A.collect_ybar(model, seqs.inputs), args.repeats)[0]["median"]

        def pipeline():
            s2 = A.prepare_sequences(model, data, labels)
            pts = A.collect_points(s2, A.collect_ybar(model, s2.inputs))
            coords = A.Projector("pca").fit_transform(pts.ybar)
            return ybar_map_figure(coords, pts.label, pts.hover, color_name="topic")
        entry["pipeline_s"] = timed(pipeline, args.repeats)[0]["median"]
        res[f"first_paint_{tokens}"] = entry

    data, labels = dataset(args.tokens)
    res["tokens"] = int(data.numel())
    ex = finished(explore(model, data, labels=labels, background=None, linked=False))

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

    big = f"first_paint_{max(args.paint_tokens)}"
    res["summary"] = {
        **{f"{k}_{n}": res[f"first_paint_{n}"][k] for n in args.paint_tokens
           for k in ("explorer_s", "explorer_complete_s", "explorer_ybar_given_s")},
        "umap_warm_s": res["umap_warm"]["median"] if "umap_warm" in res else None,
        "figure_100k_s": res["figure_100k"]["median"],
    }
    res["meets_targets"] = {
        "first_paint": res[big]["explorer_s"] <= TARGETS_S["first_paint"],
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
