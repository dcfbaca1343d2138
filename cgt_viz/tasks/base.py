"""The contract every task honours, so the trainer, evaluation and widgets can treat tasks alike."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .._checks import Has, check_device, refuse


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

    def no_information_loss(self):
        """The main loss of a model that ignores the context (a `plateau.NoInformationLoss`), or None when the
        task has no such level; `train` warns when a run stays there (see `cgt_viz.plateau`)."""
        return None

    def decode(self, tokens) -> list[str]:
        """Per-token strings for hover text and axis labels (tokens mode)."""
        return [str(int(t)) for t in tokens]

    def check_fits(self, config, name: str = "task") -> None:
        """ValueError unless this task's sequences fit a model with `config`: the same mode, tokens below its
        vocab_size or the same input/output dims, and a block_size no longer than the model's."""
        try:
            want = self.config_kwargs()
        except NotImplementedError:   # a custom task that does not say what it fixes: nothing to compare
            return
        cfg = config
        if "vocab_size" in want:
            gives = f"tokens (vocab_size={want['vocab_size']})"
        else:
            gives = f"vectors (input_dim={want.get('input_dim')}, output_dim={want.get('output_dim')})"
        reads = (f"tokens (vocab_size={cfg.vocab_size})" if cfg.mode == "tokens"
                 else f"vectors (input_dim={cfg.input_dim}, output_dim={cfg.output_dim})")
        fits = (cfg.mode == "tokens" and "vocab_size" in want and want["vocab_size"] <= cfg.vocab_size) or \
               (cfg.mode != "tokens" and "vocab_size" not in want and want.get("input_dim") == cfg.input_dim
                and want.get("output_dim") == cfg.output_dim)
        trained, used = (cfg.extra or {}).get("tokenizer"), (want.get("extra") or {}).get("tokenizer")
        if not fits:
            misfit = f"{type(self).__name__}, which gives {gives} but the model reads {reads}"
        elif isinstance(trained, str) and isinstance(used, str) and trained != used:
            misfit = f"a task that uses tokenizer {used!r}: the model was trained with tokenizer {trained!r} but the " \
                     f"task uses {used!r}; rebuild the task with cgt_viz.tasks.task_from_config(model.config)"
        elif want.get("block_size", 0) > cfg.block_size:
            misfit = f"{type(self).__name__} with block_size={want['block_size']}, but the model only takes " \
                     f"{cfg.block_size} positions; the task's block_size must be <= {cfg.block_size}"
        else:
            return
        raise refuse(name, "the model", misfit, hint="pass the task the model was trained on", verb="fit")


def check_task_fits(model: Any, task: Any, name: str = "task", *, needs: str = "get_batch") -> None:
    """TypeError unless `task` is a task object with the method `needs`; then `Task.check_fits` against the
    model's config (a duck-typed task that is no Task subclass is compared the same way)."""
    Has(needs, "config_kwargs", what=f"a task with {needs}() and config_kwargs() (e.g. make_task('icl'))").check(
        name, task)
    check = task.check_fits if isinstance(task, Task) else Task.check_fits.__get__(task)
    check(model.config, name)
