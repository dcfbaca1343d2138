"""The ceiling of a CGT's update space: for each prompt, the best its reader could possibly do.

A compiled prompt is ȳ → coefficients → a low-rank update of the layers above ℓ. When compiled prompts fall
short of prompting, either the reader (the y stream, which makes ȳ from the prompt) or the update space (what
any coefficients can express) is to blame. The oracle tells them apart: per prompt it optimises one part of
the compiled model directly, everything else frozen, and scores the result on held-out queries.

kinds
    ybar     the best ȳ: a perfect reader of today's templates
    coeffs   the best coefficients of every template: the whole fixed template space
    lora     the compiled update plus a free rank-r update at the same maps: a space that can write any
             direction at those sites, the reference for what a richer template kind could reach

The objective is the model's own loss on fresh queries of the prompt's function (`fit_queries` more queries
drawn with the prompt by the task's `eval_batch`); the scored query is never seen. Each optimum starts at the
compiled prompt (the free update at zero) and keeps the best point seen, so per prompt it is never worse than
the compiled prompt on the objective it optimises.

The pretrained family's oracle (`cgt_viz.hf.oracle`) shares `best_of` and `oracle_pass`; it scores text windows
under the head's distillation objective instead of a task's queries.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Sequence

import torch
from einops import rearrange
from torch import nn

from ._checks import Choice, Float, Instance, Int, Names, checked, refuse
from .comparison import comparison_logits
from .evaluate import gap_closed
from .losses import per_position_loss
from .model import CGT
from .sequences import eval_mode, model_device
from .tasks.base import check_task_fits

ORACLE_KINDS = ("ybar", "coeffs", "lora")


def best_of(params: Sequence[torch.Tensor], objective: Callable[[list[torch.Tensor]], torch.Tensor], steps: int,
            lr: float) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """Adam on tensors whose first axis is the row (rows independent), keeping for each row the best point seen.

    objective(params) -> (b,) per-row values at those params. Returns the best params (detached), the
    objective at the start (b,) and at the best point (b,) (≤ the start, row by row)."""
    params = [p.detach().clone().requires_grad_(True) for p in params]
    best = [p.detach().clone() for p in params]
    opt = torch.optim.Adam(params, lr=lr)
    start = best_value = None
    for step in range(steps + 1):
        value = objective(params)
        with torch.no_grad():
            v = value.detach()
            if start is None:
                start, best_value = v.clone(), v.clone()
            better = v < best_value
            best_value = torch.where(better, v, best_value)
            for b, p in zip(best, params):
                b[better] = p.detach()[better]
        if step == steps:
            break
        grads = torch.autograd.grad(value.sum(), params)
        for p, g in zip(params, grads):
            p.grad = g
        opt.step()
    return best, start, best_value


class FreeSite(nn.Module):
    """A site's templates plus a free per-row rank-r update: T h = templates(h) + (h V) Uᵀ, U, V (b, i, r)."""

    def __init__(self, base: nn.Module, U: torch.Tensor, V: torch.Tensor):
        super().__init__()
        self.base, self.free_U, self.free_V = base, U, V

    @property
    def U(self) -> torch.Tensor:          # the model's `_modulate` reads the templates' dtype from here
        return self.base.U

    def apply(self, h: torch.Tensor, coeffs: torch.Tensor) -> torch.Tensor:
        # (b, t, i) @ (b, i, r) -> (b, t, r); @ (b, r, i) -> (b, t, i)
        return self.base.apply(h, coeffs) + (h @ self.free_V) @ self.free_U.transpose(1, 2)


@contextmanager
def free_sites(model, factors: dict[str, tuple[torch.Tensor, torch.Tensor]]):
    """Swap each site "ν.site" of factors for its templates plus the free update, for the duration of a block."""
    saved = {}
    try:
        for key, (U, V) in factors.items():
            layer, site = key.split(".")
            saved[key] = model.templates[layer][site]
            model.templates[layer][site] = FreeSite(saved[key], U, V)
        yield
    finally:
        for key, base in saved.items():
            layer, site = key.split(".")
            model.templates[layer][site] = base


def free_start(model, keys: Sequence[str], rows: int, rank: int, gen: torch.Generator,
               device: torch.device) -> list[torch.Tensor]:
    """The free update's starting factors, [U, V] per site key: V random, U zero, so the update starts at
    nothing and can grow in any direction."""
    start = []
    for key in keys:
        layer, site = key.split(".")
        width = model.templates[layer][site].U.shape[1]
        V = torch.randn(rows, width, rank, generator=gen) / width ** 0.5
        start += [torch.zeros(rows, width, rank, device=device), V.to(device)]
    return start


@checked(model=Instance(CGT, "a CGT"), k=Int(1), kinds=Names(ORACLE_KINDS, "oracle kinds"), n_batches=Int(1),
         batch_size=Int(1), fit_queries=Int(1), steps=Int(0), lr=Float(0.0, lo_open=True),
         lora_lr=Float(0.0, lo_open=True), rank=Int(1), seed=Int(0), reader_info=Choice("w", "task_params", none=True))
def specialization_oracle(model: CGT, task, k: int, kinds: Sequence[str] = ORACLE_KINDS, n_batches: int = 2,
                          batch_size: int = 64, fit_queries: int = 32, steps: int = 200, lr: float = 0.05,
                          lora_lr: float = 3e-3, rank: int = 4, seed: int = 0,
                          reader_info: str | None = None) -> dict[str, Any]:
    """`evaluate_specialization`'s comparison at one k with each oracle beside the compiled prompt.

    Per prompt, `task.eval_batch(k, ...)` draws the prompt and the scored query exactly as evaluate does, and
    `task.queries_like(batch, fit_queries)` fresh queries of the same hidden function; each kind is optimised on
    those (each its own short sequence, as the compiled model sees a query) and scored on the first. Returns
    loss_<mode> for prompted, specialized and no_context, loss_oracle_<kind> and G_oracle_<kind> beside G
    (evaluate's `gap_closed`), the objective's mean at the start and at the optimum per kind, and the settings.

    reader_info names the hidden numbers of the task's batches ("w": regression's weights, "task_params": icl's
    (a, b)). With it (and the coeffs kind) the oracle also scores the best *linear reader of those numbers*:
    coefficients = L · numbers + c, fitted by least squares to the per-prompt best coefficients of half the
    prompts and applied to the other half (two folds). Where the best coefficients reach prompting but a linear
    map of the true numbers does not, the space holds the answer only as a non-linear function of them."""
    if reader_info is not None and "coeffs" not in kinds:
        raise refuse("reader_info", "None unless kinds holds 'coeffs' (the reader is fitted to its optima)",
                     repr(reader_info))
    check_task_fits(model, task, needs="eval_batch")
    check_task_fits(model, task, needs="queries_like")
    device = model_device(model)
    gen = torch.Generator().manual_seed(seed * 100_003 + k)
    sums: dict[str, float] = {}
    objective_sums = {kind: [0.0, 0.0] for kind in kinds}
    n_scored = 0
    x_only = model.x_only().eval()
    kept = []              # with reader_info: per batch (numbers (b, q), best coeffs, the scored query)

    def loss_of(logits, targets, mask):           # the model's loss per row, the mean over its scored positions
        loss, valid = per_position_loss(model.config.mode, logits, targets, mask)
        return (loss * valid).sum(1) / valid.sum(1).clamp_min(1)

    with eval_mode(model):
        for _ in range(n_batches):
            batch = task.eval_batch(k, batch_size, generator=gen, device=device)
            s, b = int(batch.split[0]), len(batch.inputs)
            more = task.queries_like(batch, fit_queries, generator=gen, device=device)
            q = (batch.inputs.shape[1] - s)                                  # one query's positions
            # the fit queries, one row each: (b, n·q, ·) -> (b·n, q, ·)
            fit = [rearrange(t, "b (n q) ... -> (b n) q ...", q=q) for t in
                   (more.inputs, more.targets, more.loss_mask.bool())]
            rows = torch.arange(b, device=device).repeat_interleave(fit_queries)     # fit row -> its prompt
            scored = (batch.inputs[:, s:], batch.targets[:, s:], batch.loss_mask[:, s:].bool())
            with torch.no_grad():
                outs = comparison_logits(model, batch.inputs, s, x_only)
                ybar = model.context(batch.inputs[:, :s])[:, -1]                       # (b, e)
            compiled = {key: c.detach() for key, c in model._fixed_coeffs(ybar).items()}   # {"ν.site": (b, 1, K)}
            per_mode = {mode: loss_of(out, scored[1], scored[2]) for mode, out in outs.items()}
            for kind in kinds:
                run, params = oracle_pass(model, kind, ybar, compiled, rank, gen,
                                          hidden=lambda x, coeffs: model._hidden(x, coeffs)[0])

                def objective(ps):                  # a prompt's mean over its fit queries -> (b,)
                    value = loss_of(model._logits(run(ps, fit[0], rows)), fit[1], fit[2])
                    return torch.zeros(b, device=device).index_add(0, rows, value) / fit_queries

                best, start, best_value = best_of(params, objective, steps, lora_lr if kind == "lora" else lr)
                with torch.no_grad():
                    per_mode[f"oracle_{kind}"] = loss_of(
                        model._logits(run(best, scored[0], torch.arange(b, device=device))), scored[1], scored[2])
                objective_sums[kind][0] += float(start.sum())
                objective_sums[kind][1] += float(best_value.sum())
                if kind == "coeffs" and reader_info is not None:
                    kept.append((batch.info[reader_info].float().flatten(1).to(device), best, scored))
            for mode, value in per_mode.items():
                sums[mode] = sums.get(mode, 0.0) + float(value.sum())
            n_scored += b
        if kept:
            sums["reader"] = _linear_reader_loss(model, kept, loss_of)
    res: dict[str, Any] = {"k": k, "n_prompts": n_scored}
    res.update({f"loss_{mode}": total / n_scored for mode, total in sums.items()})
    res["gap_closed"] = gap_closed(res["loss_no_context"], res["loss_specialized"], res["loss_prompted"])
    if kept:
        res["G_reader"] = gap_closed(res["loss_no_context"], res["loss_reader"], res["loss_prompted"])
    for kind in kinds:
        res[f"G_oracle_{kind}"] = gap_closed(res["loss_no_context"], res[f"loss_oracle_{kind}"],
                                             res["loss_prompted"])
        res[f"objective_{kind}"] = {"start": objective_sums[kind][0] / n_scored,
                                    "best": objective_sums[kind][1] / n_scored}
    res["oracle"] = {"kinds": list(kinds), "fit_queries": fit_queries, "steps": steps, "lr": lr,
                     "lora_lr": lora_lr, "rank": rank, "seed": seed, "reader_info": reader_info}
    return res


def _linear_reader_loss(model, kept: list, loss_of) -> float:
    """The summed scored loss of coefficients predicted linearly from each prompt's hidden numbers, fitted on
    the other fold's best coefficients (prompts alternate between two folds)."""
    numbers = torch.cat([n for n, _, _ in kept])                                  # (n, q)
    sizes = [c.shape[-1] for c in kept[0][1]]
    coeffs = torch.cat([torch.cat([c.flatten(1) for c in best], 1) for _, best, _ in kept])   # (n, Σ K)
    design = torch.cat([numbers, torch.ones(len(numbers), 1, device=numbers.device)], 1)     # (n, q + 1)
    fold = torch.arange(len(numbers), device=numbers.device) % 2
    predicted = torch.empty_like(coeffs)
    for f in (0, 1):
        train, test = fold != f, fold == f
        x = design[train]
        # ridge, a small multiple of the identity: a fold may have fewer prompts than numbers
        gram = x.T @ x + 1e-3 * len(x) * torch.eye(x.shape[1], device=x.device)
        predicted[test] = design[test] @ torch.linalg.solve(gram, x.T @ coeffs[train])
    total, at = 0.0, 0
    keys = None
    for numbers_b, best, scored in kept:
        b = len(numbers_b)
        parts = predicted[at:at + b].split(sizes, dim=1)                           # Σ K -> one (b, K) per site
        params = [p[:, None, :] for p in parts]                                     # (b, 1, K): ȳ frozen
        keys = keys or [f"{layer}.{site}" for layer, site in model.template_sites]
        with torch.no_grad():
            final = model._hidden(scored[0], dict(zip(keys, params)))[0]
            total += float(loss_of(model._logits(final), scored[1], scored[2]).sum())
        at += b
    return total


def factor_pairs(params: Sequence[torch.Tensor], keys: Sequence[str], rows: torch.Tensor) -> dict:
    """Flat optimiser params [F1_a, F2_a, F1_b, ...] -> {key: (F1[rows], F2[rows])}, each key's two factors at the
    rows' prompts."""
    return {key: (params[2 * j][rows], params[2 * j + 1][rows]) for j, key in enumerate(keys)}


def oracle_pass(model, kind: str, ybar: torch.Tensor, compiled: dict, rank: int, gen: torch.Generator,
                hidden: Callable[[torch.Tensor, dict], torch.Tensor], held: dict | None = None):
    """The part optimised for one kind -> (run(params, x, rows) -> the x stream's final states, the starting
    params). rows maps each row of x to its prompt (a prompt's fit rows share its params); hidden(x, coeffs) is
    the family's pass with ȳ frozen (the from-scratch CGT's whole x stream; a CGTLM's layers above ℓ from x_ℓ).
    compiled holds the templates' coefficients; held, further entries of a pass's coeffs that every kind but
    "memory" keeps as compiled (a CGTLM's token memory, {"ν.memory": (A, B)}); kind "memory" optimises those."""
    held = held or {}
    keys = list(compiled)
    fixed = lambda rows: {key: tuple(f[rows] for f in ab) for key, ab in held.items()}     # noqa: E731
    if kind == "ybar":
        return (lambda params, x, rows: hidden(x, {**model._fixed_coeffs(params[0][rows]), **fixed(rows)})), [ybar]
    if kind == "coeffs":
        return (lambda params, x, rows: hidden(x, {**{key: c[rows] for key, c in zip(keys, params)}, **fixed(rows)}),
                [compiled[key] for key in keys])
    if kind == "memory":   # the caller refuses it for a model without a memory
        mem_keys = list(held)
        return (lambda params, x, rows: hidden(x, {**{key: c[rows] for key, c in compiled.items()},
                                                   **factor_pairs(params, mem_keys, rows)}),
                [f for key in mem_keys for f in held[key]])
    start = free_start(model, keys, len(ybar), rank, gen, ybar.device)

    def run(params, x, rows):
        with free_sites(model, factor_pairs(params, keys, rows)):
            return hidden(x, {**{key: c[rows] for key, c in compiled.items()}, **fixed(rows)})
    return run, start
