"""Shared helpers for the benchmark scripts: timing (warm-up, repeats, median and spread), peak memory,
device handling (CUDA sync, bf16 autocast), a record of the environment, the analytic FLOP model, the
same-size CGT / GPT pair every cost benchmark measures, and the timed training step (CGT vs GPT).

Every benchmark writes plain JSON; nothing here asserts a timing target (see benchmarks/README.md).
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
if str(REPO_ROOT) not in sys.path:  # `python benchmarks/x.py` puts only benchmarks/ on the path
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

if TYPE_CHECKING:  # cgt_viz is imported lazily: bench_explorer times its import
    from cgt_viz import CGT, CGTConfig

DEFAULT_RESULTS = BENCH_DIR / "results"
README_PATH = BENCH_DIR / "README.md"


# ---------------------------------------------------------------------------------------------- device
def pick_device(name: str) -> torch.device:
    """"auto" -> cuda when available else cpu; "cpu"/"cuda" as asked (cuda must exist)."""
    if name not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be one of 'auto', 'cpu', 'cuda', got {name!r}")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for but torch.cuda.is_available() is False")
    return torch.device(name)


def sync(device: torch.device) -> None:
    """Wait for queued GPU work so that wall-clock times measure it (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(device: torch.device):
    """bf16 autocast on CUDA, nothing on CPU (fp32 there)."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def inference_call(fn: Callable[[], object], device: torch.device) -> Callable[[], None]:
    """fn wrapped for timing: no autograd, bf16 autocast on CUDA."""
    def call() -> None:
        with torch.no_grad(), autocast(device):
            fn()
    return call


def summarize_times(times: dict[str, list[float]], numerator: str, denominator: str) -> dict:
    """{name: summarize(ts)} for every timed call, with ratio_median and ratio_min of numerator / denominator."""
    out = {n: summarize(ts) for n, ts in times.items()}
    out["ratio_median"] = ratio(out[numerator]["median"], out[denominator]["median"])
    out["ratio_min"] = ratio(out[numerator]["min"], out[denominator]["min"])
    return out


def parser(doc: str | None) -> argparse.ArgumentParser:
    """An argument parser whose --help prints the script's docstring as written."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def dtype_name(device: torch.device) -> str:
    return "bf16 autocast" if device.type == "cuda" else "fp32"


# ---------------------------------------------------------------------------------------------- timing
def summarize(samples: Sequence[float]) -> dict:
    """Median and spread of timing samples (seconds): n, median, mean, min, max, p10, p25, p75, p90."""
    xs = sorted(float(x) for x in samples)
    if not xs:
        raise ValueError("summarize needs at least one sample, got an empty sequence")

    def q(p: float) -> float:  # linear interpolation between closest ranks
        pos = p * (len(xs) - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    return {"n": len(xs), "median": statistics.median(xs), "mean": statistics.fmean(xs), "min": xs[0],
            "max": xs[-1], "p10": q(0.10), "p25": q(0.25), "p75": q(0.75), "p90": q(0.90)}


def time_fn(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int = 1) -> list[float]:
    """Wall-clock seconds of `repeats` calls of fn() after `warmup` untimed calls (GPU synced around each)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        fn()
    sync(device)
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        out.append(time.perf_counter() - t0)
    return out


def time_interleaved(fns: dict[str, Callable[[], object]], device: torch.device, repeats: int,
                     warmup: int = 1) -> dict[str, list[float]]:
    """Like time_fn for several functions, alternating them every repeat, so that a change of machine load
    during the run hits all of them alike (ratios between them stay meaningful on a shared machine)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    sync(device)
    out: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            sync(device)
            out[name].append(time.perf_counter() - t0)
    return out


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den


# ---------------------------------------------------------------------------------------------- memory
def _read_status_kib(field: str) -> int | None:
    try:
        m = re.search(rf"^{field}:\s+(\d+)\s+kB", Path("/proc/self/status").read_text(), re.M)
    except OSError:
        return None
    return int(m.group(1)) if m else None


def reset_peak_memory(device: torch.device) -> bool:
    """Start a new peak-memory window. On Linux the RSS high-water mark is reset through
    /proc/self/clear_refs; elsewhere the peak stays the process's lifetime peak. Returns whether it was reset."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return True
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def current_rss_bytes() -> int | None:
    kib = _read_status_kib("VmRSS")
    if kib is not None:
        return kib * 1024
    try:
        import psutil
        return int(psutil.Process().memory_info().rss)
    except Exception:  # psutil is optional
        return None


def peak_memory_bytes(device: torch.device) -> dict:
    """{"kind": "cuda_max_memory_allocated" | "rss_peak", "bytes": int}: peak since reset_peak_memory."""
    if device.type == "cuda":
        return {"kind": "cuda_max_memory_allocated", "bytes": int(torch.cuda.max_memory_allocated(device))}
    kib = _read_status_kib("VmHWM")
    if kib is None:  # ru_maxrss is KiB on Linux, bytes on macOS; it never resets
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return {"kind": "rss_peak_lifetime", "bytes": int(peak if sys.platform == "darwin" else peak * 1024)}
    return {"kind": "rss_peak", "bytes": kib * 1024}


# ---------------------------------------------------------------------------------------------- environment
def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _cpu_model() -> str:
    try:
        m = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        if m:
            return m.group(1).strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: torch.device) -> dict:
    """Versions, threads, device and machine load: enough to judge whether two result files compare."""
    env = {
        "torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform(),
        "device": device.type, "dtype": dtype_name(device), "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(), "cpu_model": _cpu_model(), "git_commit": _git_commit(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        env["load_average_1_5_15"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        env["load_average_1_5_15"] = None
    if device.type == "cuda":
        env["cuda_device"] = torch.cuda.get_device_name(device)
        env["cuda_version"] = torch.version.cuda
    return env


def matmul_peak_flops(device: torch.device, n: int | None = None, repeats: int = 5) -> dict:
    """Measured FLOP/s of one large square matmul (fp32 n = 1024 on CPU, bf16 n = 8192 on CUDA): the
    machine's practical peak."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    n = n or (8192 if device.type == "cuda" else 1024)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    times = time_fn(lambda: a @ b, device, repeats=repeats, warmup=2)
    best = min(times)
    return {"n": n, "dtype": str(dtype).replace("torch.", ""), "flops_per_call": 2 * n ** 3,
            "seconds_best": best, "seconds_median": statistics.median(times), "flops_per_s": 2 * n ** 3 / best}


# ---------------------------------------------------------------------------------------------- FLOP model
def _x_block(cfg: CGTConfig, keys: int) -> int:
    """Forward FLOPs of one x block for one query attending to `keys` keys (2 per multiply-add)."""
    d = cfg.d_x
    return 2 * d * 3 * d + 2 * d * d + 2 * 2 * d * cfg.mlp_ratio * d + 4 * d * keys


def _y_block(cfg: CGTConfig, keys: int) -> int:
    d, e = cfg.d_x, cfg.d_y
    return 2 * (d + e) * 3 * e + 2 * e * e + 2 * (d + e) * cfg.mlp_ratio * e + 2 * cfg.mlp_ratio * e * e + 4 * e * keys


def _templates(cfg: CGTConfig, with_coeffs: bool) -> int:
    """Unmerged template application per token at every site (+ c(ȳ) = A ȳ + b when computed per token)."""
    coeffs = 2 * cfg.d_y * cfg.n_templates if with_coeffs else 0
    per_layer = sum(4 * cfg.n_templates * cfg.template_rank * cfg.site_dim(s) + coeffs for s in cfg.sites)
    return (cfg.n_layer - cfg.y_layer) * per_layer


def token_flops(cfg: CGTConfig, keys: int, kind: str) -> int:
    """FLOPs to process one token that attends to `keys` keys, head included.
    kind: "gpt" (also the merged compiled model), "cgt" (full, per-token ȳ), "specialized" (unmerged, frozen ȳ)."""
    x = cfg.n_layer * _x_block(cfg, keys) + 2 * cfg.d_x * cfg.out_dim
    if kind == "gpt":
        return x
    if kind == "cgt":
        return x + cfg.y_layer * _y_block(cfg, keys) + _templates(cfg, with_coeffs=True)
    if kind == "specialized":
        return x + _templates(cfg, with_coeffs=False)
    raise ValueError(f"kind must be 'gpt', 'cgt' or 'specialized', got {kind!r}")


def prefill_flops(cfg: CGTConfig, t: int, kind: str) -> int:
    """FLOPs of one causal forward over t tokens (token j attends to j keys; logits at every position)."""
    return sum(token_flops(cfg, j, kind) for j in range(1, t + 1))


def aux_padded_lengths(cfg: CGTConfig, batch: int, seq: int, draws: int = 256, seed: int = 0) -> dict:
    """Mean positions per row that the aux pass computes for splits drawn as in training: "exact" (each row's
    own suffix), "grouped" (rows in the model's own length groups, `cgt_viz.losses.aux_length_groups`, each
    padded to its longest) and "padded" (every row padded to the longest suffix of the batch)."""
    from cgt_viz.losses import AUX_LENGTH_GROUPS, aux_length_groups

    gen = torch.Generator().manual_seed(seed)
    lo, hi = cfg.aux_min_prefix, seq - cfg.aux_min_suffix
    cap = cfg.aux_suffix_len or seq
    tot = {"exact": 0.0, "grouped": 0.0, "padded": 0.0}
    for _ in range(draws):
        split = torch.randint(lo, hi + 1, (batch,), generator=gen)
        suffix = (seq - split).clamp(max=cap)
        tot["exact"] += float(suffix.sum())
        tot["padded"] += batch * float(suffix.max())
        tot["grouped"] += sum(len(g) * float(suffix[g].max()) for g in aux_length_groups(split))
    out = {k: v / (draws * batch) for k, v in tot.items()}
    out["groups"] = AUX_LENGTH_GROUPS
    return out


def training_flops(cfg: CGTConfig, batch: int, seq: int) -> dict:
    """Analytic forward FLOPs of one loss evaluation (matmuls and attention; backward ≈ 2× forward), CGT / GPT,
    with the aux pass at its mean computed length per row (exact, as grouped by the model, fully padded)."""
    gpt_fwd = batch * prefill_flops(cfg, seq, "gpt")
    main = batch * prefill_flops(cfg, seq, "cgt")
    lens = aux_padded_lengths(cfg, batch, seq)
    out = {"gpt_forward": gpt_fwd, "cgt_main_forward": main, "aux_len_per_row": lens,
           "ratio_main_only": main / gpt_fwd}
    for kind in ("exact", "grouped", "padded"):
        m = max(1, round(lens[kind]))
        aux = batch * prefill_flops(cfg, m, "specialized") if cfg.w_aux > 0 else 0
        out[f"ratio_aux_{kind}"] = (main + aux) / gpt_fwd
    out["ratio"] = out["ratio_aux_grouped"]
    return out


def training_step_flops(cfg: CGTConfig, batch: int, seq: int) -> dict:
    """Analytic FLOPs of one training step (forward + backward ≈ 3 × forward), {"gpt": ..., "cgt": ...}; the
    CGT's aux pass at the model's grouped length (training_flops' "ratio")."""
    tf = training_flops(cfg, batch, seq)
    return {"gpt": 3 * tf["gpt_forward"], "cgt": 3 * tf["ratio"] * tf["gpt_forward"]}


# ---------------------------------------------------------------------------------------------- models
def build_models(args, block_size: int, device: torch.device) -> tuple[CGT, torch.nn.Module]:
    """The CGT of add_model_args' sizes (w_aux = 1) and a separate plain GPT of the same x size
    (`cgt.x_only()`: its own copy of the x weights), both in eval mode on `device`. Template coefficients get
    small random values so that specialisation really changes the weights (cost does not depend on them)."""
    from cgt_viz import CGT, CGTConfig

    cfg = CGTConfig(vocab_size=args.vocab, block_size=block_size, n_layer=args.n_layer, d_x=args.d_x,
                    n_head=args.n_head, d_y=args.d_y, n_head_y=args.n_head_y, y_layer=args.y_layer,
                    n_templates=args.n_templates, template_rank=args.template_rank, w_aux=1.0)
    torch.manual_seed(args.seed)
    cgt = CGT(cfg)
    with torch.no_grad():
        for layer, site in cgt.template_sites:
            torch.nn.init.normal_(cgt.templates[str(layer)][site].coeff.weight, 0.0, 0.02)
    gpt = cgt.x_only()
    return cgt.to(device).eval(), gpt.to(device).eval()


# ---------------------------------------------------------------------------------------------- training step
TRAINING_KINDS = ("forward", "forward_backward", "step")


def measure_training(cgt: CGT, gpt: torch.nn.Module, device: torch.device, batch: int, seq: int,
                     repeats: int, seed: int = 0, kinds: Sequence[str] = TRAINING_KINDS) -> dict:
    """Seconds per training step, CGT (main + aux at the config's w_aux) vs GPT on the same (batch, seq)
    tokens; forward only, forward + backward, and the full step with AdamW (`kinds`: a subset of those).
    Splits are sampled per step."""
    if not kinds or any(k not in TRAINING_KINDS for k in kinds):
        raise ValueError(f"kinds must be a non-empty subset of {TRAINING_KINDS}, got {kinds!r}")
    cfg = cgt.config
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen).to(device)
    targets = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen).to(device)
    split_gen = torch.Generator().manual_seed(seed + 1)
    opts = {"gpt": torch.optim.AdamW(gpt.parameters(), lr=1e-4), "cgt": torch.optim.AdamW(cgt.parameters(), lr=1e-4)}
    models = {"gpt": gpt, "cgt": cgt}
    for m in models.values():
        m.train()

    def loss(name: str) -> torch.Tensor:
        with autocast(device):
            if name == "cgt":
                return cgt.loss(idx, targets, generator=split_gen)["total"]
            return gpt.loss(idx, targets)["total"]

    def fwd(name):
        with torch.no_grad():
            loss(name)

    def fwd_bwd(name):
        models[name].zero_grad(set_to_none=True)
        loss(name).backward()

    def step(name):
        opts[name].zero_grad(set_to_none=True)
        loss(name).backward()
        opts[name].step()

    out = {"batch": batch, "seq": seq, "w_aux": cfg.w_aux, "aux_suffix_len": cfg.aux_suffix_len}
    for kind, fn in ((k, f) for k, f in zip(TRAINING_KINDS, (fwd, fwd_bwd, step)) if k in kinds):
        times = time_interleaved({n: (lambda n=n: fn(n)) for n in ("gpt", "cgt")}, device, repeats)
        out[kind] = {n: summarize(ts) for n, ts in times.items()}
        out[kind]["ratio_median"] = ratio(out[kind]["cgt"]["median"], out[kind]["gpt"]["median"])
        out[kind]["ratio_min"] = ratio(out[kind]["cgt"]["min"], out[kind]["gpt"]["min"])
        # per-repeat ratios (neighbouring calls share the machine's load): their spread says how noisy it was
        out[kind]["ratio_per_repeat"] = summarize([c / g for c, g in zip(times["cgt"], times["gpt"])])
    for m in models.values():
        m.zero_grad(set_to_none=True)
        m.eval()
    return out


# ---------------------------------------------------------------------------------------------- output
def write_json(path: Path, obj: dict) -> None:
    """Atomic JSON write (a crash leaves the previous file); NaN/inf are written as null."""
    from cgt_viz.io import write_json as _write

    _write(path, _finite(obj))


def _finite(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def replace_readme_section(readme: Path, name: str, body: str) -> None:
    """Put `body` between <!-- name:begin --> and <!-- name:end --> in readme (appended when absent)."""
    from cgt_viz.io import atomic_write

    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    text = readme.read_text() if readme.exists() else ""
    block = f"{begin}\n{body.rstrip()}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + ("\n\n" if text else "") + block + "\n"

    def _write(tmp: str) -> None:
        Path(tmp).write_text(text)
    atomic_write(readme, _write)


def fmt(x: float | None, digits: int = 3) -> str:
    """A number for a markdown table ("—" for missing)."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    return f"{x:.{digits}g}"


def token_tfidf(token_lists) -> "np.ndarray":
    """TF-IDF (sublinear tf) over token ids, one row per sequence (a list of lists or an (n, L) tensor): the
    model-free topic reference the text benchmarks put beside ȳ."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    rows = token_lists.tolist() if hasattr(token_lists, "tolist") else token_lists
    vec = TfidfVectorizer(analyzer=lambda ids: [str(i) for i in ids], sublinear_tf=True)
    return vec.fit_transform(rows).toarray()


def grouped_knn(features: np.ndarray, labels: np.ndarray, groups: np.ndarray, k: int = 10, folds: int = 5,
                seed: int = 0) -> float:
    """kNN (cosine) topic accuracy with folds grouped by document: no excerpt is judged by its own document
    (`cgt_viz.evaluate.knn_topic_accuracy` with groups, the benchmarks' k = 10)."""
    from cgt_viz.evaluate import knn_topic_accuracy
    return knn_topic_accuracy(features, labels, n_neighbors=k, folds=folds, seed=seed, groups=groups)


def positive_int_list(name: str, text: str) -> list[int]:
    """argparse helper: "64,256,1024" -> [64, 256, 1024]; bad input names the option."""
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{name} must be a comma-separated list of positive ints, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise ValueError(f"{name} must be a comma-separated list of positive ints, got {text!r}")
    return vals


def add_output_args(p, what: str) -> None:
    """--seed, --out (a folder for `what`), --write-readme and --readme, shared by the table-writing benchmarks."""
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(DEFAULT_RESULTS), help=f"folder for {what}")
    p.add_argument("--write-readme", action="store_true", help="write the results tables into --readme")
    p.add_argument("--readme", default=str(README_PATH))


def add_model_args(p) -> None:
    """The device, thread and model-size flags both benchmark scripts share (the same-size CGT and GPT)."""
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (the shared machine: 1)")
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--d-x", type=int, default=256)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=8)
    p.add_argument("--d-y", type=int, default=128)
    p.add_argument("--n-head-y", type=int, default=4)
    p.add_argument("--y-layer", type=int, default=2)
    p.add_argument("--n-templates", type=int, default=8)
    p.add_argument("--template-rank", type=int, default=1)
