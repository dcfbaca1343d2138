"""What one training update reads and optimises: the variation point of `train`.

`train` owns everything a run shares whatever it trains: the AdamW schedule, clipping, the divergence stop,
DDP, checkpoints, the stop flag, the time budget, evaluation's timing, progress and history. A `TrainStep`
says the rest, in the manner of PEFT's `LoraVariant`: where a batch comes from, how a global batch is cut for
one rank, and the loss of one update. Two steps exist:

* `TaskStep(task)`: a CGT or GPT on a `Task`'s batches (what `train(model, task)` builds for a task);
* `hf.distill.CachedHeadStep(cache)`: the head of a `CGTLM` on a feature cache of the frozen LM (what
  `train_head` hands to `train`).

A step's `loss` returns the four `LOSS_TERMS` ("main", "aux", "smooth", "total"); "total" is optimised, the
others are logged (a step without a term returns 0 for it and says so in `logged_terms`).
"""
from __future__ import annotations

from typing import Any, Iterator

import torch
import torch.nn as nn

from .losses import LOSS_TERMS
from .tasks.base import Batch, Task, check_task_fits

# offsets that separate the random streams derived from one seed
SPLIT_STREAM, VAL_STREAM, VAL_SPLIT_STREAM = 1_000_003, 2_000_029, 3_000_017


def check_batch(model: nn.Module, batch: Batch, where: str) -> None:
    """Bad data named as bad data: which batch, which field (not 'diverged' or 'idx must be finite')."""
    param = next(model.parameters(), None)
    for field_name in ("inputs", "targets"):
        value = getattr(batch, field_name)
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            continue
        if field_name == "inputs" and param is not None and value.dtype != param.dtype:
            raise TypeError(f"{where}: batch.inputs has dtype {str(value.dtype).replace('torch.', '')} but the model's "
                            f"parameters are {str(param.dtype).replace('torch.', '')}; in vectors mode they must match: "
                            f"use model.float() (or make the task return {str(param.dtype).replace('torch.', '')})")
        if bool(torch.isfinite(value.sum())) or bool(torch.isfinite(value).all()):  # one reduction when clean
            continue
        finite = torch.isfinite(value)
        bad = (~finite).nonzero()
        first = tuple(int(i) for i in bad[0])
        where_masked = ""
        mask = batch.loss_mask
        if (field_name == "targets" and isinstance(mask, torch.Tensor) and mask.dim() <= value.dim()
                and tuple(mask.shape) == tuple(value.shape[:mask.dim()])):
            bad_at = (~finite).reshape(*mask.shape, -1).any(-1)
            if not bool((bad_at & mask.bool()).any()):
                where_masked = (" (all at positions loss_mask leaves unscored: they still enter the loss as "
                                "0 · NaN = NaN, so replace them with 0)")
        raise ValueError(f"{where}: batch.{field_name} holds NaN/inf in {len(bad)} of {value.numel()} entries "
                         f"(the first at index {first}){where_masked}. The data is bad, not the training: fix the "
                         f"task's get_batch")


def class_name(cls: type) -> str:
    """module.QualifiedName of a class: how a step's identity names what it trains on."""
    return f"{cls.__module__}.{cls.__qualname__}"


class TrainStep:
    """The protocol: every method a training run calls on its step. Subclasses override all but the ones
    with a default here."""

    #: the terms shown in step events and the progress line (all four are in the history)
    logged_terms: tuple[str, ...] = ("main", "total")
    #: whether train's aux_delay / aux_ramp reweight this step's "aux" term inside "total"
    aux_schedule: bool = False

    def identity(self) -> dict[str, Any]:
        """What identifies the data and objective for the resume check (JSON-able)."""
        raise NotImplementedError

    def check_fits(self, model: nn.Module) -> None:
        """Refuse, before anything runs, a model this step cannot train."""

    def train_batch(self, step: int, batch_size: int, generators: dict[str, torch.Generator],
                    device: torch.device) -> Any:
        """The global batch of update `step` + 1, drawn from `generators` ("batch", "split": checkpointed by
        train, so a resumed run draws what the uninterrupted one would)."""
        raise NotImplementedError

    def val_batches(self, batch_size: int, n_batches: int, seed: int, device: torch.device) -> Iterator[Any]:
        """The fixed validation batches of one evaluation (the same at every evaluation)."""
        raise NotImplementedError

    def shard(self, batch: Any, lo: int, hi: int) -> Any:
        """Rows lo:hi of a global batch: one rank's part under DDP."""
        raise NotImplementedError

    def loss(self, model: nn.Module, batch: Any) -> dict[str, torch.Tensor]:
        """The LOSS_TERMS of `batch`; "total" is what the update optimises."""
        raise NotImplementedError

    def no_information_loss(self) -> float | None:
        """The main loss of a model that learnt nothing (for the plateau warning); None: no warning."""
        return None

    def preflight(self, model: nn.Module, batch_size: int, seed: int, device: torch.device) -> None:
        """What the run's first evaluation will need, checked before step 1."""


class TaskStep(TrainStep):
    """A cgt_viz CGT or GPT trained on `task`'s batches with its own `.loss` (the auxiliary split drawn here
    when the task gives none, so that DDP shards see the split of a one-process run)."""

    def __init__(self, task: Task):
        self.task = task

    def check_fits(self, model: nn.Module) -> None:
        check_task_fits(model, self.task)   # named here, not reported as a bad idx at the first step
        self._model = model
        # the GPT baseline has no auxiliary or smoothness term
        self.aux_schedule = hasattr(model, "sample_split")
        self.logged_terms = LOSS_TERMS if self.aux_schedule else ("main", "total")

    def identity(self) -> dict[str, Any]:
        """The task's class, name and the config fields it fixes."""
        task = self.task
        ident: dict[str, Any] = {"class": class_name(type(task)),
                                 "name": getattr(task, "name", None)}
        try:
            ident["config_kwargs"] = task.config_kwargs()
        except NotImplementedError:
            pass
        return ident

    def _split(self, batch: Batch, generator: torch.Generator, always: bool) -> torch.Tensor | None:
        """The auxiliary split per row: the task's, else sampled here."""
        if batch.split is not None:
            return batch.split
        sample = getattr(self._model, "sample_split", None)
        if sample is None or not (always or self._model.config.w_aux > 0):
            return None
        return sample(batch.inputs.shape[0], batch.inputs.shape[1], generator=generator, device=batch.inputs.device)

    def train_batch(self, step, batch_size, generators, device):
        batch = self.task.get_batch(batch_size, part="train", generator=generators["batch"], device=device)
        check_batch(self._model, batch, f"the training batch of step {step + 1}")
        return batch, self._split(batch, generators["split"], always=False)

    def val_batches(self, batch_size, n_batches, seed, device):
        val_gen = torch.Generator().manual_seed(seed + VAL_STREAM)
        split_gen = torch.Generator().manual_seed(seed + VAL_SPLIT_STREAM)
        for _ in range(n_batches):
            batch = self.task.get_batch(batch_size, part="val", generator=val_gen, device=device)
            yield batch, self._split(batch, split_gen, always=True)

    def shard(self, batch, lo, hi):
        batch, split = batch
        b = batch.inputs.shape[0]
        cut = lambda v: v[lo:hi] if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == b else v
        return (Batch(cut(batch.inputs), cut(batch.targets), cut(batch.loss_mask), cut(batch.split),
                      {k: cut(v) for k, v in batch.info.items()}), cut(split))

    def loss(self, model, batch):
        batch, split = batch
        return model.loss(batch.inputs, batch.targets, batch.loss_mask, split=split)

    def no_information_loss(self):
        fn = getattr(self.task, "no_information_loss", None)
        return fn() if callable(fn) else None

    def preflight(self, model, batch_size, seed, device):
        with torch.random.fork_rng(devices=[]):
            try:
                probe = self.task.get_batch(batch_size, part="val",
                                            generator=torch.Generator().manual_seed(seed + VAL_STREAM), device=device)
            except (ValueError, IndexError, RuntimeError) as err:
                raise ValueError(f"pre-flight: the evaluation batches cannot be built: task.get_batch(batch_size="
                                 f"{batch_size}, part='val') fails: {err}. Nothing was trained; fix the task's "
                                 f"validation split, lower batch_size, or pass eval_every=0 (no evaluation)") from None
        check_batch(model, probe, "the validation batch (pre-flight)")


class FullBatchStep(TrainStep):
    """Every update on the same data: `objective()` -> the scalar to minimise, e.g. a per-prompt LoRA's KL to
    its teacher (`lora_baseline.fit_factors`). The module `train` trains is whatever holds the parameters the
    objective reads (a `Parameters`); under DDP every rank computes the whole batch, so the update is one
    process's. No validation stream: train it with eval_every=0."""

    logged_terms = ("main", "total")

    def __init__(self, objective, name: str):
        self.objective, self.name = objective, name

    def identity(self) -> dict[str, Any]:
        return {"class": class_name(type(self)), "name": self.name}

    def train_batch(self, step, batch_size, generators, device):
        return None

    def val_batches(self, batch_size, n_batches, seed, device):
        raise ValueError(f"{self.name}: a FullBatchStep has no validation stream; train it with eval_every=0")

    def shard(self, batch, lo, hi):
        return batch

    def loss(self, model, batch):
        value = self.objective()
        zero = torch.zeros((), device=value.device)
        return {"main": value, "aux": zero, "smooth": zero, "total": value}


class Parameters(nn.Module):
    """A module that holds given parameters (and nothing else), so that `train` can optimise tensors that live
    elsewhere: the LoRA factors a functional call reads, or the adapters inside a peft model kept in eval mode."""

    def __init__(self, params):
        super().__init__()
        self.held = nn.ParameterList(params)
