"""Tasks: batches of sequences for training and evaluating a CGT (see base.Task for the contract).

    make_task("icl", family="affine", P=7)      SyntheticICL    pairs (u, f(u)) of a hidden f_{a,b}
    make_task("regression", dim=16)             LinearRegression  in-context linear regression (vectors)
    make_task("text", source="bbc")             TextMixture     two excerpts of different topics
    make_task("text", tokenizer="gpt2")         ... with GPT-2's BPE ("bpe": trained on the corpus, "bytes")

`task.config_kwargs()` gives the CGTConfig fields a task fixes, including
`extra={"task": {"name": ..., <constructor kwargs>}}`, so `task_from_config(model.config)` rebuilds the
task a saved model was trained on.
"""
from __future__ import annotations

import inspect
from typing import Any

from .._checks import refuse
from .base import Batch, Task
from .icl import SyntheticICL
from .regression import LinearRegression
from .text import TextMixture
from .tokenizer import ByteTokenizer, CorpusBPE, GPT2Tokenizer, tokenizer_from_spec

TASKS: dict[str, type[Task]] = {"icl": SyntheticICL, "regression": LinearRegression, "text": TextMixture}


def make_task(name: str, **kwargs: Any) -> Task:
    """Build a task by registry name ("icl", "regression", "text") with its constructor kwargs."""
    if not isinstance(name, str) or name not in TASKS:
        raise refuse("name", f"a registered task name, one of {sorted(TASKS)}", f"unknown task name {name!r}")
    try:
        return TASKS[name](**kwargs)
    except TypeError as err:
        if "unexpected keyword" in str(err):
            allowed = [p for p in inspect.signature(TASKS[name]).parameters if p != "self"]
            unknown = sorted(set(kwargs) - set(allowed))
            raise refuse(f"the arguments of task {name!r}", f"among {allowed}", f"unknown arguments {unknown}",
                         TypeError) from None
        raise


def task_from_config(cfg) -> Task:
    """Rebuild the task recorded in cfg.extra["task"] (a CGTConfig or its dict)."""
    extra = cfg.get("extra", {}) if isinstance(cfg, dict) else getattr(cfg, "extra", None)
    spec = (extra or {}).get("task")
    if not isinstance(spec, dict) or "name" not in spec:
        raise refuse("cfg.extra", "a 'task' entry {'name': ..., <kwargs>}", "no such entry" if spec is None
                     else f"extra['task'] = {spec!r}", hint="build the config with **task.config_kwargs() to record it",
                     verb="hold")
    kwargs = {k: v for k, v in spec.items() if k != "name"}
    if spec["name"] == "regression" and "layout" not in kwargs:
        kwargs["layout"] = "split"   # saved before layouts existed: the only layout there was
    if spec["name"] == "text" and "tokenizer" not in kwargs:
        kwargs["tokenizer"] = "bytes"  # saved before tokenizers were a choice: the only one there was
    if spec["name"] == "text" and (isinstance(kwargs["tokenizer"], dict) or kwargs["tokenizer"] in ("bytes", "gpt2")):
        kwargs["tokenizer"] = _recorded_tokenizer(cfg, extra, kwargs["tokenizer"])
    return make_task(spec["name"], **kwargs)


def _recorded_tokenizer(cfg, extra: dict, spec):
    """The tokenizer cfg.extra["task"]["tokenizer"] describes, checked against the config: the name it records
    (cfg.extra["tokenizer"]) and vocab_size must be this tokenizer's, or the ids would not be the model's."""
    from .tokenizer import tokenizer_from_spec
    try:
        tok = tokenizer_from_spec(spec)
    except (TypeError, ValueError) as err:
        raise ValueError(f"cfg.extra['task']['tokenizer'] does not describe a usable tokenizer: {err}") from None
    vocab_size = cfg.get("vocab_size") if isinstance(cfg, dict) else getattr(cfg, "vocab_size", None)
    name = extra.get("tokenizer")
    if (name is not None and name != tok.name) or (vocab_size is not None and vocab_size != tok.vocab_size):
        raise ValueError(f"tokenizer mismatch: the config was trained with tokenizer {name!r} and vocab_size "
                         f"{vocab_size} (cfg.extra['tokenizer'], cfg.vocab_size), but cfg.extra['task']['tokenizer'] "
                         f"builds {tok.name!r} with {tok.vocab_size} tokens; the tokenizer data was swapped or edited, "
                         f"so the model would read other ids than it was trained on")
    return tok


__all__ = ["Batch", "Task", "SyntheticICL", "LinearRegression", "TextMixture", "ByteTokenizer", "GPT2Tokenizer",
           "CorpusBPE", "tokenizer_from_spec", "TASKS",
           "make_task", "task_from_config"]
