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
                NaN, with the reason in gap_closed_note, when L_no_context − L_prompted ≤ GAP_NOISE_FLOOR
                (0.01 nats; MSE for vectors tasks): a ratio over a difference that small is noise

G = 1: the compiled model is as good as the prompted one; G = 0: compiling bought nothing. G can exceed
1 when the specialized model beats the prompted one (the auxiliary loss trains it directly on queries).
For SyntheticICL the held-out queries are values u that never occur in the prompt, so copying cannot help.
"""
from __future__ import annotations

import contextlib
import math
import warnings
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ._checks import (Array, Bool, Choice, Float, Instance, Int, Ints, check_array, check_float, check_int, checked, describe,
                      is_number, refuse)
from .comparison import MODES, comparison_logits
from .losses import per_position_loss
from .model import CGT, GPT
from .tasks.base import check_task_fits
from .sequences import Baseline, TextTask, model_device, eval_mode




# ---------------------------------------------------------------------------- small helpers
GAP_NOISE_FLOOR = 0.01       # loss units (nats, or MSE for vectors tasks): below it L_nc − L_prompted is noise
GAP_NOISE_FLOOR_ACC = 0.01   # accuracy (one percentage point), for gap_closed_acc


def gap_note(loss_no_context: float, loss_prompted: float, floor: float = GAP_NOISE_FLOOR) -> str:
    """Why G is NaN for these losses ("" when it is defined): the prompt helps by less than the noise floor."""
    denom = loss_no_context - loss_prompted
    if math.isfinite(denom) and denom > floor:
        return ""
    return (f"L_no_context − L_prompted = {denom:.4g} is below the noise floor {floor:g}: the prompt barely "
            f"helps here, so G (a ratio over that difference) is undefined and reported as NaN")


def gap_closed(loss_no_context: float, loss_specialized: float, loss_prompted: float,
               eps: float = GAP_NOISE_FLOOR) -> float:
    """G = (L_nc − L_spec) / (L_nc − L_prompt); NaN when the prompt does not help: the denominator is at
    most `eps`, the noise floor (GAP_NOISE_FLOOR = 0.01 nats by default; on a difference of 0.004 nats a
    G of −5 says nothing)."""
    for name, value in (("loss_no_context", loss_no_context), ("loss_specialized", loss_specialized),
                        ("loss_prompted", loss_prompted)):
        check_float(name, value)
    check_float("eps", eps, 0.0)
    return gap_closed_unchecked(float(loss_no_context), float(loss_specialized), float(loss_prompted), eps)


def gap_closed_unchecked(loss_no_context: float, loss_specialized: float, loss_prompted: float,
                         eps: float = GAP_NOISE_FLOOR) -> float:
    """gap_closed without the checks, for losses a measurement computed (evaluation rows, the LoRA baselines):
    (no_context - specialized) / (no_context - prompted), a float; NaN in (e.g. accuracy of a vectors task) gives
    NaN out, and so does a gap of at most `eps` (no context effect to close)."""
    denom = loss_no_context - loss_prompted
    if not math.isfinite(denom) or denom <= eps:
        return float("nan")
    return float((loss_no_context - loss_specialized) / denom)


def _per_position(cfg, out: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-position loss (b, t) and, in tokens mode, per-position correctness (b, t) bool."""
    loss = per_position_loss(cfg.mode, out, targets)[0]
    return loss, (out.argmax(-1) == targets) if cfg.mode == "tokens" else None


def _check_k_values(ks: tuple[int, ...], task) -> tuple[int, ...]:
    """Prompt sizes (declared `Ints(1)`) the task can build."""
    for k in ks:   # one row per k: the task says whether k demonstrations fit its sequences
        try:
            task.eval_batch(int(k), 1, generator=torch.Generator().manual_seed(0))
        except ValueError as err:
            raise refuse("k_values", "prompt sizes this task can build", f"{list(ks)}: {err}") from None
    return tuple(int(k) for k in ks)


# ---------------------------------------------------------------------------- the comparison
_MODEL = Instance(CGT, "a CGT")
_TEXT_CALL = dict(model=_MODEL, task=TextTask(), n_batches=Int(1), batch_size=Int(1), seed=Int(0),
                  part=Choice("train", "val"))



def _caller_level() -> int:
    """The stacklevel that names the first frame outside cgt_viz and torch: the decorators in between
    (torch.no_grad, @checked) made a fixed stacklevel name torch's _contextlib.py, an install path the user
    never wrote."""
    import sys
    frame, level = sys._getframe(1), 1
    inside = (str(Path(__file__).resolve().parent), str(Path(torch.__file__).resolve().parent))
    while frame is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(inside):
        frame, level = frame.f_back, level + 1
    return level

@torch.no_grad()
@checked(model=_MODEL, k_values=Ints(1), n_batches=Int(1), batch_size=Int(1), baseline=Baseline(), seed=Int(0),
         check_merged=Bool())
def evaluate_specialization(model: CGT, task, k_values: Sequence[int] | int = (4, 8, 16), n_batches: int = 4,
                            batch_size: int = 64, baseline: GPT | None = None, seed: int = 0,
                            check_merged: bool = True) -> list[dict[str, Any]]:
    """Prompted vs specialized vs no-context (vs baseline GPT) on held-out queries after k demonstrations.

    model      a CGT; task: any task with `eval_batch(k, batch_size, generator, device)` (all built-in tasks)
    k_values   prompt sizes (demonstrations for icl/regression, prompt tokens for text)
    baseline   optional plain GPT trained on the same task; it sees the prompt in context
    check_merged  compare `forward_specialized` once against the merged `specialize` GPT (float tolerance)

    Returns one row per k: k, n_scored, loss_<mode> then acc_<mode> for mode in MODES (acc is NaN for
    vectors tasks; no baseline columns without a baseline), gap_closed, gap_closed_acc (the same ratio
    on accuracy), gap_closed_note ("" or why G is NaN: L_no_context − L_prompted under the noise floor
    GAP_NOISE_FLOOR = 0.01, which also warns), and spec_merge_max_diff (max |logit difference| of the
    merged check, NaN if skipped).
    """
    if baseline is not None:
        check_task_fits(baseline, task, "task", needs="eval_batch")
    check_task_fits(model, task, needs="eval_batch")
    ks = _check_k_values(k_values, task)
    cfg, device = model.config, model_device(model)
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
                    raise refuse("task.eval_batch", "one prompt length (split) shared by all rows",
                                 "no split" if split is None else f"splits {sorted(set(split.tolist()))}", verb="return")
                s = int(split[0])
                prompt, queries = batch.inputs[:, :s], batch.inputs[:, s:]
                targets, mask = batch.targets[:, s:], batch.loss_mask[:, s:].bool()
                outs = comparison_logits(model, batch.inputs, s, x_only, baseline)
                if check_merged and math.isnan(merge_diff):
                    merged = model.specialize(prompt[0])
                    merged_out = model.stream.merged_logits(merged, queries[:1])
                    merge_diff = float((merged_out - outs["specialized"][:1]).abs().max())
                n_scored += int(mask.sum())
                for mode, out in outs.items():
                    loss, correct = _per_position(cfg, out, targets)
                    sums[mode][0] += float(loss[mask].sum())
                    if correct is not None:
                        sums[mode][1] += float(correct[mask].sum())
            if n_scored == 0:
                raise refuse(f"task.eval_batch(k={k})", "held-out query positions in loss_mask", "none", verb="mark")
            row: dict[str, Any] = {"k": k, "n_scored": n_scored}
            modes = [m for m in MODES if m != "baseline" or baseline is not None]   # no baseline: no columns
            for mode in modes:
                row[f"loss_{mode}"] = sums[mode][0] / n_scored
            for mode in modes:
                row[f"acc_{mode}"] = sums[mode][1] / n_scored if cfg.mode == "tokens" else float("nan")
            row["gap_closed"] = gap_closed_unchecked(row["loss_no_context"], row["loss_specialized"],
                                                     row["loss_prompted"])
            # the same ratio on accuracy (higher is better, so the signs flip)
            row["gap_closed_acc"] = gap_closed_unchecked(-row["acc_no_context"], -row["acc_specialized"],
                                                         -row["acc_prompted"], GAP_NOISE_FLOOR_ACC)
            row["gap_closed_note"] = gap_note(row["loss_no_context"], row["loss_prompted"])
            if row["gap_closed_note"]:
                warnings.warn(f"k = {k}: {row['gap_closed_note']}", stacklevel=_caller_level())
            row["spec_merge_max_diff"] = merge_diff
            rows.append(row)
    return rows


# ---------------------------------------------------------------------------- statistics over seeds
@checked(level=Float(0.0, 1.0, lo_open=True, hi_open=True))
def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of the t-interval at `level` (half-width NaN for fewer than 2 finite values).

    values: numbers; None, NaN and inf are skipped (e.g. a column that is NaN without a baseline)."""
    if isinstance(values, (torch.Tensor, np.ndarray)):
        values = np.asarray(values.detach().cpu() if isinstance(values, torch.Tensor) else values).ravel().tolist()
    listed = not isinstance(values, (str, bytes, dict)) and isinstance(values, Iterable)
    values = list(values) if listed else values
    odd = [v for v in values if v is not None and not is_number(v)] if listed else [values]
    if odd:
        raise refuse("values", "a sequence of numbers (None and NaN are skipped)",
                     describe(odd[0]) + (" among them" if listed else ""), TypeError)
    arr = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    if arr.size == 0:
        return float("nan"), float("nan")
    if arr.size < 2:
        return float(arr.mean()), float("nan")
    from scipy import stats
    half = stats.t.ppf(0.5 + level / 2, df=arr.size - 1) * arr.std(ddof=1) / np.sqrt(arr.size)
    return float(arr.mean()), float(half)


@checked(level=Float(0.0, 1.0, lo_open=True, hi_open=True))
def seeds_summary(runs: Sequence[Sequence[dict]], by: str = "k", level: float = 0.95) -> list[dict[str, Any]]:
    """Mean ± interval over seeds of every numeric column.

    runs: one list of rows per seed (e.g. one `evaluate_specialization` result per trained seed).
    Returns one row per value of `by`: `by`, n_seeds, and for each numeric column c, c_mean and c_ci95
    (the half-width of the `level` t-interval; the name keeps "ci95" whatever the level).
    """
    if not isinstance(runs, (list, tuple)) or not runs or any(not isinstance(r, (list, tuple)) for r in runs):
        raise refuse("runs", "a non-empty list with one list of rows (dicts) per seed", describe(runs), TypeError)
    groups: dict[Any, list[dict]] = {}
    for rows in runs:
        for row in rows:
            if not isinstance(row, dict):
                raise refuse("runs", "lists of rows (dicts)", f"a row {describe(row)}", TypeError, verb="hold")
            if by not in row:   # a cross-argument check: the column against the rows
                raise refuse("by", "a column of every row", f"by={by!r} and a row with {sorted(row)}")
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
@checked(model=_MODEL, k=Int(1), n_batches=Int(1), batch_size=Int(1), seed=Int(0))
def collect_summaries(model: CGT, task, k: int = 8, n_batches: int = 4, batch_size: int = 128,
                      seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """ȳ at the last token of a k-demonstration prompt and the hidden numbers it should encode.

    Returns features (n, d_y) and targets: task_params (n, 2) for icl, w (n, dim) for regression.
    """
    check_task_fits(model, task, needs="eval_batch")
    device, gen = model_device(model), torch.Generator().manual_seed(seed)
    feats, targets = [], []
    with eval_mode(model):
        for _ in range(n_batches):
            batch = task.eval_batch(k, batch_size, generator=gen, device=device)
            key = "task_params" if "task_params" in batch.info else "w" if "w" in batch.info else None
            if key is None:
                raise refuse("task", "a task whose batches carry hidden numbers ('task_params' or 'w') to probe",
                             type(task).__name__)
            s = int(batch.split[0])
            feats.append(model.context(batch.inputs[:, :s])[:, -1].float().cpu().numpy())
            targets.append(batch.info[key].cpu().numpy())
    return np.concatenate(feats), np.concatenate(targets)


@checked(kind=Choice("auto", "classification", "regression"), test_fraction=Float(0.0, 1.0, lo_open=True, hi_open=True), seed=Int(0))
def linear_probe(features, targets, kind: str = "auto", test_fraction: float = 0.25, seed: int = 0) -> dict[str, Any]:
    """How well a linear map decodes each target column from ȳ, on held-out rows.

    features (n, e); targets (n,) or (n, m). kind "classification" (logistic regression, accuracy per
    column, chance = share of the most common value), "regression" (ridge, R² per column), or "auto"
    (float targets -> regression, anything else -> classification). features must be finite, with at
    least 8 rows; test_fraction in (0, 1) must leave at least 2 rows for training. Returns {"kind", "scores": [per column], "chance": [...], "mean"}.
    """
    from sklearn.linear_model import LogisticRegression, RidgeCV
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    X = check_array("features", features, 2, min_rows=8, what="2-D (n, e)")
    Y = _labels_array("targets", targets, (1, 2))
    if Y.ndim == 1:
        Y = Y[:, None]
    _check_same_rows("features", X, "targets", Y, "(n,) or (n, m)")
    n_test = math.ceil(test_fraction * X.shape[0])       # how train_test_split rounds
    if X.shape[0] - n_test < 2:
        raise refuse("test_fraction", f"at least 2 of the {X.shape[0]} rows for training", str(test_fraction),
                     verb="leave")
    if kind == "auto":
        kind = "regression" if np.issubdtype(Y.dtype, np.floating) else "classification"   # ints, bools, strings
    if kind == "regression" and not np.issubdtype(Y.dtype, np.number):
        raise refuse("targets", "numbers for a regression probe", f"dtype {Y.dtype}", TypeError)
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
    y = torch.from_numpy(check_array("ybar", ybar, (2, 3), what="(t, e) or (b, t, e)")).float()
    if y.dim() == 2:
        y = y[None]
    if y.shape[1] < 2:
        raise refuse("ybar", "(t, e) or (b, t, e) with t >= 2 positions", f"shape {tuple(y.shape)}")
    prev, cur = y[:, :-1], y[:, 1:]
    return {"mean_step_norm": float((cur - prev).norm(dim=-1).mean()),
            "mean_cosine": float(F.cosine_similarity(cur, prev, dim=-1).mean())}


def _labels_array(name: str, values: Any, ndim: int | tuple[int, ...]) -> np.ndarray:
    """Class labels or targets (numbers or strings) as an array with ndim dimensions and no NaN."""
    dims = (ndim,) if isinstance(ndim, int) else ndim
    want = f"an array of shape {' or '.join('(n,)' if d == 1 else '(n, m)' for d in dims)}"
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    if isinstance(values, (str, bytes, dict)) or values is None or not hasattr(values, "__len__"):
        raise refuse(name, want, describe(values), TypeError)
    arr = np.asarray(values)
    if arr.ndim not in dims or arr.dtype == object:
        raise refuse(name, want, f"shape {arr.shape} and dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).all():
        raise refuse(name, "finite", f"{int((~np.isfinite(arr)).sum())} NaN or inf value(s)")
    return arr


def _check_same_rows(name: str, X: np.ndarray, other: str, Y: np.ndarray, other_shape: str) -> None:
    """features X (n, e) and labels or targets Y with one row per row of X."""
    if X.shape[0] != Y.shape[0]:
        raise refuse(name, f"(n, e) and {other} {other_shape} with the same n", f"{X.shape} and {Y.shape}")


# ---------------------------------------------------------------------------- text
@torch.no_grad()
@checked(**_TEXT_CALL)
def text_position_curves(model: CGT, task, split: int | None = None, boundary: int | None = None,
                         n_batches: int = 4, batch_size: int = 32, seed: int = 0, part: str = "val") -> dict[str, Any]:
    """Per-position loss on mixture rows with a fixed topic boundary, ȳ frozen at the split.

    Rows have excerpt A at positions < boundary and excerpt B from boundary on (default boundary =
    block_size // 2, split = boundary // 2). Prompted: the full CGT on the whole row; specialized: ȳ at
    position split − 1, the x-only specialized model on positions split.. alone; no_context: x_only on the
    same positions. Returns positions (m,) (absolute, split..t−1), loss_prompted/specialized/no_context (m,)
    means over rows, plus split, boundary and n_rows; and the paired difference specialized − no_context:
    diff_specialized_no_context and sem_specialized_no_context (m,) (its mean and standard error over rows),
    diff_rows_before / diff_rows_after (n_rows,) (each row's mean difference before / from the boundary).
    """
    check_task_fits(model, task)
    t = task.block_size
    boundary = t // 2 if boundary is None else check_int("boundary", boundary, 1, t - 1)
    split = boundary // 2 if split is None else split
    check_int("split", split, 1, t - 1)
    device, gen = model_device(model), torch.Generator().manual_seed(seed)
    x_only = model.x_only().eval()
    sums = {m: torch.zeros(t - split) for m in MODES[:3]}
    diffs = []                                   # (b, m) specialized − no_context, per batch
    with eval_mode(model):
        for _ in range(n_batches):
            batch = task.get_batch(batch_size, part=part, generator=gen, device=device, boundary=boundary)
            targets = batch.targets[:, split:]
            rows = {}
            for mode, out in comparison_logits(model, batch.inputs, split, x_only).items():
                rows[mode] = _per_position(model.config, out, targets)[0].cpu()
                sums[mode] += rows[mode].sum(0)
            diffs.append((rows["specialized"] - rows["no_context"]).double())
    n = n_batches * batch_size
    d = torch.cat(diffs).numpy()                 # (n, m)
    cut = boundary - split
    res_diff = {"diff_specialized_no_context": d.mean(0),
                "sem_specialized_no_context": d.std(0, ddof=1) / np.sqrt(n) if n > 1 else np.full(d.shape[1], np.nan),
                "diff_rows_before": d[:, :cut].mean(1) if cut > 0 else np.full(n, np.nan),
                "diff_rows_after": d[:, max(cut, 0):].mean(1)}
    res: dict[str, Any] = {"positions": np.arange(split, t), "split": split, "boundary": boundary, "n_rows": n}
    for mode, total in sums.items():
        res[f"loss_{mode}"] = (total / n).numpy()
    res.update(res_diff)
    return res


@torch.no_grad()
@checked(**_TEXT_CALL, window=Int(1))
def text_step_profile(model: CGT, task, boundary: int | None = None, window: int = 16, n_batches: int = 4,
                      batch_size: int = 32, seed: int = 0, part: str = "val") -> dict[str, Any]:
    """Does ȳ move more just after the topic switch? Mean ‖ȳ_p − ȳ_p−1‖ over rows, per position p = 1..t−1,
    on mixture rows with the switch at `boundary` (default block_size // 2) and on no-switch control rows
    (the same excerpts A and boundary, excerpt B of A's topic: `get_batch(switch=False)`).

    Returns positions (t−1,), step_switch and step_no_switch (t−1,), and ratio / ratio_no_switch: the mean
    step over the `window` positions from the boundary on over that elsewhere (positions ≥ window, where the
    prefix is no longer short). A ratio above its control's is movement that the switch causes."""
    check_task_fits(model, task)
    t = task.block_size
    boundary = t // 2 if boundary is None else check_int("boundary", boundary, 1, t - 1)
    if boundary + window > t or boundary <= window:
        raise _window_refused(window, boundary, t, f"block_size {t}")
    device = model_device(model)
    profiles = {}
    with eval_mode(model):
        for switch in (True, False):
            gen, total = torch.Generator().manual_seed(seed), torch.zeros(t - 1)
            for _ in range(n_batches):
                batch = task.get_batch(batch_size, part=part, generator=gen, device=device, boundary=boundary,
                                       switch=switch)
                ybar = model.context(batch.inputs).float()                        # (b, t, e)
                total += (ybar[:, 1:] - ybar[:, :-1]).norm(dim=-1).sum(0).cpu()  # (t − 1,): step into p = 1..t−1
            profiles[switch] = (total / (n_batches * batch_size)).numpy()
    (after, elsewhere), (after_ctl, elsewhere_ctl) = (step_window_means(profiles[s], boundary, window)
                                                      for s in (True, False))
    return {"positions": np.arange(1, t), "step_switch": profiles[True], "step_no_switch": profiles[False],
            "ratio": after / elsewhere, "ratio_no_switch": after_ctl / elsewhere_ctl,
            "step_after": after, "step_elsewhere": elsewhere, "step_after_no_switch": after_ctl,
            "boundary": boundary, "window": window, "n_rows": n_batches * batch_size}


@checked(steps=Array(1, "1-D (t − 1,)"), boundary=Int(1), window=Int(1))
def step_window_means(steps, boundary: int, window: int) -> tuple[float, float]:
    """steps (t−1,): the mean step into positions p = 1..t−1 -> (its mean over the `window` positions from the
    boundary on, its mean elsewhere from position `window` on, where the prefix is no longer short)."""
    pos = np.arange(1, len(steps) + 1)
    after = (pos >= boundary) & (pos < boundary + window)
    elsewhere = ~after & (pos >= window)
    if boundary + window - 1 > len(steps) or not elsewhere.any():
        raise _window_refused(window, boundary, len(steps) + 1, f"{len(steps)} steps")
    return float(steps[after].mean()), float(steps[elsewhere].mean())


def _window_refused(window: int, boundary: int, t: int, where: str) -> ValueError:
    """The step window against the boundary of rows of t positions (`where` says how the caller counts them)."""
    return refuse("window", f"after the boundary and leave positions before it (boundary {boundary}, {where}: "
                            f"window < {min(boundary, t - boundary + 1)})", str(window), verb="fit")


@torch.no_grad()
@checked(**_TEXT_CALL)
def collect_excerpt_ends(model: CGT, task, n_batches: int = 8, batch_size: int = 32, seed: int = 0,
                         part: str = "val") -> tuple[np.ndarray, np.ndarray]:
    """ȳ at the last token of each excerpt (boundary − 1 with topic A, t − 1 with topic B).

    Returns features (2n, d_y) and topic labels (2n,)."""
    check_task_fits(model, task)
    device, gen = model_device(model), torch.Generator().manual_seed(seed)
    feats, labels = [], []
    with eval_mode(model):
        for _ in range(n_batches):
            batch = task.get_batch(batch_size, part=part, generator=gen, device=device)
            ybar = model.context(batch.inputs)                                  # (b, t, e)
            rows = torch.arange(ybar.shape[0], device=ybar.device)
            feats += [ybar[rows, batch.info["boundary"] - 1], ybar[:, -1]]
            labels += [batch.info["topic_a"], batch.info["topic_b"]]
    return torch.cat(feats).float().cpu().numpy(), torch.cat(labels).cpu().numpy()


@checked(seed=Int(0))
def knn_topic_accuracy(features, labels, n_neighbors: int = 5, folds: int = 5, seed: int = 0,
                       groups=None) -> float:
    """Cross-validated k-nearest-neighbour accuracy (cosine metric) of labels from features (n, e).

    Any class labels work: topics of text excerpts, or an ICL task id a·P + b, which shows whether ȳ
    identifies the task even where a linear probe of a alone is weak (ȳ tends to code the answer table).
    folds must be in 2..(size of the smallest class) and n_neighbors at most the rows of a training fold.

    groups (n,), e.g. document ids: folds grouped by them (stratified), so no row is judged by neighbours of its
    own group (several excerpts of one document would otherwise find each other). Grouped folds differ in
    size, so the accuracy is then over all rows, each judged once (without groups: the mean over folds)."""
    from sklearn.model_selection import StratifiedGroupKFold, StratifiedKFold, cross_val_score
    from sklearn.neighbors import KNeighborsClassifier

    X = check_array("features", features, 2, what="2-D (n, e)")
    y = _labels_array("labels", labels, 1)
    _check_same_rows("features", X, "labels", y, "(n,)")
    if groups is not None:
        groups = _labels_array("groups", groups, 1)
        _check_same_rows("features", X, "groups", groups, "(n,)")
    _, counts = np.unique(y, return_counts=True)
    if counts.min() < 2:
        raise refuse("labels", "at least 2 examples of every class for cross-validation",
                     f"a smallest class of {int(counts.min())}", verb="have")
    check_int("folds", folds, 2, int(counts.min()), hint=" (folds <= the size of the smallest class)")
    # the smallest training fold: every class gives up at most ceil(count / folds) rows to the test fold
    n_train = int(X.shape[0] - np.ceil(counts / folds).sum())
    check_int("n_neighbors", n_neighbors, 1, n_train, hint=f" (the rows of a training fold with folds={folds})")
    clf = KNeighborsClassifier(n_neighbors=n_neighbors, metric="cosine")
    if groups is None:
        cv = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
        return float(cross_val_score(clf, X, y, cv=cv).mean())
    correct = 0
    for train, test in StratifiedGroupKFold(n_splits=folds, shuffle=True, random_state=seed).split(X, y, groups):
        correct += int((clf.fit(X[train], y[train]).predict(X[test]) == y[test]).sum())
    return correct / len(y)
