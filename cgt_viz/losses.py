"""Per-position scoring shared by the model's losses, evaluation and the views.

Shapes: b batch, t time, v output width (vocab or output_dim), m selected positions, f features.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .contracts import IGNORE_INDEX


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
