"""The training loop: AdamW, warm-up + cosine schedule, clipping, evaluation, callbacks, checkpoints, DDP.

    model, history = train(model, task, steps=2000, batch_size=32, lr=1e-3)

One entry point serves a notebook, the CLI and `torchrun --nproc_per_node N` (DDP, gloo on CPU, nccl on
CUDA). Choices worth knowing:

* Step numbers count *completed* optimizer steps: the first step dict has step=1, a checkpoint at step k
  holds the state after k updates, and resuming from it continues with update k+1.
* Randomness comes from named streams so that a run is a pure function of `seed`: batches are drawn with
  a torch.Generator seeded from `seed`, auxiliary splits with another, evaluation with fixed ones (so
  evaluating never changes the training trajectory), and the global torch RNG (dropout, VAE noise) is
  seeded with `seed + rank`. All of them go into each checkpoint, so resuming from step k reproduces the
  uninterrupted run bit for bit on the CPU.
* Distributed: every rank draws the *whole* global batch from the shared generator and keeps its own
  contiguous slice of `batch_size // world_size` rows. The data (and aux splits) are therefore exactly
  those of a single-process run with the same seed and batch_size, whatever the number of ranks.
  Gradients are synchronised by DDP. DDP hooks its all-reduce into `forward()`, but our training call is
  the step's loss (`model.loss(...)` for a task); so the model is wrapped in `_StepForward`, a two-line module
  whose forward *is* that loss, and DDP wraps that. At wrapping, DDP gives every rank rank 0's weights (a
  CGTLM's frozen LM too: one broadcast at the start). (All-reducing gradients by hand would also work, but gives up DDP's
  overlap of communication with the backward pass.) Only rank 0 evaluates, logs, calls callbacks and
  writes checkpoints.
* NaN/inf in any loss term or in the gradient norm stops training *before* the update with
  `TrainingDiverged` (naming the step and the term); the model keeps its last good weights and the
  checkpoint folder is left alone.
* Ctrl-C (SIGINT, also SIGTERM) is caught between steps: the step in flight finishes, a checkpoint of
  it is written (when checkpoint_dir is set), and `train` **returns normally** with
  `history.interrupted = True` — so in a notebook `model, history = train(...)` still assigns both and
  the model is never half-updated. A second Ctrl-C while the step finishes raises KeyboardInterrupt at once.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import sys
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

from ._checks import (Bool, CallableArg, CallableList, Constraint, Device, Instance, PathArg, check_device, check_dict,
                      check_divisible, checked, describe, refuse)
from ._ranks import process_group as _process_group   # tests/training/test_ddp.py imports it from here
from .checkpoint import RunLock, capture_rng, latest_checkpoint, load_checkpoint, restore_rng, save_checkpoint
from .config import with_added_fields
from .losses import LOSS_TERMS
from .plateau import PlateauDetector, PlateauWarning
from .steps import SPLIT_STREAM, TaskStep, TrainStep
from .tasks.base import Task
from .train_config import DERIVED, TrainConfig

# with steps=None the run's length is planned from the rate of this many first updates and the time budget
PLAN_AFTER = 10


class TrainingDiverged(RuntimeError):
    """A loss term or the gradient norm became NaN/inf; the model holds the weights of the last good step."""

    def __init__(self, step: int, term: str, value: float, history: "TrainHistory", checkpoint: Path | None,
                 weights_finite: bool = True, hint: str = "Try a lower lr, a longer warmup or grad_clip."):
        self.step, self.term, self.value, self.history, self.checkpoint = step, term, value, history, checkpoint
        self.weights_finite = weights_finite
        kept = (f"the last good checkpoint is {str(checkpoint)!r}" if checkpoint is not None
                else "no checkpoint was written")
        state = ("no update was applied" if weights_finite else
                 "no update was applied, but the weights are already NaN/inf: the previous update overflowed, so "
                 "reload the last good checkpoint")
        super().__init__(f"training diverged at step {step}: the {term} loss is {value} "
                         f"({state}; {kept}). {hint}")


@dataclass
class TrainHistory:
    """Per-step losses (one entry per completed step) and a list of evaluation dicts.

    `history.to_dataframe()` gives one row per step; `history.evals_dataframe()` one row per evaluation.
    """

    step: list[int] = field(default_factory=list)
    main: list[float] = field(default_factory=list)
    aux: list[float] = field(default_factory=list)
    smooth: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    grad_norm: list[float] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)
    warnings: list[dict[str, Any]] = field(default_factory=list)   # {"step", "kind", "message"}, in words
    interrupted: bool = False
    timed_out: bool = False       # stopped by the time budget (TrainConfig.minutes)
    seconds: float = 0.0

    def __len__(self) -> int:
        return len(self.step)

    def __getitem__(self, key: str):
        return getattr(self, key)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainHistory":
        check_dict("d", d, "a dict as written by TrainHistory.to_dict")
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        for name in ("step", "main", "aux", "smooth", "total", "lr", "grad_norm", "evals", "warnings"):
            if name in known and not isinstance(known[name], list):
                raise refuse(f"d[{name!r}]", "a list (one entry per step)", describe(known[name]), TypeError)
        lengths = {k: len(known[k]) for k in ("step", "main", "aux", "smooth", "total") if k in known}
        if len(set(lengths.values())) > 1:
            raise refuse("d", "per-step lists of one length", f"lengths {lengths}", verb="hold")
        return cls(**known)

    def to_dataframe(self):
        import pandas as pd
        cols = ("step", "main", "aux", "smooth", "total", "lr", "grad_norm")
        return pd.DataFrame({c: getattr(self, c) for c in cols})

    def evals_dataframe(self):
        import pandas as pd
        return pd.DataFrame(self.evals)


# ---------------------------------------------------------------------------------------------- pieces
def lr_at(step: int, steps: int, lr: float, warmup: int, min_lr_ratio: float) -> float:
    """Learning rate for update number `step` (0-based): linear warm-up to lr, then cosine to lr·min_lr_ratio."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def aux_weight_scale(step: int, delay: int, ramp: int) -> float:
    """Share of w_aux applied at update `step` (0-based): 0 before `delay`, then a linear ramp to 1."""
    if step < delay:
        return 0.0
    return 1.0 if ramp == 0 else min(1.0, (step - delay + 1) / ramp)


def resolve_device(device: str | torch.device) -> torch.device:
    """"auto" -> cuda > mps > cpu; anything else is checked to exist."""
    return check_device("device", device, allow_auto=True)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: matrices decay; biases, LayerNorm weights (all 1-D) and embedding tables do not."""
    embedding_params = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay, no_decay = [], []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.dim() < 2 or id(p) in embedding_params else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]      # an empty group would cost the optimizer a call per step


class _StepForward(nn.Module):
    """DDP synchronises gradients of what runs through forward(); this makes forward() be the step's loss."""

    def __init__(self, model: nn.Module, step: TrainStep):
        super().__init__()
        self.model, self.step = model, step

    def forward(self, batch):
        return self.step.loss(self.model, batch)


def _json_safe(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


def config_differences(saved: Any, now: Any, prefix: str = "", labels: tuple[str, str] = ("checkpoint", "now")) -> list[str]:
    """Dotted names of the entries that differ between two nested dicts, with both values."""
    if isinstance(saved, dict) and isinstance(now, dict):
        out = []
        for key in sorted(set(saved) | set(now), key=str):
            name = f"{prefix}.{key}" if prefix else str(key)
            if key not in saved or key not in now:
                out.append(f"{name} ({labels[0]} {saved.get(key, '<absent>')!r}, {labels[1]} {now.get(key, '<absent>')!r})")
            else:
                out.extend(config_differences(saved[key], now[key], name, labels))
        return out
    return [] if saved == now else [f"{prefix} ({labels[0]} {saved!r}, {labels[1]} {now!r})"]


class StopOnSignal:
    """Turns the first SIGINT/SIGTERM into a flag checked between steps; a second one raises at once."""

    def __init__(self):
        self.requested = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False


# ----------------------------------------------------------------------------------------- checks
def _check_dtypes(model: nn.Module, dev: torch.device) -> None:
    """Parameter dtypes that cannot train are named before step 1 (not reported as divergence at step 2)."""
    dtypes = {p.dtype for p in model.parameters() if p.requires_grad}
    if torch.float16 in dtypes:
        raise refuse("model parameters", "float32 or bfloat16 to train", f"float16 (on {dev.type})", TypeError,
                     hint="AdamW's eps (1e-8) underflows to 0 in float16, so the first update divides by zero. Use "
                          "model.float() (mixed precision on CUDA is automatic: amp=True)")


def _check_writable(folder: Path, model: nn.Module, keep: int) -> None:
    """The checkpoint folder can be written and the disk has room for the checkpoints (before step 1)."""
    import errno
    import shutil
    import tempfile
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-"):
            pass
    except OSError as err:
        raise OSError(err.errno, f"pre-flight: checkpoint_dir {str(folder)!r} is not writable "
                                 f"({err.strerror}); nothing was trained") from None
    n_bytes = sum(v.numel() * v.element_size() for v in model.state_dict().values())   # what a checkpoint holds
    need = 3 * n_bytes * (max(keep, 1) + 1)   # weights + 2 AdamW moments, `keep` kept and one being written
    free = shutil.disk_usage(folder).free
    if free < need:
        raise OSError(errno.ENOSPC, f"pre-flight: checkpoint_dir {str(folder)!r} has {free / 2**20:.1f} MiB free, but "
                                    f"the checkpoints need about {need / 2**20:.1f} MiB (weights and optimizer state, "
                                    f"{max(keep, 1)} kept + 1 being written); nothing was trained")

# ------------------------------------------------------------------------------------------ warnings, progress
class AuxDelayWarning(UserWarning):
    """The run ends before the auxiliary loss joins (steps <= aux_delay): ȳ is never trained to specialise."""


def _aux_never_on(cfg: TrainConfig, model: nn.Module) -> str | None:
    """Why the auxiliary loss never joins this run, in words; None when it does (or the model has none)."""
    w_aux = float(getattr(getattr(model, "config", None), "w_aux", 0.0) or 0.0)
    if not hasattr(model, "sample_split") or w_aux == 0 or cfg.steps is None or cfg.steps > cfg.aux_delay:
        return None
    return (f"steps = {cfg.steps} ends before aux_delay = {cfg.aux_delay}: the auxiliary loss is weighted 0 for the "
            f"whole run, so ȳ is never trained to specialise the model and a compiled prompt will do little. Train "
            f"for more than aux_delay steps (the auxiliary loss then ramps up over aux_ramp = {cfg.aux_ramp}), or "
            f"lower aux_delay")


def _is_terminal(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except (OSError, ValueError):       # a closed or detached stream
        return False


def _progress_bar(total: int, initial: int, *, every: int, stream: Any = None):
    """The training progress: tqdm's bar in a notebook or a terminal; in a log (the stream, stderr by default,
    is not a terminal) a `_LogProgress`, one plain line per `every` updates, since a bar redrawn with carriage
    returns is one unreadable line in a file."""
    from tqdm.asyncio import tqdm as console_tqdm
    from tqdm.auto import tqdm

    stream = sys.stderr if stream is None else stream
    if tqdm is not console_tqdm or _is_terminal(stream):      # a notebook's widget (tqdm.auto's choice), a terminal's bar
        return tqdm(total=total, initial=initial, desc="train", dynamic_ncols=True, file=stream)
    return _LogProgress(total, initial, every=every, stream=stream)


class _LogProgress:
    """Progress for a log file: one line "train step N/TOTAL (percent): main …, aux …, lr …, val_main …;
    elapsed, about … left" after every `every`-th update (after its evaluation, when it has one) and after the
    last. The same calls as the tqdm bar the loop drives (update, set_postfix, write, close), plus `step_done`."""

    def __init__(self, total: int, initial: int, *, every: int, stream: Any = None):
        self.total, self.n, self.every = total, initial, max(1, int(every))
        self.stream = sys.stderr if stream is None else stream
        self.postfix: dict[str, str] = {}
        self._start_n, self._t0 = initial, time.perf_counter()

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix(self, refresh: bool = False, **values: str) -> None:
        self.postfix.update(values)

    def step_done(self, step: int) -> None:
        if step % self.every == 0 or step == self.total:
            self.write(self.line(step))

    def line(self, step: int) -> str:
        elapsed = time.perf_counter() - self._t0
        done = step - self._start_n
        left = (self.total - step) * elapsed / done if done > 0 and self.total else None
        values = ", ".join(f"{k} {v}" for k, v in self.postfix.items())
        timing = f"{_duration(elapsed)}" + (f", about {_duration(left)} left" if left and step < self.total else "")
        of = f"/{self.total} ({100 * step / max(1, self.total):.0f}%)" if self.total else ""
        return (f"train step {step}{of}"
                + (f": {values}" if values else "") + f"; {timing}")

    def write(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def close(self) -> None:
        pass


def _duration(seconds: float) -> str:
    """Seconds, minutes or hours, whichever reads best."""
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


# ------------------------------------------------------------------------------------------------ train
class _Trainable(Constraint):
    """A model train can train: an nn.Module with a .loss (a cgt_viz CGT or GPT)."""

    refuses_only = True

    def check(self, name, value, args=None):
        if isinstance((args or {}).get("task"), TrainStep):     # the step computes the loss: any module trains
            if not isinstance(value, nn.Module):
                raise refuse(name, "an nn.Module (what the TrainStep's loss trains)", describe(value), TypeError)
        elif not isinstance(value, nn.Module) or not callable(getattr(value, "loss", None)):
            raise refuse(name, "a cgt_viz CGT or GPT (an nn.Module with .loss)", describe(value), TypeError)
        return value

    def bad_values(self):
        return ["model", None, nn.Linear(2, 2)]

    def shown(self, value):
        return type(value).__name__


# skip_nested=False: the body hands the model what the task (user code) made, and calls callbacks: the checked
# calls inside it check again. The keyword settings are TrainConfig's fields, checked by TrainConfig.build.
@checked(skip_nested=False, model=_Trainable(),
         task=Instance((Task, TrainStep), "a cgt_viz.tasks.base.Task (e.g. make_task('icl')) or a cgt_viz.steps.TrainStep"),
         config=Instance(TrainConfig, "a TrainConfig", none=True),
         eval_fn=CallableArg("a callable (model, step) -> dict", none=True),
         callbacks=CallableList("a list of callables taking one dict"), device=Device(auto=True), amp=Bool(),
         compile=Bool(), checkpoint_dir=PathArg("a checkpoint folder", none=True), resume=Bool(), progress=Bool())
def train(model: nn.Module, task: Task | TrainStep, config: TrainConfig | None = None, *,
          eval_fn: Callable[[nn.Module, int], dict[str, float]] | None = None,
          callbacks: Iterable[Callable[[dict], None]] = (), device: str | torch.device = "auto", amp: bool = True,
          compile: bool = False, checkpoint_dir: str | os.PathLike | None = None, resume: bool = False,
          progress: bool = True, **settings: Any) -> tuple[nn.Module, TrainHistory]:
    """Train `model` (CGT or GPT) on batches of `task`; returns (model, history). The model is trained in place.

    task            a Task (the model's own .loss on its batches), or any `cgt_viz.steps.TrainStep`: where the
                    batches come from and what one update optimises (`hf.distill.train_head` trains a CGTLM's
                    head on a feature cache this way); everything below is the same for every step

    config / settings  a `TrainConfig`, and/or its fields as keywords (`train(model, task, steps=2000,
                    batch_size=32, aux_delay=500)`); keywords override the config's fields. The fields:
    steps           number of optimizer updates in the whole run (a resumed run continues up to it); None with
                    `minutes`: planned after the first updates as as many as the budget allows at their rate
                    (warmup, eval_every and checkpoint_every must then be given: their defaults follow from steps)
    minutes         a time budget counted from this call: the run stops after the first update past it, with a
                    checkpoint (history.timed_out = True); the schedule still ends at `steps`
    batch_size      global batch: sequences per update over all ranks (each rank gets batch_size // world)
    lr              peak learning rate; `warmup` updates of linear warm-up (default min(100, steps // 10)),
                    then cosine decay to lr · min_lr_ratio at the last step
    weight_decay    AdamW decay for matrices (not biases, LayerNorms, embedding tables)
    grad_clip       max global gradient norm (None: no clipping)
    eval_every      evaluate every so many steps and at the last (default steps // 20; 0 = never): the mean
                    "val_main", "val_aux", "val_total" over `eval_batches` fixed validation batches of
                    batch_size, plus whatever eval_fn(model, step) returns
    callbacks       functions called with plain dicts: once before the first update {"kind": "start", "step"
                    (the first update's number − 1), "steps", "aux_delay", "aux_ramp", "weights": {"main": 1.0,
                    "aux": w_aux, "smooth": w_smooth}} (what a monitor needs to draw the run), then
                    {"kind": "step", "step", "main", "aux", "smooth", "total", "lr"} (a GPT, which has no aux or
                    smoothness term: "main" and "total"), {"kind": "eval", "step", <metric>: float, ...}, {"kind": "end", "step"},
                    and once per run {"kind": "warning", "step", "message"} when the main loss has sat at the
                    task's no-information level for plateau_steps updates (see cgt_viz.plateau)
    seed            seeds the batch, split and global torch streams (see the module docstring)
    device          "auto" (cuda > mps > cpu), "cpu", "cuda", "cuda:N", "mps"; the model is moved there
    amp             bf16 autocast on CUDA (ignored elsewhere)
    compile         torch.compile the training forward
    checkpoint_dir  folder for checkpoints (see cgt_viz.checkpoint), written every `checkpoint_every` steps
                    (default steps // 10), at the last step and on Ctrl-C; the newest `keep_checkpoints` stay (0: all)
    resume          continue from the latest checkpoint in checkpoint_dir (a fresh start if there is none);
                    the checkpoint must come from the same model config, task and hyper-parameters
                    (`steps` may differ: the cosine then ends at the new last step, the warm-up is kept).
                    Without resume, a checkpoint_dir that holds a checkpoint is an error.
    progress        show progress on stderr: tqdm's bar in a notebook or a terminal; when stderr is not a
                    terminal (a log file, a pipe) one plain line per evaluation interval, no carriage returns

    aux_delay, aux_ramp  weight the auxiliary loss by 0 for the first aux_delay updates, then ramp it linearly
                    to w_aux over aux_ramp updates (the aux term is still computed and logged; "total" is what
                    is optimised); docs/notes.md measures what this does on SyntheticICL. A CGT run with
                    steps <= aux_delay never trains the auxiliary loss: `AuxDelayWarning` (and a "warning"
                    record for the callbacks)

    Ctrl-C stops after the step in flight, checkpoints it and returns normally with history.interrupted = True.
    NaN/inf raises TrainingDiverged before the bad update (see the module docstring).
    """
    # ---------------------------------------------------------------- arguments (each declared above; here what relates them)
    cfg = TrainConfig.build(config, settings)
    step_source = task if isinstance(task, TrainStep) else TaskStep(task)
    step_source.check_fits(model)
    if cfg.steps is None:
        unset = [name for name in ("minutes", "warmup", "eval_every", "checkpoint_every") if getattr(cfg, name) is None]
        if unset:
            raise refuse("steps", "an int, or None with minutes, warmup, eval_every and checkpoint_every given",
                         f"None with {', '.join(unset)} unset",
                         hint="with steps=None the run's length is planned from the time budget `minutes`, and the "
                              "defaults of warmup, eval_every and checkpoint_every are fractions of steps")
    if resume and checkpoint_dir is None:
        raise refuse("checkpoint_dir", "set with resume=True (the folder to resume from)", "None")
    # ---------------------------------------------------------------- processes and device
    with _process_group(device) as (dev, distributed, rank, world):
        # everything is validated: hand the config, the arguments and dev, rank, world to the loop
        # one writer per checkpoint folder (rank 0 writes; the others never touch it)
        with (RunLock(checkpoint_dir, "checkpoint_dir") if checkpoint_dir is not None and rank == 0
              else contextlib.nullcontext()):
            return _run(cfg, model=model, step_source=step_source, eval_fn=eval_fn, callbacks=callbacks, amp=amp, compile=compile,
                        checkpoint_dir=checkpoint_dir, resume=resume, progress=progress, dev=dev,
                        distributed=distributed, rank=rank, world=world)


# ------------------------------------------------------------------------------------ evaluate and save
def _autocast(use_amp: bool):
    """bf16 autocast on CUDA when amp is on; a no-op context otherwise."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if use_amp else contextlib.nullcontext()


def evaluate(model: nn.Module, step_source: TrainStep, step: int, *, batch_size: int, eval_batches: int, seed: int,
             dev: torch.device, use_amp: bool = False,
             eval_fn: Callable[[nn.Module, int], dict[str, float]] | None = None) -> dict[str, float]:
    """The eval event of `step`: the mean val_<term> of each logged term over the step's `eval_batches` fixed
    validation batches (plus eval_fn's metrics). A forked global RNG: evaluating never changes the run."""
    cuda_index = (dev.index if dev.index is not None else torch.cuda.current_device()) if dev.type == "cuda" else None
    with torch.random.fork_rng(devices=[cuda_index] if cuda_index is not None else []):
        model.eval()
        terms = [t for t in ("main", "aux", "total") if t in step_source.logged_terms]
        sums = {f"val_{name}": 0.0 for name in terms}
        try:
            with torch.no_grad(), _autocast(use_amp):
                for batch in step_source.val_batches(batch_size, eval_batches, seed, dev):
                    out = step_source.loss(model, batch)
                    for name in terms:
                        sums[f"val_{name}"] += float(out[name]) / eval_batches
            metrics = {**sums, **(eval_fn(model, step) if eval_fn is not None else {})}
        finally:
            model.train()
    return {"kind": "eval", "step": step, **{k: float(v) for k, v in metrics.items()}}


def save(checkpoint_dir: str | os.PathLike, step: int, *, model: nn.Module, optimizer: torch.optim.Optimizer,
         run: dict[str, Any], rng: dict[str, Any], history: TrainHistory, keep: int, last: Path | None) -> Path:
    """Checkpoint the state after `step` updates; returns its path. `last` (the newest good checkpoint) is
    what TrainingDiverged names when the weights are NaN/inf: those never overwrite good checkpoints."""
    if not all(bool(torch.isfinite(p).all()) for p in model.parameters() if p.requires_grad):
        raise TrainingDiverged(step, "weights after the update", float("nan"), history, last, weights_finite=False)
    state = {k: v for k, v in model.state_dict().items()}
    return save_checkpoint(checkpoint_dir, step, run, state, optimizer.state_dict(), rng, history.to_dict(), keep=keep)


# ------------------------------------------------------------------------------------------------ the loop
def _run(cfg: TrainConfig, *, model: nn.Module, step_source: TrainStep, eval_fn, callbacks: list, amp: bool, compile: bool,
         checkpoint_dir, resume: bool, progress: bool, dev: torch.device, distributed: bool, rank: int,
         world: int) -> tuple[nn.Module, TrainHistory]:
    """The training loop of `train` (arguments validated there). Every setting is read from `cfg` here, so
    a TrainConfig field this function does not read is caught by tests/training/test_train.py."""
    t_call = time.perf_counter()
    steps, batch_size, seed = cfg.steps, cfg.batch_size, cfg.seed      # steps None: planned (train checked the rest)
    eval_every = DERIVED["eval_every"][1](steps) if cfg.eval_every is None else cfg.eval_every
    checkpoint_every = DERIVED["checkpoint_every"][1](steps) if cfg.checkpoint_every is None else cfg.checkpoint_every
    check_divisible("batch_size", batch_size, world, "the number of ranks")
    lo, hi = rank * (batch_size // world), (rank + 1) * (batch_size // world)
    is_main = rank == 0
    was_training = model.training
    model.to(dev).train()
    optimizer = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=cfg.betas)
    generators = {"batch": torch.Generator().manual_seed(seed),
                  "split": torch.Generator().manual_seed(seed + SPLIT_STREAM)}

    # ---------------------------------------------------------------- fresh start or resume
    found = latest_checkpoint(checkpoint_dir) if checkpoint_dir is not None else None
    if found is not None and not resume:
        raise ValueError(f"checkpoint_dir {str(checkpoint_dir)!r} already holds a checkpoint ({found.name}); "
                         f"pass resume=True to continue it, or choose another checkpoint_dir")
    ckpt = load_checkpoint(found) if found is not None else None
    if steps is None and ckpt is not None:   # a planned run resumes with the length it planned
        steps = ckpt.run["steps"]
    warmup = cfg.warmup
    if warmup is None:  # the default depends on steps; a resumed run that extends `steps` keeps its warm-up
        warmup = ckpt.run["warmup"] if ckpt is not None else DERIVED["warmup"][1](steps)
    config = getattr(model, "config", None)
    run_id = _json_safe({"model_class": type(model).__name__,
                         "config": config.to_dict() if callable(getattr(config, "to_dict", None)) else None,
                         "task": step_source.identity(), **cfg.identity(warmup)})
    history, start = TrainHistory(), 0
    if ckpt is not None:
        saved_run = {k: v for k, v in ckpt.run.items() if k != "steps"}
        if "config" in saved_run:   # a run saved before config.ADDED_FIELDS existed: the same migration as loading
            saved_run["config"] = with_added_fields(saved_run["config"])
        diff = config_differences(saved_run, run_id)
        if diff:
            raise ValueError(f"checkpoint_dir {str(checkpoint_dir)!r} was written by a different run; it differs in: "
                             + "; ".join(diff[:8]) + ". Use a new checkpoint_dir, or the settings of that run.")
        model.load_state_dict({k: v.to(dev) for k, v in ckpt.model_state.items()})
        optimizer.load_state_dict(ckpt.optimizer_state)
        restore_rng(ckpt.rng, generators)
        if rank > 0:  # rank 0 wrote the checkpoint; the other ranks need their own dropout/noise stream
            torch.manual_seed(seed + rank + ckpt.step * world)
        history, start = TrainHistory.from_dict(ckpt.history), ckpt.step
    else:
        torch.manual_seed(seed + rank)
        random.seed(seed + rank)
        np.random.seed(seed + rank)
    writes = checkpoint_dir is not None and is_main    # rank 0 writes the checkpoints
    last_ckpt: Path | None = found
    saved_step = start        # the newest step on disk (0: none)

    # ---------------------------------------------------------------- the step function
    loss_module: nn.Module = _StepForward(model, step_source)
    if distributed:
        from torch.nn.parallel import DistributedDataParallel as DDP
        loss_module = DDP(loss_module, device_ids=[dev.index] if dev.type == "cuda" else None)
    if compile:
        loss_module = torch.compile(loss_module)
    use_amp = amp and dev.type == "cuda"
    params = [p for p in model.parameters() if p.requires_grad]

    def emit(event: dict) -> None:
        for fn in callbacks:
            fn(event)

    # ---------------------------------------------------------------- pre-flight: before step 1
    # what the run will need later is checked now, so that it cannot die at its first evaluation or save
    _check_dtypes(model, dev)
    if eval_every and is_main and (steps is None or start < steps):
        step_source.preflight(model, batch_size, seed, dev)
    if writes:
        _check_writable(Path(checkpoint_dir), model, cfg.keep_checkpoints)

    has_aux = step_source.aux_schedule   # a CGT on a task; the GPT baseline has no auxiliary loss
    logged = step_source.logged_terms
    reference = step_source.no_information_loss()
    warned = any(w.get("kind") == "plateau" for w in history.warnings)   # a resumed run warns once in all
    plateau = PlateauDetector(reference, cfg.plateau_steps, cfg.plateau_tolerance, fired=warned) \
        if reference is not None else None

    # ---------------------------------------------------------------- the loop
    bar = None
    if progress and is_main:
        bar = _progress_bar(steps, start, every=eval_every or (DERIVED["eval_every"][1](steps) if steps else 50))
    t0 = time.perf_counter() - history.seconds
    deadline = None if cfg.minutes is None else t_call + 60 * cfg.minutes
    step = start
    if is_main and (steps is None or start < steps):
        cfg_m = getattr(model, "config", None)
        # a model without the context stream (the GPT baseline) has no aux or smoothness term: weight 0, so a
        # monitor neither draws them nor puts them in the total
        emit({"kind": "start", "step": start, "steps": steps, "aux_delay": cfg.aux_delay, "aux_ramp": cfg.aux_ramp,
              "weights": {"main": 1.0, "aux": float(getattr(cfg_m, "w_aux", 0.0) or 0.0) if has_aux else 0.0,
                          "smooth": float(getattr(cfg_m, "w_smooth", 0.0) or 0.0) if has_aux else 0.0}})
        message = _aux_never_on(cfg, model) if has_aux and start < cfg.aux_delay else None
        if message is not None:
            warnings.warn(message, AuxDelayWarning, stacklevel=4)   # the train() call (past _run, train, @checked)
            emit({"kind": "warning", "step": start, "message": message})
    # the random streams the loop advances, as they were after the last completed step (for a save on error;
    # Python's and NumPy's, which the loop does not touch, are read at save time: cheaper per step)
    snapshot = lambda: {"torch": torch.get_rng_state(), "generators": {n: g.get_state() for n, g in generators.items()}}
    rng_done = snapshot() if writes else None
    try:
        with StopOnSignal() as stop:
            while steps is None or step < steps:
                if steps is None and step - start == PLAN_AFTER:    # the run's length from the first updates' rate
                    plan = torch.tensor([step + max(1, int(PLAN_AFTER * 60 * cfg.minutes / (time.perf_counter() - t_call)))],
                                        device=dev)
                    if distributed:                                  # rank 0's plan, so that the ranks' lr agree
                        dist.broadcast(plan, 0)
                    steps = int(plan)
                    if bar is not None:
                        bar.total = steps
                cur_lr = lr_at(step, steps or 10 ** 9, cfg.lr, warmup, cfg.min_lr_ratio)
                for group in optimizer.param_groups:
                    group["lr"] = cur_lr
                batch = step_source.train_batch(step, batch_size, generators, dev)
                if distributed:
                    batch = step_source.shard(batch, lo, hi)
                with _autocast(use_amp):
                    out = loss_module(batch)
                aux_scale = aux_weight_scale(step, cfg.aux_delay, cfg.aux_ramp) if has_aux else 1.0
                if aux_scale < 1:
                    out = {**out, "total": out["total"] - (1 - aux_scale) * model.config.w_aux * out["aux"]}
                out["total"].backward()
                late = deadline is not None and time.perf_counter() >= deadline
                # one small all-reduce: the global-batch losses for logging, and whether any rank was interrupted
                # or is past the time budget
                report = torch.stack([torch.as_tensor(out[k], device=dev).detach().float() for k in LOSS_TERMS]
                                     + [torch.tensor(float(stop.requested), device=dev),
                                        torch.tensor(float(late), device=dev)])
                if distributed:
                    dist.all_reduce(report)
                    report[:4] /= world
                terms = dict(zip(LOSS_TERMS, report[:4].tolist()))
                stop_now, timed_out = report[4].item() > 0, report[5].item() > 0
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip) if cfg.grad_clip else
                                  torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None]))
                bad = [(k, terms[k]) for k in (*logged, *LOSS_TERMS) if not math.isfinite(terms[k])]   # the logged first
                if bad or not math.isfinite(grad_norm):
                    optimizer.zero_grad(set_to_none=True)
                    term, value = bad[0] if bad else ("gradient norm of the total", grad_norm)
                    if is_main:
                        emit({"kind": "end", "step": step})
                    finite = all(bool(torch.isfinite(p).all()) for p in params)
                    raise TrainingDiverged(step + 1, term, value, history, last_ckpt, weights_finite=finite)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                step += 1
                if rng_done is not None:
                    rng_done = snapshot()

                history.step.append(step)
                for k in LOSS_TERMS:
                    getattr(history, k).append(terms[k])
                history.lr.append(cur_lr)
                history.grad_norm.append(grad_norm)
                history.seconds = time.perf_counter() - t0
                message = plateau.update(step, terms["main"]) if plateau is not None else None
                if message is not None:
                    history.warnings.append({"step": step, "kind": "plateau", "message": message})
                    if is_main:
                        warnings.warn(message, PlateauWarning, stacklevel=4)   # the train() call (past _run, train, @checked)
                        emit({"kind": "warning", "step": step, "message": message})
                if is_main:
                    emit({"kind": "step", "step": step, **{k: terms[k] for k in LOSS_TERMS if k in logged},
                          "lr": cur_lr})
                    if bar is not None:
                        bar.update(1)
                        shown = {k: f"{terms[k]:.4g}" for k in ("main", "aux") if k in logged}
                        bar.set_postfix(**shown, lr=f"{cur_lr:.2g}", refresh=False)
                    if eval_every and (step % eval_every == 0 or step == steps):
                        event = evaluate(model, step_source, step, batch_size=batch_size, eval_batches=cfg.eval_batches,
                                         seed=seed, dev=dev, use_amp=use_amp, eval_fn=eval_fn)
                        history.evals.append({k: v for k, v in event.items() if k != "kind"})
                        emit(event)
                        if bar is not None:
                            bar.set_postfix(val_main=f"{event['val_main']:.4g}", refresh=False)
                    if isinstance(bar, _LogProgress):
                        bar.step_done(step)      # a log's line comes after the step's evaluation, with it
                # single process: also honour a Ctrl-C that came during this step's callbacks or evaluation
                stop_now = stop_now or (not distributed and stop.requested)
                if writes and (step % checkpoint_every == 0 or step == steps or stop_now or timed_out):
                    last_ckpt = save(checkpoint_dir, step, model=model, optimizer=optimizer,
                                     run={**run_id, "steps": steps}, rng=capture_rng(generators), history=history,
                                     keep=cfg.keep_checkpoints, last=last_ckpt)
                    saved_step = step
                if stop_now:
                    history.interrupted = True
                    if bar is not None:
                        bar.write(f"interrupted: stopped cleanly after step {step}"
                                  + (f"; checkpoint in {str(last_ckpt)!r}" if last_ckpt is not None else ""))
                    break
                if timed_out:
                    history.timed_out = True
                    if bar is not None:
                        bar.write(f"time budget of {cfg.minutes:g} min reached: stopped after step {step}")
                    break
    except (Exception, KeyboardInterrupt) as err:
        # an error that is not a crash (bad data at step k, a failing eval_fn or callback): save the completed
        # steps first, so that `resume=True` continues from them once it is fixed. Divergence and failed saves
        # are not retried (the weights or the disk are the problem).
        if (rng_done is not None and step > saved_step and not isinstance(err, (TrainingDiverged, OSError))
                and all(bool(torch.isfinite(p).all()) for p in params)):
            try:
                last_ckpt = save(checkpoint_dir, step, model=model, optimizer=optimizer,
                                 run={**run_id, "steps": steps}, rng={**capture_rng(generators), **rng_done},
                                 history=history, keep=cfg.keep_checkpoints, last=last_ckpt)
                saved_step = step
                note = f"the {step} completed steps were checkpointed in {str(last_ckpt)!r}; resume=True continues"
            except Exception as save_err:  # noqa: BLE001 — the original error is the one to report
                note = f"saving the {step} completed steps failed too ({type(save_err).__name__}: {save_err})"
            if hasattr(err, "add_note"):
                err.add_note(note)
            if bar is not None:
                bar.write(note)
        raise
    finally:
        if bar is not None:
            bar.close()
        model.train(was_training)
    if is_main:
        emit({"kind": "end", "step": step})
    return model, history
