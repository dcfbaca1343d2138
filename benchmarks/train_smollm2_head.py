"""Train the shipped CGT head over SmolLM2-135M-Instruct on BBC by context distillation, and measure it.

    python benchmarks/train_smollm2_head.py                      # cache + training + measurement, one command
                                                                 # (remove the shipped head first: one run a folder)
    python benchmarks/train_smollm2_head.py --measure-only       # re-measure the shipped head
    python benchmarks/train_smollm2_head.py --resume             # continue an interrupted run

The same as `python benchmarks/ship.py smollm2-bbc-head ...` (benchmarks/ship.py holds every shipped artefact's
command): `python -m cgt_viz train-head` (cgt_viz/hf/head_run.py) into data/models/smollm2-bbc-head/ (config,
weights, metrics.json, topic_means.json), the cache and training speeds into benchmarks/results/smollm2_head.json.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ship import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["smollm2-bbc-head", *sys.argv[1:]]))
