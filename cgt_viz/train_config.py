"""TrainConfig: the settings that define a training run, declared once.

`train()` reads it, every checkpoint records it (`identity()`: the fields a resumed run must share),
the CLI generates its `train` flags from its fields (help text and contract included), and run.json stores
it. Each field carries its contract (`_checks.Constraint`) and a one-line help in its metadata.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ._checks import Constraint, Float, Instance, Int, Seq, check_dict, refuse

SEED_MAX = 2**63 - 1   # every seed a user types; offsets added to it stay inside torch's 64-bit range


def _setting(default: Any, check: Constraint | None, help: str) -> Any:
    return field(default=default, metadata={"check": check, "help": help})


@dataclass(frozen=True)
class TrainConfig:
    steps: int | None = _setting(2000, Int(1, none=True, hint=" (None: planned from minutes)"),
                                 "optimizer updates in the whole run (a resumed run continues up to it); None: as "
                                 "many as `minutes` allows at the rate of the first updates")
    batch_size: int = _setting(32, Int(1), "global batch: sequences per update over all ranks")
    lr: float = _setting(1e-3, Float(0.0, lo_open=True), "peak learning rate")
    warmup: int | None = _setting(None, Int(0, none=True, hint=" (number of updates)"),
                                  "linear warm-up updates, then cosine decay")
    min_lr_ratio: float = _setting(0.1, Float(0.0, 1.0), "the cosine ends at lr * min_lr_ratio")
    weight_decay: float = _setting(0.01, Float(0.0), "AdamW decay of matrices (not biases, norms, embeddings)")
    betas: tuple[float, float] = _setting((0.9, 0.999), Seq(Float(0.0, 1.0, hi_open=True), 2, "a pair (beta1, beta2) "
                                          "of numbers in [0, 1)"), "AdamW betas, two numbers in [0, 1)")
    grad_clip: float | None = _setting(1.0, Float(0.0, lo_open=True, none=True),
                                       "max global gradient norm (None: no clipping)")
    eval_every: int | None = _setting(None, Int(0, none=True, hint=" (0 = never)"),
                                      "evaluate every so many updates and at the last (0 = never)")
    eval_batches: int = _setting(4, Int(1), "validation batches per evaluation")
    checkpoint_every: int | None = _setting(None, Int(1, none=True),
                                            "checkpoint every so many updates")
    keep_checkpoints: int = _setting(2, Int(0, hint=" (0 = keep all)"), "newest checkpoints kept (0: all)")
    seed: int = _setting(0, Int(0, SEED_MAX, hint=" (torch's generators take a 64-bit seed; the splits add offsets)"),
                         "seeds the model init (CLI), the batches, the splits and torch's RNG")
    aux_delay: int = _setting(0, Int(0, hint=" (number of updates)"), "updates with the auxiliary loss weighted 0")
    aux_ramp: int = _setting(0, Int(0, hint=" (number of updates)"), "then updates to ramp its weight up to w_aux")
    plateau_steps: int = _setting(500, Int(0, hint=" (number of updates; 0 = never warn)"),
                                  "warn once the main loss has sat at the task's no-information level this long")
    plateau_tolerance: float = _setting(0.02, Float(0.0, lo_open=True),
                                        "relative distance from that level that still counts as on it")
    minutes: float | None = _setting(None, Float(0.0, lo_open=True, none=True),
                                     "a time budget: stop (with a checkpoint) at the first update past it, counted "
                                     "from the call (None: no budget)")

    # may change between a run and its resumption; every other field must match the checkpoint's
    RESUMABLE = ("steps", "eval_every", "eval_batches", "checkpoint_every", "keep_checkpoints", "plateau_steps",
                 "plateau_tolerance", "minutes")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            check = f.metadata.get("check")
            if check is not None:
                object.__setattr__(self, f.name, check.check(f.name, getattr(self, f.name)))

    @classmethod
    def build(cls, config: "TrainConfig | None" = None, settings: dict[str, Any] | None = None) -> "TrainConfig":
        """`config` (or the defaults) with `settings` (field name -> value) applied; unknown names are refused."""
        Instance(cls, "a TrainConfig", none=True).check("config", config)
        settings = dict(settings or {})
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(settings) - set(names))
        if unknown:
            raise refuse("settings", "TrainConfig fields", f"unknown training settings {unknown}", TypeError,
                         hint=f"the TrainConfig fields are {names}", verb="name")
        return dataclasses.replace(config, **settings) if config is not None else cls(**settings)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        return cls.build(None, check_dict("d", d, "a dict of TrainConfig fields (as written by to_dict)"))

    def identity(self, warmup: int) -> dict[str, Any]:
        """What a checkpoint records and a resumed run must match: every field but RESUMABLE, with the
        warm-up resolved (its default depends on steps, which may change on resume)."""
        d = {k: v for k, v in self.to_dict().items() if k not in self.RESUMABLE}
        d["warmup"] = warmup
        return d


# The fields whose None means a value that follows from the run's steps: {field: (the rule in words, the rule)}.
# train() applies them; `train --help` shows them, with the number for the run's steps.
DERIVED: dict[str, tuple[str, Any]] = {
    "warmup": ("min(100, steps // 10)", lambda steps: min(100, steps // 10)),
    "eval_every": ("max(1, steps // 20)", lambda steps: max(1, steps // 20)),
    "checkpoint_every": ("max(1, steps // 10)", lambda steps: max(1, steps // 10)),
}


def settings_help() -> dict[str, str]:
    """{field: help} for generated command-line flags."""
    return {f.name: f.metadata["help"] for f in dataclasses.fields(TrainConfig)}
