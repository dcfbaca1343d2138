"""How well can any summary of a text-mixture excerpt name its topic? Model-free references for ȳ's kNN score.

    python benchmarks/text_topic_reference.py                       # block sizes 128, 512, 1024 (~30 s)

For each block size, the excerpts at the same places `collect_excerpt_ends` reads ȳ (both excerpts of every
validation row) are described by features that need no training: the byte histogram, and TF-IDF word
vectors. Their cross-validated kNN accuracy (the same `knn_topic_accuracy` as ȳ's, cosine, 5 neighbours)
and a TF-IDF logistic regression say how much topic information an excerpt of that length carries at all,
so a ȳ score can be read against them rather than against chance alone. Writes results/text_topic_reference.json.
"""
from __future__ import annotations

import time

import numpy as np
import torch

import common
from cgt_viz.evaluate import knn_topic_accuracy
from cgt_viz.tasks import make_task


def excerpts(block_size: int, n_batches: int, batch_size: int, seed: int) -> tuple[list[bytes], np.ndarray]:
    """Both excerpts of each validation row, drawn with the seed stream collect_excerpt_ends uses."""
    task = make_task("text", block_size=block_size, tokenizer="bytes")   # this reference counts bytes
    gen = torch.Generator().manual_seed(seed)
    texts, labels = [], []
    for _ in range(n_batches):
        batch = task.get_batch(batch_size, part="val", generator=gen)
        for i in range(batch_size):
            cut, row = int(batch.info["boundary"][i]), batch.inputs[i].tolist()
            texts += [bytes(row[:cut]), bytes(row[cut:])]
            labels += [int(batch.info["topic_a"][i]), int(batch.info["topic_b"][i])]
    return texts, np.array(labels)


def references(texts: list[bytes], labels: np.ndarray, seed: int) -> dict[str, float]:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score

    hist = np.stack([np.bincount(np.frombuffer(t, dtype=np.uint8), minlength=256) for t in texts]).astype(float)
    words = TfidfVectorizer().fit_transform([t.decode("utf-8", "replace") for t in texts])
    folds = StratifiedKFold(5, shuffle=True, random_state=seed)
    return {"chance": float(np.bincount(labels).max() / len(labels)),
            "byte_histogram_knn": knn_topic_accuracy(hist, labels, seed=seed),
            "tfidf_knn": knn_topic_accuracy(words.toarray(), labels, seed=seed),
            "tfidf_logistic": float(cross_val_score(LogisticRegression(max_iter=2000), words, labels, cv=folds).mean()),
            "mean_excerpt_bytes": float(np.mean([len(t) for t in texts]))}


def main(argv: list[str] | None = None) -> dict:
    p = common.parser(__doc__)
    p.add_argument("--block-sizes", default="128,512,1024")
    p.add_argument("--n-batches", type=int, default=8, help="as tasks_results.py's kNN (8 batches of 32 rows)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=4000, help="the stream tasks_results.py uses for seed 0")
    p.add_argument("--out", default=str(common.DEFAULT_RESULTS))
    args = p.parse_args(argv)
    started = time.time()
    rows = []
    for block_size in (int(b) for b in args.block_sizes.split(",")):
        texts, labels = excerpts(block_size, args.n_batches, args.batch_size, args.seed)
        rows.append({"block_size": block_size, "n_excerpts": len(texts), **references(texts, labels, args.seed)})
        print({k: round(v, 3) if isinstance(v, float) else v for k, v in rows[-1].items()}, flush=True)
    res = {"rows": rows, "environment": common.environment(torch.device("cpu")), "wall_seconds": time.time() - started}
    common.write_json(common.Path(args.out) / "text_topic_reference.json", res)
    return res


if __name__ == "__main__":
    main()
