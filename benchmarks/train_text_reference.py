"""Train the reference text CGT on BBC News (5 topics) and measure it on held-out documents.

    python benchmarks/train_text_reference.py                      # train, save data/models/text-bbc5/, measure
    python benchmarks/train_text_reference.py --measure-only       # measure the saved model again
    python benchmarks/train_text_reference.py --steps 200 --out /tmp/pilot   # a short pilot

Training uses one CPU thread by default (--threads) or the GPU when one is present (device "auto"). The
model is written with `save_pretrained` (model.safetensors + config.json; the config records the task and
its tokenizer, so `task_from_config(CGT.from_pretrained(out).config)` rebuilds both exactly), and the
measured numbers go to metrics.json beside it. What is measured (all on validation documents):

  knn_*         ȳ at the last token of each excerpt, topic kNN (k = 10, cosine), 5 folds grouped by
                document (an excerpt is never classified by another excerpt of its own document); beside it
                TF-IDF over the same excerpts' tokens, the same kNN and folds; knn_ybar_first / _second
                the first excerpts' ends alone (a one-topic prefix) and the second's (the prefix holds both);
                knn_mean_ln_x<ν> the mean of LN(x_ν) over each excerpt's own tokens, every layer ν;
                knn_ybar_ema_part / _stream_part the read-out's exponential mean and gated y stream alone
  readout_*     the learned gate and half-lives of the "ema" read-out
  frozen_*      text_position_curves (boundary = block/2, ȳ frozen at split = boundary/2): mean loss of the
                specialised model and of no context on positions split..boundary−1 (same topic) and
                boundary..t−1 (after the switch), per evaluation draw; mean and 95 % interval over draws
  smooth_*      mean ‖ȳ_t − ȳ_{t−1}‖ in the `--window` positions after the boundary over that mean elsewhere;
                *_no_switch the same on control rows whose excerpt B has excerpt A's topic
  ablation_*    template_ablation on mixture rows for every site: the largest Δ main loss (nats)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cgt_viz import CGT, CGTConfig, train  # noqa: E402
from cgt_viz.analysis import template_ablation  # noqa: E402
from cgt_viz.evaluate import mean_ci, text_position_curves, text_step_profile  # noqa: E402
from cgt_viz.io import write_json  # noqa: E402
from cgt_viz.tasks import make_task, task_from_config  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from common import grouped_knn, token_tfidf  # noqa: E402

MODEL = dict(n_layer=4, d_x=128, n_head=4, d_y=32, n_head_y=2, y_layer=2, n_templates=8, template_rank=2,
             sites=("attn_in", "mlp_in"), y_readout="ema", aux_min_prefix=32, aux_min_suffix=32, aux_suffix_len=64)


@torch.no_grad()
def excerpt_ends(model, task, n_batches: int, batch_size: int, seed: int):
    """ȳ at the last token of both excerpts of validation rows, their labels, documents and token lists."""
    gen = torch.Generator().manual_seed(seed)
    feats, labels, docs, toks = [], [], [], []
    model.eval()
    for _ in range(n_batches):
        b = task.get_batch(batch_size, part="val", generator=gen)
        ybar = model.context(b.inputs.to(model.device)).cpu()
        cut = b.info["boundary"]
        rows = torch.arange(batch_size)
        feats += [ybar[rows, cut - 1], ybar[:, -1]]
        labels += [b.info["topic_a"], b.info["topic_b"]]
        docs += [b.info["doc_a"], b.info["doc_b"]]
        for i in range(batch_size):
            toks.append(b.inputs[i, :int(cut[i])].tolist())
        for i in range(batch_size):
            toks.append(b.inputs[i, int(cut[i]):].tolist())
    return (torch.cat(feats).float().numpy(), torch.cat(labels).numpy(), torch.cat(docs).numpy(), toks)


@torch.no_grad()
def mean_state_knn(model, task, n_batches: int = 8, batch_size: int = 32, seed: int = 1000) -> dict:
    """Diagnostics for ȳ near chance: kNN (same rows, folds, k) of the mean over each excerpt's own tokens of
    LN(x_ν) for every layer ν (what a mean read-out of that layer could carry) and of the token embeddings."""
    gen = torch.Generator().manual_seed(seed)
    layers = range(model.config.n_layer + 1)
    means = {"embed": [], **{n: [] for n in layers}}
    labels, docs = [], []
    for _ in range(n_batches):
        b = task.get_batch(batch_size, part="val", generator=gen)
        _, rec = model.run_with_cache(b.inputs.to(model.device))
        feats = {n: torch.nn.functional.layer_norm(rec[f"x.{n}"], (model.config.d_x,)).cpu() for n in layers}
        feats["embed"] = model.gpt.embed(b.inputs.to(model.device)).cpu()
        cut = b.info["boundary"]
        for key, feat in feats.items():
            means[key] += [torch.stack([feat[i, :int(c)].mean(0) for i, c in enumerate(cut)]),
                           torch.stack([feat[i, int(c):].mean(0) for i, c in enumerate(cut)])]
        labels += [b.info["topic_a"], b.info["topic_b"]]
        docs += [b.info["doc_a"], b.info["doc_b"]]
    labels, docs = torch.cat(labels).numpy(), torch.cat(docs).numpy()
    return {("knn_mean_embedding" if key == "embed" else f"knn_mean_ln_x{key}"):
            grouped_knn(torch.cat(m).numpy(), labels, docs) for key, m in means.items()}


@torch.no_grad()
def readout_parts(model, task, n_batches: int = 8, batch_size: int = 32, seed: int = 1000) -> dict:
    """For y_readout="ema": the learned half-lives and gate, and the kNN (same excerpt ends, folds, k) of the
    read-out's two parts alone: the exponential mean of P·LN(x_ℓ), and the gated y stream g·y_ℓ."""
    ema = model.y_ema
    if ema is None:
        return {}
    gen = torch.Generator().manual_seed(seed)
    parts, labels, docs = {"ema": [], "stream": []}, [], []
    for _ in range(n_batches):
        b = task.get_batch(batch_size, part="val", generator=gen)
        ell = model.config.y_layer
        _, rec = model.run_with_cache(b.inputs.to(model.device), names=[f"x.{ell}", f"y.{ell}"])
        y = ema(rec[f"x.{ell}"], rec[f"y.{ell}"])                             # the read-out: g·y_ℓ + EMA(P·LN(x_ℓ))
        stream = ema.gate * rec[f"y.{ell}"]                                    # (b, t, e)
        cut, rows = b.info["boundary"], torch.arange(batch_size)
        for key, t in (("ema", y - stream), ("stream", stream)):
            parts[key] += [t[rows, cut - 1].cpu(), t[:, -1].cpu()]
        labels += [b.info["topic_a"], b.info["topic_b"]]
        docs += [b.info["doc_a"], b.info["doc_b"]]
    labels, docs = torch.cat(labels).numpy(), torch.cat(docs).numpy()
    half = (-1.0 / torch.log2(torch.sigmoid(ema.theta))).cpu()
    return {"readout_gate": float(ema.gate), "readout_half_lives": sorted(float(h) for h in half),
            **{f"knn_ybar_{key}_part": grouped_knn(torch.cat(v).float().numpy(), labels, docs)
               for key, v in parts.items()}}


def knn_scores(model, task, n_batches: int = 8, batch_size: int = 32, seed: int = 1000, tfidf: bool = True) -> dict:
    feats, labels, docs, toks = excerpt_ends(model, task, n_batches, batch_size, seed)
    first = np.concatenate([np.arange(i * 2 * batch_size, (i * 2 + 1) * batch_size) for i in range(n_batches)])
    second = first + batch_size
    out = {"knn_ybar": grouped_knn(feats, labels, docs), "knn_n": int(len(labels)),
           "knn_ybar_first": grouped_knn(feats[first], labels[first], docs[first]),
           "knn_ybar_second": grouped_knn(feats[second], labels[second], docs[second]),
           "knn_chance": float(np.bincount(labels).max() / len(labels)),
           "knn_mean_excerpt_tokens": float(np.mean([len(t) for t in toks]))}
    if tfidf:
        out["knn_tfidf"] = grouped_knn(token_tfidf(toks), labels, docs)
    return out


def smoothness_ratio(model, task, boundary: int, window: int, seed: int = 2000) -> dict:
    p = text_step_profile(model, task, boundary=boundary, window=window, n_batches=4, batch_size=32, seed=seed)
    return {"smooth_after_boundary": p["step_after"], "smooth_elsewhere": p["step_elsewhere"],
            "smooth_ratio": p["ratio"], "smooth_ratio_no_switch": p["ratio_no_switch"],
            "smooth_after_boundary_no_switch": p["step_after_no_switch"],
            "smooth_window": window, "smooth_boundary": boundary}


def frozen_curves(model, task, draws: int = 3, n_batches: int = 2, batch_size: int = 32) -> dict:
    t = task.block_size
    boundary, split = t // 2, t // 4
    per = {k: [] for k in ("spec_before", "none_before", "prompted_before", "spec_after", "none_after",
                           "prompted_after")}
    for d in range(draws):
        c = text_position_curves(model, task, split=split, boundary=boundary, n_batches=n_batches,
                                 batch_size=batch_size, seed=3000 + d)
        before = c["positions"] < boundary
        for side, mask in (("before", before), ("after", ~before)):
            per[f"spec_{side}"].append(float(c["loss_specialized"][mask].mean()))
            per[f"none_{side}"].append(float(c["loss_no_context"][mask].mean()))
            per[f"prompted_{side}"].append(float(c["loss_prompted"][mask].mean()))
    out = {"frozen_split": split, "frozen_boundary": boundary, "frozen_draws": draws,
           "frozen_rows_per_draw": n_batches * batch_size}
    for k, v in per.items():
        m, h = mean_ci(v)
        out[f"frozen_{k}"], out[f"frozen_{k}_ci95"], out[f"frozen_{k}_draws"] = m, h, v
    for side in ("before", "after"):
        diffs = [s - n for s, n in zip(per[f"spec_{side}"], per[f"none_{side}"])]
        m, h = mean_ci(diffs)
        out[f"frozen_spec_minus_none_{side}"], out[f"frozen_spec_minus_none_{side}_ci95"] = m, h
    return out


def ablation(model, task, n_rows: int = 16, seed: int = 4000) -> dict:
    b = task.get_batch(n_rows, part="val", generator=torch.Generator().manual_seed(seed))
    best = {"ablation_max_delta": -1.0}
    per_site = {}
    for layer, site in model.template_sites:
        r = template_ablation(model, b.inputs, b.targets, (layer, site))
        k = int(np.argmax(r["delta"]))
        per_site[f"{layer}.{site}"] = [float(x) for x in r["delta"]]
        if r["delta"][k] > best["ablation_max_delta"]:
            best = {"ablation_max_delta": float(r["delta"][k]), "ablation_site": f"{layer}.{site}",
                    "ablation_template": k, "ablation_base_loss": float(r["base"])}
    return {**best, "ablation_rows": n_rows, "ablation_per_site": per_site}


COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def pca_svg(features: np.ndarray, labels: np.ndarray, names: list[str], path: Path, title: str) -> None:
    """A self-contained SVG scatter of the first two principal components, one colour per topic."""
    X = features - features.mean(0)
    X = X / np.linalg.norm(X, axis=1, keepdims=True).clip(1e-9)          # cosine geometry, as the kNN
    _, _, vt = np.linalg.svd(X - X.mean(0), full_matrices=False)
    xy = (X - X.mean(0)) @ vt[:2].T
    w, h, m = 520, 420, 30
    lo, hi = xy.min(0), xy.max(0)
    px = m + (xy[:, 0] - lo[0]) / (hi[0] - lo[0] + 1e-12) * (w - 2 * m - 120)
    py = h - m - (xy[:, 1] - lo[1]) / (hi[1] - lo[1] + 1e-12) * (h - 2 * m - 20)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>', f'<text x="{m}" y="20" font-size="13">{title}</text>']
    for x, y, lab in zip(px, py, labels):
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.6" fill="{COLORS[int(lab) % 8]}" fill-opacity="0.7"/>')
    for i, name in enumerate(names):
        out.append(f'<circle cx="{w - 130}" cy="{50 + 18 * i}" r="5" fill="{COLORS[i % 8]}"/>'
                   f'<text x="{w - 120}" y="{54 + 18 * i}">{name}</text>')
    out.append(f'<text x="{m}" y="{h - 8}" fill="#555">PC 1 / PC 2 of ȳ at the last token of each excerpt '
               f'(validation documents)</text></svg>')
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out) + "\n")


def measure(model, task, window: int = 16) -> dict:
    started = time.time()
    out = {}
    out.update(knn_scores(model, task))
    out.update(mean_state_knn(model, task))
    out.update(readout_parts(model, task))
    out.update(frozen_curves(model, task))
    out.update(smoothness_ratio(model, task, boundary=task.block_size // 2, window=window))
    out.update(ablation(model, task))
    out["measure_seconds"] = time.time() - started
    return out


def bytes_per_token(task, n: int = 200) -> float:
    docs = [int(i) for i in torch.nonzero(task.doc_is_val).flatten()[:n]]
    toks = sum(int(task.doc_len[d]) for d in docs)
    nbytes = sum(len(task.text(task.data[int(task.doc_start[d]):int(task.doc_start[d] + task.doc_len[d])]).encode())
                 for d in docs)
    return nbytes / toks


def hist_device(device: str) -> torch.device:
    from cgt_viz.train import resolve_device
    return resolve_device(device)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(ROOT / "data" / "models" / "text-bbc5"))
    p.add_argument("--tokenizer", default="bpe", choices=["bpe", "gpt2", "bytes"])
    p.add_argument("--bpe-vocab", type=int, default=4096)
    p.add_argument("--block-size", type=int, default=256)
    p.add_argument("--steps", type=int, default=320)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--w-aux", type=float, default=1.0)
    p.add_argument("--y-readout", default="ema", choices=["ema", "stream"])
    p.add_argument("--d-y", type=int, default=MODEL["d_y"])
    p.add_argument("--y-reads", default="post", choices=["post", "pre"],
                   help="the y blocks read x after (post) or before (pre) the x block of their layer")
    p.add_argument("--w-smooth", type=float, default=0.0, help="weight of the smoothness term (0: none)")
    p.add_argument("--smooth", default="l2", choices=["l2", "relative"], help="the smoothness term's form")
    p.add_argument("--aux-suffix-len", type=int, default=MODEL["aux_suffix_len"],
                   help="suffix tokens the aux pass scores (0: the whole suffix)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="auto")
    p.add_argument("--knn-every", type=int, default=0, help="ȳ kNN every so many steps (0: steps // 8)")
    p.add_argument("--measure-only", action="store_true")
    p.add_argument("--figure", default="", help="also write the PCA picture of ȳ at excerpt ends (an .svg path)")
    p.add_argument("--no-measure", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    if args.measure_only:
        model = CGT.from_pretrained(out)
        task = task_from_config(model.config)
        if args.figure:
            feats, labels, _, _ = excerpt_ends(model, task, 8, 32, 1000)
            pca_svg(feats, labels, task.topics, Path(args.figure), f"reference text CGT ({out.name}): ȳ by topic")
        res = {**json.loads((out / "metrics.json").read_text()), **measure(model, task)}
        write_json(out / "metrics.json", res)
        print(json.dumps({k: v for k, v in res.items() if not isinstance(v, (list, dict))}, indent=1))
        return res

    t0 = time.time()
    task = make_task("text", tokenizer=args.tokenizer, bpe_vocab=args.bpe_vocab, block_size=args.block_size)
    torch.manual_seed(args.seed)
    cfg = CGTConfig(**task.config_kwargs(), **{**MODEL, "y_readout": args.y_readout, "d_y": args.d_y, "y_reads": args.y_reads,
                                                 "w_aux": args.w_aux, "w_smooth": args.w_smooth, "smooth": args.smooth,
                                                 "aux_suffix_len": args.aux_suffix_len or None})
    model = CGT(cfg)
    knn_every = args.knn_every or max(1, args.steps // 4)
    along = []

    def eval_fn(m, step):
        if step % knn_every and step != args.steps:
            return {}
        r = knn_scores(m, task, n_batches=4, tfidf=False)
        along.append({"step": step, "knn_ybar": r["knn_ybar"]})
        return {"knn_ybar": r["knn_ybar"]}

    def log(ev):
        if ev["kind"] == "eval" or (ev["kind"] == "step" and ev["step"] % 50 == 0):
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in ev.items()}), flush=True)

    started = time.time()
    model, hist = train(model, task, steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                        device=args.device, eval_every=knn_every, eval_fn=eval_fn, callbacks=[log],
                        progress=False)
    train_seconds = time.time() - started
    model = model.cpu().eval()
    model.save_pretrained(out)
    res = {"command": "python benchmarks/train_text_reference.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "tokenizer": task.tokenizer.name, "vocab_size": task.tokenizer.vocab_size,
           "bytes_per_token": bytes_per_token(task), "block_size": task.block_size, "steps": args.steps,
           "steps_done": len(hist), "interrupted": bool(hist.interrupted),
           "batch_size": args.batch_size, "lr": args.lr, "w_aux": args.w_aux, "y_readout": args.y_readout,
           "y_reads": args.y_reads,
           "w_smooth": args.w_smooth, "smooth": args.smooth, "aux_suffix_len": cfg.aux_suffix_len,
           "seed": args.seed, "threads": args.threads, "device": str(hist_device(args.device)),
           "train_seconds": train_seconds, "setup_seconds": started - t0,
           "n_params": sum(p.numel() for p in model.parameters()),
           "weights_bytes": (out / "model.safetensors").stat().st_size,
           "config_bytes": (out / "config.json").stat().st_size,
           "knn_along_training": along, "final_train_main_last50": float(np.mean(hist.main[-50:])),
           "evals": hist.evals, "torch": torch.__version__}
    write_json(out / "metrics.json", res)
    if not args.no_measure:
        res.update(measure(model, task))
        write_json(out / "metrics.json", res)
    print(json.dumps({k: v for k, v in res.items() if not isinstance(v, (list, dict))}, indent=1), flush=True)
    return res


if __name__ == "__main__":
    main()
