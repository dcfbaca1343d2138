"""The from-scratch oracle (cgt_viz.oracle): the best ȳ, coefficients or free update per prompt on a task's
queries, and the tasks' `queries_like` it fits on."""
import pytest
import torch

from cgt_viz import CGT, CGTConfig
from cgt_viz.oracle import ORACLE_KINDS, specialization_oracle
from cgt_viz.tasks import make_task
from cgt_viz.train import train

SMALL = dict(n_layer=3, d_x=32, n_head=2, d_y=16, n_head_y=2, y_layer=1, n_templates=4, template_rank=1,
             sites=("attn_in", "mlp_in"))


@pytest.fixture(scope="module")
def regression():
    task = make_task("regression", dim=4, n_points=12, noise=0.0)
    torch.manual_seed(0)
    model = CGT(CGTConfig(**task.config_kwargs(), **SMALL))
    model, _ = train(model, task, steps=40, batch_size=16, lr=3e-3, aux_delay=0, aux_ramp=1, progress=False)
    return model.eval(), task


def test_queries_like_draws_new_queries_of_each_rows_own_function():
    task = make_task("regression", dim=4, n_points=12, noise=0.0)
    gen = torch.Generator().manual_seed(0)
    batch = task.eval_batch(3, 5, generator=gen)
    more = task.queries_like(batch, 20, generator=gen)   # more than block_size allows in one sequence
    assert more.inputs.shape == (5, 40, 5) and int(more.split.max()) == 0
    x, y = more.inputs[:, 0::2, :4], more.targets[:, 0::2, 0]
    torch.testing.assert_close(y, torch.einsum("bnd,bd->bn", x, batch.info["w"]) / 2.0)
    assert more.loss_mask[:, 0::2].all() and not more.loss_mask[:, 1::2].any()
    assert not torch.equal(more.inputs[:, :2], batch.inputs[:, -2:])            # fresh x, not the scored query

    icl = make_task("icl")
    batch = icl.eval_batch(4, 6, generator=gen)
    more = icl.queries_like(batch, 9, generator=gen)
    answers = icl.answer_token(more.info["u"], icl.apply(batch.info["task_params"], more.info["u"]))
    assert torch.equal(more.inputs[:, 1::2], answers)


def test_queries_like_refuses_a_batch_of_another_task():
    regression, icl = make_task("regression", dim=4, n_points=12), make_task("icl")
    other = icl.eval_batch(2, 2, generator=torch.Generator().manual_seed(0))
    with pytest.raises(TypeError, match="batch must be a Batch of this task"):
        regression.queries_like(other, 3)
    with pytest.raises(ValueError, match="n_queries"):
        icl.queries_like(other, 0)


def test_without_steps_every_oracle_is_the_compiled_prompt(regression):
    model, task = regression
    res = specialization_oracle(model, task, 4, n_batches=1, batch_size=8, fit_queries=6, steps=0)
    for kind in ORACLE_KINDS:
        assert res[f"loss_oracle_{kind}"] == pytest.approx(res["loss_specialized"], rel=1e-5), kind
        assert res[f"objective_{kind}"]["best"] == res[f"objective_{kind}"]["start"]


def test_each_oracle_is_never_worse_than_the_compiled_prompt_and_the_model_is_left_as_it_was(regression):
    model, task = regression
    before = {name: p.detach().clone() for name, p in model.state_dict().items()}
    templates = {key: type(t) for key, sites in model.templates.items() for key, t in sites.items()}
    res = specialization_oracle(model, task, 4, n_batches=1, batch_size=8, fit_queries=6, steps=15, lr=0.1)
    for kind in ORACLE_KINDS:
        assert res[f"objective_{kind}"]["best"] <= res[f"objective_{kind}"]["start"], kind
    # the whole template space (coefficients) and a free update beyond it reach below the compiled start
    assert res["objective_coeffs"]["best"] < res["objective_coeffs"]["start"]
    assert res["objective_lora"]["best"] < res["objective_lora"]["start"]
    assert all(torch.equal(before[name], p) for name, p in model.state_dict().items())
    assert templates == {key: type(t) for key, sites in model.templates.items() for key, t in sites.items()}


@pytest.mark.parametrize("kwargs, match", [
    (dict(kinds=["ybar", "nonsense"]), "kinds"),
    (dict(kinds=[]), "kinds"),
    (dict(steps=-1), "steps"),
    (dict(fit_queries=0), "fit_queries"),
    (dict(lr=0.0), "lr"),
])
def test_bad_arguments_are_refused_by_name(regression, kwargs, match):
    model, task = regression
    with pytest.raises((TypeError, ValueError), match=match):
        specialization_oracle(model, task, 4, **kwargs)


def test_a_task_without_queries_like_is_refused(regression):
    model, task = regression

    class NoQueries:
        def eval_batch(self, *a, **kw):
            return task.eval_batch(*a, **kw)

        def config_kwargs(self):
            return task.config_kwargs()

    with pytest.raises(TypeError, match="queries_like"):
        specialization_oracle(model, NoQueries(), 4, steps=0)


def test_the_linear_reader_is_scored_beside_the_oracles(regression):
    model, task = regression
    res = specialization_oracle(model, task, 4, n_batches=2, batch_size=8, fit_queries=6, steps=3,
                                reader_info="w")
    assert res["loss_reader"] > 0 and res["oracle"]["reader_info"] == "w"
    assert "G_reader" in res
    with pytest.raises(ValueError, match="reader_info"):
        specialization_oracle(model, task, 4, kinds=["ybar"], reader_info="w")
    with pytest.raises(ValueError, match="reader_info"):
        specialization_oracle(model, task, 4, reader_info="nonsense")
