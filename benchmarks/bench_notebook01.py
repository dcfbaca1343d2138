"""Notebook 01 at its defaults, timed as a user runs it: quiet, and beside a second CPU-bound job.

The notebook is executed top to bottom by nbclient (the same kernel a user gets), at its parameters cell's
defaults (`CGT_FAST` unset), once per condition:

  quiet        nothing else of ours running
  second-job   a second process busy on one core for the whole run (a one-thread float32 matmul loop, the
               load of another training job on the 2-core development machine)

Per condition the JSON holds the total wall time, each code cell's time (from nbclient's execution
timestamps) and the notebook's own results table: prompted, compiled and no-context accuracy and the gap
closed G per k, read from the kernel right after the evaluation cell. The notebook's teaching claim is
G ≥ 0.9 at k = 8 on held-out queries; the time goal is 5 minutes on the 2-core development machine. This is
a benchmark: nothing here is asserted.

    python benchmarks/bench_notebook01.py                           # both conditions (~10 min on 2 cores)
    python benchmarks/bench_notebook01.py --conditions quiet --steps 200   # a shorter look
"""
from __future__ import annotations

import copy
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common import REPO_ROOT, DEFAULT_RESULTS, environment, parser, write_json

import torch

NOTEBOOK = REPO_ROOT / "notebooks" / "01_synthetic_icl.ipynb"
CONDITIONS = ("quiet", "second-job")
RESULT_MARK = "BENCH_NOTEBOOK01_ROWS="
# the cell that holds the results table; the benchmark reads `rows` right after it
EVALUATION_CELL = "evaluate_specialization(model, task"
SECOND_JOB = ("import torch\ntorch.set_num_threads(1)\na = torch.randn(384, 384)\n"
              "while True:\n    a = torch.tanh(a @ a / 20.0)\n")


def cell_seconds(cell: dict) -> float | None:
    """Wall seconds of one executed code cell, from nbclient's timing metadata."""
    timing = cell.get("metadata", {}).get("execution", {})
    start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
    if not (start and end):
        return None
    parse = lambda s: dt.datetime.fromisoformat(s.replace("Z", "+00:00"))   # noqa: E731
    return (parse(end) - parse(start)).total_seconds()


def with_probes(nb, steps: int | None):
    """A copy of the notebook with a cell printing the results table after the evaluation cell (and, for a
    shorter look, STEPS overridden right after the cell that sets it). Returns it and the probe cell's index."""
    import nbformat

    nb = copy.deepcopy(nb)
    cells = nb.cells
    code = nbformat.v4.new_code_cell
    where = [i for i, c in enumerate(cells) if c.cell_type == "code" and EVALUATION_CELL in c.source]
    if len(where) != 1:
        raise SystemExit(f"bench_notebook01: expected one cell with {EVALUATION_CELL!r} in {NOTEBOOK}, "
                         f"found {len(where)}")
    probe = where[0] + 1
    cells.insert(probe, code(f"import json as _json\nprint({RESULT_MARK!r} + _json.dumps(rows))"))
    if steps is not None:
        params = next((i for i, c in enumerate(cells) if c.cell_type == "code" and "STEPS =" in c.source), None)
        if params is None:
            raise SystemExit("bench_notebook01: --steps needs a parameters cell that sets STEPS")
        cells.insert(params + 1, code(f"STEPS = {steps}"))
        probe += params + 1 <= probe
    return nb, probe


def run_once(nb_path: Path, steps: int | None, timeout: int) -> dict:
    import nbformat
    from nbclient import NotebookClient

    nb, probe = with_probes(nbformat.read(nb_path, as_version=4), steps)
    env_before = os.environ.pop("CGT_FAST", None)
    t0 = time.perf_counter()
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(nb_path.parent)}}).execute()
    finally:
        if env_before is not None:
            os.environ["CGT_FAST"] = env_before
    total = time.perf_counter() - t0
    text = "".join(o.get("text", "") for o in nb.cells[probe].outputs)
    rows = json.loads(text.split(RESULT_MARK, 1)[1].strip())
    cells = []
    for i, c in enumerate(nb.cells):
        if c.cell_type == "code" and i != probe:
            first = next((ln for ln in c.source.splitlines() if ln.strip() and not ln.startswith("#")), "")
            cells.append({"cell": i, "first_line": first[:80], "seconds": cell_seconds(c)})
    slow = sorted((c for c in cells if c["seconds"] is not None), key=lambda c: -c["seconds"])[:5]
    table = [{k: r.get(k) for k in ("k", "acc_prompted", "acc_specialized", "acc_no_context", "acc_baseline",
                                    "gap_closed", "gap_closed_acc")} for r in rows]
    g8 = next((r["gap_closed"] for r in rows if r["k"] == 8), None)
    return {"total_s": round(total, 1), "G_k8": g8, "results": table, "slowest_cells": slow, "cells": cells}


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--conditions", default=",".join(CONDITIONS),
                   help=f"comma-separated, from {', '.join(CONDITIONS)} (default: both)")
    p.add_argument("--steps", type=int, default=None, help="override the notebook's STEPS (default: its own)")
    p.add_argument("--timeout", type=int, default=1800, help="per-cell timeout in seconds (default 1800)")
    p.add_argument("--out", type=Path, default=DEFAULT_RESULTS / "notebook01.json")
    args = p.parse_args()
    conditions = [c.strip() for c in args.conditions.split(",") if c.strip()]
    bad = [c for c in conditions if c not in CONDITIONS]
    if bad or not conditions:
        p.error(f"--conditions must be a comma-separated list from {', '.join(CONDITIONS)}, got {args.conditions!r}")
    if args.steps is not None and args.steps < 1:
        p.error(f"--steps must be at least 1, got {args.steps}")
    out = {"command": "python benchmarks/" + " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
           "notebook": str(NOTEBOOK.relative_to(REPO_ROOT)), "steps_override": args.steps,
           "environment": environment(torch.device("cpu")), "conditions": {}}
    for cond in conditions:
        job = None
        if cond == "second-job":
            job = subprocess.Popen([sys.executable, "-c", SECOND_JOB], env={**os.environ, "OMP_NUM_THREADS": "1"})
        try:
            result = run_once(NOTEBOOK, args.steps, args.timeout)
        finally:
            if job is not None:
                job.kill()
                job.wait()
        out["conditions"][cond] = result
        print(f"{cond}: {result['total_s'] / 60:.1f} min, G at k=8 {result['G_k8']:.3f}; slowest cells: "
              + "; ".join(f"{c['first_line'][:40]!r} {c['seconds']:.0f} s" for c in result["slowest_cells"][:3]),
              flush=True)
    write_json(args.out, out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
