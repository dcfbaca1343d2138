"""Train the shipped CGT head over SmolLM2-135M-Instruct on BBC by context distillation, and measure it.

    python benchmarks/train_smollm2_head.py                      # cache + training + measurement, one command
                                                                 # (remove the shipped head first: one run a folder)
    python benchmarks/train_smollm2_head.py --measure-only       # re-measure the shipped head
    python benchmarks/train_smollm2_head.py --resume             # continue an interrupted run

`python -m cgt_viz train-head` (cgt_viz/hf/head_run.py) with the shipped head's folder and the speeds JSON as
defaults: the head goes to data/models/smollm2-bbc-head/ (config, weights, metrics.json, topic_means.json),
the cache and training speeds to benchmarks/results/smollm2_head.json.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cgt_viz.hf.head_run import main  # noqa: E402

DEFAULTS = ["--out", str(ROOT / "data" / "models" / "smollm2-bbc-head"),
            "--results", str(ROOT / "benchmarks" / "results" / "smollm2_head.json")]

if __name__ == "__main__":
    sys.exit(main(DEFAULTS + sys.argv[1:]))
