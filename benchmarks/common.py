"""Shared helpers for the benchmark scripts: timing (warm-up, repeats, median and spread), peak memory,
device handling (CUDA sync, bf16 autocast) and a record of the environment.

Every benchmark writes plain JSON; nothing here asserts a timing target (see benchmarks/README.md).
"""
from __future__ import annotations

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
from typing import Callable, Sequence

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
if str(REPO_ROOT) not in sys.path:  # `python benchmarks/x.py` puts only benchmarks/ on the path
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

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


def positive_int_list(name: str, text: str) -> list[int]:
    """argparse helper: "64,256,1024" -> [64, 256, 1024]; bad input names the option."""
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{name} must be a comma-separated list of positive ints, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise ValueError(f"{name} must be a comma-separated list of positive ints, got {text!r}")
    return vals


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
