"""Core cost ratios of a CGT against the plain GPT it contains (issue 2, "Performance").

    python benchmarks/bench_core.py [--device auto|cpu|cuda] [--out benchmarks/results] [--write-readme]

Three ratios, each measured within one run with the two sides interleaved repeat by repeat (so a change
of machine load hits both):
  training   CGT step (main + aux, w_aux = 1: forward, backward, AdamW) / GPT step, same x size (b, t)
  merged     forward of the specialised (merged) GPT / forward of the plain GPT, same input
  specialise specialize(prompt) / one CGT forward over the prompt (also / one GPT forward), per prompt length
Targets (reported, never asserted): training ≤ 1.6, merged ≤ 1.05, specialise ≤ 1.3.
CPU runs fp32 with --threads threads (default 1); CUDA runs bf16 autocast. Writes bench_core.json.
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

from cgt_viz import CGT, CGTConfig  # noqa: E402

TARGETS = {"training_step": 1.6, "merged_forward": 1.05, "specialize": 1.3}


def build_models(args, device: torch.device) -> tuple[CGT, torch.nn.Module, CGTConfig]:
    """common.build_models with a block long enough for the training sequence and every prompt."""
    cgt, gpt = common.build_models(args, max(args.block_size, args.seq, max(args.prompt_lens)), device)
    return cgt, gpt, cgt.config


def measure_merged_forward(cgt: CGT, gpt: torch.nn.Module, device: torch.device, batch: int, seq: int,
                           prompt_len: int, repeats: int, seed: int = 0) -> dict:
    """Forward (no grad) of the merged specialised GPT vs the plain GPT on the same (batch, seq) tokens;
    the unmerged specialised path (forward_specialized) for reference."""
    cfg = cgt.config
    gen = torch.Generator().manual_seed(seed + 2)
    prompt = torch.randint(0, cfg.vocab_size, (prompt_len,), generator=gen).to(device)
    idx = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen).to(device)
    cgt.eval(), gpt.eval()
    with torch.no_grad():
        merged = cgt.specialize(prompt).to(device).eval()
        ybar = cgt.context(prompt[None])[:, -1]

    run = lambda fn: common.inference_call(fn, device)   # noqa: E731
    times = common.time_interleaved({"gpt": run(lambda: gpt(idx)), "merged": run(lambda: merged(idx)),
                                     "unmerged": run(lambda: cgt.forward_specialized(idx, ybar))},
                                    device, repeats)
    out = {"batch": batch, "seq": seq, "prompt_len": prompt_len, **common.summarize_times(times, "merged", "gpt")}
    out["unmerged_ratio_median"] = common.ratio(out["unmerged"]["median"], out["gpt"]["median"])
    return out


def measure_specialize(cgt: CGT, gpt: torch.nn.Module, device: torch.device, prompt_lens: list[int],
                       repeats: int, seed: int = 0) -> list[dict]:
    """specialize(prompt) vs one forward over the same prompt (CGT full forward, and GPT forward), per length;
    with the two parts of specialisation: the summary pass (context) and the merge (merged_gpt)."""
    cfg = cgt.config
    gen = torch.Generator().manual_seed(seed + 3)
    cgt.eval(), gpt.eval()
    rows = []
    for r in prompt_lens:
        prompt = torch.randint(0, cfg.vocab_size, (1, r), generator=gen).to(device)
        with torch.no_grad():
            ybar = cgt.context(prompt)[0, -1]

        run = lambda fn: common.inference_call(fn, device)   # noqa: E731
        times = common.time_interleaved({
            "specialize": run(lambda: cgt.specialize(prompt)),
            "specialize_shared": run(lambda: cgt.specialize(prompt, share_weights=True)),
            "cgt_forward": run(lambda: cgt(prompt)),
            "gpt_forward": run(lambda: gpt(prompt)),
            "summary_pass": run(lambda: cgt.context(prompt)),
            "merge": run(lambda: cgt.merged_gpt(ybar)),
        }, device, repeats)
        row = {"prompt_len": r, **common.summarize_times(times, "specialize", "cgt_forward")}
        row["ratio_vs_gpt_forward_median"] = common.ratio(row["specialize"]["median"], row["gpt_forward"]["median"])
        row["shared"] = {"ratio_median": common.ratio(row["specialize_shared"]["median"], row["cgt_forward"]["median"]),
                         "ratio_min": common.ratio(row["specialize_shared"]["min"], row["cgt_forward"]["min"])}
        rows.append(row)
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = common.parser(__doc__)
    common.add_model_args(p)
    p.add_argument("--block-size", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8, help="training and merged-forward batch")
    p.add_argument("--seq", type=int, default=256, help="training and merged-forward sequence length")
    p.add_argument("--prompt-lens", default="64,256,1024", help="prompt lengths for the specialisation latency")
    p.add_argument("--repeats", type=int, default=5)
    common.add_output_args(p, "bench_core.json")
    args = p.parse_args(argv)
    args.prompt_lens = common.positive_int_list("--prompt-lens", args.prompt_lens)
    for name in ("threads", "vocab", "d_x", "n_layer", "n_head", "d_y", "n_head_y", "batch", "seq", "repeats"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def readme_table(res: dict) -> str:
    """The markdown results table of one bench_core.json."""
    env, c = res["environment"], res["config"]
    tr, mf, tf = res["training"], res["merged_forward"], res["training_flops"]
    lines = [f"bench_core — {env['device']} ({env['dtype']}), {env['threads']} thread(s), torch {env['torch']}, "
             f"load {env.get('load_average_1_5_15')} → {env.get('load_average_end')}; d_x {c['d_x']}, N {c['n_layer']}, "
             f"d_y {c['d_y']}, ℓ {c['y_layer']}, K {c['n_templates']}, vocab {c['vocab_size']}; {res['finished_utc']}",
             "", "| ratio | median | fastest / fastest | target | setting |", "|---|---|---|---|---|"]

    def add(name, block, target, setting):
        lines.append(f"| {name} | {common.fmt(block['ratio_median'])} | {common.fmt(block.get('ratio_min'))} | "
                     f"{target} | {setting} |")

    add("CGT train step (main + aux) / GPT step", tr["step"], f"≤ {TARGETS['training_step']}",
        f"b {tr['batch']}, t {tr['seq']}, AdamW")
    add("… forward + backward only", tr["forward_backward"], "", "")
    add("… forward only", tr["forward"], "", "")
    lines.append(f"| … analytic forward FLOP ratio | {common.fmt(tf['ratio'])} | | | main only "
                 f"{common.fmt(tf['ratio_main_only'])}; aux unpadded {common.fmt(tf['ratio_aux_exact'])}, "
                 f"padded to the longest {common.fmt(tf['ratio_aux_padded'])} |")
    add("merged specialised forward / GPT forward", mf, f"≤ {TARGETS['merged_forward']}", f"b {mf['batch']}, t {mf['seq']}")
    for row in res["specialize"]:
        add("specialize / CGT forward over the prompt", row, f"≤ {TARGETS['specialize']}",
            f"r {row['prompt_len']} (/ GPT forward: {common.fmt(row['ratio_vs_gpt_forward_median'])})")
    for row in res["specialize"]:
        add("specialize(share_weights=True) / CGT forward", row["shared"], f"≤ {TARGETS['specialize']}",
            f"r {row['prompt_len']} (untouched weights shared, for inference)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    device = common.pick_device(args.device)
    started = time.time()
    cgt, gpt, cfg = build_models(args, device)
    res = {"benchmark": "bench_core", "targets": TARGETS, "config": cfg.to_dict(),
           "args": {k: v for k, v in vars(args).items()}, "environment": common.environment(device)}
    res["training"] = common.measure_training(cgt, gpt, device, args.batch, args.seq, args.repeats, args.seed)
    res["training_flops"] = common.training_flops(cfg, args.batch, args.seq)
    res["merged_forward"] = measure_merged_forward(cgt, gpt, device, args.batch, args.seq,
                                                   min(args.prompt_lens), args.repeats, args.seed)
    res["specialize"] = measure_specialize(cgt, gpt, device, args.prompt_lens, args.repeats, args.seed)
    res["summary"] = {
        "training_step_ratio": res["training"]["step"]["ratio_median"],
        "training_fwd_bwd_ratio": res["training"]["forward_backward"]["ratio_median"],
        "merged_forward_ratio": res["merged_forward"]["ratio_median"],
        "specialize_ratio": {str(r["prompt_len"]): r["ratio_median"] for r in res["specialize"]},
        "specialize_shared_ratio": {str(r["prompt_len"]): r["shared"]["ratio_median"] for r in res["specialize"]},
    }
    res["environment"]["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    res["wall_seconds"] = time.time() - started
    res["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out = Path(args.out) / "bench_core.json"
    common.write_json(out, res)
    res["json_path"] = str(out)
    if args.write_readme:
        common.replace_readme_section(Path(args.readme), "bench_core", readme_table(res))
    print(f"bench_core: wrote {out} in {res['wall_seconds']:.0f} s; summary {res['summary']}")
    return res


if __name__ == "__main__":
    main()
