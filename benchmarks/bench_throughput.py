"""Throughput figures (issue 16, item 3): tokens/s, analytic FLOPs per token and the FLOP/s they achieve, against
one large matmul's FLOP/s on the same thread(s) as the machine's practical limit.

    python benchmarks/bench_throughput.py [--quick] [--device auto|cpu|cuda] [--out benchmarks/results] [--write-readme]

Rows (same-size CGT and GPT, common.build_models; weights untrained, cost does not depend on them):
  train_gpt, train_cgt  one training step (forward, backward, AdamW; the CGT with main + aux at w_aux = 1) on
                        (batch, seq) tokens, the two interleaved repeat by repeat; tokens/s = b·t / step seconds;
                        FLOPs/token = common.training_step_flops / (b·t) (3 × the analytic forward)
  gen_compiled          cgt.specialize(prompt) once (timed apart, "specialize ms"), then the merged plain GPT
                        generates s tokens from one BOS-like token with its KV cache
  gen_prompted          the CGT with the r-token prompt in context generates s tokens with its KV cache
  at every batch in --batches (rows are copies of one prompt, so one compiled model serves the batch).
Generation: a forward hook on the output head stamps the end of every model step; decode tokens/s = b·(s − 1)
over the s − 1 incremental steps, FLOPs/token = the analytic mean over those steps (per row, as the training
FLOPs/token), achieved FLOP/s = b × FLOPs/token × steps/s. The first step (prefill of the prompt, or the compiled
model's one BOS token) is reported apart, and end-to-end tokens/s = b·s / (first step + decode [+ specialize]).
Ratios between rows are measured within one run. Writes throughput.json and prints the markdown table.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (puts the repo root on sys.path)
import torch  # noqa: E402

BOS = 0
QUICK = {"train_batch": 2, "train_seq": 16, "prompt_len": 8, "gen_len": 4, "repeats": 2, "matmul_n": 128}


# ---------------------------------------------------------------------------------------------- FLOPs
def generation_flops(cfg, kind: str, prompt_len: int, s: int) -> dict:
    """Analytic FLOPs per row of a generate of s tokens: the first step and the mean of the s − 1 later ones.
    kind "compiled": a plain GPT from one BOS token; "prompted": the full CGT after a prompt_len-token prompt."""
    if kind == "compiled":
        start, flop_kind = 1, "gpt"
    elif kind == "prompted":
        start, flop_kind = prompt_len, "cgt"
    else:
        raise ValueError(f"kind must be 'compiled' or 'prompted', got {kind!r}")
    later = [common.token_flops(cfg, start + j, flop_kind) for j in range(1, s)]
    return {"first_step": common.prefill_flops(cfg, start, flop_kind), "per_later_token": sum(later) / max(1, len(later))}


# ---------------------------------------------------------------------------------------------- timing
def timed_generate(model, head: torch.nn.Module, idx: torch.Tensor, s: int, device: torch.device) -> dict:
    """One greedy generate of s tokens with the KV cache: seconds of the first step and of the s − 1 later ones."""
    stamps: list[float] = []

    def stamp(_module, _inp, _out):
        common.sync(device)
        stamps.append(time.perf_counter())

    hook = head.register_forward_hook(stamp)
    try:
        common.sync(device)
        t0 = time.perf_counter()
        with common.autocast(device):
            model.generate(idx, s, temperature=0)
    finally:
        hook.remove()
    if len(stamps) != s:
        raise RuntimeError(f"expected {s} model steps for {s} tokens, the head ran {len(stamps)} times")
    return {"first": stamps[0] - t0, "decode": stamps[-1] - stamps[0]}


def measure_generation(cgt, device: torch.device, batches: list[int], r: int, s: int, repeats: int,
                       seed: int) -> list[dict]:
    cfg = cgt.config
    gen = torch.Generator().manual_seed(seed + 5)
    prompt = torch.randint(0, cfg.vocab_size, (r,), generator=gen).to(device)
    cgt.eval()
    with torch.no_grad():
        compiled = cgt.specialize(prompt).to(device).eval()

    def specialize():
        with torch.no_grad(), common.autocast(device):
            cgt.specialize(prompt)
    spec = common.summarize(common.time_fn(specialize, device, repeats))
    rows = []
    for b in batches:
        plan = {"gen_compiled": (compiled, compiled.head, torch.full((b, 1), BOS, dtype=torch.long, device=device)),
                "gen_prompted": (cgt, cgt.gpt.head, prompt[None].expand(b, -1).contiguous())}
        for model, head, idx in plan.values():   # warm-up: allocator, shapes
            timed_generate(model, head, idx, min(2, s), device)
        runs: dict[str, list[dict]] = {name: [] for name in plan}
        for _ in range(repeats):                 # interleaved, so both see the same machine load
            for name, (model, head, idx) in plan.items():
                runs[name].append(timed_generate(model, head, idx, s, device))
        for name, kind in (("gen_compiled", "compiled"), ("gen_prompted", "prompted")):
            first = common.summarize([x["first"] for x in runs[name]])
            decode = common.summarize([x["decode"] for x in runs[name]])
            fl = generation_flops(cfg, kind, r, s)
            steps_per_s = (s - 1) / decode["median"]
            setup = spec["median"] if kind == "compiled" else 0.0
            rows.append({
                "name": name, "kind": "generate", "batch": b, "prompt_len": r, "gen_len": s, "repeats": repeats,
                "first_step_s": first, "decode_s": decode, "specialize_s": spec if kind == "compiled" else None,
                "tokens_per_s": b * steps_per_s,
                "end_to_end_tokens_per_s": b * s / (setup + first["median"] + decode["median"]),
                "flops_per_token": fl["per_later_token"], "flops_first_step": fl["first_step"],
                "achieved_flops_per_s": b * fl["per_later_token"] * steps_per_s})
    return rows


def measure_train(cgt, gpt, device: torch.device, batch: int, seq: int, repeats: int, seed: int) -> tuple[list[dict], dict]:
    res = common.measure_training(cgt, gpt, device, batch, seq, repeats, seed=seed, kinds=("step",))
    flops = common.training_step_flops(cgt.config, batch, seq)
    rows = []
    for name in ("gpt", "cgt"):
        step = res["step"][name]
        rows.append({"name": f"train_{name}", "kind": "train", "batch": batch, "seq": seq, "repeats": repeats,
                     "step_s": step, "tokens_per_s": batch * seq / step["median"],
                     "flops_per_step": flops[name], "flops_per_token": flops[name] / (batch * seq),
                     "achieved_flops_per_s": flops[name] / step["median"]})
    return rows, res


# ---------------------------------------------------------------------------------------------- outputs
def table(res: dict) -> str:
    env, peak = res["environment"], res["matmul_peak"]
    a = res["args"]
    lines = [f"bench_throughput — {env['device']} ({env['dtype']}), {env['threads']} thread(s), torch {env['torch']}, "
             f"load {env['load_average_1_5_15']}; d_x {a['d_x']}, N {a['n_layer']}, d_y {a['d_y']}, K {a['n_templates']}; "
             f"matmul peak {peak['flops_per_s'] / 1e9:.1f} GFLOP/s (fp32 n = {peak['n']}); {env['time_utc']}", "",
             "| row | batch | setting | tokens/s | MFLOP/token | achieved GFLOP/s | % of matmul peak | first step / specialize ms | end-to-end tokens/s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for x in res["rows"]:
        if x["kind"] == "train":
            setting = f"step, t {x['seq']} (median of {x['repeats']})"
            extra, e2e = "", ""
        else:
            setting = f"prompt {x['prompt_len']}, {x['gen_len']} new tokens" if x["name"] == "gen_prompted" \
                else f"from 1 token, {x['gen_len']} new tokens"
            extra = f"{1e3 * x['first_step_s']['median']:.1f}"
            if x["specialize_s"] is not None:
                extra += f" + {1e3 * x['specialize_s']['median']:.1f}"
            e2e = common.fmt(x["end_to_end_tokens_per_s"])
        lines.append(f"| {x['name']} | {x['batch']} | {setting} | {common.fmt(x['tokens_per_s'])} | "
                     f"{common.fmt(x['flops_per_token'] / 1e6)} | {common.fmt(x['achieved_flops_per_s'] / 1e9)} | "
                     f"{100 * x['fraction_of_matmul_peak']:.1f} | {extra} | {e2e} |")
    r = res["ratios"]
    lines += ["", f"CGT / GPT training step: {common.fmt(r['train_step_cgt_over_gpt'])} measured "
                  f"(analytic FLOPs {common.fmt(r['train_step_analytic_flops'])}); decode tokens/s compiled / "
                  f"prompted: " + ", ".join(f"b {b}: {common.fmt(v)}" for b, v in r["decode_compiled_over_prompted"].items()),
              "", "- Generation tokens/s are decode steps only (the first step apart); end-to-end adds the first step "
                  "and, for the compiled model, its one-time specialize."]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = common.parser(__doc__)
    common.add_model_args(p)
    p.add_argument("--quick", action="store_true", help="tiny sizes and 2 repeats (the test); "
                   + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    p.add_argument("--train-batch", type=int, default=8)
    p.add_argument("--train-seq", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--gen-len", type=int, default=64)
    p.add_argument("--batches", default="1,8")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--matmul-n", type=int, default=None, help="side of the peak matmul (default 1024 CPU, 8192 CUDA)")
    common.add_output_args(p, "throughput.json")
    args = p.parse_args(argv)
    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v)
    args.batches = common.positive_int_list("--batches", args.batches)
    for name in ("threads", "train_batch", "train_seq", "prompt_len", "repeats"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.gen_len < 2:
        raise ValueError(f"--gen-len must be >= 2 (decode needs a step after the first), got {args.gen_len}")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    device = common.pick_device(args.device)
    block = max(args.train_seq, args.prompt_len + args.gen_len)
    cgt, gpt = common.build_models(args, block, device)
    env = common.environment(device)
    peak = common.matmul_peak_flops(device, n=args.matmul_n)
    train_rows, train_raw = measure_train(cgt, gpt, device, args.train_batch, args.train_seq, args.repeats, args.seed)
    gen_rows = measure_generation(cgt, device, args.batches, args.prompt_len, args.gen_len, args.repeats, args.seed)
    rows = train_rows + gen_rows
    for x in rows:
        x["fraction_of_matmul_peak"] = x["achieved_flops_per_s"] / peak["flops_per_s"]
    by = {(x["name"], x["batch"]): x for x in rows}
    res = {"environment": env, "benchmark": "bench_throughput", "config": cgt.config.to_dict(),
           "args": {k: v for k, v in vars(args).items() if k not in ("out", "readme")},
           "matmul_peak": peak, "rows": rows,
           "ratios": {"train_step_cgt_over_gpt": train_raw["step"]["ratio_median"],
                      "train_step_cgt_over_gpt_per_repeat": train_raw["step"]["ratio_per_repeat"],
                      "train_step_analytic_flops": by["train_cgt", args.train_batch]["flops_per_step"]
                      / by["train_gpt", args.train_batch]["flops_per_step"],
                      "decode_compiled_over_prompted": {str(b): by["gen_compiled", b]["tokens_per_s"]
                                                        / by["gen_prompted", b]["tokens_per_s"] for b in args.batches}}}
    res["environment"]["load_average_end"] = common.environment(device)["load_average_1_5_15"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    common.write_json(out / "throughput.json", res)
    text = table(res)
    print(text)
    if args.write_readme:
        common.replace_readme_section(Path(args.readme), "bench_throughput", text)
    return res


if __name__ == "__main__":
    main()
