"""In-context linear regression: a hidden weight vector w per sequence, continuous (vectors-mode) tokens.

Sequence layout (n_points examples, length t = 2·n_points, token width dim + 1), layout="pair" (default):

    position 2i     [x_i ; 0]          x_i ~ N(0, I_dim)
    position 2i+1   [x_i ; y_i]        y_i = wᵀx_i / √dim + noise·ε,   w ~ N(0, I_dim), ε ~ N(0, 1)

(layout="split" puts [0…0 ; y_i] at position 2i+1, as in Garg et al. 2022.) The last coordinate is the
"y channel", so one linear embedding reads both kinds of position. The model predicts y_i at the x_i
position (output width 1); the loss mask keeps the x positions only, so the main loss is the MSE on the y
values. The 1/√dim keeps Var(y) ≈ 1: a model with no context scores MSE ≈ 1 + noise², the Bayes-optimal
in-context learner approaches noise² once it has seen ≳ dim examples (≈ 0.12 at k = dim, noise 0.1).

`Batch.split` falls on an example boundary (the suffix starts with [x_q; 0], [x_q; y_q]), like SyntheticICL,
and `config_kwargs` sets `aux_suffix_len = 8` (the auxiliary pass scores the compiled model on the next 4
queries, each seeing the suffix before it); `info["w"]` (b, dim) is the hidden vector for probing.

Why "pair": with "split" the model must first pair y_i with x_i through a previous-token head; with "pair"
one attention layer suffices (query x_q, keys x_j, values y_j). The recipe below (templates at all four
sites, a delayed auxiliary loss, a curriculum over the active dimension) and what each part changed are
measured in docs/results.md.

    task = LinearRegression(dim=4, n_points=16)
    cfg = CGTConfig(d_x=64, n_layer=4, n_head=4, d_y=32, n_head_y=2, y_layer=2, n_templates=16,
                    sites=("attn_in", "attn_out", "mlp_in", "mlp_out"), **task.config_kwargs())
    model, history = train(CGT(cfg), task, steps=3000, batch_size=32, lr=1e-3, aux_delay=500, aux_ramp=250,
                           callbacks=[task.curriculum(1000)])
"""
from __future__ import annotations

from typing import Any

import torch

from ..plateau import NoInformationLoss
from .base import Batch, Task
from .._checks import Choice, Device, Float, Generator, Int, check_fits, checked, check_int, describe, refuse
from .icl import check_eval_size

LAYOUTS = ("pair", "split")


class LinearRegression(Task):
    """Interleaved (x_i, y_i) positions of y = wᵀx/√dim + noise; see the module docstring.

    dim              dimension of x and w (16 in the paper)
    n_points         examples per training sequence (block_size = 2·n_points)
    noise            std of the additive noise on y
    aux_min_points   the auxiliary split leaves at least this many examples in the prefix
    layout           "pair" (default): the y position carries the whole example [x_i ; y_i]; "split": it
                     carries [0…0 ; y_i] only (the model must first learn a previous-token head to pair y_i
                     with x_i; `token_shift="previous"` hands it the previous position instead, untried on
                     this task; docs/notes.md measures the two layouts)
    """

    name = "regression"

    @checked(dim=Int(1), n_points=Int(2), noise=Float(0.0), aux_min_points=Int(1), layout=Choice(*LAYOUTS))
    def __init__(self, dim: int = 16, n_points: int = 32, noise: float = 0.1, aux_min_points: int = 1,
                 layout: str = "pair"):
        check_int("aux_min_points", aux_min_points, 1, n_points - 1, hint=" (n_points − 1)")
        # sizes before anything is built: one attention map of the block (forward and backward) for one row,
        # head and layer; one sequence's inputs
        check_fits("n_points", n_points, 8 * (2 * n_points) ** 2, f"the attention over the block of {2 * n_points} "
                                                                  f"positions (2·n_points)")
        check_fits("dim", dim, 12 * 2 * n_points * (dim + 1), f"one sequence of {2 * n_points} inputs of width "
                                                              f"{dim + 1} (dim + 1)")
        self.dim, self.n_points, self.noise, self.aux_min_points = dim, n_points, float(noise), aux_min_points
        self.layout = layout
        self.active_dims = dim

    @property
    def block_size(self) -> int:
        return 2 * self.n_points

    def kwargs(self) -> dict[str, Any]:
        return {"dim": self.dim, "n_points": self.n_points, "noise": self.noise, "aux_min_points": self.aux_min_points,
                "layout": self.layout}

    def config_kwargs(self) -> dict[str, Any]:
        return {"input_dim": self.dim + 1, "output_dim": 1, "block_size": self.block_size, "aux_suffix_len": 8,
                "extra": {"task": {"name": self.name, **self.kwargs()}}}

    def __repr__(self) -> str:
        return "LinearRegression(" + ", ".join(f"{k}={v!r}" for k, v in self.kwargs().items()) + ")"

    def _assemble(self, w: torch.Tensor, x: torch.Tensor, split: torch.Tensor, generator, device) -> Batch:
        """w (b, d), x (b, n, d) -> interleaved inputs (b, 2n, d+1), targets (b, 2n, 1), mask, info."""
        b, n, d = x.shape
        y = torch.einsum("bnd,bd->bn", x, w) / d ** 0.5
        if self.noise > 0:
            y = y + self.noise * torch.randn(b, n, generator=generator)
        inputs = torch.zeros(b, n, 2, d + 1)                       # (b, n, kind, d+1), kind 0 = x, 1 = y
        inputs[:, :, 0, :d] = x
        if self.layout == "pair":
            inputs[:, :, 1, :d] = x                                # the y position repeats its x
        inputs[:, :, 1, d] = y
        inputs = inputs.flatten(1, 2)                              # (b, n, 2, d+1) -> (b, 2n, d+1)
        targets = torch.zeros(b, 2 * n, 1)
        targets[:, 0::2, 0] = y                                    # predict y_i at the x_i position
        loss_mask = torch.zeros(b, 2 * n, dtype=torch.bool)
        loss_mask[:, 0::2] = True
        return Batch(inputs, targets, loss_mask, split, {"w": w, "y": y}).to(device)

    @checked(batch_size=Int(1), part=Choice("train", "val"), generator=Generator(), device=Device())
    def get_batch(self, batch_size: int, part: str = "train", generator: torch.Generator | None = None,
                  device: str | torch.device = "cpu") -> Batch:
        """batch_size sequences of n_points examples; "train" and "val" share the distribution."""
        w = torch.randn(batch_size, self.dim, generator=generator)
        x = torch.randn(batch_size, self.n_points, self.dim, generator=generator)
        j = torch.randint(self.aux_min_points, self.n_points, (batch_size,), generator=generator)
        n = self.active_dims
        if n < self.dim:   # curriculum: only the first n coordinates live; rescale w so that Var(y) stays ≈ 1
            x[..., n:] = 0
            w = torch.cat([w[:, :n] * (self.dim / n) ** 0.5, torch.zeros_like(w[:, n:])], dim=1)
        return self._assemble(w, x, 2 * j, generator, device)

    def no_information_loss(self) -> NoInformationLoss:
        level = 1.0 + self.noise ** 2
        return NoInformationLoss(level, f"Var(y) = 1 + noise² = {level:.3f} (predicting 0 for every query)",
                                 "Likely cause: the model has not yet learned to read the demonstrations. Train "
                                 "longer, keep layout='pair', and grow the dimension with callbacks=[task.curriculum(...)].")

    def set_active_dims(self, n: int | None) -> None:
        """Train on an easier task: `get_batch` keeps only the first n coordinates of x (the rest are 0) and
        scales w by √(dim/n) so that Var(y) stays ≈ 1; None or dim restores the full task. `eval_batch`
        always draws the full task, so evaluations measure the real thing."""
        self.active_dims = self.dim if n is None else check_int("n", n, 1, self.dim)

    @checked(steps=Int(1))
    def curriculum(self, steps: int, start: int = 1):
        """A `train` callback that grows the active dimension linearly from `start` (set now) to dim at step
        `steps` (Garg et al. 2022); see the module docstring for the measured recipe.

            model, history = train(model, task, ..., callbacks=[task.curriculum(1000)])

        The dimension lives on the task, set by the callback after each step: a resumed run passes the same
        callback (its first step still draws `start` dims), and under torchrun, where only rank 0 calls
        callbacks, the other ranks would keep `start`; use it for single-process training."""
        check_int("start", start, 1, self.dim)
        self.set_active_dims(start)

        def grow(event: dict) -> None:
            if event.get("kind") == "step":
                self.set_active_dims(min(self.dim, start + (self.dim - start) * event["step"] // steps))
        return grow

    @checked(k=Int(1), batch_size=Int(1), generator=Generator(), device=Device(), n_queries=Int(1))
    def eval_batch(self, k: int, batch_size: int, generator: torch.Generator | None = None,
                   device: str | torch.device = "cpu", n_queries: int = 1) -> Batch:
        """k demonstrations then n_queries fresh query examples; split = 2k, loss_mask on the query x positions."""
        check_eval_size(k, n_queries, batch_size, self.block_size)
        w = torch.randn(batch_size, self.dim, generator=generator)
        x = torch.randn(batch_size, k + n_queries, self.dim, generator=generator)
        split = torch.full((batch_size,), 2 * k, dtype=torch.long)
        batch = self._assemble(w, x, split, generator, "cpu")
        batch.loss_mask[:, :2 * k] = False
        return batch.to(device)

    @checked(n_queries=Int(1), generator=Generator(), device=Device())
    def queries_like(self, batch: Batch, n_queries: int, generator: torch.Generator | None = None,
                     device: str | torch.device = "cpu") -> Batch:
        """n_queries fresh examples of each row's hidden w (`batch.info["w"]`) with no prompt (split 0): inputs
        (b, 2·n_queries, dim + 1), loss_mask on the x positions. The oracle fits on them (cgt_viz.oracle); the
        rows are cut into single queries, so block_size does not bound n_queries."""
        if "w" not in getattr(batch, "info", {}):
            raise refuse("batch", "a Batch of this task (its info holds the hidden w)", describe(batch), TypeError)
        w = batch.info["w"].cpu()
        x = torch.randn(len(w), n_queries, self.dim, generator=generator)
        return self._assemble(w, x, torch.zeros(len(w), dtype=torch.long), generator, device)

    def decode(self, tokens) -> list[str]:
        """Per-position labels for vectors: 'x' or 'y=0.12' (tokens is an (t, dim+1) array); a y position is
        one whose y channel is set (x positions leave it at exactly 0, in both layouts)."""
        out = []
        for v in tokens:
            v = torch.as_tensor(v)
            is_y = bool(v[-1] != 0) and (self.layout == "pair" or bool(v[:-1].abs().sum() == 0))
            out.append(f"y={float(v[-1]):.2f}" if is_y else "x")
        return out
