"""Measurements for a CGTLM on BBCTokens: what ȳ knows about topics, what a compiled prompt buys."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .._checks import check_int


@torch.no_grad()
def excerpt_summaries(model, task, length: int = 64, per_topic: int | None = 80, part: str | None = "val",
                      batch_size: int = 32, seed: int = 0):
    """ȳ after the last token of one excerpt per document -> features (n, e) numpy, topics (n,), doc ids (n,)."""
    check_int("batch_size", batch_size, 1)
    tokens, topics, docs = task.excerpts(length, per_topic=per_topic, part=part, seed=seed)
    was = model.training
    model.eval()
    try:
        feats = torch.cat([model.context(tokens[i:i + batch_size].to(model.device))[:, -1].float().cpu()
                           for i in range(0, len(tokens), batch_size)])
    finally:
        model.train(was)
    return feats.numpy(), topics.numpy(), docs.numpy()


def ybar_topic_knn(model, task, length: int = 64, per_topic: int | None = 80, part: str | None = "val",
                   n_neighbors: int = 10, seed: int = 0) -> float:
    """kNN topic accuracy (cosine, 5 folds; one excerpt per document, so folds never share a document)."""
    from ..evaluate import knn_topic_accuracy
    feats, topics, _ = excerpt_summaries(model, task, length, per_topic, part, seed=seed)
    return knn_topic_accuracy(feats, topics, n_neighbors=n_neighbors, seed=seed)


@torch.no_grad()
def continuation_losses(model, task, k: int = 64, n_batches: int = 4, batch_size: int = 8,
                        seed: int = 0) -> dict[str, Any]:
    """Mean cross-entropy on the block_size − k tokens after a k-token prompt of the same document:

    prompted     the CGTLM with the prompt in context
    compiled     ȳ after the prompt frozen into the weights, continuation alone (= specialize(prompt))
    control      the same, but ȳ from another row's prompt (a different document)
    no_context   the LM alone on the continuation

    and gap_closed = (no_context − compiled) / (no_context − prompted), gap_closed_control likewise."""
    check_int("n_batches", n_batches, 1)
    check_int("batch_size", batch_size, 2, hint=" (the control borrows another row's prompt)")
    gen = torch.Generator().manual_seed(seed)
    sums = dict.fromkeys(("prompted", "compiled", "control", "no_context"), 0.0)
    count, no_context = 0, model.x_only()
    was = model.training
    model.eval()
    try:
        for _ in range(n_batches):
            b = task.eval_batch(k, batch_size, generator=gen, device=model.device)
            query, tgt = b.inputs[:, k:], b.targets[:, k:]
            ybar = model.context(b.inputs[:, :k])[:, -1]                       # (b, e)
            outs = {"prompted": model(b.inputs)[:, k:], "compiled": model.forward_specialized(query, ybar),
                    "control": model.forward_specialized(query, ybar.roll(1, 0)), "no_context": no_context(query)}
            for name, logits in outs.items():
                sums[name] += float(F.cross_entropy(logits.flatten(0, 1).float(), tgt.flatten(), reduction="sum"))
            count += tgt.numel()
    finally:
        model.train(was)
    res: dict[str, Any] = {f"loss_{m}": v / count for m, v in sums.items()}
    denom = res["loss_no_context"] - res["loss_prompted"]
    for name in ("compiled", "control"):
        res[f"gap_closed{'' if name == 'compiled' else '_control'}"] = (
            (res["loss_no_context"] - res[f"loss_{name}"]) / denom if denom > 1e-8 else float("nan"))
    res["n_scored"] = count
    return res
