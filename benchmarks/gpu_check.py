"""One prepared GPU check (issue 16): runs the CUDA paths once and says what it could not run.

    make gpu-check                     # = python benchmarks/gpu_check.py
    python benchmarks/gpu_check.py [--device auto|cpu|cuda] [--out benchmarks/results/gpu_check.json]
                                   [--checks train_step,ddp_step] [--budget-s 285] [--compile-on-cpu]

Checks, in this order; each one ends "pass", "fail" (with the error) or "skipped" (with the reason), and a
failing check does not stop the others:
  cuda_round_trip  tests/model/test_devices.py::test_cuda_round_trip_gives_the_cpu_answer, under pytest
  train_step       a training step (forward, backward, AdamW) of the CGT and of the same-size GPT, bf16 autocast
                   on CUDA (fp32 on CPU), via common.measure_training: tokens/s, model FLOPs utilisation, the
                   CGT / GPT ratios; and the autocast loss against the fp32 loss of the same batch
  ddp_step         one DistributedDataParallel step in one process (world size 1, tcp init on 127.0.0.1; nccl
                   on CUDA, gloo on CPU): its gradients against a plain step's, then the update
  cost_benchmark   benchmarks/bench_cost.py at GPU sizes (d_x 768, 12 layers, block 1024), run as a script
  notebook_01      notebooks/01_synthetic_icl.ipynb executed by nbconvert at full settings (CGT_FAST unset)
  compile          the training step with torch.compile on and off (last, in a child process, so that the time
                   budget bounds compilation): compiled and eager losses agree, tokens/s and MFU of each
Sizes: d_x 768, 12 layers, d_y 384, block and training sequence 1024, batch 8 on CUDA; a tiny model on CPU,
where what needs CUDA (the round trip, the GPU-size benchmark, notebook 01 at full settings) is skipped and
torch.compile runs only with --compile-on-cpu. Model FLOPs utilisation = analytic FLOPs of the step
(common.training_step_flops) / step time / the measured matmul peak (common.matmul_peak_flops).
Prints the JSON and writes it to --out; exits 1 when a check failed. A check that would start after
--budget-s seconds is skipped (the child processes get what is left as their time limit).
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (puts the repo root on sys.path)
import torch  # noqa: E402

CHECKS = ("cuda_round_trip", "train_step", "ddp_step", "cost_benchmark", "notebook_01", "compile")
SUBPROCESS_CHECKS = {"cuda_round_trip", "cost_benchmark", "notebook_01"}   # their memory is not this process's
ROUND_TRIP_TEST = "tests/model/test_devices.py::test_cuda_round_trip_gives_the_cpu_answer"
NOTEBOOK = "notebooks/01_synthetic_icl.ipynb"
DEFAULT_OUT = common.DEFAULT_RESULTS / "gpu_check.json"
SIZES = {  # model (common.build_models' arguments) and training batch
    "gpu": {"vocab": 256, "d_x": 768, "n_layer": 12, "n_head": 12, "d_y": 384, "n_head_y": 6, "y_layer": 6,
            "n_templates": 8, "template_rank": 1, "block_size": 1024, "batch": 8, "seq": 1024},
    "tiny": {"vocab": 32, "d_x": 16, "n_layer": 2, "n_head": 2, "d_y": 8, "n_head_y": 2, "y_layer": 1,
             "n_templates": 2, "template_rank": 1, "block_size": 32, "batch": 2, "seq": 16},
}
# bench_cost at GPU sizes: r + s + 64 ≤ the training sequence, so the block stays 1024
COST_ARGS = ["--prompt-lens", "64,256,768", "--gen-lens", "16,64,128", "--batches", "1,8", "--repeats", "2",
             "--train-repeats", "3"]
AUTOCAST_LOSS_RTOL = 2e-2   # bf16 autocast loss vs fp32 loss, relative
COMPILE_LOSS_RTOL = {"cuda": 2e-2, "cpu": 1e-4}
COMPILE_WARMUP_STEPS = 4
DDP_GRAD_RTOL = {"cuda": 1e-3, "cpu": 1e-5}   # max |g_ddp − g| / max |g| over all parameters


class Outcome(Exception):
    """A check ending early: the message goes to the JSON as its reason or error, `info` beside it."""

    def __init__(self, message: str, info: dict | None = None):
        super().__init__(message)
        self.info = info or {}


class Skip(Outcome):
    """A check that cannot run here."""


class CheckFailed(Outcome):
    """A check that ran and found something wrong."""


# ---------------------------------------------------------------------------------------------- setup
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = common.parser(__doc__)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--sizes", default="auto", choices=["auto", *SIZES], help="auto: gpu on CUDA, tiny on CPU")
    p.add_argument("--checks", default=",".join(CHECKS), help=f"comma-separated subset of {','.join(CHECKS)}")
    p.add_argument("--repeats", type=int, default=None, help="timed steps per measurement (default 5 CUDA, 2 CPU)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget-s", type=float, default=285.0, help="no check starts after this many seconds")
    p.add_argument("--compile-on-cpu", action="store_true", help="run the torch.compile check on a CPU too")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend (default inductor)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="the JSON file to write")
    p.add_argument("--in-child", action="store_true", help=argparse.SUPPRESS)  # the compile check's own process
    args = p.parse_args(argv)
    args.checks = [c.strip() for c in args.checks.split(",") if c.strip()]
    bad = [c for c in args.checks if c not in CHECKS]
    if bad or not args.checks:
        raise ValueError(f"--checks must be a comma-separated subset of {list(CHECKS)}, got {bad or args.checks}")
    for name in ("threads", "repeats"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.budget_s <= 0:
        raise ValueError(f"--budget-s must be > 0, got {args.budget_s}")
    return args


class Context:
    """What every check reads: device, sizes, the matmul peak, the time budget, and the same-size model pair."""

    def __init__(self, args: argparse.Namespace, started: float):
        self.args, self.started = args, started
        self.device = common.pick_device(args.device)
        self.cuda = self.device.type == "cuda"
        if self.cuda and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.sizes_name = args.sizes if args.sizes != "auto" else ("gpu" if self.cuda else "tiny")
        self.sizes = SIZES[self.sizes_name]
        self.repeats = args.repeats or (5 if self.cuda else 2)
        self.out_dir = Path(args.out).resolve().parent
        if self.cuda:
            self.no_cuda = None
        elif torch.cuda.is_available():
            self.no_cuda = "needs CUDA: this run was asked for --device cpu"
        elif torch.version.cuda is None:
            self.no_cuda = f"needs CUDA: this torch build ({torch.__version__}) has no CUDA support"
        else:
            self.no_cuda = "needs CUDA: torch.cuda.is_available() is False on this machine"
        self.peak = common.matmul_peak_flops(self.device)

    def remaining_s(self) -> float:
        return self.args.budget_s - (time.time() - self.started)

    def models(self):
        """A fresh CGT (w_aux = 1) and its same-size GPT on the device, in eval mode."""
        s = self.sizes
        ns = argparse.Namespace(seed=self.args.seed, **{k: v for k, v in s.items() if k not in ("block_size", "batch", "seq")})
        return common.build_models(ns, s["block_size"], self.device)

    def batch(self, salt: int = 0):
        """Random (idx, targets) of the training size and a generator for aux splits (CPU tensors -> device)."""
        b, t, v = self.sizes["batch"], self.sizes["seq"], self.sizes["vocab"]
        gen = torch.Generator().manual_seed(self.args.seed + 100 + salt)
        idx = torch.randint(0, v, (b, t), generator=gen).to(self.device)
        targets = torch.randint(0, v, (b, t), generator=gen).to(self.device)
        return idx, targets, torch.Generator().manual_seed(self.args.seed + 200 + salt)


def throughput(step_s: float, flops: float, tokens: int, peak_flops_per_s: float) -> dict:
    """tokens/s and model FLOPs utilisation of one step that took step_s seconds."""
    return {"step_s": step_s, "tokens_per_s": tokens / step_s, "flops_per_step": flops,
            "achieved_flops_per_s": flops / step_s, "mfu": flops / step_s / peak_flops_per_s}


def run_bounded(cmd: list[str], timeout_s: float, env: dict | None = None) -> tuple[int | None, str]:
    """Run cmd in its own process group from the repo root; on timeout kill that group. (returncode or None, output)."""
    proc = subprocess.Popen(cmd, cwd=common.REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=max(1.0, timeout_s))
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)   # the group this call started (nbconvert's kernel included)
        out, _ = proc.communicate()
        return None, out


def _tail(text: str, n: int = 3000) -> str:
    return text[-n:]


# ---------------------------------------------------------------------------------------------- checks
def check_cuda_round_trip(ctx: Context) -> dict:
    """The CUDA round-trip test of the suite, under pytest (it is skipped there without CUDA)."""
    path = common.REPO_ROOT / ROUND_TRIP_TEST.split("::")[0]
    name = ROUND_TRIP_TEST.split("::")[1]
    found = path.exists() and re.search(rf"^def {name}\(", path.read_text(), re.M) is not None
    info = {"test": ROUND_TRIP_TEST, "found": found}
    if not found:
        raise CheckFailed(f"{ROUND_TRIP_TEST} not found")
    if not ctx.cuda:
        raise Skip(ctx.no_cuda, info)
    rc, out = run_bounded([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", ROUND_TRIP_TEST],
                          ctx.remaining_s())
    info["pytest_output_tail"] = _tail(out, 1500)
    if rc is None:
        raise CheckFailed("pytest ran past the time budget")
    if rc != 0 or not re.search(r"\b1 passed\b", out):
        raise CheckFailed(f"pytest exit {rc}: {_tail(out, 800)}")
    return info


def check_train_step(ctx: Context) -> dict:
    """CGT and GPT training steps (bf16 autocast on CUDA), tokens/s, MFU, ratios; autocast loss vs fp32 loss."""
    cgt, gpt = ctx.models()
    b, t = ctx.sizes["batch"], ctx.sizes["seq"]
    res = common.measure_training(cgt, gpt, ctx.device, b, t, ctx.repeats, ctx.args.seed)
    flops = common.training_step_flops(cgt.config, b, t)
    out = {"dtype": common.dtype_name(ctx.device), "batch": b, "seq": t}
    if not ctx.cuda:
        out["note"] = "bf16 autocast needs CUDA: this CPU run is fp32"
    for name in ("cgt", "gpt"):
        out[name] = throughput(res["step"][name]["median"], flops[name], b * t, ctx.peak["flops_per_s"])
    out["ratio_step_cgt_over_gpt"] = res["step"]["ratio_median"]
    out["ratio_step_cgt_over_gpt_fastest"] = res["step"]["ratio_min"]
    out["ratio_forward_backward_cgt_over_gpt"] = res["forward_backward"]["ratio_median"]
    out["ratio_forward_cgt_over_gpt"] = res["forward"]["ratio_median"]
    out["analytic_flop_ratio_cgt_over_gpt"] = flops["cgt"] / flops["gpt"]
    out["timings"] = res

    idx, targets, split_gen = ctx.batch()
    split = cgt.sample_split(b, t, generator=split_gen)
    out["loss"] = {}
    for name, model in (("cgt", cgt), ("gpt", gpt)):
        kw = {"split": split} if name == "cgt" else {}
        with torch.no_grad():
            ref = float(model.loss(idx, targets, **kw)["total"])
            with common.autocast(ctx.device):
                got = float(model.loss(idx, targets, **kw)["total"])
        rel = abs(got - ref) / max(abs(ref), 1e-12)
        out["loss"][name] = {"fp32": ref, "autocast": got, "relative_difference": rel, "rtol": AUTOCAST_LOSS_RTOL}
        if not (math.isfinite(ref) and math.isfinite(got)):
            raise CheckFailed(f"{name} loss is not finite: fp32 {ref}, {out['dtype']} {got}")
        if rel > AUTOCAST_LOSS_RTOL:
            raise CheckFailed(f"{name} loss under {out['dtype']} is {got}, fp32 {ref}: relative difference "
                              f"{rel:.3g} > {AUTOCAST_LOSS_RTOL}")
    return out


class LossForward(torch.nn.Module):
    """DDP all-reduces the gradients of what runs through forward(): here forward() is the model's total loss."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, idx, targets, split):
        return self.model.loss(idx, targets, split=split)["total"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_ddp_step(ctx: Context) -> dict:
    """One DDP step of the CGT in a one-process group: gradients equal a plain step's, the update is finite."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    backend = "nccl" if ctx.cuda else "gloo"
    info = {"backend": backend, "world_size": 1, "init_method": "tcp://127.0.0.1:<free port>"}
    if not ctx.cuda:
        info["note"] = "nccl needs CUDA: the same one-process DDP step ran with gloo"
    if backend == "nccl" and not dist.is_nccl_available():
        raise CheckFailed("torch.distributed.is_nccl_available() is False in this torch build")
    if dist.is_initialized():
        raise CheckFailed("a torch.distributed process group already exists in this process")
    cgt, _ = ctx.models()          # its own model: DDP's gradient hooks stay off the other checks' models
    cgt.train()
    b, t = ctx.sizes["batch"], ctx.sizes["seq"]
    idx, targets, split_gen = ctx.batch(salt=1)
    split = cgt.sample_split(b, t, generator=split_gen)
    with common.autocast(ctx.device):
        cgt.loss(idx, targets, split=split)["total"].backward()
    ref = {n: p.grad.detach().clone() for n, p in cgt.named_parameters() if p.grad is not None}
    cgt.zero_grad(set_to_none=True)
    if ctx.cuda:
        torch.cuda.set_device(ctx.device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1,
                            timeout=timedelta(seconds=120))
    try:
        ddp = DDP(LossForward(cgt), device_ids=[ctx.device.index] if ctx.cuda else None)
        opt = torch.optim.AdamW(cgt.parameters(), lr=1e-4)
        with common.autocast(ctx.device):
            out = ddp(idx, targets, split)
        out.backward()
        loss = float(out.detach())
        got = {n: p.grad.detach().clone() for n, p in cgt.named_parameters() if p.grad is not None}
        if got.keys() != ref.keys():
            raise CheckFailed(f"DDP gave gradients to {len(got)} parameters, a plain step to {len(ref)}")
        scale = max(float(g.abs().max()) for g in ref.values())
        err = max(float((got[n] - ref[n]).abs().max()) for n in ref) / max(scale, 1e-30)
        info.update(loss=loss, parameters_with_grad=len(got), max_grad_difference_relative=err,
                    rtol=DDP_GRAD_RTOL[ctx.device.type])
        if not math.isfinite(loss) or err > DDP_GRAD_RTOL[ctx.device.type]:
            raise CheckFailed(f"DDP step: loss {loss}, gradients differ from a plain step by {err:.3g} "
                              f"(relative to the largest; allowed {DDP_GRAD_RTOL[ctx.device.type]})")
        before = [p.detach().clone() for p in cgt.parameters()]
        opt.step()
        moved = sum(int(not torch.equal(a, p.detach())) for a, p in zip(before, cgt.parameters()))
        if moved == 0 or not all(bool(torch.isfinite(p).all()) for p in cgt.parameters()):
            raise CheckFailed(f"after the DDP step {moved} parameters moved; all finite: "
                              f"{all(bool(torch.isfinite(p).all()) for p in cgt.parameters())}")
        info["parameters_moved"] = moved

        def step():
            opt.zero_grad(set_to_none=True)
            with common.autocast(ctx.device):
                ddp(idx, targets, cgt.sample_split(b, t, generator=split_gen)).backward()
            opt.step()
        times = common.time_fn(step, ctx.device, repeats=ctx.repeats, warmup=1)
        flops = common.training_step_flops(cgt.config, b, t)["cgt"]
        info["cgt"] = throughput(common.summarize(times)["median"], flops, b * t, ctx.peak["flops_per_s"])
    finally:
        dist.destroy_process_group()
    return info


def check_compile(ctx: Context) -> dict:
    """The training step with torch.compile on and off: same loss on the same batch and split, tokens/s of each."""
    if not ctx.cuda and not ctx.args.compile_on_cpu:
        raise Skip("torch.compile is checked on CUDA; on a CPU it runs only with --compile-on-cpu (tracing and "
                   "building the compiled CGT step takes minutes there)")
    cgt, gpt = ctx.models()
    b, t = ctx.sizes["batch"], ctx.sizes["seq"]
    idx, targets, split_gen = ctx.batch(salt=2)
    flops = common.training_step_flops(cgt.config, b, t)
    rtol = COMPILE_LOSS_RTOL[ctx.device.type]
    info = {"dtype": common.dtype_name(ctx.device), "batch": b, "seq": t, "rtol": rtol,
            "backend": ctx.args.compile_backend,
            "what": "torch.compile(model.loss), default settings; the CGT's split is drawn outside the compiled "
                    "function (TORCH_LOGS=recompiles,graph_breaks in the environment says where it recompiles)"}
    steps, agreement = {}, {}
    for name, model in (("gpt", gpt), ("cgt", cgt)):
        model.train()
        compiled = torch.compile(model.loss, backend=ctx.args.compile_backend)
        def kw(name=name):       # the CGT's aux split, a fresh draw per call
            return {"split": cgt.sample_split(b, t, generator=split_gen)} if name == "cgt" else {}
        same = kw()
        common.sync(ctx.device)
        t0 = time.perf_counter()
        with common.autocast(ctx.device):
            got = float(compiled(idx, targets, **same)["total"].detach())     # compiles
        common.sync(ctx.device)
        first_s = time.perf_counter() - t0
        with common.autocast(ctx.device):
            ref = float(model.loss(idx, targets, **same)["total"].detach())
        rel = abs(got - ref) / max(abs(ref), 1e-12)
        agreement[name] = {"eager": ref, "compiled": got, "relative_difference": rel, "first_call_s": first_s}
        if not math.isfinite(got) or rel > rtol:
            raise CheckFailed(f"{name}: compiled loss {got} vs eager {ref} (relative difference {rel:.3g} > {rtol})")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for mode, fn in (("eager", model.loss), ("compiled", compiled)):
            def step(fn=fn, model=model, opt=opt, kw=kw):
                opt.zero_grad(set_to_none=True)
                with common.autocast(ctx.device):
                    loss = fn(idx, targets, **kw())["total"]
                loss.backward()
                opt.step()
            steps[f"{name}_{mode}"] = step
    info["agreement"] = agreement
    # untimed warm-up: the CGT's first steps meet new aux-suffix lengths and recompile until dynamo has marked
    # those sizes dynamic (a few steps); after that the aux shapes change without recompiling
    times = common.time_interleaved(steps, ctx.device, ctx.repeats, warmup=COMPILE_WARMUP_STEPS)
    for key, ts in times.items():
        name = key.split("_")[0]
        info[key] = throughput(common.summarize(ts)["median"], flops[name], b * t, ctx.peak["flops_per_s"])
    for name in ("gpt", "cgt"):
        info[f"speedup_{name}"] = common.ratio(info[f"{name}_eager"]["step_s"], info[f"{name}_compiled"]["step_s"])
    info["ratio_step_cgt_over_gpt_compiled"] = common.ratio(info["cgt_compiled"]["step_s"], info["gpt_compiled"]["step_s"])
    return info


def check_compile_isolated(ctx: Context) -> dict:
    """check_compile in a child process of this script, so that the time budget bounds compilation too."""
    if not ctx.cuda and not ctx.args.compile_on_cpu:
        return check_compile(ctx)          # skipped: no child needed to say so
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "compile.json"
        left = ctx.remaining_s()
        cmd = [sys.executable, str(Path(__file__).resolve()), "--in-child", "--checks", "compile",
               "--device", ctx.device.type, "--sizes", ctx.sizes_name, "--repeats", str(ctx.repeats),
               "--threads", str(ctx.args.threads), "--seed", str(ctx.args.seed), "--budget-s", str(max(1.0, left)),
               "--compile-backend", ctx.args.compile_backend, "--out", str(out)]
        cmd += ["--compile-on-cpu"] if ctx.args.compile_on_cpu else []
        rc, text = run_bounded(cmd, left)
        if rc is None:
            raise CheckFailed(f"the torch.compile check did not finish in the {left:.0f} s left of --budget-s "
                              f"{ctx.args.budget_s:g} (rerun it alone: --checks compile); output: {_tail(text, 800)}")
        if not out.exists():
            raise CheckFailed(f"the compile child exited {rc} without writing its JSON: {_tail(text, 800)}")
        child = json.loads(out.read_text())["checks"]["compile"]
    if child["status"] == "skipped":
        raise Skip(child["reason"])
    if child["status"] == "fail":
        raise CheckFailed(f"in the compile child: {child['error']}", {"child_traceback": child.get("traceback")})
    return {k: v for k, v in child.items() if k not in ("status", "seconds")}


def check_cost_benchmark(ctx: Context) -> dict:
    """benchmarks/bench_cost.py at GPU sizes, run as a script with arguments; a summary of its JSON."""
    if not ctx.cuda:
        raise Skip(f"{ctx.no_cuda}; bench_cost at GPU sizes (d_x 768, 12 layers, block 1024) is a GPU run "
                   "(`make bench` measures the CPU sizes)")
    s = SIZES["gpu"]
    out_dir = ctx.out_dir / "gpu_sizes"
    model = ["--vocab", s["vocab"], "--d-x", s["d_x"], "--n-layer", s["n_layer"], "--n-head", s["n_head"],
             "--d-y", s["d_y"], "--n-head-y", s["n_head_y"], "--y-layer", s["y_layer"], "--n-templates",
             s["n_templates"], "--template-rank", s["template_rank"], "--train-batch", s["batch"],
             "--train-seq", s["seq"]]
    argv = [str(a) for a in ["--device", ctx.device.type, "--threads", ctx.args.threads, *model, *COST_ARGS,
                             "--seed", ctx.args.seed, "--out", out_dir]]
    rc, text = run_bounded([sys.executable, str(common.BENCH_DIR / "bench_cost.py"), *argv], ctx.remaining_s())
    info = {"argv": argv, "output_tail": _tail(text, 600)}
    if rc is None:
        raise CheckFailed(f"bench_cost ran past the time budget: {_tail(text, 800)}")
    if rc != 0:
        raise CheckFailed(f"bench_cost exited {rc}: {_tail(text, 1500)}")
    path = out_dir / "bench_cost.json"
    res = json.loads(path.read_text())
    if res["config"]["block_size"] != s["block_size"]:
        raise CheckFailed(f"bench_cost built block_size {res['config']['block_size']}, wanted {s['block_size']}")
    longest = {m: max(x["s"] for x in res["settings"] if x["mode"] == m) for m in {x["mode"] for x in res["settings"]}}
    info.update({
        "json": str(path), "wall_seconds": res["wall_seconds"], "matmul_peak": res["matmul_peak"],
        "training_step_ratio_cgt_over_gpt": res.get("training", {}).get("step", {}).get("ratio_median"),
        "targets": {k: {"value": v["value"], "met": v["met"]} for k, v in res["targets"].items()},
        "settings": [{k: x[k] for k in ("mode", "r", "batch", "s", "throughput_tok_per_s", "fraction_of_matmul_peak")}
                     | {"per_token_ms": x["per_token_s"]["median"] * 1e3 if x["per_token_s"] else None}
                     for x in res["settings"] if x["s"] == longest[x["mode"]]],
    })
    return info


def check_notebook_01(ctx: Context) -> dict:
    """Notebook 01 executed headless by nbconvert with CGT_FAST unset (its full settings)."""
    if not ctx.cuda:
        raise Skip(f"{ctx.no_cuda}; notebook 01 at full settings (CGT_FAST unset) is a GPU run "
                   "(`make test` runs it on a CPU with CGT_FAST=1)")
    env = {k: v for k, v in os.environ.items() if k != "CGT_FAST"}
    executed = ctx.out_dir / "gpu_check_01_synthetic_icl.ipynb"
    budget = ctx.remaining_s()
    cmd = [sys.executable, "-m", "nbconvert", "--to", "notebook", "--execute",
           f"--ExecutePreprocessor.timeout={max(1, int(budget))}", "--output-dir", str(ctx.out_dir),
           "--output", executed.name, str(common.REPO_ROOT / NOTEBOOK)]
    rc, text = run_bounded(cmd, budget, env=env)
    info = {"notebook": NOTEBOOK, "settings": "full (CGT_FAST unset)", "executed": str(executed),
            "output_tail": _tail(text, 600)}
    if rc is None:
        raise CheckFailed(f"notebook 01 ran past the time budget: {_tail(text, 800)}")
    if rc != 0:
        raise CheckFailed(f"nbconvert exited {rc}: {_tail(text, 1500)}")
    info["evaluation"] = _cell_text(executed, "evaluate_specialization(")
    return info


def _cell_text(notebook: Path, marker: str) -> str | None:
    """The text/plain output of the first code cell whose source contains `marker` (None when there is none)."""
    for cell in json.loads(notebook.read_text())["cells"]:
        if cell["cell_type"] == "code" and marker in "".join(cell["source"]):
            parts = [o.get("text") or o.get("data", {}).get("text/plain", "") for o in cell.get("outputs", [])]
            return _tail("".join("".join(p) if isinstance(p, list) else p for p in parts), 2000)
    return None


CHECK_FUNCTIONS = {"cuda_round_trip": "check_cuda_round_trip", "train_step": "check_train_step",
                   "ddp_step": "check_ddp_step", "compile": "check_compile_isolated",
                   "cost_benchmark": "check_cost_benchmark", "notebook_01": "check_notebook_01"}


def run_check(name: str, ctx: Context) -> dict:
    """One check: {"status": "pass" | "fail" | "skipped", "seconds", its figures, and "error" or "reason"}."""
    if ctx.remaining_s() <= 0:
        return {"status": "skipped", "reason": f"time budget spent before this check (--budget-s {ctx.args.budget_s:g})"}
    fn_name = "check_compile" if name == "compile" and ctx.args.in_child else CHECK_FUNCTIONS[name]
    fn = globals()[fn_name]      # looked up at call time (a test can replace a check)
    if ctx.cuda:                 # hand the previous checks' cached blocks back (child processes share the GPU)
        gc.collect()
        torch.cuda.empty_cache()
    common.reset_peak_memory(ctx.device)
    t0 = time.time()
    try:
        out = {"status": "pass", **fn(ctx)}
    except Skip as e:
        out = {"status": "skipped", "reason": str(e), **e.info}
    except Exception as e:  # a failing check is reported, and the others still run
        out = {"status": "fail", "error": f"{type(e).__name__}: {e}",
               "traceback": _tail("".join(traceback.format_exception(e)), 3000),
               **(e.info if isinstance(e, CheckFailed) else {})}
    out["seconds"] = time.time() - t0
    if out["status"] != "skipped" and name not in SUBPROCESS_CHECKS:   # (compile's child reports its own)
        out.setdefault("peak_memory", common.peak_memory_bytes(ctx.device))
    return out


def main(argv: list[str] | None = None) -> dict:
    started = time.time()
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    ctx = Context(args, started)
    res = {"benchmark": "gpu_check", "environment": common.environment(ctx.device), "sizes": ctx.sizes_name,
           "model": ctx.sizes, "repeats": ctx.repeats, "budget_s": args.budget_s, "matmul_peak": ctx.peak,
           "checks": {}}
    for name in args.checks:
        res["checks"][name] = run_check(name, ctx)
        c = res["checks"][name]
        print(f"gpu_check: {name}: {c['status']}" + (f" ({c.get('reason') or c.get('error')})"
                                                      if c["status"] != "pass" else ""), file=sys.stderr, flush=True)
    checks = res["checks"]
    res["summary"] = {"pass": [n for n, c in checks.items() if c["status"] == "pass"],
                      "fail": [n for n, c in checks.items() if c["status"] == "fail"],
                      "skipped": {n: c["reason"] for n, c in checks.items() if c["status"] == "skipped"}}
    tr, comp = checks.get("train_step", {}), checks.get("compile", {})
    res["headline"] = {
        "cgt_tokens_per_s": tr.get("cgt", {}).get("tokens_per_s"), "gpt_tokens_per_s": tr.get("gpt", {}).get("tokens_per_s"),
        "cgt_mfu": tr.get("cgt", {}).get("mfu"), "gpt_mfu": tr.get("gpt", {}).get("mfu"),
        "step_ratio_cgt_over_gpt": tr.get("ratio_step_cgt_over_gpt"),
        "analytic_flop_ratio_cgt_over_gpt": tr.get("analytic_flop_ratio_cgt_over_gpt"),
        "compile_speedup_cgt": comp.get("speedup_cgt"), "compile_speedup_gpt": comp.get("speedup_gpt"),
        "ddp_cgt_tokens_per_s": checks.get("ddp_step", {}).get("cgt", {}).get("tokens_per_s"),
    }
    res["wall_seconds"] = time.time() - started
    res["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out = Path(args.out)
    common.write_json(out, res)
    if not args.in_child:
        print(out.read_text())
    res["json_path"] = str(out)
    return res


def exit_code(res: dict) -> int:
    """1 when a check failed, else 0 (skipped checks do not fail the run)."""
    return 1 if res["summary"]["fail"] else 0


if __name__ == "__main__":
    sys.exit(exit_code(main()))
