"""Per-position scoring shared by the model's losses, evaluation and the views, and the smoothness penalties.

Shapes: b batch, t time, v output width (vocab or output_dim), m selected positions, f features.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from .contracts import IGNORE_INDEX

LOSS_TERMS = ("main", "aux", "smooth", "total")   # the keys of every model's loss dict, in this order
AUX_LENGTH_GROUPS = 4   # the auxiliary pass runs rows in up to this many suffix-length groups
MAX_CUT_ROWS = 1024     # aux_length_groups searches the least-padding cut up to this many rows


def aux_length_groups(split: torch.Tensor) -> list[torch.Tensor]:
    """The auxiliary pass's row groups for a CPU split (b,): rows sorted by suffix length (longest first), cut
    into min(b, AUX_LENGTH_GROUPS) contiguous groups, each padded to its own longest suffix, where the padded
    positions Σ_g |g| · max suffix_g are fewest (exactly, by dynamic programming over the cut points; equal-size
    chunks pad more: benchmarks/bench_aux_layouts.py). Above MAX_CUT_ROWS rows (the search holds a b × b
    table) the groups are equal-size chunks."""
    order = torch.argsort(split, stable=True)
    n, inf = len(order), float("inf")
    if n > MAX_CUT_ROWS:
        return list(order.chunk(AUX_LENGTH_GROUPS))
    # a group of sorted rows i..j−1 pads to row i's suffix t − s_i: Σ_g |g| (t − s_first) = t·b − Σ_g |g| s_first
    first = torch.cat([split[order].double(), torch.zeros(1, dtype=torch.float64)])
    size = (torch.arange(n + 1)[None, :] - torch.arange(n + 1)[:, None]).double()          # (i, j) -> j − i
    cost = torch.where(size > 0, -size * first[:, None], torch.full_like(size, inf))
    best = torch.full((n + 1,), inf, dtype=torch.float64)
    best[n] = 0.0                                     # best[i]: the fewest positions for rows i.. in the groups left
    cuts = []
    for _ in range(min(n, AUX_LENGTH_GROUPS)):
        best, arg = (cost + best[None, :]).min(1)
        best[n] = inf                                 # every group holds at least one row
        cuts.append(arg)
    groups, i = [], 0
    for arg in reversed(cuts):
        j = int(arg[i])
        groups.append(order[i:j])
        i = j
    return groups


def per_position_loss(mode: str, out: torch.Tensor, targets: torch.Tensor,
                      loss_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Loss at every position and whether it counts: out (b, t, v), targets -> ((b, t) float, (b, t) bool).

    Cross-entropy in tokens mode (targets (b, t), −100 not scored), mean squared error over the output
    dims in vectors mode (targets (b, t, v)); loss_mask (b, t) narrows what counts."""
    if mode == "tokens":
        loss = F.cross_entropy(out.flatten(0, 1).float(), targets.flatten().clamp_min(0),
                               reduction="none").view(targets.shape)
        valid = targets != IGNORE_INDEX
    else:
        loss = (out.float() - targets.float()).pow(2).mean(-1)
        valid = torch.ones_like(loss, dtype=torch.bool)
    if loss_mask is not None:
        valid = valid & loss_mask.bool()
    return loss, valid


def masked_loss(cfg, out: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean cross-entropy (tokens) or MSE (vectors) over positions where mask is true."""
    per_pos, valid = per_position_loss(cfg.mode, out, targets, mask)
    w = valid.to(per_pos.dtype)
    return (per_pos * w).sum() / w.sum().clamp_min(1.0)


def take_positions(seq: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """seq (b, t) or (b, t, f), src (b, m) positions (clamped to t−1) -> (b, m) or (b, m, f)."""
    src = src.clamp(max=seq.shape[1] - 1)
    if seq.dim() == 3:
        src = src[..., None].expand(-1, -1, seq.shape[-1])
    return seq.gather(1, src)


def _step(mu: torch.Tensor) -> torch.Tensor:
    return (mu[:, 1:] - mu[:, :-1]).pow(2)                                   # (b, t − 1, e)


def _l2(mu: torch.Tensor, sigma: torch.Tensor | None, tau: float) -> torch.Tensor:
    return _step(mu).sum(-1).mean()


def _relative(mu: torch.Tensor, sigma: torch.Tensor | None, tau: float) -> torch.Tensor:
    spread = (mu - mu.mean((0, 1), keepdim=True)).pow(2).sum(-1).mean()
    return _step(mu).sum(-1).mean() / (2 * spread + 1e-6)


def _vae(mu: torch.Tensor, sigma: torch.Tensor | None, tau: float) -> torch.Tensor:
    tau2 = tau ** 2
    var = sigma[:, 1:].pow(2)
    return (0.5 * (var / tau2 + _step(mu) / tau2 - 1 - torch.log(var / tau2))).sum(-1).mean()


@dataclass(frozen=True)
class Smoothness:
    """One kind of smoothness term (config.smooth): its penalty (mu, sigma, tau) -> scalar, and whether ȳ is a
    posterior N(μ, σ²) (then the model learns σ, samples ȳ in training and records "ybar_sigma"; a model
    family with no σ refuses the kind)."""
    penalty: Callable[[torch.Tensor, torch.Tensor | None, float], torch.Tensor]
    posterior: bool
    doc: str


# the smoothness kinds, in the order config errors list them; adding one is a row here
SMOOTHNESS: dict[str, Smoothness] = {
    "l2": Smoothness(_l2, False, "mean_t ‖ȳ_t − ȳ_{t−1}‖²"),
    "vae": Smoothness(_vae, True, "KL( N(μ_t, σ_t²) ‖ N(μ_{t−1}, τ²) ), summed over dims, mean over tokens"),
    "relative": Smoothness(_relative, False, "the l2 step over twice the spread of ȳ across all tokens of the batch "
                           "(≈ 1 − lag-1 autocorrelation): unlike l2 it cannot be met by a constant ȳ plus a small "
                           "informative part, and it rewards ȳ that differs between sequences while drifting slowly "
                           "within one"),
}


def smoothness_penalty(kind: str, mu: torch.Tensor, sigma: torch.Tensor | None, tau: float) -> torch.Tensor:
    """How much ȳ moves from token to token: mu (b, t, e) with t >= 2 (sigma (b, t, e) for a posterior kind)
    -> scalar, by the kind's entry in SMOOTHNESS (the one implementation both model families use)."""
    return SMOOTHNESS[kind].penalty(mu, sigma, tau)
