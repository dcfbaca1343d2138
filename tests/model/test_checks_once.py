"""`explore(model, data)` checks the model and its inputs once per call (issue 24, item 3): the public door
checks, the private passes behind it do not check again. Counted by wrapping the contracts."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import cgt_viz.analysis as A
import cgt_viz.contracts as C
import cgt_viz.widgets as W
from cgt_viz import CGT, CGTConfig
from cgt_viz._checks import checked


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
                "cgt_viz.generation", "cgt_viz.widgets.explorer", "cgt_viz.widgets._base", "cgt_viz.widgets.compare",
                "cgt_viz.hf.model"):
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


def _rows(seed: int, n: int = 3, t: int = 10) -> torch.Tensor:
    return torch.randint(0, 16, (n, t), generator=torch.Generator().manual_seed(seed))


def test_template_ablation_checks_once_however_many_templates(model, calls):
    torch.manual_seed(0)
    moved = CGT(model.config).eval()
    with torch.no_grad():                     # templates away from their identity start: ablating one changes the loss
        for p in moved.templates.parameters():
            p.normal_(0.0, 0.5)
    idx = _rows(4)
    calls.update(model=0, inputs=0)
    out = A.template_ablation(moved, idx, idx, "2.attn_in")       # a base pass and one per template (K = 2)
    assert calls == {"model": 1, "inputs": 1}

    def loss(ablate=None):                                        # the same numbers from the checked public pass
        with torch.no_grad():
            logits = moved(idx, ablate=ablate)
        return float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx.flatten()))
    want = [loss({"2.attn_in": [k]}) - loss() for k in range(2)]
    np.testing.assert_allclose(out["delta"], want, rtol=1e-4, atol=1e-6)
    assert np.abs(out["delta"]).max() > 1e-4


def test_compare_losses_checks_once_for_every_mode(model, calls):
    idx = _rows(5)
    out = A.compare_losses(model, idx, idx, 4)                   # prompted, specialized, no context
    assert calls == {"model": 1, "inputs": 1}
    with torch.no_grad():                                        # the same numbers as the checked public passes
        prompted = torch.nn.functional.cross_entropy(model(idx)[:, 4:].transpose(1, 2), idx[:, 4:], reduction="none")
    np.testing.assert_allclose(out["prompted"], prompted.mean(0).numpy(), rtol=1e-5)


@pytest.mark.parametrize("view", ["SmoothnessStrip", "TemplateInspector", "CompileCompare"])
def test_a_view_checks_the_model_and_the_data_once(model, calls, view):
    getattr(W, view)(model, _rows(6), split=4) if view == "CompileCompare" else getattr(W, view)(model, _rows(6))
    assert calls == {"model": 1, "inputs": 1}


@pytest.mark.parametrize("view", ["SmoothnessStrip", "TemplateInspector", "CompileCompare"])
def test_a_view_of_prepared_sequences_checks_their_ids_once(model, calls, view):
    seqs = A.prepare_sequences(model, _rows(7))
    calls.update(model=0, inputs=0)
    getattr(W, view)(model, seqs)
    assert calls == {"model": 1, "inputs": 1}


def test_the_strip_with_a_second_model_checks_each_model_once(model, calls):
    other = CGT(model.config).eval()
    with torch.no_grad():                                  # another model's weights, whatever the seed
        for p in other.parameters():
            p.add_(0.1 * torch.randn_like(p))
    idx = _rows(8)
    calls.update(model=0, inputs=0)
    strip = W.SmoothnessStrip(model, idx, other=other)
    assert calls == {"model": 2, "inputs": 1}
    with torch.no_grad():                                  # each model's own ȳ, collected behind the door
        np.testing.assert_allclose(strip.ybar_other, other.context(idx).numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(strip.ybar, model.context(idx).numpy(), rtol=1e-5, atol=1e-6)


def test_moving_the_compare_slider_checks_nothing_again(model, calls):
    cmp = W.CompileCompare(model, _rows(9), split=4)
    calls.update(model=0, inputs=0)
    for split in (2, 3, 5):
        cmp.show(split=split)
    assert calls == {"model": 0, "inputs": 0} and len(cmp._cache) == 4


def test_the_strip_refuses_a_second_model_too_short_for_the_data(model):
    """Its ȳ is collected unchecked behind the door, so the door compares it with the data: a block shorter
    than the rows is refused there, naming what differs (before any ȳ is collected)."""
    short = CGT(model.config.replace(block_size=8)).eval()
    with pytest.raises(ValueError, match=r"other must read the same inputs as model .*block_size 8"):
        W.SmoothnessStrip(model, _rows(10), other=short)


# ------------------------------------------------------------------ a checked call inside another checks nothing again
@checked(model=C.Model(), idx=C.Inputs("model"))
def _inner(model, idx):
    return idx


@checked(model=C.Model(), idx=C.Inputs("model"))
def _outer(model, idx):
    return _inner(model, idx.int())        # int32 ids: the nested call must still convert them to long


@checked(skip_nested=False, model=C.Model(), idx=C.Inputs("model"))
def _outer_of_user_data(model, idx):
    return _inner(model, idx)


def test_a_checked_call_inside_another_only_converts(model, calls):
    out = _outer(model, _rows(11))
    assert calls == {"model": 1, "inputs": 1}                  # the outer call's checks; none in the nested one
    assert out.dtype == torch.long and torch.equal(out, _rows(11))


def test_a_checked_function_called_by_the_user_still_checks(model, calls):
    _outer(model, _rows(12))
    calls.update(model=0, inputs=0)
    _inner(model, _rows(12))                                   # after the outer call the flag is down again
    assert calls == {"model": 1, "inputs": 1}
    with pytest.raises(ValueError, match="idx must hold token ids in 0..vocab_size-1"):
        _inner(model, torch.full((2, 4), 16))


def test_a_failing_body_lowers_the_flag(model, calls):
    @checked(model=C.Model())
    def failing(model):
        raise RuntimeError("the body fails")

    with pytest.raises(RuntimeError, match="the body fails"):
        failing(model)
    calls.update(model=0, inputs=0)
    _inner(model, _rows(13))
    assert calls == {"model": 1, "inputs": 1}


def test_a_body_that_passes_on_user_data_has_it_checked_again(model, calls):
    _outer_of_user_data(model, _rows(14))
    assert calls == {"model": 2, "inputs": 2}


def test_specialize_checks_its_prompt_once_and_each_merge_nothing_again(model, calls, monkeypatch):
    """specialize calls merged_gpt (and it lora_factors) once per prompt: both declare ybar_vec, which the
    library computed itself, so only the user's prompt is checked (each summary's finiteness check is a host
    sync on a GPU)."""
    summary_checks = []
    summary_check = C.Summary.check
    monkeypatch.setattr(C.Summary, "check", lambda self, *a, **k: summary_checks.append(1) or summary_check(self, *a, **k))
    models = model.specialize(_rows(15, n=2))
    assert len(models) == 2 and calls["inputs"] == 1 and summary_checks == []
    model.merged_gpt(torch.zeros(8))                          # called by the user: checked
    assert summary_checks == [1]


def test_a_nested_call_still_refuses_what_it_can_see_without_a_host_sync(model, calls):
    """Library code that builds a batch too long for the model (a user's PromptCase, say) still gets the door's
    message: a nested call skips only the look at the values (token range, finiteness), not the shapes."""
    too_long = torch.zeros(2, 13, dtype=torch.long)

    @checked(model=C.Model())
    def outer(model):
        return model(too_long)

    with pytest.raises(ValueError, match=r"idx must have at most block_size = 12 positions, got 13 positions"):
        outer(model)
    assert calls["inputs"] == 0
