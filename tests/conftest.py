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
