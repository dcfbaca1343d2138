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
`train_head` every rank draws the same global batch and trains on its own contiguous share of its rows, the
gradients are averaged over the ranks (one all-reduce per step), and only rank 0 evaluates, logs and writes
checkpoints. The process group is the from-scratch trainer's (`cgt_viz.train`): gloo on CPU, nccl on CUDA.
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

from .._checks import (Bool, Choice, Float, Instance, Int, PathArg, check_callable, check_divisible, check_int, checked,
                       describe, refuse)
from ..distill import aux_objective, teacher_topk
from ..io import load_tensors, published_folder, read_json, save_tensors, sha256_file, write_json
from .._ranks import process_group
from ..train import StopOnSignal, TrainingDiverged
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


HEAD_STATE = "head-state.safetensors"
HEAD_STATE_JSON = "head-state.json"


HEAD_STATE_FORMAT = "cgt_viz.head_state/2"
HISTORY_KEYS = ("step", "aux", "ce", "val_step", "val_aux", "val_ce")


def _save_head_state(folder: Path, model, opt, gen, order, info: dict) -> None:
    """The head, its AdamW state, the data order and the random stream: what resuming needs (no pickle).

    The tensors' file is the state: one atomic write that carries its own step, plan, history and settings
    (`info`, as JSON in the safetensors metadata), so a death between it and head-state.json (a copy of `info`
    for people and for `train-head`'s checks before loading) resumes from the file, never from a step the file
    does not hold."""
    tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
    for i, p in enumerate(opt.param_groups[0]["params"]):
        for name, value in opt.state.get(p, {}).items():
            tensors[f"opt.{i}.{name}"] = value if isinstance(value, torch.Tensor) else torch.tensor(value)
    tensors["generator"], tensors["order"] = gen.get_state(), order
    folder.mkdir(parents=True, exist_ok=True)
    save_tensors(folder / HEAD_STATE, tensors, metadata={"format": HEAD_STATE_FORMAT, "info": json.dumps(info)})
    write_json(folder / HEAD_STATE_JSON, info)


def _head_state_info(folder: Path) -> dict:
    """The step, plan, history and settings of the head state in `folder`, checked: from the tensors' file
    (format /2), else (a state written before it) from head-state.json."""
    file = folder / HEAD_STATE
    try:
        from safetensors import safe_open
        with safe_open(str(file), framework="pt") as f:
            meta = dict(f.metadata() or {})
    except Exception:   # noqa: BLE001 — named below as not a readable state (or as missing)
        meta = None
    if meta is None:
        if not file.is_file():
            raise FileNotFoundError(f"no head training state at {str(file)!r} (head-state.json names one); the "
                                    f"checkpoint is incomplete: remove {str(folder)!r} to train from step 0")
        raise ValueError(f"{str(file)!r} is not a readable safetensors file (truncated or tampered?)")
    where, info = (file, None) if "info" in meta else (folder / HEAD_STATE_JSON, read_json(folder / HEAD_STATE_JSON))
    if info is None:
        try:
            info = json.loads(meta["info"])
        except ValueError:
            info = None
    if not isinstance(info, dict) or not isinstance(info.get("step"), int) or isinstance(info.get("step"), bool):
        raise ValueError(f"{str(where)!r} is not a head training state (no integer 'step')")
    history = info.get("history")
    lacking = ([k for k in HISTORY_KEYS if not isinstance(history.get(k), list)] if isinstance(history, dict)
               else ["history"])
    if lacking:
        raise ValueError(f"{str(where)!r} is not a complete head training state: "
                         f"{'history' if lacking == ['history'] else 'history ' + repr(lacking)} missing or not "
                         f"{'a JSON object' if lacking == ['history'] else 'lists'} (tampered, or written by "
                         f"something else); remove {str(folder)!r} to train from step 0")
    return info


def _has_head_state(folder: Path) -> bool:
    """A state to resume: the JSON, or the tensors' file of format /2 alone (a death before its first JSON)."""
    return (folder / HEAD_STATE_JSON).exists() or (folder / HEAD_STATE).exists()


def resume_differences(saved: dict, now: dict, flag=lambda k: k) -> list[str]:
    """The settings of a resume that differ from the run's: "<flag> <now> (the run has <then>)" each."""
    return [f"{flag(k)} {now[k]!r} (the run has {saved[k]!r})" for k in sorted(saved)
            if k in now and json.loads(json.dumps(now[k])) != saved[k]]


def _load_head_state(folder: Path, model, opt, gen) -> tuple[torch.Tensor, dict]:
    info = _head_state_info(folder)
    file = folder / HEAD_STATE
    tensors = load_tensors(file)
    lacking = [k for k in ("generator", "order") if k not in tensors]
    if lacking:
        raise ValueError(f"{str(file)!r} is not a complete head training state: it lacks {lacking} (tampered, or "
                         f"written by something else); remove {str(folder)!r} to train from step 0")
    state = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    wrong = [f"{k}: the state has {tuple(state[k].shape)}, this model {want[k]}" for k in want
             if k in state and tuple(state[k].shape) != want[k]]
    missing, unexpected = sorted(set(want) - set(state)), sorted(set(state) - set(want))
    if wrong or missing or unexpected:
        raise ValueError(f"the head state in {str(file)!r} is of another head than this model: "
                         + "; ".join(filter(None, [f"shapes differ ({'; '.join(wrong[:3])})" if wrong else "",
                                                   f"missing {missing[:5]}" if missing else "",
                                                   f"unexpected {unexpected[:5]}" if unexpected else ""]))
                         + "; resume with the run's settings (d_y, n_templates, template_rank, sites, y_layer)")
    model.load_state_dict(state)
    for i, p in enumerate(opt.param_groups[0]["params"]):
        state = {k.split(".", 2)[2]: v for k, v in tensors.items() if k.startswith(f"opt.{i}.")}
        if state:
            opt.state[p] = state
    gen.set_state(tensors["generator"])
    return tensors["order"], info


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
    """Train the head of a `CGTLM(pooled_only=True)` on a feature cache (AdamW, linear warmup, cosine decay to
    a tenth of lr over `steps`; with only `minutes` the schedule assumes the step rate of the first 10 steps).

    batch_size      the global batch: windows per update over all ranks (under torchrun each rank trains on
                    batch_size // world of them and the gradients are averaged: the same update as one process)
    checkpoint_dir  write the head, optimizer, data order and random stream there every checkpoint_every steps,
                    at the end and on Ctrl-C / an exception; resume=True continues from it (the same steps give
                    the same weights as an uninterrupted run; minutes count again from the resume). The state
                    records steps, batch_size, lr, seed, weight_decay, warmup and `settings` (the caller's, e.g.
                    the cache's): a resume with other values is refused, naming them
    callback        called as callback(step, out) after each update (out: the step's loss dict; rank 0 only)
    Ctrl-C (SIGINT, SIGTERM) stops after the step in flight, on every rank, with a checkpoint.
    -> history {"step", "aux", "ce", "val_step", "val_aux", "val_ce", "seconds", "tokens_per_second", "steps",
    "interrupted"} (aux and ce of the global batch)."""
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
    with process_group(model.device, GROUP_TIMEOUT_MINUTES) as (dev, distributed, rank, world):
        check_divisible("batch_size", batch_size, world, "the number of ranks")
        model.to(dev)
        run = {"steps": steps, "batch_size": batch_size, "lr": lr, "seed": seed, "weight_decay": weight_decay,
               "warmup": warmup, **json.loads(json.dumps(settings or {}))}
        return _train_head(model, cache, steps, minutes, batch_size, lr, weight_decay, warmup, seed, val_cache,
                           eval_every, eval_windows, folder, checkpoint_every, resume, callback, progress, log,
                           distributed, rank, world, run)


def _train_head(model, cache, steps, minutes, batch_size, lr, weight_decay, warmup, seed, val_cache, eval_every,
                eval_windows, folder, checkpoint_every, resume, callback, progress, log, distributed, rank,
                world, run) -> dict[str, Any]:
    dev = model.device
    is_main = rank == 0
    lo, hi = rank * (batch_size // world), (rank + 1) * (batch_size // world)
    gen = torch.Generator().manual_seed(seed)
    params = trainable_parameters(model)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    hist: dict[str, Any] = {"step": [], "aux": [], "ce": [], "val_step": [], "val_aux": [], "val_ce": []}
    planned, step, order = steps, 0, torch.empty(0, dtype=torch.long)
    if resume and _has_head_state(folder):
        differ = resume_differences(_head_state_info(folder).get("settings", {}), run)
        if differ:
            raise ValueError(f"resume: the head state in {str(folder)!r} was trained with other settings: "
                             + "; ".join(differ) + ". Resume with the run's settings, or train from step 0 in "
                             "another checkpoint_dir")
        order, info = _load_head_state(folder, model, opt, gen)     # every rank reads rank 0's state
        step, planned, hist = info["step"], info.get("planned", steps), info["history"]
        if log and is_main:
            log(f"resumed at step {step} from {str(folder)!r}")
    if distributed:       # the ranks start from rank 0's head, as DDP would (its calibration and init)
        for value in model.state_dict().values():
            dist.broadcast(value, 0)
    deadline = None if minutes is None else time.perf_counter() + 60 * minutes
    t0, first = time.perf_counter(), step
    m = cache.tensors["suffix_x"].shape[1]

    saved = {"path": folder if resume and folder is not None and _has_head_state(folder) else None,
             "step": step if resume else None}

    def checkpoint():
        # NaN/inf weights (an update that overflowed) never replace the last good state
        if (folder is not None and is_main and saved["step"] != step
                and all(bool(torch.isfinite(p).all()) for p in params)):
            _save_head_state(folder, model, opt, gen, order, {"step": step, "planned": planned, "history": hist,
                                                              "settings": run})
            saved.update(path=folder, step=step)

    def diverged(term: str, value: float) -> TrainingDiverged:
        """Stop before the update (train()'s promise): the head keeps the weights of the last good step, and
        the checkpoint holds them (written here, so that the message can name it)."""
        opt.zero_grad(set_to_none=True)
        finite = all(bool(torch.isfinite(p).all()) for p in params)
        checkpoint()
        return TrainingDiverged(step + 1, term, value, hist, saved["path"] if is_main else folder,
                                weights_finite=finite, hint="Try a lower lr or a longer warmup.")

    bar = None
    if progress and is_main:
        from tqdm.auto import tqdm
        bar = tqdm(total=steps, initial=step, desc="train head", unit="step")
    model.train()
    interrupted = False
    try:
        with StopOnSignal() as stop:
            while steps is None or step < steps:
                if len(order) < batch_size:                      # epochs of a fresh permutation
                    order = torch.cat([order, torch.randperm(len(cache), generator=gen)])
                rows = order[:batch_size]
                if step - first == 10 and planned is None:        # minutes only: plan the schedule from the rate
                    planned = step + max(1, int(10 * 60 * minutes / (time.perf_counter() - t0)))
                    if distributed:                               # rank 0's plan, so that the ranks' lr agree
                        plan = torch.tensor([planned], device=dev)
                        dist.broadcast(plan, 0)
                        planned = int(plan)
                horizon = planned or 10 ** 9
                scale = (min(1.0, (step + 1) / warmup)
                         * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / horizon)))))
                for g in opt.param_groups:
                    g["lr"] = lr * scale
                out = cached_loss(model, cache.batch(rows[lo:hi], dev))
                opt.zero_grad(set_to_none=True)
                out["aux"].backward()
                late = deadline is not None and time.perf_counter() >= deadline
                # one all-reduce: the gradients, the global batch's losses and whether any rank must stop
                aux, ce, stop_now, timed_out = _sync_step(params, [out["aux"].detach(), out["ce"], stop.requested,
                                                                    late], distributed, world)
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, 1.0))
                bad = [(k, v) for k, v in (("aux", aux), ("ce", ce)) if not math.isfinite(v)]
                if bad or not math.isfinite(grad_norm):
                    raise diverged(*(bad[0] if bad else ("gradient norm of the aux", grad_norm)))
                opt.step()
                if not all(bool(torch.isfinite(p).all()) for p in params):
                    raise diverged("weights after the update", float("nan"))
                order = order[batch_size:]
                step += 1
                hist["step"].append(step)
                hist["aux"].append(aux)
                hist["ce"].append(ce)
                if is_main:
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix(aux=f"{aux:.3f}")
                    if val_cache is not None and eval_every and step % eval_every == 0:
                        val = evaluate_cache(model, val_cache, windows=eval_windows)
                        hist["val_step"].append(step)
                        hist["val_aux"].append(val["aux"])
                        hist["val_ce"].append(val["ce"])
                        if log:
                            log(f"step {step}: train aux {np.mean(hist['aux'][-eval_every:]):.4f} | val aux "
                                f"{val['aux']:.4f} ce {val['ce']:.4f}")
                        model.train()
                    if step % checkpoint_every == 0:
                        checkpoint()
                    if callback is not None:
                        callback(step, out)
                # one process: also a Ctrl-C that came during this step's evaluation or callback
                if stop_now or (not distributed and stop.requested):
                    interrupted = True
                    break
                if timed_out:
                    break
    except KeyboardInterrupt:
        interrupted = True             # the finished steps are kept: resume=True continues from here
    finally:
        checkpoint()
        if bar is not None:
            bar.close()
        model.eval()
    seconds = time.perf_counter() - t0
    hist.update(steps=step, seconds=seconds, interrupted=interrupted,
                tokens_per_second=(step - first) * batch_size * m / max(seconds, 1e-9))
    return hist


def _sync_step(params: list[torch.Tensor], report: list, distributed: bool, world: int) -> list:
    """Average the gradients over the ranks and reduce a step's report [aux, ce, stop flags...] in one
    all-reduce: the losses averaged, each flag true when any rank's is. -> [aux, ce, flag, ...] as Python values.

    (By hand rather than DistributedDataParallel: DDP would broadcast the frozen LM's weights at wrapping and
    needs a forward() that is this loss; the head's gradients are one small buffer.)"""
    values = [float(v) for v in report]
    if not distributed:
        return values[:2] + [bool(v) for v in values[2:]]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.flatten().float() for g in grads] + [torch.tensor(values, device=grads[0].device)])
    dist.all_reduce(flat)
    n = flat.numel() - len(values)
    flat[:n] /= world
    offset = 0
    for p, g in zip(params, grads):
        p.grad = flat[offset:offset + g.numel()].view_as(g).to(g.dtype)
        offset += g.numel()
    tail = flat[n:].tolist()
    return [tail[0] / world, tail[1] / world] + [v > 0 for v in tail[2:]]


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
