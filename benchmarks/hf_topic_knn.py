"""How much topic ȳ carries on real text when the x stream is a pretrained LM: ȳ topic kNN of a CGT over a
frozen SmolLM2-135M (`cgt_viz.hf.CGTLM`) on held-out BBC excerpts of several lengths, with the model-free
TF-IDF reference and the mean-pooled states of layer ℓ on the very same excerpts. Writes
results/hf_topic_knn.json.

    python benchmarks/hf_topic_knn.py                         # lengths 32, 64, 128; ~5 min on one CPU thread
    python benchmarks/hf_topic_knn.py --lengths 16 --per-topic 12 --out /tmp   # a quick check

For every length L, one excerpt of L tokens per validation document (a random offset; folds by document
therefore never share a document), kNN k = 10, cosine, 5 stratified folds:

  tfidf                TF-IDF (sublinear tf) over the excerpt's token ids
  mean_ln_x            the mean over positions 1..L−1 of LN(x_ℓ): what a mean read-out of layer ℓ can carry
  ybar_random          ȳ at the excerpt's last token at initialisation (the read-out's random projection)
  ybar_calibrated      the same after `calibrate_pool` on `--calib-per-topic` training excerpts per topic

No training: this is the read-out's starting point. bench_hf.py measures the same after a short training.
"""
from __future__ import annotations

import time
from pathlib import Path

from common import DEFAULT_RESULTS, environment, parser, positive_int_list, token_tfidf, write_json

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


def main(argv=None) -> dict:
    p = parser(__doc__)
    p.add_argument("--lengths", default="32,64,128", help="excerpt lengths in tokens, comma-separated")
    p.add_argument("--per-topic", type=int, default=80, help="validation excerpts per topic (one per document)")
    p.add_argument("--calib-per-topic", type=int, default=20, help="training excerpts per topic for calibrate_pool")
    p.add_argument("--calib-length", type=int, default=64)
    p.add_argument("--y-layer", type=int, default=8)
    p.add_argument("--d-y", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(DEFAULT_RESULTS), help="folder for hf_topic_knn.json")
    args = p.parse_args(argv)
    lengths = positive_int_list("lengths", args.lengths)
    torch.set_num_threads(args.threads)
    from cgt_viz import hf
    from cgt_viz.evaluate import knn_topic_accuracy

    t0 = time.perf_counter()
    lm, tok = hf.smollm2()
    task = hf.BBCTokens(tok, block_size=max(lengths + [args.calib_length]))
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
    write_json(Path(args.out) / "hf_topic_knn.json", res)
    return res


if __name__ == "__main__":
    main()
