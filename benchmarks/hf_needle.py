"""The needle probe on the shipped SmolLM2 heads: can a compiled prompt recall a word only its document holds?

    python benchmarks/hf_needle.py                          # both shipped heads, test part, p = 64
    python benchmarks/hf_needle.py --limit 20 --out /tmp/n.json

Windows (`hf.needle.needle_windows`, the heads' task and test part): a proper noun of the 64-token prompt that the
64-token continuation names again, renamed in the whole window to an invented word absent from the corpus (as many
tokens, at least 2). Scored at the continuation's first mention of it: its first token ("first", what must be
recalled) and all its tokens ("all"). Per head (`needle_losses`, `summarize_needles`): G there, the prompted LM's
gain (no context − prompted), own − topic mean, each condition's loss, with 95 % intervals over documents; the
paired memory − base differences per document; and, with --original, the same positions with the real word
(what the topic already tells). Writes --out (benchmarks/results/needle_smollm2.json) with the settings and the
command.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, write_json  # noqa: E402
from compare_heads import SHIPPED, load_head, paired_g  # noqa: E402

from cgt_viz.hf.data import BBCTokens  # noqa: E402
from cgt_viz.hf.measure import document_interval  # noqa: E402
from cgt_viz.hf.needle import MASKS, needle_losses, needle_windows, summarize_needles  # noqa: E402
from cgt_viz.hf.source import smollm2  # noqa: E402

MEMORY = ROOT / "data" / "models" / "smollm2-bbc-memory-head"


def _shown(value):
    """A path inside the repository as it is written from its root (the results file is shipped)."""
    try:
        return str(Path(value).resolve().relative_to(ROOT)) if isinstance(value, str) and "/" in value else value
    except ValueError:
        return value


def subset(needles, keep: int):
    """The first `keep` windows of needles (windows come topic by topic: --limit takes from each topic in turn)."""
    order = sorted(range(len(needles)), key=lambda i: (sum(needles.topics[:i] == needles.topics[i]), i))[:keep]
    idx = torch.tensor(sorted(order))
    return type(needles)(needles.tokens[idx], needles.original[idx], needles.topics[idx], needles.docs[idx],
                         needles.first[idx], needles.all[idx], needles.prefix_len,
                         [needles.words[i] for i in idx.tolist()])


def fmt(r: dict) -> str:
    return f"{r['value']:+.3f} [{r['ci95'][0]:+.3f}, {r['ci95'][1]:+.3f}]"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default=str(SHIPPED))
    ap.add_argument("--memory", default=str(MEMORY))
    ap.add_argument("--part", default="test", choices=("val", "test"))
    ap.add_argument("--prompt", type=int, default=None, help="default: the heads' training prefix")
    ap.add_argument("--per-doc", type=int, default=1)
    ap.add_argument("--tries", type=int, default=64)
    ap.add_argument("--min-tokens", type=int, default=2)
    ap.add_argument("--limit", type=int, default=None, help="measure at most this many windows (topics in turn)")
    ap.add_argument("--original", action="store_true", help="also score the real word at the same positions")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "needle_smollm2.json"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    lm, tok = smollm2()
    heads = {tag: load_head(Path(folder), lm) for tag, folder in (("base", args.base), ("memory", args.memory))}
    settings = heads["base"][1]
    for key in ("prefix", "suffix", "val_fraction", "test_fraction"):
        if settings.get(key) != heads["memory"][1].get(key):
            raise SystemExit(f"the heads were trained on other tasks: {key} differs")
    task = BBCTokens.for_head(tok, settings)
    p, m = args.prompt or settings["prefix"], settings["suffix"]
    needles = needle_windows(task, args.part, p, m, per_doc=args.per_doc, tries=args.tries,
                             min_tokens=args.min_tokens, seed=args.seed)
    found = len(needles)
    if args.limit is not None:
        needles = subset(needles, args.limit)
    t_windows = time.perf_counter() - t0
    print(f"{found} needle windows found, {len(needles)} measured from {len(torch.unique(needles.docs))} documents "
          f"({t_windows:.0f} s)", flush=True)
    docs, seed = needles.docs, args.seed
    result = {"command": "python benchmarks/hf_needle.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "settings": {**{k: _shown(v) for k, v in vars(args).items()}, "prompt": p, "suffix": m,
                           "head_settings": settings},
              "environment": environment(torch.device("cpu")), "n_found": found, "n_windows": len(needles),
              "n_documents": int(len(torch.unique(docs))), "words": [list(w) for w in needles.words],
              "needle_tokens_mean": float(needles.all.sum(1).float().mean())}
    losses = {}
    for tag, (model, _, means) in heads.items():
        t = time.perf_counter()
        losses[tag] = needle_losses(model, needles, means, seed=seed)
        result[tag] = summarize_needles(losses[tag], docs, seed=seed)
        if args.original:
            result[tag]["original"] = summarize_needles(needle_losses(model, needles, means, seed=seed, original=True),
                                                        docs, seed=seed)
        result[tag]["seconds"] = time.perf_counter() - t
        r = result[tag]["first"]
        print(f"{tag}: first token G {fmt(r['G'])}, prompted gain {fmt(r['prompted_gain'])} nats, own − topic mean "
              f"{fmt(r['own_minus_topic_mean'])} ({result[tag]['seconds']:.0f} s)", flush=True)
    diff = {}
    for kind in MASKS:
        new, base = losses["memory"][kind], losses["base"][kind]
        d = lambda f: document_interval(f(new) - f(base), docs, seed=seed)  # noqa: E731
        diff[kind] = {"compiled": d(lambda x: x["compiled"]),
                      "own_minus_topic_mean": d(lambda x: x["compiled"] - x["topic_mean"]),
                      "G": paired_g(new, base, docs, seed=seed)}
    result["memory_minus_base"] = diff
    print(f"memory − base, first token: G {fmt(diff['first']['G'])}, compiled loss {fmt(diff['first']['compiled'])}",
          flush=True)
    result["seconds"] = time.perf_counter() - t0
    write_json(Path(args.out), result)
    return result


if __name__ == "__main__":
    main()
