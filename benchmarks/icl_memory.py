"""Does a token memory help the from-scratch CGT compile an ICL prompt? The "icl" recipe's CGT trained twice, the
same seed, steps and data, without and with `memory_layers` (layers.TokenMemory at the MLP output map of the top
layers), then `evaluate_specialization` on the same held-out queries: the compiled model's gap closed G and its
losses against the prompted and the no-context model. Writes icl_memory.json.

    python benchmarks/icl_memory.py                              # the recipe's steps, one thread (a few minutes a run)
    python benchmarks/icl_memory.py --steps 20 --eval-batches 1 --out /tmp    # a smoke run

Two pairs of runs by default (`--tasks`): "plain", the recipe's task as it is, and "novel_split", the same task
with SyntheticICL(novel_split=True): the auxiliary split then falls before a query whose u the prefix has not
shown, as the evaluation's queries always are. With the plain task most auxiliary queries (P values, 13 pairs)
repeat a u of the prefix, so a memory can learn to answer them by copying, which the evaluation never rewards.

The held-out queries of SyntheticICL are values u the prompt never showed, so the memory (which raises the tokens
that followed the prompt's own positions) cannot answer them by copying: what it could add is a better compile of
the demonstrations. "specialized" is the whole compile here: ȳ's templates and, in the memory run, the prompt's
slots (`forward_compiled`, merged by `specialize`; spec_merge_max_diff checks the two agree).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (puts the repo root on sys.path)
import torch  # noqa: E402

KEEP = ("k", "n_scored", "loss_prompted", "loss_specialized", "loss_no_context", "acc_prompted", "acc_specialized",
        "acc_no_context", "gap_closed", "gap_closed_acc", "spec_merge_max_diff")


TASKS = {"plain": {}, "novel_split": {"novel_split": True}}


def run(memory_layers: int, task_changes: dict, args) -> dict:
    from cgt_viz import CGT, CGTConfig, train
    from cgt_viz.evaluate import evaluate_specialization
    from cgt_viz.recipes import RECIPES
    from cgt_viz.tasks import make_task
    recipe = RECIPES["icl"]
    task = make_task("icl", **{**recipe["task"], **task_changes})
    torch.manual_seed(args.seed)
    model = CGT(CGTConfig(**{**task.config_kwargs(), **recipe["model"], "memory_layers": memory_layers,
                             "memory_rank": args.memory_rank}))
    t0 = time.perf_counter()
    model, history = train(model, task, **{**recipe["train"], "steps": args.steps}, seed=args.seed, progress=False,
                           device="cpu")
    seconds = time.perf_counter() - t0
    rows = evaluate_specialization(model, task, k_values=(args.k,), n_batches=args.eval_batches, batch_size=64,
                                   seed=1000 + args.seed)
    out = {"memory_layers": memory_layers, "train_seconds": seconds,
           "main_curve": [round(v, 4) for v in history.main[99::100]],
           "aux_curve": [round(v, 4) for v in history.aux[99::100]],
           **{k: rows[-1][k] for k in KEEP}}
    if model.memory is not None:
        out["memory_gain"] = [float(g) for g in (model.memory.scale * model.memory.unit).detach()]
    return out


def main(argv=None) -> dict:
    from cgt_viz.recipes import RECIPES
    p = common.parser(__doc__)
    p.add_argument("--steps", type=int, default=RECIPES["icl"]["train"]["steps"])
    p.add_argument("--seed", type=int, default=101)
    p.add_argument("--memory-layers", type=int, default=2)
    p.add_argument("--memory-rank", type=int, default=32)
    p.add_argument("--k", type=int, default=8, help="demonstrations in the evaluated prompts")
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--tasks", default="plain,novel_split", help=f"comma-separated, of {sorted(TASKS)}")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(common.DEFAULT_RESULTS))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = sorted(set(names) - set(TASKS))
    if unknown or not names:
        p.error(f"--tasks must name some of {sorted(TASKS)}, got {args.tasks!r}")
    pairs = {}
    for name in names:
        runs = [run(0, TASKS[name], args), run(args.memory_layers, TASKS[name], args)]
        pairs[name] = {"task_changes": TASKS[name], "runs": runs,
                       "gap_closed_with_minus_without": runs[1]["gap_closed"] - runs[0]["gap_closed"]}
        for r in runs:
            print(f"{name}, memory_layers={r['memory_layers']}: G = {r['gap_closed']:.3f}, loss prompted / compiled / "
                  f"no context = {r['loss_prompted']:.3f} / {r['loss_specialized']:.3f} / {r['loss_no_context']:.3f}, "
                  f"acc compiled {r['acc_specialized']:.3f}, merge diff {r['spec_merge_max_diff']:.1e}, "
                  f"{r['train_seconds']:.0f} s", flush=True)
    res = {"settings": vars(args), "environment": common.environment(torch.device("cpu")),
           "command": "python benchmarks/icl_memory.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "recipe": "icl", "pairs": pairs}
    common.write_json(Path(args.out) / "icl_memory.json", res)
    return res


if __name__ == "__main__":
    main()
