"""Training a CGT head over a frozen LM by context distillation, from a feature cache this machine can afford.

The head (y read-out and templates, `CGTLM(pooled_only=True)`) sees a prompt only through one vector, the
pooled read-out of LN(x_ℓ) after its last token; the templates act on layers ℓ+1..N. So for one training
window (a prefix of p tokens, then a suffix of m tokens of the same document) everything that does not depend
on the head's parameters can be computed once:

    pooled         (n, d)          the prefix's pooled read-out of layer ℓ (ȳ = LN(P (pooled − μ)))
    suffix_x       (n, m, d)       x_ℓ of the suffix alone (positions from 0): where the short pass starts
    tokens         (n, p + m + 1)  the window (the suffix's targets are its last m tokens)
    teacher_ids    (n, m, k)       the teacher's top-k next tokens at each suffix position ...
    teacher_logp   (n, m, k + 1)   ... their log-probabilities and the rest bucket (cgt_viz.distill);
                                   top_k None: ids (n, m, 0) and the whole vocabulary's log-probs (n, m, v + 1)
    topic, doc     (n,)            where each window comes from
    prefix_x       (n, p, d)       with a token memory only (`CGTLM(memory_layers=...)`): x_ℓ of the prefix, from
                                   the teacher's pass (what the memory's slots read), in the store dtype

The teacher is the frozen LM with the prefix in context. A training step then runs only the modulated layers
ℓ+1..N on 64 cached states and the LM head: no forward below ℓ + 1, no backward below it.

With y blocks (pooled_only=False) ȳ depends on x_1..x_ℓ of every prefix token; a cache of those is ℓ times the
prefix's states (gigabytes for a BBC-sized set at ℓ = 22), so this path refuses such a model and the ordinary
`CGTLM.loss` (no cache) trains it.

The cache lives in `<cache_root>/features/<key>/` (features.safetensors + manifest.json). The key hashes the
LM's weights, the windows' tokens and every setting, so a change of any of them builds a new cache; the
manifest holds the file's sha256 and size, checked on every load, so a damaged file is refused by name.
Nothing in it is code: safetensors and JSON only.

Under torchrun (DDP) rank 0 builds the cache while the other ranks wait at a barrier, then load it; in
`train_head` runs through the from-scratch trainer (`cgt_viz.train.train` with a `CachedHeadStep`): every rank
draws the same global batch and trains on its own contiguous share of its rows, DDP averages the gradients, and
only rank 0 evaluates, logs and writes checkpoints (gloo on CPU, nccl on CUDA).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import stat
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from .._checks import (Bool, Choice, Float, Instance, Int, PathArg, check_callable, check_int, checked,
                       describe, refuse)
from ..distill import aux_objective, teacher_topk
from ..io import load_tensors, published_folder, read_json, save_tensors, sha256_file, write_json
from .._ranks import process_group
from ..checkpoint import latest_checkpoint
from ..steps import TrainStep, class_name
from .source import cache_root

CACHE_FORMAT = "cgt_viz.feature_cache/1"
FEATURES_NAME = "features.safetensors"
MANIFEST_NAME = "manifest.json"
STORE_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
# a rank waiting for rank 0's feature cache (26 minutes for SmolLM2 on BBC at one thread) outlives torch's
# default collective timeout; a dead rank 0 still ends the wait, via torchrun
GROUP_TIMEOUT_MINUTES = 6 * 60


def _hash_tensor(h, t: torch.Tensor) -> None:
    t = t.detach().cpu().contiguous()
    h.update(f"{tuple(t.shape)}{t.dtype}".encode())
    h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")


def lm_fingerprint(lm) -> str:
    """sha256 of the LM's parameters and buffers (names, shapes, dtypes, bytes): what `weights_sha256` records."""
    h = hashlib.sha256()
    for name, t in sorted(list(lm.named_parameters()) + list(lm.named_buffers()), key=lambda kv: kv[0]):
        h.update(name.encode())
        _hash_tensor(h, t)
    return h.hexdigest()


def _require_pooled_only(model) -> None:
    from .model import check_cgtlm
    check_cgtlm(model, pooled_only=True)


class FeatureCache:
    """The cached features of n windows (see the module docstring); `batch(rows)` hands a step its tensors."""

    def __init__(self, tensors: dict[str, torch.Tensor], manifest: dict[str, Any], path: Path | None = None):
        self.tensors, self.manifest, self.path = tensors, manifest, path

    def __len__(self) -> int:
        return int(self.tensors["pooled"].shape[0])

    def __repr__(self) -> str:
        s = self.manifest["settings"]
        return (f"FeatureCache({len(self)} windows of {s['prefix_len']} + {s['suffix_len']} tokens, top-{s['top_k']}, "
                f"{self.nbytes / 2**20:.0f} MiB at {str(self.path)!r})")

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    @property
    def prefix_len(self) -> int:
        return int(self.manifest["settings"]["prefix_len"])

    def batch(self, rows: torch.Tensor, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
        p = self.prefix_len
        t = self.tensors
        out = {"pooled": t["pooled"][rows].float().to(device), "suffix_x": t["suffix_x"][rows].float().to(device),
               "targets": t["tokens"][rows, p + 1:].long().to(device)}
        if "prefix_x" in t:
            out.update(prefix_x=t["prefix_x"][rows].float().to(device), prefix=t["tokens"][rows, :p].long().to(device))
        if t["teacher_ids"].shape[-1] == 0:      # the whole vocabulary: the teacher as log-probs, no rest bucket
            return {**out, "teacher": t["teacher_logp"][rows, :, :-1].float().to(device)}
        return {**out, "teacher_ids": t["teacher_ids"][rows].long().to(device),
                "teacher_logp": t["teacher_logp"][rows].float().to(device)}


def cache_key(model, tokens: torch.Tensor, settings: dict[str, Any], weights_sha256: str | None = None) -> str:
    """The folder name of a cache: sha256 over the LM's weights, the windows' tokens and the settings."""
    h = hashlib.sha256()
    h.update((weights_sha256 or lm_fingerprint(model.lm)).encode())
    _hash_tensor(h, tokens.long())
    h.update(json.dumps(settings, sort_keys=True).encode())
    return h.hexdigest()[:24]


@torch.no_grad()
def compute_features(model, tokens: torch.Tensor, prefix_len: int, top_k: int | None = 64,
                     batch_size: int = 8, dtype: torch.dtype = torch.float16,
                     progress: bool = False) -> dict[str, torch.Tensor]:
    """The cached tensors of windows tokens (n, p + m + 1), without writing anything (see the module docstring)."""
    n, length = tokens.shape
    m = length - prefix_len - 1
    names = ("pooled", "suffix_x", "teacher_ids", "teacher_logp") + (("prefix_x",) if model.memory is not None else ())
    out: dict[str, list[torch.Tensor]] = {k: [] for k in names}
    rows = range(0, n, batch_size)
    if progress:
        from tqdm.auto import tqdm
        rows = tqdm(rows, desc="feature cache", unit="batch")
    for i in rows:
        w = tokens[i:i + batch_size].to(model.device)
        # the LM with the prefix in context
        hidden, pooled, prefix_x = model.teacher_pass(w[:, :prefix_len + m], prefix_len, states=True)
        out["pooled"].append(pooled.float().cpu())
        if "prefix_x" in out:
            out["prefix_x"].append(prefix_x.to(dtype).cpu())
        logits = model._logits(hidden[:, prefix_len:])
        ids, logp = teacher_topk(logits, top_k)
        if top_k is None or top_k >= logits.shape[-1]:     # every token, in order: the ids say nothing
            ids = ids[..., :0]
        out["teacher_ids"].append(ids.to(torch.int32).cpu())
        out["teacher_logp"].append(logp.to(dtype).cpu())
        out["suffix_x"].append(model.x_at_layer(w[:, prefix_len:prefix_len + m]).to(dtype).cpu())
    feats = {k: torch.cat(v) for k, v in out.items()}
    feats["tokens"] = tokens.to(torch.int32).cpu()
    return feats


@checked(top_k=Int(1, none=True, hint=" (None: the whole vocabulary)"), batch_size=Int(1), progress=Bool(),
         store_dtype=Choice(*STORE_DTYPES))
def build_feature_cache(model, tokens: torch.Tensor, prefix_len: int, *, top_k: int | None = 64,
                        topics: torch.Tensor | None = None, docs: torch.Tensor | None = None,
                        root: str | os.PathLike | None = None, batch_size: int = 8, store_dtype: str = "float16",
                        progress: bool = True, weights_sha256: str | None = None) -> FeatureCache:
    """The feature cache of windows tokens (n, p + m + 1) for model (a `CGTLM(pooled_only=True)`): loaded when a
    cache with the same key exists and is intact, else computed (progress bar) and written.

    top_k        the teacher's kept tokens (None: the whole vocabulary, v + 1 numbers per position)
    root         the cache root (default `cgt_viz.hf.cache_root()`); the cache goes to root/features/<key>/
    store_dtype  "float16" (default), "bfloat16" or "float32" for the suffix states and teacher log-probs

    In a process group (torchrun) rank 0 builds the cache; the other ranks wait at a barrier, then load it."""
    _require_pooled_only(model)
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.is_floating_point():
        raise refuse("tokens", "an integer tensor of windows (n, prefix_len + suffix_len + 1)", describe(tokens),
                     TypeError)
    check_int("prefix_len", prefix_len, 2, tokens.shape[1] - 2,
              hint=f" (the windows have {tokens.shape[1]} tokens: at least 2 are left for the suffix and its target)")
    n = tokens.shape[0]
    for name, extra in (("topics", topics), ("docs", docs)):
        if extra is not None and (not isinstance(extra, torch.Tensor) or tuple(extra.shape) != (n,)):
            raise refuse(name, f"a tensor ({n},), one entry per window", describe(extra))
    settings = {"format": CACHE_FORMAT, "prefix_len": prefix_len, "suffix_len": tokens.shape[1] - prefix_len - 1,
                "top_k": top_k, "y_layer": model.config.y_layer, "pool_half_life": model.pool_half_life,
                "store_dtype": store_dtype}
    if model.memory is not None:          # only then: the keys of caches without prefix states stay as they were
        settings["prefix_states"] = True
    weights_sha256 = weights_sha256 or lm_fingerprint(model.lm)
    key = cache_key(model, tokens, settings, weights_sha256)
    folder = cache_root(root) / "features" / key
    if dist.is_initialized() and dist.get_world_size() > 1:
        if dist.get_rank() == 0:
            cache = _load_or_build(model, tokens, prefix_len, top_k, topics, docs, batch_size, store_dtype, progress,
                                   settings, weights_sha256, key, folder)
        dist.barrier()
        return cache if dist.get_rank() == 0 else load_feature_cache(folder)
    return _load_or_build(model, tokens, prefix_len, top_k, topics, docs, batch_size, store_dtype, progress,
                          settings, weights_sha256, key, folder)


def _load_or_build(model, tokens, prefix_len, top_k, topics, docs, batch_size, store_dtype, progress, settings,
                   weights_sha256, key, folder) -> FeatureCache:
    n = tokens.shape[0]
    expect = {"key": key, "settings": settings, "weights_sha256": weights_sha256, "n_windows": n,
              "vocab_size": int(model.lm.config.vocab_size), "width": int(model.lm.config.hidden_size)}
    from .source import ensure_cache_folder
    ensure_cache_folder(folder.parent.parent, "the cache root")           # a file or a dangling link, by name
    ensure_cache_folder(folder.parent, "the feature cache folder")
    # one builder per cache: a second process asking for the same cache waits for the first, then loads it
    with _build_lock(folder):
        if (folder / MANIFEST_NAME).exists():
            return load_feature_cache(folder, expect=expect)
        t0 = time.perf_counter()
        feats = compute_features(model, tokens, prefix_len, top_k, batch_size, STORE_DTYPES[store_dtype], progress)
        feats["topic"] = (topics if topics is not None else torch.full((n,), -1)).long()
        feats["doc"] = (docs if docs is not None else torch.full((n,), -1)).long()
        build_seconds = time.perf_counter() - t0
        # a temp folder of this process's own (a killed builder's is removed by the next one under the lock)
        for stale in folder.parent.glob(f".{key}.*.partial"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = folder.with_name(f".{key}.{os.getpid()}-{uuid.uuid4().hex[:8]}.partial")
        tmp.mkdir()
        # a damaged cache of the same key is replaced by the fresh one
        with published_folder(tmp, folder, folder.with_name(f".{key}.{os.getpid()}-old.partial")):
            save_tensors(tmp / FEATURES_NAME, feats, metadata={"format": CACHE_FORMAT})
            manifest = {"format": CACHE_FORMAT, "key": key, "settings": settings, "weights_sha256": weights_sha256,
                        "n_windows": n, "file_bytes": (tmp / FEATURES_NAME).stat().st_size,
                        "sha256": sha256_file(tmp / FEATURES_NAME), "build_seconds": build_seconds,
                        "lm": str(getattr(model.lm.config, "_name_or_path", ""))}
            write_json(tmp / MANIFEST_NAME, manifest)
    return FeatureCache(feats, manifest, folder)


@contextlib.contextmanager
def _build_lock(folder: Path):
    """An exclusive flock on <cache root>/.locks/features-<key>.lock while a cache is looked for and built (a
    regular file, opened without following a link; beside features/, which holds only caches; where flock does
    not exist, no lock). The lock file stays: removing it would let a later builder lock a new file while a
    waiter still holds the old one."""
    try:
        import fcntl
    except ImportError:          # not POSIX: builders are not serialised
        yield
        return
    locks = folder.parent.parent / ".locks"
    locks.mkdir(exist_ok=True)
    lock = locks / f"features-{folder.name}.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"the feature cache lock {str(lock)!r} must be a regular file; remove it")
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)            # closing releases the flock


# what a cache holds, one row per tensor: the dtypes it may have and its shape in the manifest's terms
# (n windows, p prefix and m suffix tokens, d the LM's width, k the kept teacher ids, t their log-probs); a tensor
# not in the table (an optional one of a newer cache) must still have one row per window
CACHE_TENSORS = {
    "pooled": ((torch.float32,), ("n", "d")),
    "suffix_x": (tuple(STORE_DTYPES.values()), ("n", "m", "d")),
    "tokens": ((torch.int32,), ("n", "p+m+1")),
    "teacher_ids": ((torch.int32,), ("n", "m", "k")),
    "teacher_logp": (tuple(STORE_DTYPES.values()), ("n", "m", "t")),
    "topic": ((torch.int64,), ("n",)),
    "doc": ((torch.int64,), ("n",)),
}
# with settings["prefix_states"] (a head with a token memory): the prefix's layer-ℓ states
PREFIX_STATES = {"prefix_x": (tuple(STORE_DTYPES.values()), ("n", "p", "d"))}
ID_TENSORS = {"tokens": "a token id", "teacher_ids": "a token id", "topic": "a topic (-1: none)",
              "doc": "a document (-1: none)"}


def _cache_problems(manifest: dict, tensors: dict[str, torch.Tensor], expect: dict | None) -> list[str]:
    """What is wrong with a cache's manifest and tensors (the table above; `expect`: what was asked for)."""
    settings = manifest.get("settings")
    if not isinstance(settings, dict):
        return ["the manifest has no 'settings' object"]
    sizes = {k: settings.get(k) for k in ("prefix_len", "suffix_len")}
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in sizes.values()):
        return [f"the manifest's settings have no prefix_len and suffix_len (ints >= 1): {sizes}"]
    n = manifest.get("n_windows")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        return [f"the manifest's n_windows must be an int >= 1, got {n!r}"]
    top_k = settings.get("top_k")
    table = {**CACHE_TENSORS, **(PREFIX_STATES if settings.get("prefix_states") else {})}
    missing = sorted(set(table) - set(tensors))
    if missing:
        return [f"it lacks the tensors {missing}"]
    p, m = sizes["prefix_len"], sizes["suffix_len"]
    d = expect["width"] if expect and "width" in expect else tensors["pooled"].shape[-1]
    k = tensors["teacher_ids"].shape[-1] if tensors["teacher_ids"].dim() == 3 else -1
    if k not in (0, top_k):
        return [f"teacher_ids keeps {k} ids per position, the manifest's top_k is {top_k!r}"]
    vocab = expect.get("vocab_size") if expect else None
    dims = {"n": n, "d": d, "m": m, "p": p, "p+m+1": p + m + 1, "k": k,
            "t": k + 1 if k else (vocab + 1 if vocab else tensors["teacher_logp"].shape[-1])}
    problems = []
    for name, (dtypes, shape) in table.items():
        t, want = tensors[name], tuple(dims[s] for s in shape)
        if tuple(t.shape) != want or t.dtype not in dtypes:
            problems.append(f"{name} is {tuple(t.shape)} {t.dtype}, the manifest makes it "
                            f"({', '.join(f'{s}={w}' for s, w in zip(shape, want))}) "
                            f"{' or '.join(str(x) for x in dtypes)}")
    problems += [f"{name} has {t.shape[0] if t.dim() else 0} rows, not one per window ({n})"
                 for name, t in tensors.items() if name not in table and (t.dim() == 0 or t.shape[0] != n)]
    if problems:
        return problems
    vocab = vocab or (dims["t"] - 1 if not k else None)
    for name, what in ID_TENSORS.items():
        t = tensors[name]
        lo = 0 if "token" in what else -1
        hi = vocab if "token" in what else None
        if t.numel() and (int(t.min()) < lo or (hi is not None and int(t.max()) >= hi)):
            problems.append(f"{name} holds {int(t.min())}..{int(t.max())}, each must be {what} in {lo}.."
                            f"{'' if hi is None else hi - 1}")
    if expect:
        asked = {"key": expect.get("key"), "weights_sha256": expect.get("weights_sha256")}
        problems += [f"its {name} is {manifest.get(name)!r}, asked for {want!r}" for name, want in asked.items()
                     if want is not None and manifest.get(name) != want]
        problems += [f"its setting {name} is {settings.get(name)!r}, asked for {want!r}"
                     for name, want in sorted((expect.get("settings") or {}).items()) if settings.get(name) != want]
    return problems


@checked(path=PathArg("a feature cache folder"),
         expect=Instance(dict, "None or the dict build_feature_cache asks for (key, settings, ...)", none=True))
def load_feature_cache(path: str | os.PathLike, expect: dict | None = None) -> FeatureCache:
    """A cache folder written by `build_feature_cache`, after checking its manifest, size and sha256 (a damaged
    or tampered file is refused, naming it: delete the folder to rebuild), and its tensors against the manifest
    (`CACHE_TENSORS`: shapes, dtypes, one row per window, ids in range). `expect` (what `build_feature_cache`
    asked for: key, settings, weights_sha256, vocab_size, width) must match too: a folder holding another cache
    (another LM, top_k or prefix) is refused, not used."""
    folder = Path(path)
    manifest = read_json(folder / MANIFEST_NAME)
    if not isinstance(manifest, dict) or manifest.get("format") != CACHE_FORMAT:
        raise ValueError(f"{str(folder / MANIFEST_NAME)!r} is not a cgt_viz feature cache manifest (format "
                         f"{manifest.get('format') if isinstance(manifest, dict) else None!r}, expected {CACHE_FORMAT!r})")
    file = folder / FEATURES_NAME
    if not file.is_file():
        raise ValueError(f"the feature cache {str(folder)!r} has no {FEATURES_NAME}: damaged; delete the folder to rebuild")
    size = file.stat().st_size
    if size != manifest.get("file_bytes") or sha256_file(file) != manifest.get("sha256"):
        raise ValueError(f"the feature cache file {str(file)!r} is damaged ({size} bytes; the manifest says "
                         f"{manifest.get('file_bytes')} bytes and another sha256): delete {str(folder)!r} to rebuild")
    tensors = load_tensors(file)
    problems = _cache_problems(manifest, tensors, expect)
    if problems:
        raise ValueError(f"the feature cache {str(folder)!r} is not the cache asked for or does not match its "
                         f"manifest: {'; '.join(problems[:4])}{' ...' if len(problems) > 4 else ''}; delete "
                         f"{str(folder)!r} to rebuild")
    return FeatureCache(tensors, manifest, folder)


# ---------------------------------------------------------------------------------------------- the objective
def _scored(model, ybar: torch.Tensor, student_hidden: torch.Tensor, targets: torch.Tensor,
            teacher_ids: torch.Tensor | None, teacher_logp: torch.Tensor | None,
            teacher: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    student = model._logits(student_hidden)                                                  # (b, m, v)
    ce = F.cross_entropy(student.flatten(0, 1).float(), targets.flatten(), reduction="none").view(targets.shape)
    aux = aux_objective(model.config, ce, student, teacher=teacher, teacher_ids=teacher_ids,
                        teacher_logprobs=teacher_logp)
    return {"aux": aux.mean(), "ce": ce.mean().detach(), "ybar": ybar}


def cached_loss(model, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The aux objective of `model.config` (aux_ce · CE + aux_kl · KL to the cached teacher) on a batch of
    `FeatureCache.batch`: ȳ from the pooled read-out, layers ℓ+1..N over the cached suffix states."""
    ybar = model.summary_of_pooled(batch["pooled"])                                          # (b, e)
    coeffs = model._fixed_coeffs(ybar)
    if model.memory is not None:
        if "prefix_x" not in batch:
            raise refuse("cache", "a feature cache with the prefix states a token memory reads (built for a CGTLM "
                         "with memory_layers > 0)", "a cache without prefix_x")
        coeffs.update(model.memory_coeffs(batch["prefix_x"], batch["prefix"]))
    hidden = model._upper_hidden(batch["suffix_x"], coeffs)                                   # (b, m, d)
    return _scored(model, ybar, hidden, batch["targets"], batch.get("teacher_ids"), batch.get("teacher_logp"),
                   batch.get("teacher"))


def uncached_loss(model, tokens: torch.Tensor, prefix_len: int, top_k: int | None = 64) -> dict[str, torch.Tensor]:
    """The same objective as `cached_loss` straight from windows tokens (b, p + m + 1): the prefix's ȳ by the
    model's own pass, the specialised LM over the suffix tokens, the teacher computed now. The reference the
    cache is tested against (equal gradients)."""
    _require_pooled_only(model)
    tokens = tokens.to(model.device)
    m = tokens.shape[1] - prefix_len - 1
    with torch.no_grad():
        teacher_hidden = model.teacher_pass(tokens[:, :prefix_len + m], prefix_len)[0]
        ids, logp = teacher_topk(model._logits(teacher_hidden[:, prefix_len:]), top_k)
    prefix_x, ybar, _ = model._lower(tokens[:, :prefix_len])
    ybar = ybar[:, -1]
    coeffs = {**model._fixed_coeffs(ybar), **model.memory_coeffs(prefix_x, tokens[:, :prefix_len])}
    hidden = model._hidden(tokens[:, prefix_len:prefix_len + m], coeffs)[0]
    return _scored(model, ybar, hidden, tokens[:, prefix_len + 1:].long(), ids, logp)


# ---------------------------------------------------------------------------------------------- training
def trainable_parameters(model) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


# the old head-state format: refused by name, not resumed (train_head wrote it before it ran through train)
OLD_HEAD_STATE_FILES = ("head-state.safetensors", "head-state.json")
OLD_HEAD_STATE_FORMAT = "cgt_viz.head_state/2"


def old_head_state(folder: str | os.PathLike) -> list[str]:
    """The files of a head training state of the old format in `folder` (none: [])."""
    return [name for name in OLD_HEAD_STATE_FILES if (Path(folder) / name).exists()]


def refuse_old_head_state(folder: Path, name: str = "checkpoint_dir") -> None:
    """An interrupted head run of the old format cannot be resumed: say so by name (nothing is removed)."""
    found = old_head_state(folder)
    if found:
        raise refuse(name, "a checkpoint folder of cgt_viz.train (cgt_viz.checkpoint/2)",
                     f"{str(folder)!r}, which holds a head training state of the old format {OLD_HEAD_STATE_FORMAT} "
                     f"({', '.join(found)})",
                     hint="train_head now runs through cgt_viz.train.train and does not resume that format; finish "
                          "that run with cgt_viz 0.x before this change, or remove the folder to train from step 0",
                     verb="be")


def resume_differences(saved: dict, now: dict, flag=lambda k: k) -> list[str]:
    """The settings of a resume that differ from the run's: "<flag> <now> (the run has <then>)" each."""
    return [f"{flag(k)} {now[k]!r} (the run has {saved[k]!r})" for k in sorted(saved)
            if k in now and json.loads(json.dumps(now[k])) != saved[k]]


def head_checkpoint_run(folder: str | os.PathLike) -> dict | None:
    """The run record of the newest checkpoint in `folder` when train_head wrote it (None: no checkpoint, or
    one of another run)."""
    found = latest_checkpoint(folder) if Path(folder).is_dir() else None
    if found is None:
        return None
    # the record alone, not the tensors: train verifies the whole checkpoint when it resumes from it
    state = read_json(found / "state.json")
    run = state.get("run") if isinstance(state, dict) else None
    task = run.get("task") if isinstance(run, dict) else None
    return run if isinstance(task, dict) and task.get("class") == class_name(CachedHeadStep) else None


def checkpoint_settings(folder: str | os.PathLike) -> dict | None:
    """The `settings` a head run recorded with its newest checkpoint in `folder` (None: no head checkpoint)."""
    run = head_checkpoint_run(folder)
    return None if run is None else dict(run["task"].get("settings") or {})


class CachedHeadStep(TrainStep):
    """One update of a `CGTLM(pooled_only=True)` head on a feature cache: `batch_size` windows drawn at random
    (distinct within the batch) from train's batch stream; "total" is the aux objective of the specialised model
    against the cached teacher, "main" its cross-entropy (logged). Validation: the first `eval_windows` windows
    of `val_cache`, in order. A batch is the rows' indices, so a rank's share is cut before a tensor is gathered."""

    logged_terms = ("aux", "main", "total")     # the objective first: what a divergence names

    def __init__(self, cache: FeatureCache, val_cache: FeatureCache | None = None, eval_windows: int = 128,
                 settings: dict | None = None):
        self.cache, self.val_cache, self.eval_windows = cache, val_cache, eval_windows
        self.settings = json.loads(json.dumps(settings or {}))

    def identity(self) -> dict[str, Any]:
        return {"class": class_name(CachedHeadStep), "windows": len(self.cache), "settings": self.settings}

    def check_fits(self, model) -> None:
        _require_pooled_only(model)

    def train_batch(self, step, batch_size, generators, device):
        return self.cache, torch.randperm(len(self.cache), generator=generators["batch"])[:batch_size]

    def val_batches(self, batch_size, n_batches, seed, device):
        n = min(self.eval_windows, len(self.val_cache))
        for i in range(0, n, batch_size):
            yield self.val_cache, torch.arange(i, min(i + batch_size, n))

    def shard(self, batch, lo, hi):
        cache, rows = batch
        return cache, rows[lo:hi]

    def loss(self, model, batch):
        cache, rows = batch                              # (the cache the rows index, row indices)
        # the cache stays on the CPU; DDP on CUDA moves the batch's tensors (the rows) to the rank's device
        out = cached_loss(model, cache.batch(rows.cpu(), model.device))
        return {"main": out["ce"], "aux": out["aux"], "smooth": torch.zeros((), device=out["aux"].device),
                "total": out["aux"]}


_CACHE = Instance(FeatureCache, "a FeatureCache (build_feature_cache, load_feature_cache)")


@checked(cache=_CACHE, steps=Int(1, none=True), minutes=Float(0.0, lo_open=True, none=True), lr=Float(0.0, lo_open=True),
         weight_decay=Float(0.0), warmup=Int(0), seed=Int(0),
         val_cache=Instance(FeatureCache, "a FeatureCache of validation windows", none=True), eval_every=Int(0),
         eval_windows=Int(1), checkpoint_every=Int(1), resume=Bool(), progress=Bool(),
         settings=Instance(dict, "a dict of the run's settings (recorded with its state)", none=True))
def train_head(model, cache: FeatureCache, *, steps: int | None = None, minutes: float | None = None,
               batch_size: int = 16, lr: float = 2e-3, weight_decay: float = 0.0, warmup: int = 20,
               seed: int = 0, val_cache: FeatureCache | None = None, eval_every: int = 0, eval_windows: int = 128,
               checkpoint_dir: str | os.PathLike | None = None, checkpoint_every: int = 50, resume: bool = False,
               callback=None, progress: bool = True, log=None, settings: dict | None = None) -> dict[str, Any]:
    """Train the head of a `CGTLM(pooled_only=True)` on a feature cache: `cgt_viz.train.train` with a
    `CachedHeadStep` (AdamW, linear warm-up, cosine decay to a tenth of lr at `steps`, gradient norm clipped at
    1; with only `minutes` the schedule's length is planned from the rate of the first updates).

    batch_size      the global batch: windows per update over all ranks (under torchrun each rank trains on
                    batch_size // world of them and DDP averages the gradients: the same update as one process)
    checkpoint_dir  train's checkpoints (cgt_viz.checkpoint) every checkpoint_every steps, at the end and on
                    Ctrl-C / an exception; resume=True continues from it (the same steps give the same weights as
                    an uninterrupted run; minutes count again from the resume). A resume with another batch_size,
                    lr, seed, weight_decay, warmup or `settings` (the caller's, e.g. the cache's) is refused,
                    naming them; so is a folder holding the old head-state format.
    callback        called as callback(step, record) after each update (record: train's step event with the global
                    batch's "main" (the cross-entropy), "aux", "total" and "lr"; rank 0 only)
    Ctrl-C (SIGINT, SIGTERM) stops after the step in flight, on every rank, with a checkpoint.
    -> history {"step", "aux", "ce", "val_step", "val_aux", "val_ce", "seconds", "tokens_per_second", "steps",
    "interrupted"} (aux and ce of the global batch; seconds and tokens/s of this call)."""
    from ..train import train
    _require_pooled_only(model)
    for name, fn in (("callback", callback), ("log", log)):
        if fn is not None:
            check_callable(name, fn, "None or a callable")
    if steps is None and minutes is None:
        raise refuse("steps or minutes", "given, or both (training stops at whichever comes first)", "neither")
    check_int("batch_size", batch_size, 1, len(cache), hint=f" (the cache holds {len(cache)} windows)")
    folder = None if checkpoint_dir is None else Path(checkpoint_dir)
    if resume and folder is None:
        raise refuse("checkpoint_dir", "set with resume=True (the folder a previous train_head wrote)", "None")
    if folder is not None:
        refuse_old_head_state(folder)
    if val_cache is None:
        eval_every = 0
    n_val = 0 if val_cache is None else min(eval_windows, len(val_cache))
    hist: dict[str, Any] = {k: [] for k in ("step", "aux", "ce", "val_step", "val_aux", "val_ce")}
    first = {"step": 0}

    def record(event: dict) -> None:
        kind = event["kind"]
        if kind == "start":
            first["step"] = event["step"]
            if event["step"] and log:
                log(f"resumed at step {event['step']} from {str(folder)!r}")
        elif kind == "step":
            hist["step"].append(event["step"])
            hist["aux"].append(event["aux"])
            hist["ce"].append(event["main"])
            if callback is not None:
                callback(event["step"], event)
        elif kind == "eval":
            hist["val_step"].append(event["step"])
            hist["val_aux"].append(event["val_aux"])
            hist["val_ce"].append(event["val_main"])
            if log:
                recent = hist["aux"][-eval_every:] or [float("nan")]
                log(f"step {event['step']}: train aux {np.mean(recent):.4f} | val aux {event['val_aux']:.4f} "
                    f"ce {event['val_main']:.4f}")

    step = CachedHeadStep(cache, val_cache, eval_windows, settings)
    t0 = time.perf_counter()
    history, interrupted = None, False
    with process_group(model.device, GROUP_TIMEOUT_MINUTES) as (dev, _, _, _):
        try:
            _, history = train(model, step, steps=steps, minutes=minutes, batch_size=batch_size, lr=lr,
                               weight_decay=weight_decay, warmup=warmup, min_lr_ratio=0.1, grad_clip=1.0, seed=seed,
                               eval_every=eval_every, eval_batches=max(1, math.ceil(n_val / batch_size)),
                               checkpoint_every=checkpoint_every, keep_checkpoints=1, plateau_steps=0,
                               device=dev, amp=False, checkpoint_dir=folder, resume=resume, progress=progress,
                               callbacks=[record])
        except KeyboardInterrupt:
            interrupted = True           # train checkpointed the finished steps: resume=True continues from them
        finally:
            model.eval()
    if history is not None:              # the whole run's curves (a resumed run's earlier steps too)
        interrupted = history.interrupted
        hist = {"step": list(history.step), "aux": list(history.aux), "ce": list(history.main),
                "val_step": [int(e["step"]) for e in history.evals], "val_aux": [e["val_aux"] for e in history.evals],
                "val_ce": [e["val_main"] for e in history.evals]}
    seconds = time.perf_counter() - t0
    done = hist["step"][-1] if hist["step"] else first["step"]
    m = cache.tensors["suffix_x"].shape[1]
    hist.update(steps=done, seconds=seconds, interrupted=interrupted,
                tokens_per_second=(done - first["step"]) * batch_size * m / max(seconds, 1e-9))
    return hist


@torch.no_grad()
@checked(cache=_CACHE, windows=Int(1, none=True), batch_size=Int(1))
def evaluate_cache(model, cache: FeatureCache, windows: int | None = None, batch_size: int = 16) -> dict[str, float]:
    """Mean aux objective and cross-entropy of the specialised model over the first `windows` of a cache."""
    _require_pooled_only(model)
    was = model.training
    model.eval()
    n = len(cache) if windows is None else min(windows, len(cache))
    aux = ce = 0.0
    try:
        for i in range(0, n, batch_size):
            rows = torch.arange(i, min(i + batch_size, n))
            out = cached_loss(model, cache.batch(rows, model.device))
            aux += float(out["aux"]) * len(rows)
            ce += float(out["ce"]) * len(rows)
    finally:
        model.train(was)
    return {"aux": aux / n, "ce": ce / n}
