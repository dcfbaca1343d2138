"""Property-based checks over random configurations: the core invariants hold for every valid config,
and every invalid one is refused with an error that names the field."""
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cgt_viz import SITES, CGTConfig
from families import build, hf_cfg, logits
from helpers import make_inputs

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def configs(draw):
    n_layer = draw(st.integers(2, 4))
    n_head = draw(st.sampled_from([1, 2, 4]))
    n_head_y = draw(st.sampled_from([1, 2]))
    mode = draw(st.sampled_from(["tokens", "vectors"]))
    io = ({"vocab_size": draw(st.integers(2, 20))} if mode == "tokens"
          else {"input_dim": draw(st.integers(1, 6)), "output_dim": draw(st.integers(1, 4))})
    return CGTConfig(
        **io, block_size=16, n_layer=n_layer, n_head=n_head, d_x=n_head * draw(st.sampled_from([4, 8])),
        n_head_y=n_head_y, d_y=n_head_y * draw(st.sampled_from([2, 4])),
        y_layer=draw(st.integers(1, n_layer - 1)),
        n_templates=draw(st.integers(1, 5)), template_rank=draw(st.integers(1, 3)),
        sites=tuple(draw(st.lists(st.sampled_from(SITES), min_size=1, max_size=4, unique=True))),
        y_reads=draw(st.sampled_from(["post", "pre"])), y_pos=draw(st.booleans()),
        mlp_ratio=draw(st.integers(1, 4)), bias=draw(st.booleans()),
        smooth=draw(st.sampled_from(["l2", "vae"])))


@st.composite
def hf_configs(draw):
    """Configs of a CGT over a pretrained LM (hf.CGTLM on the tiny 4-layer Llama of tests/families.py)."""
    n_head_y = draw(st.sampled_from([1, 2]))
    return hf_cfg(y_layer=draw(st.integers(1, 3)), n_head_y=n_head_y, d_y=n_head_y * draw(st.sampled_from([2, 4])),
                  n_templates=draw(st.integers(1, 5)), template_rank=draw(st.integers(1, 3)),
                  sites=tuple(draw(st.lists(st.sampled_from(SITES), min_size=1, max_size=4, unique=True))),
                  smooth=draw(st.sampled_from(["l2", "relative"])), pooled_only=draw(st.booleans()),
                  y_mlp_ratio=draw(st.integers(1, 4)))


@SETTINGS
@given(cfg=configs(), seed=st.integers(0, 10_000), split=st.integers(1, 11))
def test_invariants_hold_for_random_configs(cfg, seed, split):
    invariants_hold(cfg, seed, split)


@settings(SETTINGS, max_examples=10)   # each example builds two models over the LM: the CI budget
@given(cfg=st.deferred(hf_configs), seed=st.integers(0, 10_000), split=st.integers(1, 11))
def test_invariants_hold_for_random_configs_over_a_pretrained_lm(cfg, seed, split):
    invariants_hold(cfg, seed, split)


def invariants_hold(cfg, seed, split):
    torch.manual_seed(seed)
    model = build(cfg).eval()
    seq = make_inputs(cfg, 2, 12, seed)
    # T = I at initialisation
    torch.testing.assert_close(model(seq), model.x_only()(seq), atol=0, rtol=0)
    with torch.no_grad():
        for layer, site in model.template_sites:
            model.templates[str(layer)][site].coeff.weight.normal_(0, 0.5)
            model.templates[str(layer)][site].coeff.bias.normal_(0, 0.5)
    # merged = unmerged = auxiliary path
    ybar = model.context(seq[:1, :split])[:, -1]
    unmerged = model.forward_specialized(seq[:1, split:], ybar)
    merged = logits(model.specialize(seq[0, :split]), seq[:1, split:])
    torch.testing.assert_close(merged, unmerged, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(model.aux_logits(seq[:1], split), unmerged, atol=2e-5, rtol=1e-4)
    # causality of the full pass
    changed = seq.clone()
    changed[:, split:] = make_inputs(cfg, 2, 12 - split, seed + 1)
    torch.testing.assert_close(model(changed)[:, :split], model(seq)[:, :split])
    # losses are finite scalars
    tgt = (make_inputs(cfg, 2, 12, seed + 2) if cfg.mode == "tokens"
           else torch.randn(2, 12, cfg.out_dim))
    if cfg.mode == "tokens":
        tgt = tgt % cfg.vocab_size
    losses = model.train().loss(seq, tgt)
    assert all(torch.isfinite(v) for v in losses.values())


FIELDS = {
    "n_layer": st.integers(-3, 1),
    "y_layer": st.one_of(st.integers(-3, 0), st.integers(4, 9)),
    "n_templates": st.integers(-5, 0),
    "template_rank": st.integers(-5, 0),
    "d_x": st.sampled_from([3, 5, 6, 7]),           # not divisible by n_head=4
    "d_y": st.sampled_from([3, 5, 7]),              # not divisible by n_head_y=2
    "block_size": st.integers(-5, 0),
    "w_aux": st.floats(max_value=-1e-6, allow_nan=False),
    "w_smooth": st.one_of(st.floats(max_value=-1e-6, allow_nan=False), st.just(float("nan"))),
    "sites": st.lists(st.text(min_size=1, max_size=8).filter(lambda s: s not in SITES), min_size=1, max_size=3).map(tuple),
    "smooth": st.text(max_size=6).filter(lambda s: s not in ("l2", "vae")),
    "vae_sigma": st.floats(max_value=0.0, allow_nan=False),
    "dropout": st.floats(min_value=1.0, max_value=5.0),
}


@SETTINGS
@given(data=st.data())
def test_invalid_configs_name_the_field(data):
    field = data.draw(st.sampled_from(sorted(FIELDS)))
    value = data.draw(FIELDS[field])
    kwargs = dict(vocab_size=8, block_size=16, n_layer=4, d_x=8, n_head=4, d_y=4, n_head_y=2, y_layer=2)
    kwargs[field] = value
    try:
        CGTConfig(**kwargs)
    except (ValueError, TypeError) as err:
        named = field if field != "sites" else "site"
        assert named in str(err), f"error for {field}={value!r} does not name it: {err}"
        shown = [r(v) for v in (value if field == "sites" else [value]) for r in (str, repr)]
        assert any(v in str(err) for v in shown), f"error for {field}={value!r} does not show the value: {err}"
        assert "must" in str(err), f"error for {field}={value!r} does not say what is allowed: {err}"
    else:
        raise AssertionError(f"CGTConfig accepted {field}={value!r}")
