"""What running a per-prompt LoRA through the one training loop costs: `lora_baseline.train_lora` (its Adam
steps go through `cgt_viz.train.train` via `fit_factors`) against the same Adam steps written as a plain loop,
on the same model, case and starting factors, interleaved. Writes train_overhead.json.

    python benchmarks/bench_train_overhead.py                 # a small ICL CGT, 100 steps, 7 repeats, one thread
    python benchmarks/bench_train_overhead.py --steps 10 --repeats 2 --out /tmp    # a smoke run (tests)

Both give the same factors and losses (tests/training/test_train_steps.py holds that bit for bit; the run here
checks it too); the ratio is of wall time per run of `--steps` updates, median over repeats.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (puts the repo root on sys.path)
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402


def plain_adam(model, data, factors, steps: int, lr: float):
    """The ten-line loop train_lora had before it ran through train: Adam on the factors, full batch."""
    import cgt_viz.lora_baseline as lb
    base = model.gpt
    params = {n: (nn.Parameter(a.detach().clone()), nn.Parameter(b.detach().clone())) for n, (a, b) in factors.items()}
    opt = torch.optim.Adam([p for ab in params.values() for p in ab], lr=lr)
    was = base.training
    base.eval()
    for p in base.parameters():
        p.requires_grad_(False)
    try:
        for _ in range(steps):
            loss = lb.distill_kl(model.config.mode, lb.lora_logits(base, params, data.inputs), data,
                                 model.config.aux_kl_top_k)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    finally:
        for p in base.parameters():
            p.requires_grad_(True)
        base.train(was)
    return params, float(loss.detach())


def main(argv=None) -> dict:
    import cgt_viz.lora_baseline as lb
    from cgt_viz import CGT, CGTConfig
    from cgt_viz.tasks import make_task
    p = common.parser(__doc__)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--out", default=str(common.DEFAULT_RESULTS))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    task = make_task("icl")
    torch.manual_seed(0)
    model = CGT(CGTConfig(**task.config_kwargs(), n_layer=4, d_x=64, d_y=32, y_layer=2, n_templates=8,
                          template_rank=2))
    case = lb.icl_case(task, k=8, generator=torch.Generator().manual_seed(0))
    data = case.make_train(model, case.prompt)
    start = lb.random_factors(model, torch.Generator().manual_seed(1))
    got = {}
    fns = {"through_train": lambda: got.__setitem__("train", lb.train_lora(model, data, (args.steps,), init=start,
                                                                           lr=args.lr)),
           "plain_adam": lambda: got.__setitem__("plain", plain_adam(model, data, start, args.steps, args.lr))}
    times = common.time_interleaved(fns, torch.device("cpu"), args.repeats)
    trained, (plain, plain_kl) = got["train"][-1], got["plain"]
    same = all(torch.equal(trained.factors[n][i], plain[n][i].detach()) for n in plain for i in (0, 1))
    res = {"settings": vars(args), "environment": common.environment(torch.device("cpu")),
           "command": "python benchmarks/bench_train_overhead.py " + " ".join(argv or sys.argv[1:]),
           "same_factors": same, "seconds": common.summarize_times(times, "through_train", "plain_adam"),
           "per_step_overhead_ms": 1000 * (common.summarize(times["through_train"])["median"]
                                           - common.summarize(times["plain_adam"])["median"]) / args.steps}
    common.write_json(Path(args.out) / "train_overhead.json", res)
    print(f"through train / plain Adam: {res['seconds']['ratio_median']:.3f} (median of {args.repeats}); "
          f"{res['per_step_overhead_ms']:.2f} ms a step; same factors: {same}")
    return res


if __name__ == "__main__":
    main()
