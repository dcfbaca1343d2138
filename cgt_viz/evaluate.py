"""Does a prompt compiled into the weights do what the prompt did? Measurements, no plotting.

Arrays (or models) in, plain dicts / lists of row dicts out (`pandas.DataFrame(rows)` shows them as a table).

The central comparison (`evaluate_specialization`), on the same held-out query tokens after a prompt of
k demonstrations (`task.eval_batch(k, ...)`, whose `split` is the prompt length and whose loss_mask marks
the held-out queries):

    prompted      the full CGT with the prompt in context
    specialized   ȳ taken at the last prompt token, the x-only model with T(ȳ) frozen, run on the
                  queries alone (prompt dropped)
    no_context    `model.x_only()` (T = I) on the queries alone
    baseline      a plain GPT with the prompt in context (optional)

    gap closed  G = (L_no_context − L_specialized) / (L_no_context − L_prompted)

G = 1: the compiled model is as good as the prompted one; G = 0: compiling bought nothing. G can exceed
1 when the specialised model beats the prompted one (the auxiliary loss trains it directly on queries).
For SyntheticICL the held-out queries are values u that never occur in the prompt, so copying cannot help.
"""
from __future__ import annotations

import contextlib
import math
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .model import CGT, GPT, per_position_loss
from .sequences import eval_mode


MODES = ("prompted", "specialized", "no_context", "baseline")


# ---------------------------------------------------------------------------- small helpers
def gap_closed(loss_no_context: float, loss_specialized: float, loss_prompted: float, eps: float = 1e-8) -> float:
    """G = (L_nc − L_spec) / (L_nc − L_prompt); NaN when the prompt does not help (denominator ≤ eps)."""
    denom = loss_no_context - loss_prompted
    if not math.isfinite(denom) or denom <= eps:
        return float("nan")
    return float((loss_no_context - loss_specialized) / denom)


def _device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _per_position(cfg, out: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-position loss (b, t) and, in tokens mode, per-position correctness (b, t) bool."""
    loss = per_position_loss(cfg.mode, out, targets)[0]
    return loss, (out.argmax(-1) == targets) if cfg.mode == "tokens" else None


def _check_k_values(k_values: Any) -> tuple[int, ...]:
    if isinstance(k_values, int):
        k_values = (k_values,)
    try:
        ks = tuple(k_values)
    except TypeError:
        raise TypeError(f"k_values must be an int or a sequence of ints, got {type(k_values).__name__}") from None
    if not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks):
        raise ValueError(f"k_values must be a non-empty sequence of ints >= 1, got {k_values!r}")
    return ks


def _check_positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


# ---------------------------------------------------------------------------- the comparison
@torch.no_grad()
def evaluate_specialization(model: CGT, task, k_values: Sequence[int] | int = (4, 8, 16), n_batches: int = 4,
                            batch_size: int = 64, baseline: GPT | None = None, seed: int = 0,
                            check_merged: bool = True) -> list[dict[str, Any]]:
    """Prompted vs specialised vs no-context (vs baseline GPT) on held-out queries after k demonstrations.

    model      a CGT; task: any task with `eval_batch(k, batch_size, generator, device)` (all built-in tasks)
    k_values   prompt sizes (demonstrations for icl/regression, prompt tokens for text)
    baseline   optional plain GPT trained on the same task; it sees the prompt in context
    check_merged  compare `forward_specialized` once against the merged `specialize` GPT (float tolerance)

    Returns one row per k: k, n_scored, loss_<mode> and acc_<mode> for mode in MODES (acc is NaN for
    vectors tasks, baseline columns NaN without a baseline), gap_closed, gap_closed_acc (the same ratio
    on accuracy), and spec_merge_max_diff (max |logit difference| of the merged check, NaN if skipped).
    """
    if not isinstance(model, CGT):
        raise TypeError(f"model must be a CGT, got {type(model).__name__}")
    if baseline is not None and not isinstance(baseline, GPT):
        raise TypeError(f"baseline must be a GPT or None, got {type(baseline).__name__}")
    ks = _check_k_values(k_values)
    _check_positive("n_batches", n_batches)
    _check_positive("batch_size", batch_size)
    if not hasattr(task, "eval_batch"):
        raise TypeError(f"task must provide eval_batch(k, batch_size, generator, device); {type(task).__name__} does not")
    cfg, device = model.config, _device_of(model)
    x_only = model.x_only().eval()
    rows, merge_diff = [], float("nan")
    with eval_mode(model), (eval_mode(baseline) if baseline is not None else contextlib.nullcontext()):
        for k in ks:
            gen = torch.Generator().manual_seed(seed * 100_003 + k)
            sums = {m: [0.0, 0.0] for m in MODES}   # loss sum, correct sum
            n_scored = 0
            for _ in range(n_batches):
                batch = task.eval_batch(k, batch_size, generator=gen, device=device)
                split = batch.split
                if split is None or int(split.min()) != int(split.max()):
                    raise ValueError("task.eval_batch must return one prompt length (split) shared by all rows")
                s = int(split[0])
                prompt, queries = batch.inputs[:, :s], batch.inputs[:, s:]
                targets, mask = batch.targets[:, s:], batch.loss_mask[:, s:].bool()
                ybar = model.context(prompt)[:, -1]                               # (b, e)
                outs = {"prompted": model(batch.inputs)[:, s:],
                        "specialized": model.forward_specialized(queries, ybar),
                        "no_context": x_only(queries)}
                if baseline is not None:
                    outs["baseline"] = baseline(batch.inputs)[:, s:]
                if check_merged and math.isnan(merge_diff):
                    merged = model.specialize(prompt[0])
                    merge_diff = float((merged(queries[:1]) - outs["specialized"][:1]).abs().max())
                n_scored += int(mask.sum())
                for mode, out in outs.items():
                    loss, correct = _per_position(cfg, out, targets)
                    sums[mode][0] += float(loss[mask].sum())
                    if correct is not None:
                        sums[mode][1] += float(correct[mask].sum())
            if n_scored == 0:
                raise ValueError(f"task.eval_batch(k={k}) marked no held-out query positions in loss_mask")
            row: dict[str, Any] = {"k": k, "n_scored": n_scored}
            for mode in MODES:
                have = mode != "baseline" or baseline is not None
                row[f"loss_{mode}"] = sums[mode][0] / n_scored if have else float("nan")
                row[f"acc_{mode}"] = sums[mode][1] / n_scored if (have and cfg.mode == "tokens") else float("nan")
            row["gap_closed"] = gap_closed(row["loss_no_context"], row["loss_specialized"], row["loss_prompted"])
            # the same ratio on accuracy (higher is better, so the signs flip)
            row["gap_closed_acc"] = gap_closed(-row["acc_no_context"], -row["acc_specialized"], -row["acc_prompted"])
            row["spec_merge_max_diff"] = merge_diff
            rows.append(row)
    return rows


# ---------------------------------------------------------------------------- statistics over seeds
def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of the t-interval at `level` (half-width NaN for fewer than 2 finite values)."""
    arr = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    if arr.size == 0:
        return float("nan"), float("nan")
    if arr.size < 2:
        return float(arr.mean()), float("nan")
    from scipy import stats
    half = stats.t.ppf(0.5 + level / 2, df=arr.size - 1) * arr.std(ddof=1) / np.sqrt(arr.size)
    return float(arr.mean()), float(half)


def seeds_summary(runs: Sequence[Sequence[dict]], by: str = "k", level: float = 0.95) -> list[dict[str, Any]]:
    """Mean ± interval over seeds of every numeric column.

    runs: one list of rows per seed (e.g. one `evaluate_specialization` result per trained seed).
    Returns one row per value of `by`: `by`, n_seeds, and for each numeric column c, c_mean and c_ci95
    (the half-width of the `level` t-interval; the name keeps "ci95" whatever the level).
    """
    if not runs or any(not isinstance(r, (list, tuple)) for r in runs):
        raise ValueError("runs must be a non-empty list with one list of rows per seed")
    groups: dict[Any, list[dict]] = {}
    for rows in runs:
        for row in rows:
            if by not in row:
                raise ValueError(f"every row needs the column by={by!r}; got a row with {sorted(row)}")
            groups.setdefault(row[by], []).append(row)
    out = []
    for key, rows in groups.items():
        summary: dict[str, Any] = {by: key, "n_seeds": len(rows)}
        for col in rows[0]:
            if col == by or not all(isinstance(r.get(col), (int, float)) and not isinstance(r.get(col), bool)
                                    for r in rows):
                continue
            summary[f"{col}_mean"], summary[f"{col}_ci95"] = mean_ci([r[col] for r in rows], level)
        out.append(summary)
    return out


# ---------------------------------------------------------------------------- what ȳ encodes
@torch.no_grad()
def collect_summaries(model: CGT, task, k: int = 8, n_batches: int = 4, batch_size: int = 128,
                      seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """ȳ at the last token of a k-demonstration prompt and the hidden numbers it should encode.

    Returns features (n, d_y) and targets: task_params (n, 2) for icl, w (n, dim) for regression.
    """
    _check_positive("k", k)
    _check_positive("n_batches", n_batches)
    device, gen = _device_of(model), torch.Generator().manual_seed(seed)
    feats, targets = [], []
    with eval_mode(model):
        for _ in range(n_batches):
            batch = task.eval_batch(k, batch_size, generator=gen, device=device)
            key = "task_params" if "task_params" in batch.info else "w" if "w" in batch.info else None
            if key is None:
                raise ValueError(f"{type(task).__name__} batches carry no hidden numbers ('task_params' or 'w') to probe")
            s = int(batch.split[0])
            feats.append(model.context(batch.inputs[:, :s])[:, -1].float().cpu().numpy())
            targets.append(batch.info[key].cpu().numpy())
    return np.concatenate(feats), np.concatenate(targets)


def linear_probe(features, targets, kind: str = "auto", test_fraction: float = 0.25, seed: int = 0) -> dict[str, Any]:
    """How well a linear map decodes each target column from ȳ, on held-out rows.

    features (n, e); targets (n,) or (n, m). kind "classification" (logistic regression, accuracy per
    column, chance = share of the most common value), "regression" (ridge, R² per column), or "auto"
    (integer targets -> classification). Returns {"kind", "scores": [per column], "chance": [...], "mean"}.
    """
    from sklearn.linear_model import LogisticRegression, RidgeCV
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    X = np.asarray(features, dtype=float)
    Y = np.asarray(targets)
    if Y.ndim == 1:
        Y = Y[:, None]
    if X.ndim != 2 or Y.ndim != 2 or X.shape[0] != Y.shape[0]:
        raise ValueError(f"features must be (n, e) and targets (n,) or (n, m) with the same n; "
                         f"got {X.shape} and {np.asarray(targets).shape}")
    if X.shape[0] < 8:
        raise ValueError(f"features has {X.shape[0]} rows; a probe needs at least 8")
    if kind == "auto":
        kind = "classification" if np.issubdtype(Y.dtype, np.integer) else "regression"
    if kind not in ("classification", "regression"):
        raise ValueError(f"kind must be 'auto', 'classification' or 'regression', got {kind!r}")
    idx_train, idx_test = train_test_split(np.arange(X.shape[0]), test_size=test_fraction, random_state=seed)
    scaler = StandardScaler().fit(X[idx_train])
    Xtr, Xte = scaler.transform(X[idx_train]), scaler.transform(X[idx_test])
    scores, chance = [], []
    for j in range(Y.shape[1]):
        ytr, yte = Y[idx_train, j], Y[idx_test, j]
        if kind == "classification":
            values, counts = np.unique(ytr, return_counts=True)
            chance.append(float(np.mean(yte == values[counts.argmax()])))
            if len(values) < 2:    # a constant column (e.g. a = 1 for "shift") is trivially decodable
                scores.append(float(np.mean(yte == values[0])))
                continue
            clf = LogisticRegression(max_iter=2000).fit(Xtr, ytr)
            scores.append(float(clf.score(Xte, yte)))
        else:
            chance.append(0.0)
            scores.append(float(RidgeCV(alphas=np.logspace(-3, 3, 7)).fit(Xtr, ytr).score(Xte, yte)))
    return {"kind": kind, "scores": scores, "chance": chance, "mean": float(np.mean(scores))}


def smoothness_stats(ybar) -> dict[str, float]:
    """Token-to-token change of ȳ: ybar (t, e) or (b, t, e) -> mean ‖ȳ_t − ȳ_{t−1}‖ and mean cosine."""
    y = torch.as_tensor(np.asarray(ybar) if not isinstance(ybar, torch.Tensor) else ybar).float()
    if y.dim() == 2:
        y = y[None]
    if y.dim() != 3 or y.shape[1] < 2:
        raise ValueError(f"ybar must be (t, e) or (b, t, e) with t >= 2, got shape {tuple(y.shape)}")
    prev, cur = y[:, :-1], y[:, 1:]
    return {"mean_step_norm": float((cur - prev).norm(dim=-1).mean()),
            "mean_cosine": float(F.cosine_similarity(cur, prev, dim=-1).mean())}


# ---------------------------------------------------------------------------- text
@torch.no_grad()
def text_position_curves(model: CGT, task, split: int | None = None, boundary: int | None = None,
                         n_batches: int = 4, batch_size: int = 32, seed: int = 0, part: str = "val") -> dict[str, Any]:
    """Per-position loss on mixture rows with a fixed topic boundary, ȳ frozen at the split.

    Rows have excerpt A at positions < boundary and excerpt B from boundary on (default boundary =
    block_size // 2, split = boundary // 2). Prompted: the full CGT on the whole row; specialized: ȳ at
    position split − 1, the x-only specialised model on positions split.. alone; no_context: x_only on the
    same positions. Returns positions (m,) (absolute, split..t−1), loss_prompted/specialized/no_context (m,)
    means over rows, plus split, boundary and n_rows.
    """
    t = task.block_size
    boundary = t // 2 if boundary is None else boundary
    split = boundary // 2 if split is None else split
    if isinstance(split, bool) or not isinstance(split, int) or not 1 <= split < t:
        raise ValueError(f"split must be an int in 1..{t - 1}, got {split!r}")
    device, gen = _device_of(model), torch.Generator().manual_seed(seed)
    x_only = model.x_only().eval()
    sums = {m: torch.zeros(t - split) for m in ("prompted", "specialized", "no_context")}
    with eval_mode(model):
        for _ in range(n_batches):
            batch = task.get_batch(batch_size, part=part, generator=gen, device=device, boundary=boundary)
            suffix, targets = batch.inputs[:, split:], batch.targets[:, split:]
            ybar = model.context(batch.inputs[:, :split])[:, -1]
            outs = {"prompted": model(batch.inputs)[:, split:],
                    "specialized": model.forward_specialized(suffix, ybar),
                    "no_context": x_only(suffix)}
            for mode, out in outs.items():
                sums[mode] += _per_position(model.config, out, targets)[0].sum(0).cpu()
    n = n_batches * batch_size
    res: dict[str, Any] = {"positions": np.arange(split, t), "split": split, "boundary": boundary, "n_rows": n}
    for mode, total in sums.items():
        res[f"loss_{mode}"] = (total / n).numpy()
    return res


@torch.no_grad()
def collect_excerpt_ends(model: CGT, task, n_batches: int = 8, batch_size: int = 32, seed: int = 0,
                         part: str = "val") -> tuple[np.ndarray, np.ndarray]:
    """ȳ at the last token of each excerpt (boundary − 1 with topic A, t − 1 with topic B).

    Returns features (2n, d_y) and topic labels (2n,)."""
    device, gen = _device_of(model), torch.Generator().manual_seed(seed)
    feats, labels = [], []
    with eval_mode(model):
        for _ in range(n_batches):
            batch = task.get_batch(batch_size, part=part, generator=gen, device=device)
            ybar = model.context(batch.inputs)                                  # (b, t, e)
            rows = torch.arange(ybar.shape[0], device=ybar.device)
            feats += [ybar[rows, batch.info["boundary"] - 1], ybar[:, -1]]
            labels += [batch.info["topic_a"], batch.info["topic_b"]]
    return torch.cat(feats).float().cpu().numpy(), torch.cat(labels).cpu().numpy()


def knn_topic_accuracy(features, labels, n_neighbors: int = 5, folds: int = 5, seed: int = 0) -> float:
    """Cross-validated k-nearest-neighbour accuracy (cosine metric) of labels from features (n, e).

    Any class labels work: topics of text excerpts, or an ICL task id a·P + b, which shows whether ȳ
    identifies the task even where a linear probe of a alone is weak (ȳ tends to code the answer table).
    """
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.neighbors import KNeighborsClassifier

    X, y = np.asarray(features, dtype=float), np.asarray(labels)
    if X.ndim != 2 or y.ndim != 1 or X.shape[0] != y.shape[0]:
        raise ValueError(f"features must be (n, e) and labels (n,); got {X.shape} and {y.shape}")
    _, counts = np.unique(y, return_counts=True)
    folds = min(folds, int(counts.min()))
    if folds < 2:
        raise ValueError("labels needs at least 2 examples of every class for cross-validation")
    clf = KNeighborsClassifier(n_neighbors=n_neighbors, metric="cosine")
    cv = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    return float(cross_val_score(clf, X, y, cv=cv).mean())
