"""How much topic ȳ carries on real text when the x stream is a pretrained LM: ȳ topic kNN of a CGT over a
frozen SmolLM2-135M (`cgt_viz.hf.CGTLM`) on held-out BBC excerpts of several lengths, with the model-free
TF-IDF reference and the mean-pooled states of layer ℓ on the very same excerpts. Writes
results/hf_topic_knn.json.

    python benchmarks/hf_topic_knn.py                         # lengths 32, 64, 128 and the mixture; ~13 min, one thread
    python benchmarks/hf_topic_knn.py --lengths 16 --per-topic 12 --out /tmp   # a quick check

For every length L, one excerpt of L tokens per validation document (a random offset; folds by document
therefore never share a document), kNN k = 10, cosine, 5 stratified folds:

  tfidf                TF-IDF (sublinear tf) over the excerpt's token ids
  mean_ln_x            the mean over positions 1..L−1 of LN(x_ℓ): what a mean read-out of layer ℓ can carry
  ybar_random          ȳ at the excerpt's last token at initialisation (the read-out's random projection)
  ybar_calibrated      the same after `calibrate_pool` on `--calib-per-topic` training excerpts per topic

With --mixture-length L (default 128; 0 skips it) the reference text model's protocol as well: rows of two
L-token excerpts of validation documents of different topics (every validation document once as excerpt A),
ȳ (calibrated) at the end of each excerpt, kNN with folds grouped by document (`common.grouped_knn`), beside
TF-IDF and the mean of LN(x_ℓ) over each excerpt's own tokens; and the mean step ‖ȳ_p − ȳ_p−1‖ in the 16
positions after the boundary over that elsewhere (p ≥ 16), on these rows and on no-switch control rows
(excerpt B of A's topic). For the read-out over the whole prefix ("mean") and for exponential read-outs
(`CGTLM(pool_half_life=h)`, h from --half-lives), each calibrated on the same training excerpts.

No training: this is the read-out's starting point. bench_hf.py measures the same after a short training.
"""
from __future__ import annotations

import time
from pathlib import Path

from common import DEFAULT_RESULTS, environment, grouped_knn, parser, positive_int_list, token_tfidf, write_json

import numpy as np  # noqa: E402
import torch  # noqa: E402


@torch.no_grad()
def pooled_states(model, tokens: torch.Tensor, batch_size: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """(mean over positions ≥ 1 of LN(x_ℓ), ȳ at the last position) for every row of tokens (n, L)."""
    ell = model.config.y_layer
    means, last = [], []
    for rows in tokens.split(batch_size):
        rec = model.lower_cache(rows.to(model.device))
        x = rec[f"x.{ell}"].float()
        x = torch.nn.functional.layer_norm(x, x.shape[-1:])[:, 1:]             # (b, L − 1, d): the sink left out
        means.append(x.mean(1).cpu())
        last.append(rec["ybar"][:, -1].float().cpu())
    return torch.cat(means).numpy(), torch.cat(last).numpy()


SMOOTH_WINDOW = 16


def mixture_rows(tokens: torch.Tensor, topics: torch.Tensor, switch: bool,
                 seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row i = excerpt i, then a random other excerpt of another topic (switch) or of the same topic: -> (n, 2L)
    tokens and the partner's index (n,)."""
    gen = torch.Generator().manual_seed(seed)
    partner = torch.empty(len(topics), dtype=torch.long)
    for i, t in enumerate(topics.tolist()):
        pool = torch.nonzero((topics != t) if switch else (topics == t)).flatten()
        pool = pool[pool != i]
        partner[i] = pool[torch.randint(len(pool), (1,), generator=gen)]
    return torch.cat([tokens, tokens[partner]], dim=1), partner


@torch.no_grad()
def mixture_measures(readouts: dict, tokens: torch.Tensor, topics: torch.Tensor, docs: torch.Tensor,
                     window: int = SMOOTH_WINDOW, batch_size: int = 16) -> dict:
    """The reference text model's kNN and smoothness protocol on two-excerpt rows (see the module docstring),
    for every read-out in readouts {name: CGTLM}: CGTLMs over one LM that differ only in their read-out, so
    the LM runs once per row (on the first) and each read-out's ȳ comes from the same states x_1..x_ℓ."""
    from cgt_viz.evaluate import step_window_means
    n, length = tokens.shape
    first = next(iter(readouts.values()))
    ell = first.config.y_layer
    out: dict = {"length": length, "rows": n, "readouts": {}}
    ends = {name: [] for name in readouts}
    steps = {(name, switch): [] for name in readouts for switch in (True, False)}
    labels = groups = means = None
    for switch in (True, False):
        rows, partner = mixture_rows(tokens, topics, switch, seed=7)
        row_means = []
        for chunk in rows.split(batch_size):
            rec = first.lower_cache(chunk.to(first.device))
            xs = [rec[f"x.{n_}"] for n_ in range(1, ell + 1)]
            for name, model in readouts.items():
                ybar = (rec["ybar"] if model is first else model.ybar_from_states(xs)).float().cpu()   # (b, 2L, e)
                steps[name, switch].append((ybar[:, 1:] - ybar[:, :-1]).norm(dim=-1))              # (b, 2L − 1)
                if switch:
                    ends[name].append(torch.stack([ybar[:, length - 1], ybar[:, -1]], 1))         # (b, 2, e)
            if switch:
                x = torch.nn.functional.layer_norm(xs[-1].float(), xs[-1].shape[-1:]).cpu()
                row_means.append(torch.stack([x[:, 1:length].mean(1), x[:, length:].mean(1)], 1))
        if switch:
            labels = torch.stack([topics, topics[partner]], 1).numpy()                              # (n, 2)
            groups = torch.stack([docs, docs[partner]], 1).numpy()
            means = torch.cat(row_means).numpy()
            tfidf = token_tfidf(torch.cat([rows[:, :length], rows[:, length:]]))   # (2n, vocab): one vocabulary
            tfidf = tfidf.reshape(2, n, -1).transpose(1, 0, 2)                     # (n, 2, vocab)

    def knn(prefix: str, f: np.ndarray) -> dict:
        return {prefix: grouped_knn(f.reshape(2 * n, -1), labels.reshape(-1), groups.reshape(-1)),
                f"{prefix}_first": grouped_knn(f[:, 0], labels[:, 0], groups[:, 0]),
                f"{prefix}_second": grouped_knn(f[:, 1], labels[:, 1], groups[:, 1])}

    out.update(knn("knn_tfidf", tfidf))
    out.update(knn("knn_mean_ln_x", means))
    for name in readouts:
        r = knn("knn_ybar", torch.cat(ends[name]).numpy())
        for switch, key in ((True, "smooth_ratio"), (False, "smooth_ratio_no_switch")):
            after, elsewhere = step_window_means(torch.cat(steps[name, switch]).mean(0).numpy(), length, window)
            r[key] = after / elsewhere
        out["readouts"][name] = r
    out["smooth_window"] = window
    return out


def main(argv=None) -> dict:
    p = parser(__doc__)
    p.add_argument("--lengths", default="32,64,128", help="excerpt lengths in tokens, comma-separated")
    p.add_argument("--per-topic", type=int, default=80, help="validation excerpts per topic (one per document)")
    p.add_argument("--calib-per-topic", type=int, default=20, help="training excerpts per topic for calibrate_pool")
    p.add_argument("--calib-length", type=int, default=64)
    p.add_argument("--y-layer", type=int, default=8)
    p.add_argument("--d-y", type=int, default=64)
    p.add_argument("--mixture-length", type=int, default=128,
                   help="tokens per excerpt of the two-excerpt protocol (0: skip it)")
    p.add_argument("--half-lives", default="32",
                   help="pool_half_life read-outs the two-excerpt protocol compares with the mean, comma-separated")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(DEFAULT_RESULTS), help="folder for hf_topic_knn.json")
    args = p.parse_args(argv)
    lengths = positive_int_list("lengths", args.lengths)
    half_lives = positive_int_list("--half-lives", args.half_lives) if args.half_lives.strip() else []
    if args.mixture_length < 0 or 0 < args.mixture_length <= SMOOTH_WINDOW:
        raise ValueError(f"--mixture-length must be 0 (skip the two-excerpt protocol) or more than the "
                         f"{SMOOTH_WINDOW}-position smoothness window, got {args.mixture_length}")
    torch.set_num_threads(args.threads)
    from cgt_viz import hf
    from cgt_viz.evaluate import knn_topic_accuracy

    t0 = time.perf_counter()
    lm, tok = hf.smollm2()
    task = hf.BBCTokens(tok, block_size=max(lengths + [args.calib_length, args.mixture_length]))
    torch.manual_seed(0)
    model = hf.CGTLM(lm, y_layer=args.y_layer, d_y=args.d_y, n_head_y=4, n_templates=8, template_rank=2,
                     sites=("attn_in", "mlp_in"))
    res: dict = {"args": vars(args), "environment": environment(torch.device("cpu")),
                 "setup_s": time.perf_counter() - t0, "by_length": []}
    random_pool = model.pool.weight.detach().clone(), model.pool_center.detach().clone()
    calib, _, _ = task.excerpts(args.calib_length, per_topic=args.calib_per_topic, part="train", seed=1)
    for length in lengths:
        t0 = time.perf_counter()
        tokens, topics, _ = task.excerpts(length, per_topic=args.per_topic, part="val", seed=0)
        with torch.no_grad():
            model.pool.weight.copy_(random_pool[0])
            model.pool_center.copy_(random_pool[1])
        mean_x, ybar_random = pooled_states(model, tokens)
        model.calibrate_pool(calib)
        _, ybar_cal = pooled_states(model, tokens)
        row = {"length": length, "n": len(topics), "chance": float(np.bincount(topics.numpy()).max() / len(topics))}
        for name, feats in (("tfidf", token_tfidf(tokens)), ("mean_ln_x", mean_x),
                            ("ybar_random", ybar_random), ("ybar_calibrated", ybar_cal)):
            row[name] = knn_topic_accuracy(feats, topics.numpy(), n_neighbors=10)
        row["seconds"] = time.perf_counter() - t0
        res["by_length"].append(row)
        print(row, flush=True)
    if args.mixture_length:
        t0 = time.perf_counter()
        readouts = {"mean": model}
        for half in half_lives:
            torch.manual_seed(0)
            readouts[f"half_life_{half:g}"] = hf.CGTLM(lm, y_layer=args.y_layer, d_y=args.d_y, n_head_y=4, n_templates=8,
                                                       template_rank=2, sites=("attn_in", "mlp_in"),
                                                       pool_half_life=half).calibrate_pool(calib)
        tokens, topics, docs = task.excerpts(args.mixture_length, per_topic=args.per_topic, part="val", seed=2)
        res["mixture"] = {**mixture_measures(readouts, tokens, topics, docs), "seconds": time.perf_counter() - t0}
        print(res["mixture"], flush=True)
    write_json(Path(args.out) / "hf_topic_knn.json", res)
    return res


if __name__ == "__main__":
    main()
