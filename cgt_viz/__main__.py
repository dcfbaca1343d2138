"""The command line: train, evaluate and report on runs kept in folders.

    python -m cgt_viz train --task icl --out runs/shift --steps 2000 --task-arg family=shift
    python -m cgt_viz train --out runs/shift --resume          # continue it (settings come from run.json)
    python -m cgt_viz evaluate runs/shift                       # prompted / specialised / no-context table
    python -m cgt_viz report runs/shift                         # runs/shift/report.html, works offline
    torchrun --nproc_per_node 2 -m cgt_viz train ...            # the same, data-parallel (DDP)

A run folder holds run.json (the command's settings, written first), ckpt/ (checkpoints, see
cgt_viz.checkpoint), and at the end model/ (save_pretrained) and history.json.
Exit codes: 0 done, 1 training diverged (NaN/inf), 2 bad input (message, no traceback), 130 interrupted
(a checkpoint was written; `--resume` continues).
"""
from __future__ import annotations

import argparse
import html
import importlib
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Sequence

RUN_FILE = "run.json"
TASK_NAMES = ("icl", "regression", "text")

# flags that define a run: (flag dest, default). None defaults are left to CGTConfig / train.
TRAIN_DEFAULTS: dict[str, Any] = {"task": None, "model": "cgt", "steps": 2000, "batch_size": 32, "lr": 1e-3,
                                  "seed": 0, "warmup": None, "weight_decay": 0.01, "grad_clip": 1.0,
                                  "eval_every": None, "eval_batches": 4, "checkpoint_every": None, "task_arg": [],
                                  "aux_delay": 0, "aux_ramp": 0}
MODEL_FLAGS = {"n_layer": int, "d_x": int, "n_head": int, "d_y": int, "n_head_y": int, "y_layer": int,
               "n_templates": int, "template_rank": int, "mlp_ratio": int, "dropout": float, "w_aux": float,
               "w_smooth": float, "smooth": str, "y_reads": str, "sites": str}
# may change between a run and its resumption
RESUMABLE = {"steps", "eval_every", "eval_batches", "checkpoint_every"}


class CLIError(Exception):
    """A problem with the user's input: printed as 'error: …' with exit code 2."""


# ------------------------------------------------------------------------------------------- parsing
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m cgt_viz", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a CGT (or a GPT baseline) on a task; checkpoints into OUT/ckpt")
    t.add_argument("--task", help=f"one of {', '.join(TASK_NAMES)}, or module:Class for your own Task subclass")
    t.add_argument("--out", required=True, help="run folder, e.g. runs/NAME")
    t.add_argument("--model", choices=("cgt", "gpt"), help="cgt (default) or the plain gpt baseline")
    t.add_argument("--steps", type=int, help=f"optimizer updates (default {TRAIN_DEFAULTS['steps']})")
    t.add_argument("--batch-size", type=int, help=f"global batch (default {TRAIN_DEFAULTS['batch_size']})")
    t.add_argument("--lr", type=float, help=f"peak learning rate (default {TRAIN_DEFAULTS['lr']})")
    t.add_argument("--seed", type=int, help="seed of the model init and of every random stream (default 0)")
    t.add_argument("--warmup", type=int, help="warm-up updates (default min(100, steps // 10))")
    t.add_argument("--aux-delay", type=int, help="updates with the auxiliary loss weighted 0 (default 0)")
    t.add_argument("--aux-ramp", type=int, help="then updates to ramp its weight up to w_aux (default 0)")
    t.add_argument("--weight-decay", type=float)
    t.add_argument("--grad-clip", type=float)
    t.add_argument("--eval-every", type=int, help="evaluate every N steps (default steps // 20; 0 = never)")
    t.add_argument("--eval-batches", type=int)
    t.add_argument("--checkpoint-every", type=int, help="checkpoint every N steps (default steps // 10)")
    t.add_argument("--device", default="auto", help="auto (cuda > mps > cpu), cpu, cuda, cuda:N, mps")
    t.add_argument("--threads", type=int, help="CPU threads for torch (default: torch's choice); 1 on a busy machine")
    t.add_argument("--compile", action="store_true", help="torch.compile the training step")
    t.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    for name, kind in MODEL_FLAGS.items():
        extra = {"help": "comma-separated subset of attn_in,attn_out,mlp_in,mlp_out"} if name == "sites" else {}
        t.add_argument("--" + name.replace("_", "-"), type=kind, dest=name, **extra)
    t.add_argument("--task-arg", action="append", metavar="KEY=VALUE",
                   help="a task constructor argument (repeatable), e.g. --task-arg family=affine --task-arg P=7")

    e = sub.add_parser("evaluate", help="compare prompted, specialised and no-context models of a run")
    e.add_argument("run", help="run folder written by train")
    e.add_argument("--k", default="4,8,16", help="prompt sizes, comma-separated (default 4,8,16)")
    e.add_argument("--n-batches", type=int, default=4)
    e.add_argument("--batch-size", type=int, default=64)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--baseline", help="run folder of a GPT baseline trained on the same task")
    e.add_argument("--device", default="auto")
    e.add_argument("--threads", type=int, help="CPU threads for torch")

    r = sub.add_parser("report", help="write a self-contained HTML report (loss curves, settings, evaluation)")
    r.add_argument("run", help="run folder written by train")
    r.add_argument("--output", help="HTML file (default RUN/report.html)")
    return p


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


def make_task_by_name(name: str, kwargs: dict[str, Any]):
    """A registered task ("icl", "regression", "text") or "module:Class" for a Task subclass of your own."""
    from .tasks.base import Task

    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as err:
            raise CLIError(f"--task must be one of {', '.join(TASK_NAMES)} or an importable module:Class, got "
                           f"{name!r}: cannot import {attr!r} from module {module!r} ({err})") from None
        task = _with_task_args(cls, kwargs)
        if not isinstance(task, Task):
            raise CLIError(f"--task {name!r} is not a cgt_viz.tasks.base.Task subclass")
        return task
    if name not in TASK_NAMES:
        raise CLIError(f"unknown --task {name!r}; allowed: {', '.join(TASK_NAMES)} (or module:Class)")
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
def _settings(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """The run's settings: flags given now, else those saved in run.json (on --resume), else defaults."""
    given = {k: getattr(args, k) for k in (*TRAIN_DEFAULTS, *MODEL_FLAGS) if getattr(args, k) is not None}
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
                 for k in given if k in TRAIN_DEFAULTS and k not in RESUMABLE and given[k] != saved.get(k)]
        if clash:
            raise CLIError(f"--resume: the run in {str(out)!r} was started with different settings: "
                           + "; ".join(clash) + ". Resume with its settings or start a new --out")
    settings = {**TRAIN_DEFAULTS, **saved, **given}
    if not isinstance(settings["task_arg"], dict):
        settings["task_arg"] = _task_kwargs(settings["task_arg"])
    if settings["task"] is None:
        raise CLIError("--task is required for a new run (one of icl, regression, text, or module:Class)")
    for name in ("steps", "batch_size"):
        if settings[name] <= 0:
            raise CLIError(f"--{name.replace('_', '-')} must be > 0, got {settings[name]}")
    if not settings["lr"] > 0:
        raise CLIError(f"--lr must be > 0, got {settings['lr']}")
    return settings


def _build(settings: dict[str, Any]):
    import torch

    from . import CGT, GPT, CGTConfig

    task = make_task_by_name(settings["task"], settings["task_arg"])
    model_kw = {k: settings[k] for k in MODEL_FLAGS if settings.get(k) is not None}
    if "sites" in model_kw:
        model_kw["sites"] = tuple(s.strip() for s in model_kw["sites"].split(",") if s.strip())
    cfg = CGTConfig(**{**task.config_kwargs(), **model_kw})
    torch.manual_seed(settings["seed"])
    model = (GPT if settings["model"] == "gpt" else CGT)(cfg)
    return task, model


def cmd_train(args: argparse.Namespace) -> int:
    from .io import write_json
    from .train import TrainingDiverged, train

    out = Path(args.out)
    settings = _settings(args, out)
    task, model = _build(settings)
    is_main = int(os.environ.get("RANK", "0")) == 0
    if args.resume and (out / RUN_FILE).is_file():  # the model flags must rebuild the run's model exactly
        from .io import read_json
        from .train import config_differences
        saved = read_json(out / RUN_FILE)
        diff = config_differences({"model_class": saved.get("model_class"), **saved.get("config", {})},
                            json.loads(json.dumps({"model_class": type(model).__name__, **model.config.to_dict()})),
                            labels=("the run", "now"))
        if diff:
            raise CLIError(f"--resume: the run in {str(out)!r} has a different model; it differs in: "
                           + "; ".join(diff[:8]) + ". Resume with its settings or start a new --out")
    if is_main:
        write_json(out / RUN_FILE, {"settings": settings, "model_class": type(model).__name__,
                                    "config": model.config.to_dict()})
    try:
        model, history = train(model, task, settings["steps"], settings["batch_size"], settings["lr"],
                               warmup=settings["warmup"], weight_decay=settings["weight_decay"],
                               grad_clip=settings["grad_clip"], eval_every=settings["eval_every"],
                               eval_batches=settings["eval_batches"], seed=settings["seed"], device=args.device,
                               compile=args.compile, checkpoint_dir=out / "ckpt",
                               checkpoint_every=settings["checkpoint_every"], resume=args.resume,
                               progress=not args.no_progress, aux_delay=settings["aux_delay"],
                               aux_ramp=settings["aux_ramp"])
    except TrainingDiverged as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
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


# ------------------------------------------------------------------------------------ loading a run
def load_run(run: str | os.PathLike, device: str = "cpu"):
    """(model, task, run_info) of a run folder: model/ if training finished, else the latest checkpoint."""
    from . import CGT, GPT, CGTConfig
    from .checkpoint import latest_checkpoint, load_checkpoint
    from .io import read_json

    run = Path(run)
    if not (run / RUN_FILE).is_file():
        raise CLIError(f"run must be a run folder written by `python -m cgt_viz train`; {str(run)!r} has no {RUN_FILE}")
    info = read_json(run / RUN_FILE)
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
    task = make_task_by_name(info["settings"]["task"], info["settings"]["task_arg"])
    return model.eval(), task, info


def _history_of(run: Path) -> dict[str, Any]:
    from .checkpoint import latest_checkpoint, load_checkpoint
    from .io import read_json

    if (run / "history.json").is_file():
        return read_json(run / "history.json")
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
    model, task, _ = load_run(args.run, device=device)
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
            baseline, _, _ = load_run(args.baseline, device=device)
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
    return write_report(args.run, args.output, load_run=load_run, history_of=_history_of, run_file=RUN_FILE)


# ---------------------------------------------------------------------------------------------- main
def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code (see the module docstring)."""
    args = _parser().parse_args(argv)
    if getattr(args, "threads", None) is not None:
        if args.threads < 1:
            print(f"error: --threads must be >= 1, got {args.threads}", file=sys.stderr)
            return 2
        import torch
        torch.set_num_threads(args.threads)
    command = {"train": cmd_train, "evaluate": cmd_evaluate, "report": cmd_report}[args.command]
    try:
        return command(args)
    except ModuleNotFoundError as err:
        print(f"error: {err.name} is needed for this command; install the notebook extras: "
              f"pip install -e '.[notebook]'", file=sys.stderr)
        return 2
    except (CLIError, ValueError, TypeError, FileNotFoundError) as err:
        if os.environ.get("CGT_VIZ_DEBUG"):
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
