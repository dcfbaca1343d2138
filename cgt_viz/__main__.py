"""The command line: train, evaluate and report on runs kept in folders.

    python -m cgt_viz train --task icl --out runs/shift --steps 2000 --task-arg family=shift
    python -m cgt_viz train --out runs/shift --resume          # continue it (settings come from run.json)
    python -m cgt_viz train --task regression --recipe regression-dim16 --out runs/r16   # a named recipe
    python -m cgt_viz evaluate runs/shift                       # prompted / specialised / no-context table
    python -m cgt_viz report runs/shift                         # runs/shift/report.html, works offline
    python -m cgt_viz train-head --out runs/head                # a CGT head over the frozen SmolLM2 (cgt_viz.hf)
    python -m cgt_viz train --task smollm2-bbc --out runs/head --minutes 25   # the same, from train
    torchrun --nproc_per_node 2 -m cgt_viz train ...            # the same, data-parallel (DDP)
    python -m cgt_viz train --out runs/mine --resume --task mymod:MyTask   # your own Task: typed again

A run folder is data: run.json names its task, and only registered names (icl, regression, text) are
built from it. A pretrained-LM task (smollm2-bbc: a CGT head over the frozen SmolLM2 on BBC) is trained by
train-head's pipeline (cgt_viz/hf/head_run.py): train's flags that mean the same there are translated, the
head's own settings are --task-arg key=value, and `train --out OUT --resume` continues it like any run. A "module:Class" task of your own is imported only when typed on the command line.

A run folder holds run.json (the command's settings, written first), ckpt/ (checkpoints, see
cgt_viz.checkpoint), and at the end model/ (save_pretrained) and history.json.
Exit codes: 0 done, 1 training diverged (NaN/inf), 2 bad input or a folder in use (message, no traceback),
3 an OS error (disk full, no permission, a path of the wrong kind: one line saying what and where),
130 interrupted (a checkpoint was written; `--resume` continues).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from ._checks import THREADS_MAX, Int
from .train_config import DERIVED, TrainConfig, settings_help

RUN_FILE = "run.json"
TASK_NAMES = ("icl", "regression", "text")
PRETRAINED_TASKS = ("smollm2-bbc",)   # trained by cgt_viz.hf.head_run (a head over a frozen LM)

# What defines a run besides the TrainConfig fields (whose flags are generated from the dataclass) and the
# model flags: None means "the task's recipe (cgt_viz.recipes), else the library default".
# "recipe": the named recipe (cgt_viz.recipes) the run's defaults came from, chosen by --recipe or by the task's
# arguments, and kept in run.json so that a run says which recipe it trained
RUN_DEFAULTS: dict[str, Any] = {"task": None, "model": "cgt", "task_arg": [], "curriculum": None, "recipe": None}
MODEL_FLAGS = ("n_layer", "d_x", "n_head", "d_y", "n_head_y", "y_layer", "n_templates", "template_rank", "mlp_ratio",
               "dropout", "w_aux", "w_smooth", "smooth", "y_reads", "sites", "aux_row_fraction", "memory_layers",
               "memory_rank")

MODEL_HELP = {"n_layer": "N, blocks in all", "d_x": "width of x", "n_head": "heads of x",
              "d_y": "width of y and of the summary ȳ", "n_head_y": "heads of y",
              "y_layer": "ℓ: ȳ = LN(y_ℓ); layers ℓ+1..N are modulated", "n_templates": "K, templates per site",
              "template_rank": "r, rank of each template", "mlp_ratio": "MLP hidden width / width",
              "dropout": "dropout probability", "w_aux": "weight of the auxiliary (specialisation) loss",
              "w_smooth": "weight of the smoothness term of ȳ", "smooth": "kind of smoothness term: l2, vae, relative",
              "y_reads": "y block reads x after its x block (post) or before it (pre)",
              "sites": "comma-separated subset of attn_in,attn_out,mlp_in,mlp_out",
              "aux_row_fraction": "share of the rows the auxiliary pass runs on in training",
              "memory_layers": "token memory at the MLP output map of the top this many layers (0: none)",
              "memory_rank": "width of the token memory's shared key read-out"}

# The CLI's own numeric flags, declared like the TrainConfig fields (a flag left out is None: not checked)
FLAG_CONSTRAINTS = {"curriculum": Int(0, hint=" (0 = off)"),
                    "threads": Int(1, THREADS_MAX, hint=" (a few times this machine's cores)")}


class CLIError(Exception):
    """A problem with the user's input: printed as 'error: …' with exit code 2."""


# ------------------------------------------------------------------------------------------- parsing
def _parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command line's parser; `argv` (the command's words) picks the task whose defaults `train --help`
    shows (`--task`, `--task-arg`, `--recipe`, `--steps` given there)."""
    from .recipes import RECIPE_NAMES

    p = argparse.ArgumentParser(prog="python -m cgt_viz", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    shown = _help_defaults(argv)
    t = sub.add_parser("train", help="train a CGT (or a GPT baseline) on a task; checkpoints into OUT/ckpt",
                       epilog=shown.pop("", None))
    t.add_argument("--task", help=f"one of {', '.join(TASK_NAMES)}, or module:Class for your own Task subclass; "
                                  f"{', '.join(PRETRAINED_TASKS)}: a CGT head over a frozen pretrained LM "
                                  f"(train-head's pipeline; its settings as --task-arg)")
    t.add_argument("--out", required=True, help="run folder, e.g. runs/NAME")
    t.add_argument("--recipe", metavar="NAME",
                   help=f"the named recipe of --task whose settings are the defaults, whatever the --task-arg: one "
                        f"of {', '.join(RECIPE_NAMES)} ({shown['recipe']})")
    t.add_argument("--model", choices=("cgt", "gpt"), help="cgt or the plain gpt baseline (default: cgt)")
    for name, text in settings_help().items():   # one flag per TrainConfig field
        t.add_argument("--" + name.replace("_", "-"), dest=name, type=_flag_type(name), metavar=name.upper(),
                       help=f"{text} ({shown[name]})".replace("%", "%%"))
    t.add_argument("--curriculum", type=int, help="updates of the task's curriculum (regression: the live "
                   "dimensions of x grow from 1; icl: the share of pure shifts falls from 1; 0 = off) "
                   f"({shown['curriculum']})")
    t.add_argument("--device", default="auto", help="auto (cuda > mps > cpu), cpu, cuda, cuda:N, mps")
    t.add_argument("--threads", type=int, help="CPU threads for torch (default: torch's choice); 1 on a busy machine")
    t.add_argument("--compile", action="store_true", help="torch.compile the training step")
    t.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    t.add_argument("--no-progress", action="store_true", help="no progress (a bar in a terminal, a line per "
                   "evaluation interval in a log)")
    for name in MODEL_FLAGS:
        t.add_argument("--" + name.replace("_", "-"), type=_model_flag_type(name), dest=name,
                       help=f"{MODEL_HELP[name]} ({shown[name]})".replace("%", "%%"))
    t.add_argument("--task-arg", action="append", metavar="KEY=VALUE",
                   help="a task constructor argument (repeatable), e.g. --task-arg family=affine --task-arg P=7 "
                        f"({shown['task_arg']})".replace("%", "%%"))

    e = sub.add_parser("evaluate", help="compare prompted, specialised and no-context models of a run")
    e.add_argument("run", help="run folder written by train")
    e.add_argument("--k", default="4,8,16", help="prompt sizes, comma-separated (default 4,8,16)")
    e.add_argument("--n-batches", type=int, default=4)
    e.add_argument("--batch-size", type=int, default=64)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--baseline", help="run folder of a GPT baseline trained on the same task")
    e.add_argument("--device", default="auto")
    e.add_argument("--task", help="only for a run of your own module:Class task: the same module:Class, typed here "
                                  "(a run folder is data; nothing named in it is imported)")
    e.add_argument("--threads", type=int, help="CPU threads for torch")

    h = sub.add_parser("train-head", add_help=False,
                       help="train a CGT head over the frozen SmolLM2 on BBC by context distillation (a feature "
                            "cache, then the head; resumable): python -m cgt_viz train-head --help")
    h.add_argument("head_args", nargs=argparse.REMAINDER)

    r = sub.add_parser("report", help="write a self-contained HTML report (loss curves, settings, evaluation)")
    r.add_argument("run", help="run folder written by train")
    r.add_argument("--output", help="HTML file (default RUN/report.html); - writes the page to stdout")
    return p


def _help_defaults(argv: Sequence[str] | None) -> dict[str, str]:
    """{flag: "default: VALUE"} for `train --help`: the value a run takes when the flag is left out, for the
    task named by --task in `argv` (its recipe, with the variant its --task-arg select), else the library's
    value followed by each recipe that differs. Settings whose default follows from steps get the number for
    the run's steps. Key "": a closing note (the epilog)."""
    from .config import CGTConfig
    from .recipes import RECIPES, recipe_for

    pre = argparse.ArgumentParser(add_help=False)
    for flag in ("--task", "--steps", "--recipe"):
        pre.add_argument(flag)
    pre.add_argument("--task-arg", action="append")
    known = pre.parse_known_args(list(argv or []))[0]
    base_model = {f.name: f.default for f in dataclasses.fields(CGTConfig) if f.name in MODEL_FLAGS}

    def values(task: str | None, task_args: dict[str, Any], name: str | None = None) -> dict[str, Any]:
        recipe = {}
        if task not in RECIPES:
            name = None
        else:
            try:
                recipe = recipe_for(task, task_args, name)
            except ValueError:      # not a recipe of this task: the run refuses it; help shows the task's default
                name, recipe = None, recipe_for(task, task_args)
        out = {**TrainConfig().to_dict(), **recipe.get("train", {}), **base_model, **recipe.get("model", {}),
               "curriculum": recipe.get("curriculum") or 0, "task_arg": recipe.get("task", {}),
               "recipe": _recipe_name(task, task_args, name) or "none"}
        return {k: (",".join(v) if k == "sites" else v) for k, v in out.items()}

    def derived(name: str, steps: int) -> str | None:     # what train() makes of None
        return f"{DERIVED[name][0]} = {DERIVED[name][1](steps)}" if name in DERIVED else None

    def fmt(name: str, value: Any, steps: int, short: bool = False) -> str:
        if value is None and derived(name, steps):
            text = derived(name, steps)
            return text.rpartition(" = ")[2] if short else text
        if name == "task_arg":
            return " ".join(f"{k}={v}" for k, v in value.items()) or "none"
        if name == "betas":
            return ",".join(str(b) for b in value)
        return "off" if name == "curriculum" and not value else str(value)

    def steps_of(vals: dict[str, Any]) -> int:
        try:
            return int(known.steps)
        except (TypeError, ValueError):
            return int(vals["steps"])

    names = [*TrainConfig().to_dict(), *MODEL_FLAGS, "curriculum", "task_arg", "recipe"]
    task = known.task
    if task in PRETRAINED_TASKS:
        return {**{n: "train-head's default: python -m cgt_viz train-head --help" for n in names},
                "": f"--task {task} is trained by train-head's pipeline: its defaults are in "
                    f"python -m cgt_viz train-head --help"}
    if task is not None:
        try:
            task_args = _task_kwargs(known.task_arg)
        except CLIError:
            task_args = {}
        vals = values(task, task_args, known.recipe)
        steps = steps_of(vals)
        where = f"--task {task}" + "".join(f" --task-arg {k}={v}" for k, v in task_args.items()) + \
            (f" --recipe {vals['recipe']}" if known.recipe == vals["recipe"] else "")
        note = (f"defaults shown for {where}: its recipe (cgt_viz.recipes), else the library's"
                if task in RECIPES else f"defaults shown for --task {task}: the library's (no recipe)")
        return {**{n: f"default: {fmt(n, vals[n], steps)}" for n in names}, "": note}
    base = values(None, {})
    per_task = {name: values(name, {}) for name in RECIPES}
    shown = {}
    for n in names:
        text = f"default: {fmt(n, base[n], steps_of(base))}"
        differ = [f"{t} {fmt(n, v[n], steps_of(v), short=True)}" for t, v in per_task.items()
                  if fmt(n, v[n], steps_of(v)) != fmt(n, base[n], steps_of(base))]
        shown[n] = text + (f"; --task {', '.join(differ)}" if differ else "")
    # each task's own recipe is named after it, so a per-task list would only repeat the task names
    shown["recipe"] = "default: the task's own (named after it), or the variant its --task-arg select"
    shown[""] = ("defaults: each task's recipe (cgt_viz.recipes), else the library's; "
                 "python -m cgt_viz train --task NAME --help shows one task's values")
    return shown


def _flag_type(name: str):
    """The argparse type of a TrainConfig field: int or float as its contract says, "none" where None is allowed,
    betas as "b1,b2" (the values are checked by TrainConfig itself, with its messages)."""
    from ._checks import Float, Int

    if name == "betas":
        return lambda text: tuple(float(x) for x in text.split(","))
    check = next(f.metadata["check"] for f in dataclasses.fields(TrainConfig) if f.name == name)
    kind = int if isinstance(check, Int) else float if isinstance(check, Float) else str
    if getattr(check, "none", False):
        return lambda text: None if text.lower() == "none" else kind(text)
    return kind


def _model_flag_type(name: str):
    """int, float or str as the CGTConfig field is annotated (the values are checked by CGTConfig itself)."""
    from .config import CGTConfig

    kind = next(str(f.type) for f in dataclasses.fields(CGTConfig) if f.name == name)
    return int if kind.startswith("int") else float if kind.startswith("float") else str


def _task_value(text: str) -> Any:
    """'7' -> 7, '0.5' -> 0.5, 'true'/'True' -> True, '[1,2]' -> [1, 2], anything else stays a string."""
    if text in ("True", "False"):
        return text == "True"
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _task_kwargs(items: Sequence[str]) -> dict[str, Any]:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CLIError(f"--task-arg must look like key=value, got {item!r}")
        out[key.strip()] = _task_value(value.strip())
    return out


def make_task_by_name(name: str, kwargs: dict[str, Any], *, allow_import: bool = False):
    """A registered task ("icl", "regression", "text"), or "module:Class" for a Task subclass of your own.

    "module:Class" is imported only when `allow_import` is set, i.e. when the user typed it on this command
    line. A name read from a file (run.json on --resume, evaluate, report) is data: only registered names
    are built from it, and nothing is imported or called because a file says so.
    """
    from .tasks.base import Task

    if not isinstance(name, str):
        raise CLIError(f"the task name must be a string, one of {', '.join(TASK_NAMES)}, got {type(name).__name__} "
                       f"{name!r}")
    if ":" in name:
        if not allow_import:
            raise CLIError(f"the run's task {name!r} is not a registered task (allowed: {', '.join(TASK_NAMES)}); "
                           f"a run folder is data and nothing named in it is imported. If you trust that code, "
                           f"pass --task {name} on the command line")
        module, _, attr = name.partition(":")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as err:
            raise CLIError(f"--task must be one of {', '.join(TASK_NAMES)} or an importable module:Class, got "
                           f"{name!r}: cannot import {attr!r} from module {module!r} ({err})") from None
        if not (isinstance(cls, type) and issubclass(cls, Task)):   # checked before anything is called
            raise CLIError(f"--task {name!r} must name a cgt_viz.tasks.base.Task subclass, got {type(cls).__name__}")
        return _with_task_args(cls, kwargs)
    if name not in TASK_NAMES:
        raise CLIError(f"unknown --task {name!r}; allowed: {', '.join(TASK_NAMES)} (or module:Class)")
    if not isinstance(kwargs, dict):
        raise CLIError(f"the task arguments must be a dict of constructor arguments, got {type(kwargs).__name__}")
    try:
        from .tasks import make_task
    except ImportError:
        raise CLIError("the task registry (cgt_viz.tasks.make_task) is not available in this installation") from None
    return _with_task_args(make_task, kwargs, name)


def _with_task_args(build, kwargs: dict[str, Any], *args):
    """Build the task; an error caused by the --task-arg values is reported as theirs."""
    try:
        return build(*args, **kwargs)
    except (TypeError, ValueError) as err:
        if not kwargs:
            raise
        given = " ".join(f"{k}={v!r}" for k, v in kwargs.items())
        raise CLIError(f"--task-arg {given}: {err}") from None


# --------------------------------------------------------------------------------------------- train
TRAIN_FIELDS = tuple(f.name for f in dataclasses.fields(TrainConfig))


def _settings(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """The run's settings: flags given now, else those saved in run.json (on --resume), else the task's recipe
    (`cgt_viz.recipes.recipe_for`: the one --recipe names, else the task's own with the variants its arguments
    select), else the defaults (TrainConfig's, CGTConfig's)."""
    from .recipes import recipe_for

    given = {k: getattr(args, k) for k in (*RUN_DEFAULTS, *TRAIN_FIELDS, *MODEL_FLAGS) if getattr(args, k) is not None}
    run_file = out / RUN_FILE
    saved: dict[str, Any] = {}
    is_main = int(os.environ.get("RANK", "0")) == 0
    if run_file.is_file() and (args.resume or is_main):   # under torchrun, rank 0 may have just written it
        if not args.resume:
            raise CLIError(f"--out {str(out)!r} already holds a run; pass --resume to continue it, "
                           f"or choose another --out")
        from .io import read_json
        try:
            saved = read_json(run_file)["settings"]
        except (ValueError, KeyError, TypeError) as err:
            raise CLIError(f"{str(run_file)!r} is not a run file written by this CLI: {err}") from None
        if "task_arg" in given:
            given["task_arg"] = _task_kwargs(given["task_arg"])
        # model flags are checked on the built config (see cmd_train); here the training settings
        clash = [f"--{k.replace('_', '-')} {given[k]!r} (the run has {saved.get(k)!r})"
                 for k in given if k in (*RUN_DEFAULTS, *TRAIN_FIELDS) and k not in TrainConfig.RESUMABLE
                 and _plain(given[k]) != _plain(saved.get(k))]
        if clash:
            raise CLIError(f"--resume: the run in {str(out)!r} was started with different settings: "
                           + "; ".join(clash) + ". Resume with its settings or start a new --out")
    task = given.get("task", saved.get("task"))
    if task is None:
        raise CLIError("--task is required for a new run (one of icl, regression, text, or module:Class)")
    recipe, recipe_name = {}, None
    if not saved:
        typed = _task_kwargs(given.get("task_arg"))
        with _as_flag_error():       # "recipe must be one of ..." -> "--recipe must be one of ..."
            recipe = recipe_for(task, typed, given.get("recipe"))
        recipe_name = _recipe_name(task, typed, given.get("recipe"))
    defaults = {**RUN_DEFAULTS, **TrainConfig().to_dict(), "recipe": recipe_name,
                "task_arg": dict(recipe.get("task", {})),
                "curriculum": recipe.get("curriculum"), **recipe.get("train", {}),
                **{k: (",".join(v) if k == "sites" else v) for k, v in recipe.get("model", {}).items()}}
    settings = {**defaults, **saved, **given}
    if not isinstance(settings["task_arg"], dict):
        settings["task_arg"] = {**(defaults["task_arg"] if not saved else {}), **_task_kwargs(settings["task_arg"])}
    with _as_flag_error():
        TrainConfig.build(None, {k: settings[k] for k in TRAIN_FIELDS})
    _check_flags(curriculum=settings["curriculum"])
    return settings


def _recipe_name(task: str | None, typed: dict[str, Any], chosen: str | None) -> str | None:
    """The recipe a run of `task` takes: `chosen` (--recipe), else the variants its typed --task-arg select
    (joined by "+"), else the task's own (None for a task without a recipe)."""
    from .recipes import RECIPES, variants_selected

    if chosen is not None:
        return chosen
    if task not in RECIPES:
        return None
    return "+".join(variants_selected(task, typed)) or task


def _recipe_note(task: str, task_args: Sequence[str] | None) -> str | None:
    """The line that says which variant the task arguments chose, when they chose one (None otherwise):
    "recipe: regression-dim16 (chosen by --task-arg dim=16; --recipe to choose another)"."""
    from .recipes import RECIPES, VARIANTS, variants_selected

    typed = _task_kwargs(task_args)
    chosen = variants_selected(task, typed) if task in RECIPES else []
    if not chosen:
        return None
    # a selecting argument the user did not type matched the task's default value (icl's family=affine)
    when = {k: v for name in chosen for k, v in VARIANTS[name]["when"].items()}
    why = [" ".join(f"--task-arg {k}={v}" for k, v in when.items() if k in typed)] + \
        [f"the default {k}={v}" for k, v in when.items() if k not in typed]
    return f"recipe: {' + '.join(chosen)} (chosen by {' and '.join(w for w in why if w)}; --recipe to choose another)"


@contextlib.contextmanager
def _as_flag_error():
    """A TypeError/ValueError about a setting as a CLIError about its flag: "steps must ..." -> "--steps must ..."."""
    try:
        yield
    except (TypeError, ValueError) as err:
        name, _, rest = str(err).partition(" ")
        raise CLIError(f"--{name.replace('_', '-')} {rest}") from None


def _check_flags(**values: Any) -> None:
    """The given flags of FLAG_CONSTRAINTS (None: not given) against their contracts."""
    for name, value in values.items():
        if value is not None:
            with _as_flag_error():
                FLAG_CONSTRAINTS[name].check(name, value)


def _plain(value: Any) -> Any:
    """A setting as JSON stores it (tuples become lists), so that a saved and a given value compare equal."""
    return json.loads(json.dumps(value))


def _build(settings: dict[str, Any], allow_import: bool = False):
    import torch

    from . import CGT, GPT, CGTConfig

    task = make_task_by_name(settings["task"], settings["task_arg"], allow_import=allow_import)
    if settings.get("curriculum") and not callable(getattr(task, "curriculum", None)):
        raise CLIError(f"--curriculum must be 0 for task {settings['task']!r}: it has no curriculum (regression "
                       f"and icl have one), got {settings['curriculum']}")
    model_kw = {k: settings[k] for k in MODEL_FLAGS if settings.get(k) is not None}
    if "sites" in model_kw:
        model_kw["sites"] = tuple(s.strip() for s in model_kw["sites"].split(",") if s.strip())
    cfg = CGTConfig(**{**task.config_kwargs(), **model_kw})
    cls = GPT if settings["model"] == "gpt" else CGT
    _check_model_fits(cls, task, model_kw)
    torch.manual_seed(settings["seed"])
    model = cls(cfg)
    return task, model


def _check_model_fits(cls, task, model_kw: dict[str, Any]) -> None:
    """The model's training state (parameters, gradients, AdamW's two moments: float32) against the free memory,
    from a model built on the meta device (shapes only: no memory, no time), before the real one is allocated.
    The message names the given flag most of it comes from (the one whose default shrinks it most)."""
    import torch

    from . import CGTConfig
    from ._checks import available_memory, check_fits

    def need(kw: dict[str, Any]) -> float:
        try:
            with torch.device("meta"):
                model = cls(CGTConfig(**{**task.config_kwargs(), **kw}))
        except (TypeError, ValueError):   # that flag alone at its default makes no valid model
            return math.inf
        return 16 * sum(p.numel() for p in model.parameters()) + 4 * sum(b.numel() for b in model.buffers())

    total, free = need(model_kw), available_memory()
    if free is None or total <= free:
        return
    flag = min(model_kw, key=lambda k: need({kk: v for kk, v in model_kw.items() if kk != k}), default=None)
    check_fits("--" + flag.replace("_", "-") if flag else "--task-arg", model_kw.get(flag, task), total,
               f"the model's training state (parameters, gradients and AdamW's two moments in float32, "
               f"at least {total / 16:.3g} parameters)")


def cmd_train(args: argparse.Namespace) -> int:
    import contextlib

    from .checkpoint import RunLock

    out = Path(args.out)
    if out.is_symlink() and not out.exists():
        raise CLIError(f"--out {str(out)!r} is a dangling symbolic link to {os.readlink(out)!r} (nothing is there); "
                       f"create that folder, remove the link, or choose another --out")
    pretrained = _pretrained_task(args, out)
    if pretrained is not None:
        from .hf.head_run import train_route
        from .recipes import recipe_for
        if args.recipe is not None:      # no recipe is of a pretrained-LM task: refused, naming the flag
            with _as_flag_error():
                recipe_for(pretrained, None, args.recipe)
        given = {k: getattr(args, k) for k in (*RUN_DEFAULTS, *TRAIN_FIELDS, *MODEL_FLAGS, "threads")
                 if k not in ("task", "task_arg", "recipe") and getattr(args, k) is not None}
        given.update({k: v for k, v in (("device", args.device), ("compile", args.compile),
                                        ("no_progress", args.no_progress)) if v not in ("auto", False)})
        return train_route(pretrained, out, given, _task_kwargs(args.task_arg), args.resume)
    _settings(args, out)            # a bad flag is refused before anything is created or written
    if out.exists() and not out.is_dir():
        raise CLIError(f"--out must be a run folder (or not exist yet), got the file {str(out)!r}")
    is_main = int(os.environ.get("RANK", "0")) == 0
    # one writer per run folder: a second trainer (a second --resume) is refused while this one runs
    with RunLock(out, "--out") if is_main else contextlib.nullcontext():
        return _train_locked(args, out, is_main)


def _pretrained_task(args: argparse.Namespace, out: Path) -> str | None:
    """The pretrained-LM task of this command: typed with --task, or (on --resume) named in OUT/run.json."""
    if args.task is not None:
        return args.task if args.task in PRETRAINED_TASKS else None
    if args.resume and (out / RUN_FILE).is_file():
        from .io import read_json
        try:
            task = read_json(out / RUN_FILE)["settings"]["task"]
        except (ValueError, KeyError, TypeError):
            return None                     # _settings names what is wrong with the file
        return task if task in PRETRAINED_TASKS else None
    return None


def _train_locked(args: argparse.Namespace, out: Path, is_main: bool) -> int:
    from .checkpoint import latest_checkpoint
    from .io import write_json
    from .train import TrainingDiverged, train

    settings = _settings(args, out)  # again: now that no other writer can change run.json
    # a module:Class task is imported only when typed now (on --resume it must equal the run's: _settings)
    task, model = _build(settings, allow_import=args.task is not None)
    if args.resume and (out / RUN_FILE).is_file():  # the model flags must rebuild the run's model exactly
        from .config import with_added_fields
        from .io import read_json
        from .train import config_differences
        saved = read_json(out / RUN_FILE)
        # a run made before config.ADDED_FIELDS existed: the same migration as from_pretrained
        diff = config_differences({"model_class": saved.get("model_class"),
                                   **with_added_fields(saved.get("config", {}))},
                            json.loads(json.dumps({"model_class": type(model).__name__, **model.config.to_dict()})),
                            labels=("the run", "now"))
        if diff:
            raise CLIError(f"--resume: the run in {str(out)!r} has a different model; it differs in: "
                           + "; ".join(diff[:8]) + ". Resume with its settings or start a new --out")
    run_file = out / RUN_FILE
    previous = run_file.read_bytes() if run_file.is_file() else None
    before = latest_checkpoint(out / "ckpt")
    note = _recipe_note(settings["task"], args.task_arg) if previous is None and args.recipe is None else None
    if is_main and note:        # a variant chosen by the task arguments alone is easy to miss: say so once
        print(note, file=sys.stderr)
    if is_main:
        write_json(run_file, {"settings": settings, "model_class": type(model).__name__,
                              "config": model.config.to_dict()})
    config = TrainConfig.build(None, {k: settings[k] for k in TRAIN_FIELDS})
    callbacks = [task.curriculum(settings["curriculum"])] if settings.get("curriculum") else []
    if is_main and settings.get("curriculum") and settings["curriculum"] > settings["steps"]:
        import warnings   # a recipe's curriculum is sized for the recipe's steps: a short run never finishes it
        warnings.warn(f"--curriculum {settings['curriculum']} (updates of the task's curriculum) is longer than "
                      f"--steps {settings['steps']}: the run ends {settings['steps'] / settings['curriculum']:.0%} "
                      f"of the way through it; pass --curriculum {settings['steps']} (or less) to finish it, or 0 "
                      f"to turn it off", RuntimeWarning, stacklevel=2)
    try:
        model, history = train(model, task, config, device=args.device, compile=args.compile, callbacks=callbacks,
                               checkpoint_dir=out / "ckpt", resume=args.resume, progress=not args.no_progress)
    except TrainingDiverged as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except Exception:
        # refused before any step was saved (a bad value train() checks, a failed pre-flight): run.json goes
        # back to what it was, so the corrected command is not refused as a mismatch
        if is_main and latest_checkpoint(out / "ckpt") == before:
            if previous is None:
                run_file.unlink(missing_ok=True)
            else:
                from .io import atomic_write
                atomic_write(run_file, lambda tmp: Path(tmp).write_bytes(previous))
        raise
    if not is_main:
        return 0
    write_json(out / "history.json", history.to_dict())
    if history.interrupted:
        print(f"interrupted after step {len(history)}; continue with: python -m cgt_viz train --out {out} --resume",
              file=sys.stderr)
        return 130
    model.save_pretrained(out / "model")
    last = history.evals[-1] if history.evals else {}
    summary = ", ".join(f"{k} {v:.4g}" for k, v in last.items() if k != "step")
    print(f"trained {len(history)} steps in {history.seconds:.1f} s; {summary}; model in {out / 'model'}")
    return 0


def _read_run(run: Path) -> dict[str, Any]:
    """run.json of a run folder, checked for the entries the commands read (a clear error, not a KeyError)."""
    from .io import read_json

    if not (run / RUN_FILE).is_file():
        raise CLIError(f"run must be a run folder written by `python -m cgt_viz train`; {str(run)!r} has no {RUN_FILE}")
    info = read_json(run / RUN_FILE)
    settings = info.get("settings") if isinstance(info, dict) else None
    problems = ([] if isinstance(settings, dict) else ["'settings' must be a dict"]) + \
               ([] if isinstance(info, dict) and isinstance(info.get("config", {}), dict) else ["'config' must be a dict"])
    if not problems:
        problems = [f"'settings' lacks {k!r}" for k in ("task", "task_arg") if k not in settings]
    if problems:
        raise CLIError(f"{str(run / RUN_FILE)!r} is not a run file written by this CLI: {'; '.join(problems)}")
    return info


# ------------------------------------------------------------------------------------ loading a run
def load_run(run: str | os.PathLike, device: str = "cpu", task: Any = None):
    """(model, task, run_info) of a run folder: model/ if training finished, else the latest checkpoint.

    The task is rebuilt from run.json by registered name only. For a run of your own Task subclass pass
    `task`: the Task itself (from Python), or the same "module:Class" string typed on the command line.
    """
    from . import CGT, GPT, CGTConfig
    from .checkpoint import latest_checkpoint, load_checkpoint

    run = Path(run)
    info = _read_run(run)
    if info["settings"]["task"] in PRETRAINED_TASKS:
        raise CLIError(f"{str(run)!r} holds a CGT head over a frozen pretrained LM ({info['settings']['task']}): its "
                       f"measurement is {str(run / 'metrics.json')!r}; measure it again with python -m cgt_viz "
                       f"train-head --out {run} --measure-only")
    cls = GPT if info.get("model_class") == "GPT" else CGT
    if (run / "model" / "config.json").is_file():
        model = cls.from_pretrained(run / "model", device=device)
    elif latest_checkpoint(run / "ckpt") is not None:
        ckpt = load_checkpoint(run / "ckpt")
        model = cls(CGTConfig.from_dict(ckpt.run["config"]))
        model.load_state_dict(ckpt.model_state)
        model.to(device)
        print(f"note: training has not finished; using the checkpoint at step {ckpt.step}", file=sys.stderr)
    else:
        raise CLIError(f"{str(run)!r} holds neither a trained model (model/) nor a checkpoint (ckpt/)")
    from .tasks.base import Task
    saved = info["settings"]["task"]
    if isinstance(task, Task):
        pass
    elif task is not None and task != saved:
        raise CLIError(f"--task {task!r} is not the run's task {saved!r}; pass the run's task or leave --task out")
    else:
        task = make_task_by_name(saved, info["settings"]["task_arg"], allow_import=task is not None)
    return model.eval(), task, info


def _history_of(run: Path) -> dict[str, Any]:
    from .checkpoint import latest_checkpoint, load_checkpoint
    from .io import read_json

    from .report import check_history

    if (run / "history.json").is_file():
        return check_history(read_json(run / "history.json"), run / "history.json")
    if latest_checkpoint(run / "ckpt") is not None:
        return load_checkpoint(run / "ckpt").history
    raise CLIError(f"{str(run)!r} has no history.json and no checkpoint yet")


# ------------------------------------------------------------------------------------------ evaluate
def cmd_evaluate(args: argparse.Namespace) -> int:
    import torch

    from . import CGT
    from .io import write_json
    from .train import resolve_device

    try:  # the flags first: a typo is reported before any file is read
        ks = tuple(int(k) for k in args.k.split(","))
    except ValueError:
        raise CLIError(f"--k must be comma-separated ints, e.g. 4,8,16, got {args.k!r}") from None
    if min(ks) < 1:
        raise CLIError(f"--k must be comma-separated ints >= 1 (prompt sizes), got {args.k!r}")
    device = resolve_device(args.device)
    model, task, _ = load_run(args.run, device=device, task=args.task)
    try:
        from .evaluate import evaluate_specialization
    except ImportError:
        evaluate_specialization = None
    if evaluate_specialization is None or not isinstance(model, CGT) or not hasattr(task, "eval_batch"):
        why = ("cgt_viz.evaluate is not available in this installation" if evaluate_specialization is None
               else "the run holds a plain GPT (nothing to specialise)" if not isinstance(model, CGT)
               else f"the task {type(task).__name__} has no eval_batch (held-out prompts)")
        print(f"note: {why}; showing validation losses only")
        gen = torch.Generator().manual_seed(args.seed)
        with torch.no_grad():
            totals = {}
            for _ in range(args.n_batches):
                batch = task.get_batch(args.batch_size, part="val", generator=gen, device=device)
                out = model.loss(batch.inputs, batch.targets, batch.loss_mask, split=batch.split)
                for k, v in out.items():
                    totals[f"val_{k}"] = totals.get(f"val_{k}", 0.0) + float(v) / args.n_batches
        rows = [totals]
    else:
        baseline = None
        if args.baseline:
            baseline, _, _ = load_run(args.baseline, device=device, task=task)
        rows = evaluate_specialization(model, task, k_values=ks, n_batches=args.n_batches, batch_size=args.batch_size,
                                       baseline=baseline, seed=args.seed)
    print(_table(rows))
    write_json(Path(args.run) / "evaluation.json", rows)
    return 0


def _table(rows: list[dict[str, Any]]) -> str:
    """A fixed-width text table (one line per row)."""
    cols = list(dict.fromkeys(k for row in rows for k in row))
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)
    cells = [[fmt(row.get(c, "")) for c in cols] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(cols)]
    line = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, widths))
    return "\n".join([line(cols), line(["-" * w for w in widths])] + [line(r) for r in cells])


# -------------------------------------------------------------------------------------------- report
def cmd_report(args: argparse.Namespace) -> int:
    from .report import write_report   # the page is built in cgt_viz/report.py
    return write_report(args.run, args.output, load_run=load_run, history_of=_history_of, read_run=_read_run)


# ---------------------------------------------------------------------------------------------- main
def cmd_train_head(args: argparse.Namespace) -> int:
    """The pretrained-LM head's own pipeline (cgt_viz/hf/head_run.py): its flags are its own."""
    from .hf.head_run import main as head_main
    try:
        return head_main(args.head_args)
    except SystemExit as done:           # argparse's --help or a bad flag
        return int(done.code or 0)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code (see the module docstring)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser(argv)
    args, rest = parser.parse_known_args(argv)
    if args.command == "train-head":      # its flags (--help among them) are the head pipeline's own
        args.head_args = [*rest, *args.head_args]
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    command = {"train": cmd_train, "evaluate": cmd_evaluate, "report": cmd_report,
               "train-head": cmd_train_head}[args.command]
    from .checkpoint import FolderLocked
    try:
        with _warnings_as_lines():
            return _run_command(command, args)
    except ModuleNotFoundError as err:
        print(f"error: {err.name} is needed for this command; install the notebook extras: "
              f"pip install -e '.[notebook]'", file=sys.stderr)
        return 2
    except (CLIError, ValueError, TypeError, FileNotFoundError, FolderLocked) as err:
        return _report_error(err, str(err), 2)
    except OSError as err:   # disk full, permissions, a path of the wrong kind: what and where, no traceback
        return _report_error(err, _os_error(err), 3)
    except KeyboardInterrupt as err:   # Ctrl-C outside training (which stops cleanly by itself): one line, 130
        # (the head pipeline's says after which step and how to resume)
        return _report_error(err, str(err) or f"interrupted (Ctrl-C) during {args.command}", 130)


def _run_command(command, args: argparse.Namespace) -> int:
    threads = getattr(args, "threads", None)
    _check_flags(threads=threads)
    if threads is not None:
        import torch
        torch.set_num_threads(threads)
    return command(args)


@contextlib.contextmanager
def _warnings_as_lines():
    """A warning (the aux loss never joining, a plateau) as one "warning: ..." line on stderr, as a log reads
    it, not Python's file:line header with a line of source code."""
    import warnings

    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        print(f"warning: {message}", file=sys.stderr if file is None else file)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown


def _report_error(err: BaseException, message: str, code: int) -> int:
    """One line (plus the exception's notes) on stderr and the exit code; CGT_VIZ_DEBUG=1 shows the traceback."""
    if os.environ.get("CGT_VIZ_DEBUG"):
        raise err
    print(f"error: {message}", file=sys.stderr)
    for note in getattr(err, "__notes__", []):
        print(f"note: {note}", file=sys.stderr)
    return code


def _os_error(err: OSError) -> str:
    """'<what the OS said>: <path>' in one line (the previous checkpoint is left as it was)."""
    what = err.strerror or str(err)
    where = [str(f) for f in (err.filename, err.filename2) if f is not None]
    return what + (f": {' -> '.join(repr(w) for w in where)}" if where else "")


if __name__ == "__main__":
    sys.exit(main())
