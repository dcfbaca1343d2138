"""The contract every task honours, so the trainer, evaluation and widgets can treat tasks alike."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .._checks import check_device


@dataclass
class Batch:
    """One batch of sequences.

    inputs     (b, t) long tokens, or (b, t, input_dim) float vectors
    targets    (b, t) long next tokens (−100 = not scored), or (b, t, output_dim) floats
    loss_mask  (b, t) bool: positions the main loss scores (None = all)
    split      (b,) long or None: a task-chosen auxiliary split (prefix length) per row; None lets the
               model sample one within its aux bounds
    info       task-specific arrays for probing and plots, each with leading dim b
               (e.g. "task_params" (b, 2), "w" (b, 16), "topic" (b, t), "boundary" (b,))
    """

    inputs: torch.Tensor
    targets: torch.Tensor
    loss_mask: torch.Tensor | None = None
    split: torch.Tensor | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def to(self, device) -> "Batch":
        device = check_device("device", device)
        move = lambda v: v.to(device) if isinstance(v, torch.Tensor) else v
        return Batch(move(self.inputs), move(self.targets), move(self.loss_mask), move(self.split),
                     {k: move(v) for k, v in self.info.items()})


class Task:
    """Base class. Subclasses set `name` and implement `get_batch` and `config_kwargs`."""

    name: str = "task"

    def config_kwargs(self) -> dict[str, Any]:
        """The CGTConfig fields this task fixes: vocab_size or input_dim/output_dim, block_size."""
        raise NotImplementedError

    def get_batch(self, batch_size: int, part: str = "train", generator: torch.Generator | None = None,
                  device: str | torch.device = "cpu") -> Batch:
        """A batch drawn with `generator` (seeded by the caller); part is "train" or "val"."""
        raise NotImplementedError

    def decode(self, tokens) -> list[str]:
        """Per-token strings for hover text and axis labels (tokens mode)."""
        return [str(int(t)) for t in tokens]
