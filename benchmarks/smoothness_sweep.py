"""Smoothness penalties on the text mixture: does ȳ get smooth, or just constant?

    python benchmarks/smoothness_sweep.py --steps 600 --weights 0,0.002,0.01 --smooth l2      # ~7 CPU min a run
    python benchmarks/smoothness_sweep.py --steps 600 --weights 0.1 --smooth relative

One model per weight (notebook 03's text model, block size 128, seed 0). Per run: the validation main loss;
cos(ȳ_t, ȳ_t−1) (smooth within a sequence); the cosine between the last ȳ of different sequences and the
spread of ȳ over tokens (a collapsed ȳ has both near 1 and 0); kNN topic accuracy at excerpt ends; and the
specialised / no-context losses before and after the topic switch. Writes results/smoothness_sweep.json.
"""
from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

import common
from cgt_viz import CGT, CGTConfig
from cgt_viz.evaluate import collect_excerpt_ends, knn_topic_accuracy, text_position_curves
from cgt_viz.tasks import make_task
from cgt_viz.train import train

MODEL = dict(n_layer=4, d_x=128, n_head=4, d_y=64, n_head_y=2, y_layer=2, n_templates=8, template_rank=2)


def run(task, smooth: str, weight: float, steps: int, batch_size: int, eval_batches: int, seed: int) -> dict:
    torch.manual_seed(seed)
    model = CGT(CGTConfig(**task.config_kwargs(), **MODEL, w_smooth=weight, smooth=smooth))
    t0 = time.perf_counter()
    model, _ = train(model, task, steps=steps, batch_size=batch_size, seed=seed, progress=False)
    seconds = time.perf_counter() - t0
    model.eval()
    val = task.get_batch(64, part="val", generator=torch.Generator().manual_seed(5000 + seed))
    with torch.no_grad():
        ybar = model.context(val.inputs)                                     # (b, t, e)
        val_main = model.loss(val.inputs, val.targets, val.loss_mask)["main"].item()
    ends = F.normalize(ybar[:, -1], dim=-1)
    off_diagonal = ~torch.eye(len(ends), dtype=torch.bool)
    feats, topic = collect_excerpt_ends(model, task, n_batches=eval_batches, seed=4000 + seed)
    curves = text_position_curves(model, task, n_batches=eval_batches, seed=3000 + seed)
    before = curves["positions"] < curves["boundary"]
    row = {"smooth": smooth, "w_smooth": weight, "steps": steps, "train_seconds": seconds, "val_main": val_main,
           "adjacent_cosine": float(F.cosine_similarity(ybar[:, 1:], ybar[:, :-1], dim=-1).mean()),
           "between_sequence_cosine": float((ends @ ends.T)[off_diagonal].mean()),
           "ybar_spread": float(ybar.reshape(-1, ybar.shape[-1]).std(0).mean()),
           "knn_topic_acc": knn_topic_accuracy(feats, topic)}
    for side, sel in (("before", before), ("after", ~before)):
        for mode in ("prompted", "specialized", "no_context"):
            row[f"{side}_{mode}"] = float(np.mean(curves[f"loss_{mode}"][sel]))
    return row


def main(argv: list[str] | None = None) -> dict:
    p = common.parser(__doc__)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--weights", default="0,0.002,0.01", help="comma-separated w_smooth values")
    p.add_argument("--smooth", default="l2", choices=("l2", "vae", "relative"))
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(common.DEFAULT_RESULTS))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    task = make_task("text", block_size=args.block_size)
    started, rows = time.time(), []
    for weight in (float(w) for w in args.weights.split(",")):
        rows.append(run(task, args.smooth, weight, args.steps, args.batch_size, args.eval_batches, args.seed))
        print({k: round(v, 5) if isinstance(v, float) else v for k, v in rows[-1].items()}, flush=True)
    res = {"rows": rows, "model": MODEL, "environment": common.environment(torch.device("cpu")),
           "wall_seconds": time.time() - started}
    common.write_json(common.Path(args.out) / f"smoothness_sweep_{args.smooth}.json", res)
    return res


if __name__ == "__main__":
    main()
