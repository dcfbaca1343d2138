"""Train and measure a shipped artefact by its name: one entry point for every model under data/models/.

    python benchmarks/ship.py --list                               # the artefacts, their commands and folders
    python benchmarks/ship.py text-bbc5                            # train it again as it was trained, and measure
    python benchmarks/ship.py smollm2-bbc-head --measure-only      # re-measure the shipped one
    python benchmarks/ship.py smollm2-bbc-memory-head --out /tmp/mem   # retrain into another folder
    python benchmarks/ship.py smollm2-bbc-head --resume            # continue an interrupted run
    python benchmarks/ship.py smollm2-bbc-memory-head --out runs/mem --from-scratch
                                  # what it starts from first (runs/mem-base), then it: the whole chain, resumable

Each artefact's trainer and the exact flags it was trained with are declared once, in SHIPPED; flags given
after the name are added after them (a later flag wins, so `--out` or `--steps` override). The from-scratch text
model trains through `benchmarks/train_text_reference.py` (cgt_viz.train.train on BBC excerpts, then its
measurements); a head over SmolLM2 through `python -m cgt_viz train-head` (cgt_viz.hf.head_run: the feature
cache, cgt_viz.train.train with a CachedHeadStep, then compile_comparison on test documents). Both write their
weights, config and metrics.json into the artefact's folder. A folder under data/models/ without an entry here
fails tests/project/test_ship.py: nothing ships without the command that makes it.

An artefact that starts from another (`needs`: the head with a token memory starts from the shipped head's read-out
and templates, its `--init-from`) trains from the shipped folder of that other one; `--from-scratch` trains the
other one first into OUT-base with its own entry's flags (or takes the finished run already there: a rerun of
the chain resumes it) and starts from that. The cost of each link is what its own results JSON records
(cache_seconds, the training minutes or steps, the measurement).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


@dataclass(frozen=True)
class Shipped:
    trainer: str                 # "text" (train_text_reference.main) or "head" (cgt_viz.hf.head_run.main)
    flags: tuple[str, ...]       # what it was trained with, beyond the trainer's defaults
    about: str
    needs: str | None = None     # the artefact it starts from (--init-from its folder), trained first by --from-scratch

    def argv(self, name: str, extra: list[str]) -> list[str]:
        return ["--out", str(ROOT / "data" / "models" / name), *self.flags, *extra]


SHIPPED: dict[str, Shipped] = {
    "text-bbc5": Shipped(
        "text", ("--steps", "6000", "--lr", "3e-3", "--threads", "2", "--knn-every", "1000"),
        "the reference from-scratch text CGT on BBC News (5 topics); about an hour on 2 CPU cores"),
    "smollm2-bbc-head": Shipped(
        "head", ("--results", str(ROOT / "benchmarks" / "results" / "smollm2_head.json"), "--threads", "1"),
        "the CGT head over SmolLM2-135M-Instruct, by context distillation (the default head of notebook 05)"),
    "smollm2-bbc-memory-head": Shipped(
        "head", ("--results", str(ROOT / "benchmarks" / "results" / "smollm2_head_memory.json"), "--threads", "1",
                 "--memory-layers", "4", "--memory-rank", "64",
                 "--init-from", str(ROOT / "data" / "models" / "smollm2-bbc-head"),
                 "--per-doc", "1", "--train-per-topic", "240", "--steps", "150", "--no-progress"),
        "the head above with a token memory at its top four layers, trained on from it (needs it first)",
        needs="smollm2-bbc-head"),
}


def trainer(kind: str):
    """The main(argv) of a trainer kind."""
    if kind == "text":
        import train_text_reference
        return train_text_reference.main
    from cgt_viz.hf.head_run import main
    return main


def listing() -> str:
    lines = []
    for name, item in SHIPPED.items():
        command = "python benchmarks/ship.py " + name
        lines.append(f"{name}\n  {item.about}\n  {command}\n  = {item.trainer} trainer with "
                     f"{' '.join(a.replace(str(ROOT) + '/', '') for a in item.argv(name, []))}")
        if item.needs:
            lines.append(f"  starts from {item.needs}; with --out OUT --from-scratch it trains that first into OUT-base")
    return "\n".join(lines)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python benchmarks/ship.py", description=__doc__.splitlines()[0])
    parser.add_argument("name", nargs="?", choices=sorted(SHIPPED), help="the artefact (its folder under data/models)")
    parser.add_argument("--list", action="store_true", help="list the artefacts and the commands that make them")
    parser.add_argument("--from-scratch", action="store_true",
                        help="train the artefact it starts from first, into OUT-base (needs --out OUT)")
    args, extra = parser.parse_known_args(argv)
    if args.list or args.name is None:
        print(listing())
        return 0
    item = SHIPPED[args.name]
    if args.from_scratch:
        extra = chain_first(args.name, item, extra)
    result = trainer(item.trainer)(item.argv(args.name, extra))
    return result if isinstance(result, int) else 0


def _out_of(extra: list[str]) -> str | None:
    """The last --out among the extra flags (a later flag wins, as argparse reads them), or None."""
    out = None
    for i, flag in enumerate(extra):
        if flag == "--out" and i + 1 < len(extra):
            out = extra[i + 1]
        elif flag.startswith("--out="):
            out = flag.split("=", 1)[1]
    return out


def chain_first(name: str, item: Shipped, extra: list[str]) -> list[str]:
    """--from-scratch: train what `name` starts from into OUT-base (resuming a run there), then return the extra
    flags that make `name` start from it."""
    if item.needs is None:
        raise SystemExit(f"ship.py: --from-scratch: {name} starts from nothing else; train it without the flag")
    out = _out_of(extra)
    if out is None:
        raise SystemExit(f"ship.py: --from-scratch needs --out OUT (its base goes to OUT-base; the shipped "
                         f"data/models/{item.needs} is never overwritten by a chain)")
    base = Path(str(out).rstrip("/") + "-base")
    first = SHIPPED[item.needs]
    shared = []                   # where it runs and how it reports: the same for both links
    for i, flag in enumerate(extra):
        if flag in ("--threads", "--device") and i + 1 < len(extra):
            shared += [flag, extra[i + 1]]
        elif flag == "--no-progress":
            shared.append(flag)
    resume = ["--resume"] if (base / "ckpt").exists() or (base / "model.safetensors").exists() else []
    print(f"ship.py: {name} starts from {item.needs}: training that first into {base}", flush=True)
    # a chain's speeds go beside its runs: the shipped results JSON describes the shipped folders only
    done = trainer(first.trainer)(first.argv(item.needs, ["--out", str(base), "--results",
                                                          str(base / "speeds.json"), *shared, *resume]))
    if isinstance(done, int) and done != 0:
        raise SystemExit(done)
    return [*extra, "--init-from", str(base), "--results", str(Path(out) / "speeds.json")]


if __name__ == "__main__":
    sys.exit(main())
