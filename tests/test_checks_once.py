"""`explore(model, data)` checks the model and its inputs once per call (issue 24, item 3): the public door
checks, the private passes behind it do not check again. Counted by wrapping the contracts."""
from __future__ import annotations

import pytest
import torch

import cgt_viz.analysis as A
import cgt_viz.contracts as C
import cgt_viz.widgets as W
from cgt_viz import CGT, CGTConfig


@pytest.fixture(scope="module")
def model():
    cfg = CGTConfig(vocab_size=16, block_size=12, n_layer=3, d_x=16, n_head=2, d_y=8, n_head_y=1, y_layer=1,
                    n_templates=2)
    return CGT(cfg).eval()


@pytest.fixture
def calls(monkeypatch):
    """{contract: calls}: the model check (`Model` in a declaration) and `check_inputs` wherever it is imported."""
    counts = {"model": 0, "inputs": 0}
    model_check, check_inputs = C.Model.check, C.check_inputs

    def counting_model(self, name, value, args=None):
        counts["model"] += 1
        return model_check(self, name, value, args)

    def counting_inputs(*args, **kwargs):
        counts["inputs"] += 1
        return check_inputs(*args, **kwargs)

    monkeypatch.setattr(C.Model, "check", counting_model)
    import importlib
    for mod in ("cgt_viz.contracts", "cgt_viz.sequences", "cgt_viz.analysis", "cgt_viz.model",
                "cgt_viz.generation", "cgt_viz.widgets.explorer", "cgt_viz.hf.model"):
        m = importlib.import_module(mod)
        if hasattr(m, "check_inputs"):
            monkeypatch.setattr(m, "check_inputs", counting_inputs)
    return counts


def test_explore_checks_the_model_and_the_data_once(model, calls):
    data = torch.randint(0, 16, (40, 10), generator=torch.Generator().manual_seed(0))
    ex = W.explore(model, data, background=None)
    ex.wait()
    assert calls == {"model": 1, "inputs": 1}
    assert ex.ybar_full.shape == (40, 10, 8)     # and the work behind the door was done


def test_explore_of_strings_checks_once(model, calls):
    big = CGT(model.config.replace(vocab_size=256)).eval()
    calls.update(model=0, inputs=0)
    W.explore(big, ["hello there", "a second"], background=None).wait()
    assert calls == {"model": 1, "inputs": 1}


def test_explore_with_a_preview_checks_once(model, calls, monkeypatch):
    monkeypatch.setattr(W.Explorer, "preview_tokens", 40)   # 400 tokens > 2 × 40: a preview, the rest in a thread
    data = torch.randint(0, 16, (40, 10), generator=torch.Generator().manual_seed(1))
    ex = W.explore(model, data, background=None)
    ex.wait()
    assert calls == {"model": 1, "inputs": 1}


def test_collect_ybar_checks_once_however_many_chunks(model, calls):
    idx = torch.randint(0, 16, (9, 10), generator=torch.Generator().manual_seed(2))
    out = A.collect_ybar(model, idx, batch_size=2)            # 5 chunks
    assert calls == {"model": 1, "inputs": 1}
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(out), model.context(idx).float())


def test_run_with_cache_checks_its_ids_once(model, calls):
    idx = torch.randint(0, 16, (2, 10), generator=torch.Generator().manual_seed(3))
    model.run_with_cache(idx, names="ybar")
    assert calls["inputs"] == 1
