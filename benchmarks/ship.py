"""Train and measure a shipped artefact by its name: one entry point for every model under data/models/.

    python benchmarks/ship.py --list                               # the artefacts, their commands and folders
    python benchmarks/ship.py text-bbc5                            # train it again as it was trained, and measure
    python benchmarks/ship.py smollm2-bbc-head --measure-only      # re-measure the shipped one
    python benchmarks/ship.py smollm2-bbc-memory-head --out /tmp/mem   # retrain into another folder
    python benchmarks/ship.py smollm2-bbc-head --resume            # continue an interrupted run

Each artefact's trainer and the exact flags it was trained with are declared once, in SHIPPED; flags given
after the name are added after them (a later flag wins, so `--out` or `--steps` override). The from-scratch text
model trains through `benchmarks/train_text_reference.py` (cgt_viz.train.train on BBC excerpts, then its
measurements); a head over SmolLM2 through `python -m cgt_viz train-head` (cgt_viz.hf.head_run: the feature
cache, cgt_viz.train.train with a CachedHeadStep, then compile_comparison on test documents). Both write their
weights, config and metrics.json into the artefact's folder. A folder under data/models/ without an entry here
fails tests/test_benchmarks.py: nothing ships without the command that makes it.
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
        "the head above with a token memory at its top four layers, trained on from it (needs it first)"),
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
    return "\n".join(lines)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python benchmarks/ship.py", description=__doc__.splitlines()[0])
    parser.add_argument("name", nargs="?", choices=sorted(SHIPPED), help="the artefact (its folder under data/models)")
    parser.add_argument("--list", action="store_true", help="list the artefacts and the commands that make them")
    args, extra = parser.parse_known_args(argv)
    if args.list or args.name is None:
        print(listing())
        return 0
    item = SHIPPED[args.name]
    result = trainer(item.trainer)(item.argv(args.name, extra))
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
