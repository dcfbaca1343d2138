"""What compiling a prompt saves (issue 5): the cost of generating s tokens after an r-token prompt.

    python benchmarks/bench_cost.py [--device auto|cpu|cuda] [--out benchmarks/results] [--write-readme]
    python benchmarks/bench_cost.py --from-json benchmarks/results/bench_cost.json --write-readme  # redraw only

Settings (same-size models; weights untrained, cost does not depend on them):
  i_cgt_full       (i)   the CGT, not fixed: the prompt in context, generating with its KV cache (model.generate)
  ii_compiled      (ii)  model.specialize(prompt) once, then the merged plain GPT generates from one BOS-like
                         token with its own KV cache; the one-time specialisation is timed separately
  iii_gpt_nocache  (iii) the plain GPT with the prompt, recomputing the whole sequence for every token
  iv_gpt_kvcache   (iv)  the plain GPT with the prompt's KV cache (prefill, then incremental)
  gpt_no_prompt          the plain GPT from one BOS-like token: the physical floor for (ii)
Batch rows are copies of one prompt (one compiled model serves the whole batch in (ii)).

How tokens are timed: one greedy `generate` of max(s) tokens per repeat, with a forward hook on the output head
stamping the end of every model step (GPU synced); time to first token = prefill step, per-token latency = gap
between consecutive steps; the figures for smaller s are the first s tokens of the same run (identical work).
The settings run interleaved repeat by repeat, so ratios between them are measured under the same load.
Writes bench_cost.json, bench_cost.html (latency vs r, one line per setting) and, with --write-readme,
the tables in benchmarks/README.md.
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

from cgt_viz import CGT, GPT, CGTConfig  # noqa: E402

MODES = {
    "i_cgt_full": "(i) CGT not fixed, prompt in context + KV cache",
    "ii_compiled": "(ii) compiled: specialised GPT, no prompt",
    "iii_gpt_nocache": "(iii) GPT with prompt, recomputed per token",
    "iv_gpt_kvcache": "(iv) GPT with prompt's KV cache",
    "gpt_no_prompt": "plain GPT without prompt (floor for ii)",
}
TARGETS = {"ii_over_no_prompt_max": 1.05, "ii_flat_in_r_max_change": 0.05, "iv_over_ii_at_max_r_min": 2.0,
           "specialize_over_forward_max": 1.3, "training_step_ratio_max": 1.6}
BOS = 0  # the first token of (ii) and of the no-prompt baseline


# ---------------------------------------------------------------------------------- generation FLOPs and bytes
def generation_flops(cfg: CGTConfig, mode: str, r: int, s: int) -> dict:
    """Analytic FLOPs per row: the first step (prefill) and the mean of the s − 1 later steps."""
    tok, pre = common.token_flops, common.prefill_flops
    if mode in ("ii_compiled", "gpt_no_prompt"):
        first, later = pre(cfg, 1, "gpt"), [tok(cfg, 1 + j, "gpt") for j in range(1, s)]
    elif mode == "iv_gpt_kvcache":
        first, later = pre(cfg, r, "gpt"), [tok(cfg, r + j, "gpt") for j in range(1, s)]
    elif mode == "i_cgt_full":
        first, later = pre(cfg, r, "cgt"), [tok(cfg, r + j, "cgt") for j in range(1, s)]
    elif mode == "iii_gpt_nocache":
        first, later = pre(cfg, r, "gpt"), [pre(cfg, r + j, "gpt") for j in range(1, s)]
    else:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
    return {"first_step": first, "per_later_token": sum(later) / max(1, len(later))}


def step_bytes(cfg: CGTConfig, mode: str, r: int, s: int, batch: int, kv_elem: int = 4, w_elem: int = 4) -> float:
    """Analytic bytes one incremental step reads (mean over the s − 1 later steps): every weight matrix once
    (shared by the batch; token_flops with no keys is 2 × the weights multiplied) plus each row's KV cache.
    At batch 1 decoding is bound by this traffic, not by FLOPs. (iii) recomputes: its weights only."""
    kind = "cgt" if mode == "i_cgt_full" else "gpt"
    weights = common.token_flops(cfg, 0, kind) // 2 * w_elem
    if mode == "iii_gpt_nocache":
        return float(weights)
    per_key = 2 * (cfg.n_layer * cfg.d_x + (cfg.y_layer * cfg.d_y if kind == "cgt" else 0)) * kv_elem
    start = 1 if mode in ("ii_compiled", "gpt_no_prompt") else r
    keys = [start + j for j in range(1, s)] or [start]
    return weights + batch * per_key * sum(keys) / len(keys)


# ---------------------------------------------------------------------------------------------- timing
def timed_generate(model, head: torch.nn.Module, idx: torch.Tensor, s: int, device: torch.device,
                   use_cache: bool = True) -> dict:
    """One greedy generate of s tokens; returns t0-relative step end times and the KV-cache bytes
    after the prefill step and at the end (the cache list generate makes, captured via new_cache)."""
    stamps: list[float] = []
    caches: list = []
    kv_after_prefill: list[int] = []
    make_cache = model.new_cache

    def capture_cache():
        caches.append(make_cache())
        return caches[-1]

    def stamp(_module, _inp, _out):
        common.sync(device)
        stamps.append(time.perf_counter())
        if len(stamps) == 1 and caches:
            kv_after_prefill.append(sum(c.nbytes() for c in caches[0]))

    hook = head.register_forward_hook(stamp)
    model.new_cache = capture_cache  # instance attribute: generate's self.new_cache() finds it first
    try:
        common.sync(device)
        t0 = time.perf_counter()
        with common.autocast(device):
            model.generate(idx, s, temperature=0, use_cache=use_cache)
        common.sync(device)
        t_end = time.perf_counter()
    finally:
        hook.remove()
        del model.new_cache
    if len(stamps) != s:
        raise RuntimeError(f"expected {s} model steps for {s} tokens, the head ran {len(stamps)} times")
    return {"steps": [t - t0 for t in stamps], "total": t_end - t0,
            "kv_after_prefill": kv_after_prefill[0] if kv_after_prefill else 0,
            "kv_end": sum(c.nbytes() for c in caches[0]) if caches else 0}


def param_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def run_grid(args, cgt: CGT, gpt: GPT, device: torch.device) -> tuple[list[dict], list[dict]]:
    """Every (r, batch): the settings interleaved repeat by repeat. Returns (settings rows, specialisation rows)."""
    cfg = cgt.config
    gen = torch.Generator().manual_seed(args.seed)
    s_max = max(args.gen_lens)
    s_nocache = min(s_max, args.nocache_max_s)
    rows, spec_rows = [], []
    for r in args.prompt_lens:
        prompt = torch.randint(0, cfg.vocab_size, (r,), generator=gen).to(device)
        # ---- (ii)'s one-time cost: specialize vs one forward over the prompt (CGT and plain GPT)
        with torch.no_grad():
            compiled = cgt.specialize(prompt).to(device).eval()

        nograd = lambda fn: common.inference_call(fn, device)   # noqa: E731
        t = common.time_interleaved({"specialize": nograd(lambda: cgt.specialize(prompt)),
                                     "cgt_forward": nograd(lambda: cgt(prompt[None])),
                                     "gpt_forward": nograd(lambda: gpt(prompt[None]))}, device, args.repeats)
        n_mod = sum(p.numel() * p.element_size() for name, p in compiled.named_parameters()
                    if any(name == f"blocks.{layer - 1}.{w}.weight" for layer in cgt.modulated_layers
                           for w in _site_weights(cfg)))
        with torch.no_grad():
            lora = sum(a.numel() * a.element_size() + b.numel() * b.element_size()
                       for a, b in cgt.lora_factors(cgt.context(prompt[None])[0, -1]).values())
        spec = {"r": r, **{k: common.summarize(v) for k, v in t.items()}}
        spec["ratio_vs_cgt_forward"] = common.ratio(spec["specialize"]["median"], spec["cgt_forward"]["median"])
        spec["ratio_vs_gpt_forward"] = common.ratio(spec["specialize"]["median"], spec["gpt_forward"]["median"])
        spec["merged_model_bytes"] = param_bytes(compiled)
        spec["merged_changed_weight_bytes"] = n_mod
        spec["lora_factor_bytes"] = lora
        spec["ybar_bytes"] = cfg.d_y * torch.finfo(torch.float32).bits // 8
        spec_rows.append(spec)

        for b in args.batches:
            inputs = {"prompted": prompt[None].expand(b, -1).contiguous(),
                      "bos": torch.full((b, 1), BOS, dtype=torch.long, device=device)}
            plan = {  # mode -> (model, its output head, input, generated tokens, use_cache, repeats)
                "i_cgt_full": (cgt, cgt.gpt.head, inputs["prompted"], s_max, True, args.repeats),
                "ii_compiled": (compiled, compiled.head, inputs["bos"], s_max, True, args.repeats),
                "gpt_no_prompt": (gpt, gpt.head, inputs["bos"], s_max, True, args.repeats),
                "iv_gpt_kvcache": (gpt, gpt.head, inputs["prompted"], s_max, True, args.repeats),
                "iii_gpt_nocache": (gpt, gpt.head, inputs["prompted"], s_nocache, False,
                                    args.nocache_repeats if r * b > args.nocache_long else args.repeats),
            }
            plan = {m: v for m, v in plan.items() if m in args.modes}
            for model, head, idx, s, use_cache, _ in plan.values():  # warm-up: allocator, shapes
                timed_generate(model, head, idx, min(2, s), device, use_cache)
            runs: dict[str, list[dict]] = {m: [] for m in plan}
            peaks: dict[str, int] = {m: 0 for m in plan}
            for rep in range(args.repeats):
                for mode, (model, head, idx, s, use_cache, reps) in plan.items():
                    if rep >= reps:
                        continue
                    common.reset_peak_memory(device)
                    runs[mode].append(timed_generate(model, head, idx, s, device, use_cache))
                    peaks[mode] = max(peaks[mode], common.peak_memory_bytes(device)["bytes"])
            for mode, (model, head, idx, s, use_cache, reps) in plan.items():
                rows += summarize_runs(args, cfg, mode, r, b, s, runs[mode], peaks[mode], device)
    return rows, spec_rows


def _site_weights(cfg: CGTConfig) -> list[str]:
    from cgt_viz.layers import SITE_WEIGHTS
    return [SITE_WEIGHTS[s] for s in cfg.sites]


def summarize_runs(args, cfg, mode, r, b, s_run, runs, peak, device) -> list[dict]:
    """One row per generated length s ≤ s_run: the first s steps of each run."""
    out = []
    for s in [s for s in args.gen_lens if s <= s_run] or [s_run]:
        ttft = [run["steps"][0] for run in runs]
        per_tok = [b_ - a_ for run in runs for a_, b_ in zip(run["steps"][: s - 1], run["steps"][1:s])]
        total = [run["steps"][s - 1] for run in runs]
        fl = generation_flops(cfg, mode, r, s)
        lat = common.summarize(per_tok) if per_tok else None
        med = lat["median"] if lat else None
        achieved = b * fl["per_later_token"] / med if med else None
        row = {"mode": mode, "label": MODES[mode], "r": r, "batch": b, "s": s, "repeats": len(runs),
               "ttft_s": common.summarize(ttft), "per_token_s": lat,
               "total_s": common.summarize(total),
               "throughput_tok_per_s": b * s / common.summarize(total)["median"],
               "peak_memory_bytes": peak, "peak_memory_kind": common.peak_memory_bytes(device)["kind"],
               "kv_cache_bytes_after_prefill": runs[0]["kv_after_prefill"],
               "kv_cache_bytes_end": runs[0]["kv_end"] if s == s_run else None,
               "flops_first_step": b * fl["first_step"], "flops_per_token": b * fl["per_later_token"],
               "flops_per_token_per_row": fl["per_later_token"], "achieved_flops_per_s": achieved,
               "bytes_per_step": step_bytes(cfg, mode, r, s, b, kv_elem=2 if device.type == "cuda" else 4),
               "capped": s_run < max(args.gen_lens)}
        out.append(row)
    return out


# ---------------------------------------------------------------------------------------------- derived figures
def _row(rows, mode, r, b, s=None):
    cands = [x for x in rows if x["mode"] == mode and x["r"] == r and x["batch"] == b and (s is None or x["s"] == s)]
    return max(cands, key=lambda x: x["s"]) if cands else None


def _lat(row, q: str = "median"):
    return row["per_token_s"][q] if row and row["per_token_s"] else None


def _break_even(spec_s: float, ii: dict, x: dict, q: str) -> dict:
    """Smallest n with spec + ttft_ii + (n − 1)·lat_ii ≤ ttft_x + (n − 1)·lat_x (None: never)."""
    head = spec_s + ii["ttft_s"][q] - x["ttft_s"][q]
    gain = _lat(x, q) - _lat(ii, q)
    n = 1 if head <= 0 else (None if gain <= 0 else 1 + int(-(-head // gain)))
    return {"tokens": n, "extra_first_token_s": head, "saving_per_token_s": gain}


def _latency_targets(rows, rs, b, q: str) -> dict:
    """The three per-token targets for batch b, from latency quantile q of each setting."""
    floor = {r: _lat(_row(rows, "gpt_no_prompt", r, b), q) for r in rs}
    comp = {r: _lat(_row(rows, "ii_compiled", r, b), q) for r in rs}
    kv = _lat(_row(rows, "iv_gpt_kvcache", max(rs), b), q)
    change, floor_change = common.ratio(comp[max(rs)], comp[min(rs)]), common.ratio(floor[max(rs)], floor[min(rs)])
    return {"ii_over_no_prompt": {str(r): common.ratio(comp[r], floor[r]) for r in rs},
            "ii_flat_in_r": None if change is None else change - 1,
            # the no-prompt GPT cannot depend on r: its change is the machine's drift
            "no_prompt_floor_change": None if floor_change is None else floor_change - 1,
            "iv_over_ii": common.ratio(kv, comp[max(rs)])}


def derive(res: dict) -> None:
    """Break-even tokens, fractions of the matmul peak, and the targets: "value" from median latencies (the
    targets' definition), "value_p10" from the fastest decile of tokens (less sensitive to a busy machine)."""
    rows, specs = res["settings"], res["specialization"]
    peak = res["matmul_peak"]["flops_per_s"]
    for row in rows:
        row["fraction_of_matmul_peak"] = common.ratio(row["achieved_flops_per_s"], peak)
    rs, bs = res["args"]["prompt_lens"], res["args"]["batches"]
    spec_by_r = {x["r"]: x for x in specs}
    res["break_even"] = []
    for r in rs:
        for b in bs:
            ii = _row(rows, "ii_compiled", r, b)
            for other in ("i_cgt_full", "iii_gpt_nocache", "iv_gpt_kvcache"):
                x = _row(rows, other, r, b)
                if not ii or not x or _lat(ii) is None or _lat(x) is None:
                    continue
                entry = {"r": r, "batch": b, "versus": other,
                         **_break_even(spec_by_r[r]["specialize"]["median"], ii, x, "median")}
                entry["tokens_p10"] = _break_even(spec_by_r[r]["specialize"]["p10"], ii, x, "p10")["tokens"]
                res["break_even"].append(entry)
    t = {}
    for b in bs:
        med, fast = _latency_targets(rows, rs, b, "median"), _latency_targets(rows, rs, b, "p10")
        lim = TARGETS["ii_over_no_prompt_max"]
        t[f"ii_over_no_prompt_b{b}"] = {
            "value": med["ii_over_no_prompt"], "value_p10": fast["ii_over_no_prompt"], "target": f"≤ {lim} at every r",
            "met": all(v is not None and v <= lim for v in med["ii_over_no_prompt"].values())}
        lim = TARGETS["ii_flat_in_r_max_change"]
        t[f"ii_flat_in_r_b{b}"] = {
            "value": med["ii_flat_in_r"], "value_p10": fast["ii_flat_in_r"],
            "target": f"change {min(rs)}→{max(rs)} within ±{100 * lim:.0f} %",
            "met": med["ii_flat_in_r"] is not None and abs(med["ii_flat_in_r"]) <= lim,
            "no_prompt_floor_change": med["no_prompt_floor_change"]}
        lim = TARGETS["iv_over_ii_at_max_r_min"]
        iv_row, ii_row = _row(rows, "iv_gpt_kvcache", max(rs), b), _row(rows, "ii_compiled", max(rs), b)
        t[f"iv_over_ii_at_r{max(rs)}_b{b}"] = {
            "value": med["iv_over_ii"], "value_p10": fast["iv_over_ii"], "target": f"≥ {lim} (per token)",
            "analytic_flop_ratio": iv_row and ii_row and common.ratio(iv_row["flops_per_token"], ii_row["flops_per_token"]),
            "analytic_bytes_ratio": iv_row and ii_row and common.ratio(iv_row.get("bytes_per_step"),
                                                                        ii_row.get("bytes_per_step")),
            "met": med["iv_over_ii"] is not None and med["iv_over_ii"] >= lim}
    lim = TARGETS["specialize_over_forward_max"]
    vals = {str(x["r"]): x["ratio_vs_cgt_forward"] for x in specs}
    t["specialize_over_cgt_forward"] = {
        "value": vals, "value_p10": {str(x["r"]): common.ratio(x["specialize"]["p10"], x["cgt_forward"]["p10"])
                                     for x in specs},
        "target": f"≤ {lim} at every r", "met": all(v is not None and v <= lim for v in vals.values())}
    t["specialize_over_gpt_forward"] = {"value": {str(x["r"]): x["ratio_vs_gpt_forward"] for x in specs},
                                        "target": "(reference: the plain GPT's prefill)", "met": None}
    if res.get("training"):
        v = res["training"]["step"]["ratio_median"]
        lim = TARGETS["training_step_ratio_max"]
        step = res["training"]["step"]
        t["training_step_ratio"] = {"value": v, "value_p10": common.ratio(step["cgt"]["p10"], step["gpt"]["p10"]),
                                    "target": f"≤ {lim}", "met": v is not None and v <= lim}
    res["targets"] = t


# ---------------------------------------------------------------------------------------------- outputs
def write_plot(res: dict, path: Path) -> None:
    """Self-contained HTML: per-token latency and time to first token against r, one line per setting."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from cgt_viz.io import atomic_write

    fig = make_subplots(rows=1, cols=2, subplot_titles=("per-token latency (median, p10–p90)", "time to first token"))
    rows = res["settings"]
    for mode, label in MODES.items():
        for b in res["args"]["batches"]:
            pts = sorted((x for x in rows if x["mode"] == mode and x["batch"] == b
                          and x["s"] == max(y["s"] for y in rows if y["mode"] == mode)), key=lambda x: x["r"])
            if not pts:
                continue
            name = f"{label}, b={b}" + (f" (s={pts[0]['s']})" if pts[0]["capped"] else "")
            lat = [x["per_token_s"]["median"] * 1e3 if x["per_token_s"] else None for x in pts]
            err = [x["per_token_s"]["p90"] * 1e3 - l if l is not None else None for x, l in zip(pts, lat)]
            errm = [l - x["per_token_s"]["p10"] * 1e3 if l is not None else None for x, l in zip(pts, lat)]
            dash = "solid" if b == min(res["args"]["batches"]) else "dash"
            fig.add_trace(go.Scatter(x=[x["r"] for x in pts], y=lat, name=name, legendgroup=name, mode="lines+markers",
                                     line={"dash": dash}, error_y={"type": "data", "array": err, "arrayminus": errm}),
                          row=1, col=1)
            fig.add_trace(go.Scatter(x=[x["r"] for x in pts], y=[x["ttft_s"]["median"] * 1e3 for x in pts], name=name,
                                     legendgroup=name, showlegend=False, mode="lines+markers", line={"dash": dash}),
                          row=1, col=2)
    specs = res["specialization"]
    fig.add_trace(go.Scatter(x=[x["r"] for x in specs], y=[x["specialize"]["median"] * 1e3 for x in specs],
                             name="(ii) one-time specialize(prompt)", mode="lines+markers", line={"color": "black"}),
                  row=1, col=2)
    env = res["environment"]
    fig.update_layout(title=f"bench_cost — {env['device']} {env['dtype']}, {env['threads']} thread(s), "
                            f"torch {env['torch']}", height=520, width=1200)
    for col in (1, 2):
        fig.update_xaxes(title_text="prompt length r", type="log", row=1, col=col)
        fig.update_yaxes(title_text="ms", type="log", row=1, col=col)
    atomic_write(path, lambda tmp: fig.write_html(tmp, include_plotlyjs=True, full_html=True))


def readme_tables(res: dict) -> str:
    """Markdown tables from one bench_cost.json: targets, every setting at the largest s, (ii)'s one-time cost."""
    env, c, rows = res["environment"], res["config"], res["settings"]
    mb = 1 / 2 ** 20
    out = [f"bench_cost — {env['device']} ({env['dtype']}), {env['threads']} thread(s), torch {env['torch']}, "
           f"load {env.get('load_average_1_5_15')} → {env.get('load_average_end')}; d_x {c['d_x']}, N {c['n_layer']}, heads {c['n_head']}, "
           f"d_y {c['d_y']}, ℓ {c['y_layer']}, K {c['n_templates']}, vocab {c['vocab_size']}; "
           f"matmul peak {res['matmul_peak']['flops_per_s'] / 1e9:.1f} GFLOP/s; {res['finished_utc']}", "",
           "| target | measured (medians) | fastest decile (p10) | wanted | met |", "|---|---|---|---|---|"]

    def shown(v):
        if isinstance(v, dict):
            return ", ".join(f"r{k}: {common.fmt(x)}" for k, x in sorted(v.items(), key=lambda kv: int(kv[0])))
        return common.fmt(v)

    for name, t in sorted(res["targets"].items()):
        med = shown(t["value"])
        if t.get("no_prompt_floor_change") is not None:
            med += f" (no-prompt GPT: {common.fmt(t['no_prompt_floor_change'])})"
        if t.get("analytic_flop_ratio") is not None:
            med += (f" (analytic: FLOPs {common.fmt(t['analytic_flop_ratio'])}×, "
                    f"bytes read {common.fmt(t.get('analytic_bytes_ratio'))}×)")
        met = "—" if t["met"] is None else ("yes" if t["met"] else "no")
        out.append(f"| {name} | {med} | {shown(t.get('value_p10'))} | {t['target']} | {met} |")
    out += ["", "| setting | r | b | s | TTFT ms | per token ms (p10–p90) | tok/s | peak MB | KV MB | GFLOP/token | "
                "% peak | MB read/step |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for x in sorted(rows, key=lambda x: (list(MODES).index(x["mode"]), x["batch"], x["r"])):
        if x["s"] != max(y["s"] for y in rows if y["mode"] == x["mode"]):
            continue
        p = x["per_token_s"]
        lat = f"{p['median'] * 1e3:.2f} ({p['p10'] * 1e3:.2f}–{p['p90'] * 1e3:.2f})" if p else "—"
        frac = x.get("fraction_of_matmul_peak")
        out.append(f"| {x['mode']} | {x['r']} | {x['batch']} | {x['s']} | {x['ttft_s']['median'] * 1e3:.1f} | {lat} | "
                   f"{x['throughput_tok_per_s']:.0f} | {x['peak_memory_bytes'] * mb:.0f} | "
                   f"{x['kv_cache_bytes_after_prefill'] * mb:.2f} | {x['flops_per_token'] / 1e9:.3g} | "
                   f"{'—' if frac is None else f'{100 * frac:.1f}'} | {x.get('bytes_per_step', 0) * mb:.1f} |")
    out += ["", "| r | specialize ms | / CGT forward | / GPT forward | merged model MB | changed weights MB | "
            "LoRA factors KB | break-even tokens vs (iv), b=" + str(min(res['args']['batches'])) + " (fastest decile) |",
            "|---|---|---|---|---|---|---|---|"]
    for x in res["specialization"]:
        be = [y for y in res["break_even"] if y["r"] == x["r"] and y["versus"] == "iv_gpt_kvcache"
              and y["batch"] == min(res["args"]["batches"])]
        word = lambda n: "never" if n is None else str(n)  # noqa: E731
        be_s = f"{word(be[0]['tokens'])} ({word(be[0].get('tokens_p10'))})" if be else "—"
        out.append(f"| {x['r']} | {x['specialize']['median'] * 1e3:.1f} | {common.fmt(x['ratio_vs_cgt_forward'])} | "
                   f"{common.fmt(x['ratio_vs_gpt_forward'])} | {x['merged_model_bytes'] * mb:.1f} | "
                   f"{x['merged_changed_weight_bytes'] * mb:.2f} | {x['lora_factor_bytes'] / 1024:.0f} | {be_s} |")
    if res.get("training"):
        tr = res["training"]
        out += ["", f"Training overhead (b {tr['batch']}, t {tr['seq']}, w_aux {tr['w_aux']}): CGT / GPT step "
                    f"{common.fmt(tr['step']['ratio_median'])}, forward + backward {common.fmt(tr['forward_backward']['ratio_median'])}, "
                    f"forward {common.fmt(tr['forward']['ratio_median'])}."]
    out += ["", *[f"- {n}" for n in res["notes"]]]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = common.parser(__doc__)
    common.add_model_args(p)
    p.add_argument("--prompt-lens", default="64,256,1024", help="prompt lengths r")
    p.add_argument("--gen-lens", default="16,64,256", help="generated lengths s")
    p.add_argument("--batches", default="1,8", help="batch sizes")
    p.add_argument("--modes", default=",".join(MODES), help=f"subset of {','.join(MODES)}")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--nocache-max-s", type=int, default=16, help="cap on s for (iii), which is quadratic in length")
    p.add_argument("--nocache-long", type=int, default=2048, help="r·b above which (iii) runs --nocache-repeats times")
    p.add_argument("--nocache-repeats", type=int, default=1)
    p.add_argument("--train-batch", type=int, default=8)
    p.add_argument("--train-seq", type=int, default=256)
    p.add_argument("--train-repeats", type=int, default=3, help="0 skips the training overhead")
    p.add_argument("--from-json", default=None, help="skip measuring: redraw plot/README from this JSON")
    common.add_output_args(p, "bench_cost.json and .html")
    args = p.parse_args(argv)
    args.prompt_lens = common.positive_int_list("--prompt-lens", args.prompt_lens)
    args.gen_lens = sorted(common.positive_int_list("--gen-lens", args.gen_lens))
    args.batches = common.positive_int_list("--batches", args.batches)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in args.modes if m not in MODES]
    if bad or not args.modes:
        raise ValueError(f"--modes must be a comma-separated subset of {list(MODES)}, got {bad or args.modes}")
    if min(args.gen_lens) < 2:
        raise ValueError(f"--gen-lens must all be >= 2 (a per-token latency needs two tokens), got {args.gen_lens}")
    for name in ("threads", "vocab", "d_x", "n_layer", "n_head", "d_y", "n_head_y", "repeats", "nocache_max_s",
                 "nocache_repeats", "train_batch", "train_seq"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.train_repeats < 0:
        raise ValueError(f"--train-repeats must be >= 0, got {args.train_repeats}")
    return args


def build_models(args, device: torch.device) -> tuple[CGT, GPT]:
    """common.build_models with room for r + s (and the training sequence) with a margin."""
    block = max(args.prompt_lens) + max(args.gen_lens) + 64
    return common.build_models(args, max(block, args.train_seq), device)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    out_dir = Path(args.out)
    if args.from_json:
        res = common_read(args.from_json)
        derive(res)  # derived figures follow the current code; the measurements are kept as they are
    else:
        torch.set_num_threads(args.threads)
        device = common.pick_device(args.device)
        started = time.time()
        cgt, gpt = build_models(args, device)
        res = {"benchmark": "bench_cost", "config": cgt.config.to_dict(), "args": dict(vars(args)),
               "environment": common.environment(device), "modes": MODES, "target_thresholds": TARGETS}
        res["notes"] = [
            f"(iii) recomputes the whole sequence per token (generate(use_cache=False)); its s is capped at "
            f"{min(max(args.gen_lens), args.nocache_max_s)} and it runs {args.nocache_repeats} repeat(s) when "
            f"r·b > {args.nocache_long}.",
            "Per-token latency: median over every later token of every repeat (p10–p90 spread); TTFT: the prefill "
            "step (for ii and the no-prompt GPT a 1-token step, excluding ii's one-time specialize).",
            "Batch rows share one prompt; (i), (iii), (iv) prefill all rows (generate has no shared-prefix cache).",
            "KV bytes: KVCache.nbytes() summed over the cache list generate creates, right after the prefill step.",
            "FLOPs: analytic matmul + attention count (2 per multiply-add), logits at every prefill position; "
            "per_token is the mean over the s − 1 incremental steps, times the batch.",
            f"Peak memory: {'RSS high-water mark (reset per run via /proc/self/clear_refs), whole process' if device.type == 'cpu' else 'torch.cuda.max_memory_allocated'}.",
        ]
        res["matmul_peak"] = common.matmul_peak_flops(device)
        res["settings"], res["specialization"] = run_grid(args, cgt, gpt, device)
        if args.train_repeats:
            res["training"] = common.measure_training(cgt, gpt, device, args.train_batch, args.train_seq,
                                                      args.train_repeats, args.seed)
        res["environment"]["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
        res["wall_seconds"] = time.time() - started
        res["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        derive(res)
        common.write_json(out_dir / "bench_cost.json", res)
        print(f"bench_cost: wrote {out_dir / 'bench_cost.json'} in {res['wall_seconds']:.0f} s")
    write_plot(res, out_dir / "bench_cost.html")
    if args.write_readme:
        common.replace_readme_section(Path(args.readme), "bench_cost", readme_tables(res))
    return res


def common_read(path: str) -> dict:
    from cgt_viz.io import read_json
    res = read_json(path)
    if not isinstance(res, dict) or res.get("benchmark") != "bench_cost":
        raise ValueError(f"--from-json must name a bench_cost.json, got {path!r}")
    return res


if __name__ == "__main__":
    main()
