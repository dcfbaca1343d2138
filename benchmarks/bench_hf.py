"""CGT over a frozen SmolLM2-135M (cgt_viz.hf): ȳ topic kNN at init and after a short training, gap closed on
BBC continuations, training tokens/s, specialise time / one forward, peak RSS. Writes results/hf_smollm2.json.

    python benchmarks/bench_hf.py                   # CPU smoke run (~15 min on one thread)
    python benchmarks/bench_hf.py --steps 300 --batch-size 256 --device cuda   # a GPU run (32k tokens a step)
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from cgt_viz import hf, train  # noqa: E402
from cgt_viz.evaluate import evaluate_specialization  # noqa: E402
from cgt_viz.hf.measure import continuation_losses, ybar_topic_knn  # noqa: E402


def rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def timing(model, task, device, repeats: int = 3) -> dict:
    """Median seconds of one LM forward over a 256-token prompt and of specialize on it (interleaved)."""
    prompt = torch.cat([task.docs[i] for i in range(3)])[:256].to(device)
    fwd, spec = [], []
    with torch.no_grad():
        model.lm(input_ids=prompt[None])       # warm-up
        model.specialize(prompt)
        for _ in range(repeats):
            t0 = time.perf_counter()
            model.lm(input_ids=prompt[None])
            fwd.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            model.specialize(prompt)
            spec.append(time.perf_counter() - t0)
    f, s = sorted(fwd)[repeats // 2], sorted(spec)[repeats // 2]
    return {"forward_256_s": f, "specialize_256_s": s, "specialize_over_forward": s / f,
            "forward_256_all_s": fwd, "specialize_256_all_s": spec}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--block-size", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--per-topic", type=int, default=80, help="held-out excerpts per topic for the ȳ kNN")
    ap.add_argument("--eval-batches", type=int, default=6, help="batches of 8 rows for the continuation losses")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "hf_smollm2.json"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    res: dict = {"args": vars(args)}
    t0 = time.perf_counter()
    lm, tok = hf.smollm2()
    res["load_s"] = time.perf_counter() - t0
    lm.to(args.device)
    task = hf.BBCTokens(tok, block_size=args.block_size)
    torch.manual_seed(0)
    model = hf.CGTLM(lm, y_layer=8, d_y=64, n_head_y=4, n_templates=8, template_rank=2,
                     sites=("attn_in", "mlp_in"), aux_suffix_len=64).to(args.device)
    res["trainable_params"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    res.update(timing(model, task, args.device))
    print(json.dumps(res, indent=1), flush=True)
    res["knn_init_random_projection"] = ybar_topic_knn(model, task, per_topic=args.per_topic)
    calib, _, _ = task.excerpts(64, per_topic=20, part="train", seed=1)
    t0 = time.perf_counter()
    model.calibrate_pool(calib.to(args.device))
    res["calibrate_s"] = time.perf_counter() - t0
    res["knn_init"] = ybar_topic_knn(model, task, per_topic=args.per_topic)
    res["continuation_init"] = continuation_losses(model, task, k=64, n_batches=args.eval_batches, batch_size=8)
    res["peak_rss_gb_before_training"] = rss_gb()
    print("init", res["knn_init_random_projection"], res["knn_init"], res["continuation_init"], flush=True)
    t0 = time.perf_counter()
    model, history = train(model, task, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                           device=args.device, eval_every=0, warmup=max(1, args.steps // 10))
    res["train_s"] = time.perf_counter() - t0
    res["train_tokens_per_s"] = args.steps * args.batch_size * args.block_size / res["train_s"]
    res["loss_first_last"] = [history.total[:5], history.total[-5:]]
    res["knn_trained"] = ybar_topic_knn(model, task, per_topic=args.per_topic)
    res["continuation_trained"] = continuation_losses(model, task, k=64, n_batches=args.eval_batches, batch_size=8)
    res["evaluate_specialization"] = evaluate_specialization(model, task, k_values=64, n_batches=1, batch_size=8)
    res["peak_rss_gb"] = rss_gb()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1, default=float))
    print(json.dumps(res, indent=1, default=float))
    return res


if __name__ == "__main__":
    main()
