"""The oracle of a head's update space (cgt_viz.hf.oracle) on a tiny random Llama."""
import pytest
import torch

pytest.importorskip("transformers")
from cgt_viz import hf  # noqa: E402
from cgt_viz.hf import oracle  # noqa: E402
from cgt_viz.hf.measure import window_losses  # noqa: E402
from cgt_viz.hf.tiny import RandomWindows  # noqa: E402
from tests.helpers import randomize_templates  # noqa: E402

PREFIX, M = 6, 8


@pytest.fixture(scope="module")
def head():
    torch.manual_seed(0)
    model = hf.CGTLM(hf.tiny_llama(seed=0), y_layer=2, d_y=8, n_head_y=2, n_templates=3, template_rank=2,
                     pooled_only=True, aux_kl=1.0, aux_ce=0.5)
    return randomize_templates(model)


def _windows(n=5, seed=0):
    return torch.randint(0, 96, (n, PREFIX + M + 1), generator=torch.Generator().manual_seed(seed))


def test_best_of_keeps_each_rows_best_point_and_never_ends_worse_than_its_start():
    start = torch.tensor([[3.0], [-2.0], [0.5]])
    parabola = lambda ps: ((ps[0] - 1.0) ** 2).sum(1)
    # a large lr makes Adam overshoot, so the last point is not always the best one
    best, first, best_value = oracle.best_of([start], parabola, steps=6, lr=5.0)
    assert torch.equal(first, torch.tensor([4.0, 9.0, 0.25]))
    assert (best_value <= first).all() and (best_value < first).any()
    torch.testing.assert_close(parabola(best), best_value)
    same, first0, best0 = oracle.best_of([start], parabola, steps=0, lr=5.0)
    assert torch.equal(same[0], start) and torch.equal(first0, best0)
    assert not start.requires_grad   # the caller's tensor is not touched


@pytest.mark.parametrize("target", oracle.ORACLE_TARGETS)
def test_each_oracle_is_never_worse_than_the_compiled_prompt_on_its_objective(head, target):
    out = oracle.oracle_window_losses(head, _windows(), PREFIX, target=target, steps=4, lr=0.1, rank=2,
                                      samples=2, batch_size=3)
    for kind in oracle.ORACLE_KINDS:
        assert out[f"oracle_{kind}"].shape == (5, M) and torch.isfinite(out[f"oracle_{kind}"]).all()
        start, best = out["objective"][kind]["start"], out["objective"][kind]["best"]
        assert (best <= start).all(), kind
        torch.testing.assert_close(start, out["objective"]["ybar"]["start"])   # every kind starts at the head


def test_without_steps_every_oracle_is_the_compiled_prompt(head):
    tokens = _windows()
    topics, docs = torch.zeros(5, dtype=torch.long), torch.arange(5)
    compiled = window_losses(head, tokens, PREFIX, topics, docs, batch_size=2, per_position=True)["compiled"]
    out = oracle.oracle_window_losses(head, tokens, PREFIX, steps=0, batch_size=2)
    for kind in oracle.ORACLE_KINDS:
        torch.testing.assert_close(out[f"oracle_{kind}"], compiled, msg=kind)
    assert len(head.lm.model.layers) == 4 and all(
        type(t).__name__ == "SiteTemplates" for sites in head.templates.values() for t in sites.values())


def test_the_capacity_oracle_lowers_the_objective_of_every_kind(head):
    out = oracle.oracle_window_losses(head, _windows(), PREFIX, steps=15, lr=0.2, rank=4, batch_size=5)
    for kind in oracle.ORACLE_KINDS:
        assert float(out["objective"][kind]["best"].mean()) < float(out["objective"][kind]["start"].mean()), kind


def test_oracle_comparison_reports_each_kind_beside_the_head(head):
    res = oracle.oracle_comparison(head, RandomWindows(), prompt_len=PREFIX, suffix_len=M, draws=2,
                                   topic_means=torch.zeros(2, 8), steps=2, rank=2, batch_size=4)
    for kind in oracle.ORACLE_KINDS:
        assert f"G_oracle_{kind}" in res and res[f"objective_{kind}"]["never_worse"]
        lo, hi = res[f"compiled_minus_oracle_{kind}"]["ci95"]
        assert lo <= res[f"compiled_minus_oracle_{kind}"]["value"] <= hi
    assert {"prompt_token", "rest"} <= set(res["by_position"]) and res["oracle"]["target"] == "capacity"
    assert "G_oracle_coeffs" in res["by_position"]["rest"]


@pytest.mark.parametrize("kw, name", [({"kinds": ("ybar", "all")}, "kinds"), ({"target": "cheat"}, "target"),
                                      ({"steps": -1}, "steps"), ({"lr": 0.0}, "lr"), ({"rank": 0}, "rank"),
                                      ({"samples": 0}, "samples"), ({"prefix_len": 13}, "prefix_len"),
                                      ({"lora_lr": -1.0}, "lora_lr")])
def test_bad_oracle_arguments_are_refused_by_name(head, kw, name):
    kw = {"prefix_len": PREFIX, **kw}
    with pytest.raises(ValueError, match=name):
        oracle.oracle_window_losses(head, _windows(n=2), **kw)


def test_the_capacity_oracle_never_reads_the_continuations_own_next_tokens(head):
    """Its objective is the teacher's distributions on the scored text: the last token (a target only) changes
    the scored loss but not the optimum's objective."""
    tokens = _windows(n=3)
    changed = tokens.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 96
    a = oracle.oracle_window_losses(head, tokens, PREFIX, kinds=("coeffs",), steps=3, batch_size=3)
    b = oracle.oracle_window_losses(head, changed, PREFIX, kinds=("coeffs",), steps=3, batch_size=3)
    torch.testing.assert_close(a["objective"]["coeffs"]["best"], b["objective"]["coeffs"]["best"])
    assert not torch.equal(a["oracle_coeffs"][:, -1], b["oracle_coeffs"][:, -1])


@pytest.fixture(scope="module")
def memory_head():
    torch.manual_seed(0)
    model = hf.CGTLM(hf.tiny_llama(seed=0), y_layer=2, d_y=8, n_head_y=2, n_templates=3, template_rank=2,
                     pooled_only=True, aux_kl=1.0, aux_ce=0.5, memory_layers=2, memory_rank=4)
    with torch.no_grad():
        model.memory.scale.fill_(0.7)     # the memory switched on (it starts writing nothing)
    return randomize_templates(model)


def test_every_oracle_of_a_memory_head_starts_at_its_compile_memory_included(memory_head):
    tokens = _windows()
    topics, docs = torch.zeros(5, dtype=torch.long), torch.arange(5)
    compiled = window_losses(memory_head, tokens, PREFIX, topics, docs, batch_size=2, per_position=True)["compiled"]
    kinds = (*oracle.ORACLE_KINDS, "memory")
    out = oracle.oracle_window_losses(memory_head, tokens, PREFIX, kinds=kinds, steps=0, batch_size=2)
    for kind in kinds:       # each kind keeps the compiled memory (or starts from it): the head's own loss
        torch.testing.assert_close(out[f"oracle_{kind}"], compiled, msg=kind)


def test_the_memory_oracle_lowers_the_objective_and_a_head_without_memory_refuses_it(memory_head, head):
    out = oracle.oracle_window_losses(memory_head, _windows(), PREFIX, kinds=("memory",), steps=15, lora_lr=0.05,
                                      batch_size=5)
    start, best = out["objective"]["memory"]["start"], out["objective"]["memory"]["best"]
    assert (best <= start).all() and float(best.mean()) < float(start.mean())
    with pytest.raises(ValueError, match="kinds.*token memory"):
        oracle.oracle_window_losses(head, _windows(), PREFIX, kinds=("memory",), steps=1)
