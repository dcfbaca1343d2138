"""What the aux suffix window costs (issue 16, item 1): the CGT / GPT training-step ratio for several
`aux_suffix_len`, measured and analytic, in one interleaved run. Writes aux_suffix.json.

    python benchmarks/bench_aux_suffix.py                       # the benchmark size, suffix all / 128 / 64 / 32
    python benchmarks/bench_aux_suffix.py --d-x 128 --n-head 4 --d-y 32 --n-head-y 2 --template-rank 2 \\
        --vocab 4096 --aux-min 32                               # the reference text model's size

`aux_suffix_len` changes the objective (the aux pass scores only the first L tokens of each row's suffix);
what it does to quality is measured by training, not here (docs/notes.md, issue 16's trade-off table). Every
setting runs the same splits and tokens in each repeat; the ratio is of process CPU time per full step
(forward, backward, AdamW; wall time on a GPU), median over repeats, the per-repeat spread beside it.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (puts the repo root on sys.path)
import torch  # noqa: E402


def main(argv=None) -> dict:
    p = common.parser(__doc__)
    common.add_model_args(p)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--suffix-lens", default="0,128,64,32", help="aux_suffix_len values, comma-separated (0: all)")
    p.add_argument("--aux-min", type=int, default=1, help="aux_min_prefix = aux_min_suffix")
    p.add_argument("--repeats", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(common.DEFAULT_RESULTS))
    args = p.parse_args(argv)
    lens = [int(x) for x in args.suffix_lens.split(",")] if args.suffix_lens else []
    if not lens or any(x < 0 for x in lens):
        raise ValueError(f"--suffix-lens must be non-negative integers (0: the whole suffix), got {args.suffix_lens!r}")
    torch.set_num_threads(args.threads)
    device = common.pick_device(args.device)
    cgt, gpt = common.build_models(args, args.seq, device)
    base = dataclasses.replace(cgt.config, aux_min_prefix=args.aux_min, aux_min_suffix=args.aux_min)
    configs = {x: dataclasses.replace(base, aux_suffix_len=x or None) for x in lens}
    gen = torch.Generator().manual_seed(args.seed)
    idx = torch.randint(0, base.vocab_size, (args.batch, args.seq), generator=gen).to(device)
    targets = torch.randint(0, base.vocab_size, (args.batch, args.seq), generator=gen).to(device)
    opts = {"gpt": torch.optim.AdamW(gpt.parameters(), lr=1e-4), "cgt": torch.optim.AdamW(cgt.parameters(), lr=1e-4)}
    cgt.train(), gpt.train()

    clock = time.process_time if device.type == "cpu" else time.perf_counter     # CPU: steadier on a shared machine

    def step(name: str, cfg=None, seed: int = 0) -> float:
        started = clock()
        opts[name].zero_grad(set_to_none=True)
        with common.autocast(device):
            if name == "gpt":
                loss = gpt.loss(idx, targets)["total"]
            else:
                cgt.config = cfg
                loss = cgt.loss(idx, targets, generator=torch.Generator().manual_seed(seed))["total"]
        loss.backward()
        opts[name].step()
        common.sync(device)
        return clock() - started

    for x in lens:                                      # warm-up
        step("cgt", configs[x])
    step("gpt")
    times = {"gpt": [], **{x: [] for x in lens}}
    for r in range(args.repeats):
        times["gpt"].append(step("gpt"))
        for x in lens:
            times[x].append(step("cgt", configs[x], seed=r))
    cgt.config = base
    rows = []
    for x in lens:
        per = [c / g for c, g in zip(times[x], times["gpt"])]
        rows.append({"aux_suffix_len": x or None, "ratio_median": common.summarize(per)["median"],
                     "ratio_spread": common.summarize(per),
                     "ratio_analytic": common.training_flops(configs[x], args.batch, args.seq)["ratio"],
                     "cgt_step_s": common.summarize(times[x])})
        print(rows[-1]["aux_suffix_len"], round(rows[-1]["ratio_median"], 3), round(rows[-1]["ratio_analytic"], 3),
              flush=True)
    res = {"environment": common.environment(device), "args": vars(args), "gpt_step_s": common.summarize(times["gpt"]),
           "rows": rows}
    common.write_json(Path(args.out) / "aux_suffix.json", res)
    return res


if __name__ == "__main__":
    main()
