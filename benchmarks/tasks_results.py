"""The results table of the README: train each task for several seeds and measure what compiling keeps.

    python benchmarks/tasks_results.py --tasks icl regression text --seeds 0 1 2      # the README's table
    python benchmarks/tasks_results.py --tasks regression --seeds 0 --steps 200         # a quick look

Per task and seed: prompted / specialised / no-context losses (accuracy for icl) after k demonstrations and
the gap closed G (`evaluate_specialization`); for icl and regression the linear probe of the hidden numbers
from ȳ; for text the per-position losses before/after the topic switch with ȳ frozen at the split, the kNN
topic accuracy of ȳ at excerpt ends, and a second model with the smoothness term (mean cosine of
consecutive ȳ and its main-loss cost). Writes benchmarks/results/tasks.json and prints a markdown table
(mean ± 95 % interval over seeds).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, write_json  # noqa: E402

from cgt_viz import CGT, CGTConfig  # noqa: E402
from cgt_viz.evaluate import (collect_excerpt_ends, collect_summaries, evaluate_specialization,  # noqa: E402
                              knn_topic_accuracy, linear_probe, mean_ci, smoothness_stats, text_position_curves)
from cgt_viz.tasks import make_task  # noqa: E402
from cgt_viz.train import train  # noqa: E402

# the notebooks' settings (notebooks 01, 02, 03 at their defaults)
RECIPES = {
    "icl": dict(task={}, model=dict(n_layer=4, d_x=64, n_head=4, d_y=32, n_head_y=2, y_layer=2, n_templates=16),
                steps=3000, batch_size=32, k=8),
    "regression": dict(task=dict(dim=4, n_points=16, noise=0.1),   # recipe: cgt_viz/tasks/regression.py
                       model=dict(n_layer=4, d_x=64, n_head=4, d_y=32, n_head_y=2, y_layer=2, n_templates=16,
                                  sites=("attn_in", "attn_out", "mlp_in", "mlp_out")),
                       steps=3000, batch_size=32, k=4, train=dict(aux_delay=500, aux_ramp=250), curriculum=1000),
    "text": dict(task=dict(block_size=128), model=dict(n_layer=4, d_x=128, n_head=4, d_y=64, n_head_y=2, y_layer=2,
                                                        n_templates=8, template_rank=2),
                 steps=1500, batch_size=32, k=64, w_smooth=0.05),
}


def run_one(name: str, seed: int, steps: int | None, eval_batches: int) -> dict:
    recipe = RECIPES[name]
    task = make_task(name, **recipe["task"])
    torch.manual_seed(seed)
    model = CGT(CGTConfig(**task.config_kwargs(), **recipe["model"]))
    steps = steps or recipe["steps"]
    t0 = time.perf_counter()
    callbacks = [task.curriculum(min(recipe["curriculum"], steps))] if "curriculum" in recipe else []
    model, history = train(model, task, steps=steps, batch_size=recipe["batch_size"], seed=seed, progress=False,
                           callbacks=callbacks, **recipe.get("train", {}))
    out = {"task": name, "seed": seed, "steps": steps, "train_seconds": time.perf_counter() - t0}
    row = evaluate_specialization(model, task, k_values=(recipe["k"],), n_batches=eval_batches, batch_size=64,
                                  seed=1000 + seed)[0]
    out.update({k: v for k, v in row.items() if isinstance(v, (int, float))})
    if name in ("icl", "regression"):
        feats, target = collect_summaries(model, task, k=recipe["k"], n_batches=eval_batches, seed=2000 + seed)
        out["probe"] = linear_probe(feats, target)["mean"]
    if name == "text":
        curves = text_position_curves(model, task, n_batches=eval_batches, seed=3000 + seed)
        pos, bnd = np.asarray(curves["positions"]), curves["boundary"]
        for side, sel in (("before", pos < bnd), ("after", pos >= bnd)):
            for mode in ("prompted", "specialized", "no_context"):
                out[f"{side}_{mode}"] = float(np.asarray(curves[f"loss_{mode}"])[sel].mean())
        feats, topic = collect_excerpt_ends(model, task, n_batches=eval_batches, seed=4000 + seed)
        out["knn_topic_acc"] = knn_topic_accuracy(feats, topic)
        val = task.get_batch(64, part="val", generator=torch.Generator().manual_seed(5000 + seed))
        smooth_model = CGT(CGTConfig(**task.config_kwargs(), **recipe["model"], w_smooth=recipe["w_smooth"]))
        torch.manual_seed(seed)
        smooth_model, _ = train(smooth_model, task, steps=steps, batch_size=recipe["batch_size"], seed=seed,
                                progress=False)
        for tag, m in (("", model), ("smooth_", smooth_model)):
            m.eval()
            with torch.no_grad():
                out[f"{tag}cosine"] = smoothness_stats(m.context(val.inputs))["mean_cosine"]
                out[f"{tag}val_main"] = float(m.loss(val.inputs, val.targets, val.loss_mask)["main"])
        out["smooth_main_cost"] = out["smooth_val_main"] / out["val_main"] - 1
    return out


def table(rows: list[dict]) -> str:
    def fmt(name, col, digits=3):
        vals = [r[col] for r in rows if r["task"] == name and col in r]
        if not vals:
            return "–"
        m, h = mean_ci(vals)
        return f"{m:.{digits}f} ± {h:.{digits}f}" if len(vals) > 1 else f"{m:.{digits}f}"
    lines = ["| task | seeds | steps | prompted | specialised | no context | gap closed G | probe / kNN |",
             "|---|---|---|---|---|---|---|---|"]
    for name in dict.fromkeys(r["task"] for r in rows):
        n = sum(r["task"] == name for r in rows)
        steps = next(r["steps"] for r in rows if r["task"] == name)
        metric = "acc" if name == "icl" else "loss"
        extra = fmt(name, "knn_topic_acc") if name == "text" else fmt(name, "probe")
        lines.append(f"| {name} ({metric}) | {n} | {steps} | {fmt(name, f'{metric}_prompted')} | "
                     f"{fmt(name, f'{metric}_specialized')} | {fmt(name, f'{metric}_no_context')} | "
                     f"{fmt(name, 'gap_closed')} | {extra} |")
    text = [r for r in rows if r["task"] == "text"]
    if text:
        lines += ["", "| text, ȳ frozen at the split | prompted | specialised | no context |", "|---|---|---|---|"]
        for side in ("before", "after"):
            lines.append(f"| {side} the topic switch | " + " | ".join(fmt("text", f"{side}_{m}") for m in
                                                                  ("prompted", "specialized", "no_context")) + " |")
        lines += ["", "| smoothness (text) | mean cos(ȳ_t, ȳ_t−1) | val main loss |", "|---|---|---|",
                  f"| w_smooth = 0 | {fmt('text', 'cosine')} | {fmt('text', 'val_main')} |",
                  f"| w_smooth = {RECIPES['text']['w_smooth']} | {fmt('text', 'smooth_cosine')} | "
                  f"{fmt('text', 'smooth_val_main')} (cost {fmt('text', 'smooth_main_cost')}) |"]
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=None, help="override every task's step count")
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "tasks.json"))
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for name in args.tasks:
        for seed in args.seeds:
            rows.append(run_one(name, seed, args.steps, args.eval_batches))
            print(json.dumps(rows[-1]), flush=True)
    result = {"rows": rows, "table": table(rows), "environment": environment(torch.device("cpu")), "argv": sys.argv[1:]}
    write_json(Path(args.out), result)
    print(result["table"])
    return result


if __name__ == "__main__":
    main()
