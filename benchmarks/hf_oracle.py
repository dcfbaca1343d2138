"""The ceiling of a SmolLM2 head's update space, beside the head: `cgt_viz.hf.oracle.oracle_comparison` on the
head's test documents, for each oracle kind and target. Writes results/hf_oracle.json.

    python benchmarks/hf_oracle.py                  # the shipped head, test part, both targets; one thread
    python benchmarks/hf_oracle.py --smoke --out /tmp/o.json    # the tiny random Llama, seconds (tests)

Per prompt (the test windows of `compile_comparison`, prompt length --prefix, --suffix scored tokens):

  ybar    the best ȳ for this prompt (a perfect reader of the head's templates)
  coeffs  the best coefficients of every template (the whole fixed template space)
  lora    the compiled update plus a free rank --rank update at the same maps (any direction)
  memory  a head with a token memory: the best factors of the memory's update (its space's ceiling)

optimised for --steps Adam steps: KL to the prompted LM on the scored text (capacity; its tokens are never used)
or the head's own objective on --samples continuations sampled from the prompted LM (fair). G of each, the paired compiled − oracle per
document, and all of it at prompt-token positions and elsewhere.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from common import DEFAULT_RESULTS, environment, parser, write_json

import torch  # noqa: E402

from cgt_viz._checks import check_int  # noqa: E402

HEAD = Path(__file__).resolve().parents[1] / "data" / "models" / "smollm2-bbc-head"


def _args(argv=None):
    p = parser(__doc__)
    p.add_argument("--head", default=str(HEAD), help="a head folder written by train-head (default: the shipped one)")
    p.add_argument("--part", default="test", choices=("val", "test"))
    p.add_argument("--targets", default="capacity,fair", help="comma-separated subset of capacity,fair")
    p.add_argument("--kinds", default="ybar,coeffs,lora",
                   help="comma-separated subset of ybar,coeffs,lora,memory (memory: a head with a token memory)")
    p.add_argument("--prefix", type=int, default=64, help="prompt length p")
    p.add_argument("--suffix", type=int, default=64, help="scored continuation tokens m")
    p.add_argument("--per-topic", type=int, default=4, help="test documents per topic")
    p.add_argument("--draws", type=int, default=1, help="windows per document")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--rank", type=int, default=8, help="rank of the free update (kind lora)")
    p.add_argument("--lora-lr", type=float, default=3e-3, help="Adam's step for the free update's factors")
    p.add_argument("--samples", type=int, default=2, help="sampled continuations per prompt (target fair)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="the tiny random Llama on random windows, seconds")
    p.add_argument("--out", default=str(DEFAULT_RESULTS / "hf_oracle.json"))
    args = p.parse_args(argv)
    from cgt_viz.hf.oracle import HF_ORACLE_KINDS, ORACLE_TARGETS
    for name, allowed in (("targets", ORACLE_TARGETS), ("kinds", HF_ORACLE_KINDS)):
        items = [s for s in getattr(args, name).split(",") if s]
        bad = [s for s in items if s not in allowed]
        if bad or not items:
            p.error(f"--{name} takes a comma-separated subset of {','.join(allowed)}, not {getattr(args, name)!r}")
        setattr(args, name, items)
    for name in ("prefix", "suffix", "per_topic", "draws", "rank", "samples", "batch", "threads"):
        try:
            check_int(name, getattr(args, name), 1)
        except ValueError as err:
            p.error(f"--{name.replace('_', '-')}: {err}")
    if args.steps < 0 or not args.lr > 0 or not args.lora_lr > 0:
        p.error("--steps takes an integer ≥ 0, --lr and --lora-lr a number > 0")
    return args


def _load(args):
    from cgt_viz import hf
    from cgt_viz.hf.tiny import RandomWindows
    if args.smoke:
        torch.manual_seed(args.seed)
        model = hf.CGTLM(hf.tiny_llama(seed=0), y_layer=2, d_y=8, n_head_y=2, n_templates=3, template_rank=2,
                         pooled_only=True, aux_kl=1.0, aux_ce=0.5)
        for p in model.templates.parameters():
            torch.nn.init.normal_(p, 0.0, 0.3)
        return model, RandomWindows(), torch.randn(2, 8), "tiny random Llama"
    head = Path(args.head)
    lm, tok = hf.smollm2()
    model = hf.CGTLM.from_pretrained(head, lm)
    settings = json.loads((head / "metrics.json").read_text())["settings"]
    task = hf.BBCTokens.for_head(tok, settings)
    means = torch.tensor(json.loads((head / "topic_means.json").read_text())["ybar"])
    try:                          # the results file is shipped: a head inside the repository by its path from the root
        name = str(head.resolve().relative_to(HEAD.parents[2]))
    except ValueError:
        name = str(head)
    return model, task, means, name


def main(argv=None) -> dict:
    args = _args(argv)
    torch.set_num_threads(args.threads)
    from cgt_viz.hf.oracle import oracle_comparison
    model, task, means, name = _load(args)
    res = {"head": name, "smoke": args.smoke, "part": args.part,
           "settings": {k: v for k, v in vars(args).items() if k not in ("out", "head")},
           "environment": environment(torch.device("cpu")), "targets": {}}
    for target in args.targets:
        t0 = time.perf_counter()
        one = oracle_comparison(model, task, args.part, args.prefix, args.suffix, args.draws, args.per_topic, means,
                                kinds=args.kinds, target=target, steps=args.steps, lr=args.lr, rank=args.rank,
                                samples=args.samples, batch_size=args.batch, seed=args.seed, lora_lr=args.lora_lr)
        one["seconds"] = time.perf_counter() - t0
        res["targets"][target] = one
        line = ", ".join(f"{k} {one[f'G_oracle_{k}']['value']:.3f}" for k in args.kinds)
        print(f"{target}: G head {one['G']['value']:.3f}, oracle {line} ({one['seconds']:.0f} s)", flush=True)
    write_json(Path(args.out), res)
    return res


if __name__ == "__main__":
    main()
