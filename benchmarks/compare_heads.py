"""Two SmolLM2 heads on the same windows, paired: does a new head beat the shipped one per document?

    python benchmarks/compare_heads.py --new runs/memory-head                   # against the shipped head
    python benchmarks/compare_heads.py --new A --base B --part val --prompts 64

Both heads must have been trained on the same task settings (their metrics.json 'settings' give the task):
the windows are `compile_comparison`'s for the new head's settings, and both heads are scored on each of them.
It writes under "paired" in --out (the new head's run record, its other keys kept): per prompt length, for
each head, the summary `compile_comparison` gives, and the paired new − base differences per document with 95 % bootstrap intervals: of the compiled loss, of own − topic mean and own −
other document, and of G (a ratio of means, so the difference of the two G over each resample of documents).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, write_json  # noqa: E402

from cgt_viz.hf import CGTLM  # noqa: E402
from cgt_viz.hf.data import BBCTokens  # noqa: E402
from cgt_viz.hf.measure import (by_position, document_interval, prompt_token_positions,  # noqa: E402
                                summarize_comparison, window_losses)
from cgt_viz.hf.source import smollm2  # noqa: E402

SHIPPED = ROOT / "data" / "models" / "smollm2-bbc-head"


def load_head(folder: Path, lm):
    settings = json.loads((folder / "metrics.json").read_text())["settings"]
    means = torch.tensor(json.loads((folder / "topic_means.json").read_text())["ybar"])
    return CGTLM.from_pretrained(folder, lm).eval(), settings, means


def paired_g(new: dict, base: dict, docs: torch.Tensor, n_boot: int = 2000, seed: int = 0) -> dict:
    """G_new − G_base with a 95 % interval over resamples of documents; new, base: {condition: (n,) losses}."""
    uniq = torch.unique(docs)
    per_doc = {(tag, c): np.array([float(v[docs == d].mean()) for d in uniq])
               for tag, losses in (("new", new), ("base", base)) for c, v in losses.items()}

    def g(tag, idx):
        nc, pr, co = (per_doc[(tag, c)][idx].mean() for c in ("no_context", "prompted", "compiled"))
        return (nc - co) / (nc - pr)

    boots = np.random.default_rng(seed).integers(0, len(uniq), size=(n_boot, len(uniq)))
    draws = np.array([g("new", b) - g("base", b) for b in boots])
    all_docs = np.arange(len(uniq))
    lo, hi = np.percentile(draws, [2.5, 97.5])
    return {"value": float(g("new", all_docs) - g("base", all_docs)), "ci95": [float(lo), float(hi)]}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--new", required=True, help="the new head's folder (written by train-head)")
    ap.add_argument("--base", default=str(SHIPPED), help="default: the shipped head")
    ap.add_argument("--part", default="test", choices=("val", "test"))
    ap.add_argument("--prompts", type=int, nargs="+", default=None, help="default: the new head's eval_prompts")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "smollm2_head_memory.json"),
                    help="the new head's run record (train-head --results): the comparison goes under its 'paired'")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    lm, tok = smollm2()
    new, settings, new_means = load_head(Path(args.new), lm)
    base, base_settings, base_means = load_head(Path(args.base), lm)
    for key in ("prefix", "suffix", "val_fraction", "test_fraction", "eval_draws", "eval_per_topic", "seed"):
        if settings.get(key) != base_settings.get(key):
            raise SystemExit(f"the heads were measured on other windows: {key} is {settings.get(key)!r} for --new "
                             f"and {base_settings.get(key)!r} for --base")
    task = BBCTokens.for_head(tok, settings)
    result = {"new": str(args.new), "base": str(args.base), "part": args.part, "settings": settings,
              "environment": environment(torch.device("cpu")), "argv": sys.argv[1:] if argv is None else list(argv)}
    for p in args.prompts or settings["eval_prompts"]:
        tokens, topics, docs = task.document_windows(p + settings["suffix"] + 1, args.part,
                                                     per_doc=settings["eval_draws"],
                                                     per_topic=settings["eval_per_topic"], seed=settings["seed"] + p)
        losses = {tag: window_losses(model, tokens, p, topics, docs, means, 8, settings["seed"], per_position=True)
                  for tag, model, means in (("new", new, new_means), ("base", base, base_means))}
        mean = {tag: {c: v.mean(1) for c, v in lo.items()} for tag, lo in losses.items()}
        prompt_tokens = prompt_token_positions(tokens, p)
        res = {tag: {**summarize_comparison(mean[tag], docs, seed=settings["seed"]),
                     "by_position": by_position(losses[tag], prompt_tokens, docs, seed=settings["seed"])}
               for tag in ("new", "base")}
        diff = lambda f: document_interval(f(mean["new"]) - f(mean["base"]), docs, seed=settings["seed"])  # noqa: E731
        res["new_minus_base"] = {
            "compiled": diff(lambda m: m["compiled"]),
            "own_minus_topic_mean": diff(lambda m: m["compiled"] - m["topic_mean"]),
            "own_minus_other": diff(lambda m: m["compiled"] - m["other_doc"]),
            "G": paired_g(mean["new"], mean["base"], docs, seed=settings["seed"]),
        }
        result[f"p={p}"] = res
        d = res["new_minus_base"]
        print(f"p={p}: G {res['new']['G']['value']:.3f} vs {res['base']['G']['value']:.3f} "
              f"(new − base {d['G']['value']:+.3f} [{d['G']['ci95'][0]:+.3f}, {d['G']['ci95'][1]:+.3f}]); "
              f"own − topic mean {res['new']['own_minus_topic_mean']['value']:+.3f} vs "
              f"{res['base']['own_minus_topic_mean']['value']:+.3f} (new − base "
              f"{d['own_minus_topic_mean']['value']:+.3f} [{d['own_minus_topic_mean']['ci95'][0]:+.3f}, "
              f"{d['own_minus_topic_mean']['ci95'][1]:+.3f}])", flush=True)
    result["seconds"] = time.perf_counter() - t0
    out = Path(args.out)   # the head's run record (its command, speeds) keeps its other keys: this is its "paired"
    record = json.loads(out.read_text()) if out.exists() else {}
    write_json(out, {**record, "paired": result})
    return result


if __name__ == "__main__":
    main()
