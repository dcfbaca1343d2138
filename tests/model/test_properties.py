"""Property-based checks over random configurations: the core invariants hold for every valid config,
and every invalid one is refused with an error that names the field.

The strategies are derived from the package's own declarations: CGTConfig's `FIELD_CONSTRAINTS` (each field's
Int/Float/Choice/Bool/DistinctNames contract, whose choices come from the tables SITES, SMOOTHNESS, ...) through
`strategy_for`, so a new option or field is drawn without editing this file. What ties fields together (widths
divisible by their heads, y_layer below n_layer, a split that fits the sequence, small sizes for speed) is stated
here as explicit relations, and `test_every_field_is_drawn_or_fixed` fails for a field that is neither drawn nor
listed as fixed."""
import dataclasses
import inspect
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cgt_viz import CGTConfig
from cgt_viz._checks import Bool, Choice, Constraint, DistinctNames, Float, Int
from cgt_viz.config import FIELD_CONSTRAINTS
from cgt_viz.losses import SMOOTHNESS
from families import build, hf_cfg, logits, tiny_lm
from helpers import make_inputs

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
T = 12          # the length of the sequences the invariants run on
OPEN = 1e-3     # how close a drawn float comes to an open bound (a std of 1e-300 is valid, and no test of the maths)


def strategy_for(constraint: Constraint, cap: float | None = None) -> st.SearchStrategy:
    """The values a declared constraint accepts. An unbounded size stops at `cap` (default: 4 above its least value,
    small models for speed); a float stays OPEN away from an open bound and takes a closed one as it is."""
    if isinstance(constraint, Bool):
        strategy = st.booleans()
    elif isinstance(constraint, Choice):
        strategy = st.sampled_from(constraint.choices)
    elif isinstance(constraint, DistinctNames):
        strategy = st.lists(st.sampled_from(constraint.choices), min_size=1, max_size=len(constraint.choices),
                            unique=True).map(tuple)
    elif isinstance(constraint, Int):
        lo = 0 if constraint.lo is None else constraint.lo
        strategy = st.integers(lo, constraint.hi if constraint.hi is not None else cap if cap is not None else lo + 4)
    elif isinstance(constraint, Float):
        lo = 0.0 if constraint.lo is None else constraint.lo + (OPEN if constraint.lo_open else 0.0)
        hi = (constraint.hi - (OPEN if constraint.hi_open else 0.0) if constraint.hi is not None
              else cap if cap is not None else lo + 4.0)
        strategy = st.floats(lo, hi, allow_nan=False, allow_infinity=False, allow_subnormal=False)
        edges = [b for b, is_open in ((constraint.lo, constraint.lo_open), (constraint.hi, constraint.hi_open))
                 if b is not None and not is_open]
        strategy = st.one_of(st.sampled_from(edges), strategy) if edges else strategy   # a closed bound: often 0
    else:
        raise TypeError(f"strategy_for has no strategy for a {type(constraint).__name__} constraint: add one")
    return st.one_of(st.none(), strategy) if getattr(constraint, "none", False) else strategy


def invalid_for(constraint: Constraint) -> st.SearchStrategy | None:
    """Values a declared constraint refuses (None: none drawn here; the audit's bad_values cover the rest)."""
    if isinstance(constraint, Int):
        out = ([st.integers(constraint.lo - 5, constraint.lo - 1)] if constraint.lo is not None else []) + \
              ([st.integers(constraint.hi + 1, constraint.hi + 5)] if constraint.hi is not None else [])
    elif isinstance(constraint, Float):
        out = [st.just(math.nan)]
        if constraint.lo is not None:
            out.append(st.floats(max_value=constraint.lo if constraint.lo_open else constraint.lo - 1e-6,
                                 allow_nan=False))
        if constraint.hi is not None:
            out.append(st.floats(min_value=constraint.hi if constraint.hi_open else constraint.hi + 1e-6,
                                 max_value=constraint.hi + 5.0))
    elif isinstance(constraint, Choice):
        out = [st.text(max_size=6).filter(lambda s: s not in constraint.choices)]
    elif isinstance(constraint, DistinctNames):
        out = [st.lists(st.text(min_size=1, max_size=8).filter(lambda s: s not in constraint.choices),
                        min_size=1, max_size=3).map(tuple)]
    else:
        return None
    return st.one_of(*out) if out else None


def _aux_weights(draw) -> dict:
    """aux_ce and aux_kl from their constraints, not both 0 (the aux term would score nothing)."""
    aux_kl = draw(strategy_for(FIELD_CONSTRAINTS["aux_kl"]))
    aux_ce = draw(strategy_for(FIELD_CONSTRAINTS["aux_ce"]).filter(lambda v: v > 0 or aux_kl > 0))
    return {"aux_kl": aux_kl, "aux_ce": aux_ce}


def _split_bounds(draw) -> dict:
    """aux_min_prefix + aux_min_suffix fit in the T tokens the loss is taken on."""
    prefix = draw(strategy_for(FIELD_CONSTRAINTS["aux_min_prefix"], cap=T // 2))
    return {"aux_min_prefix": prefix, "aux_min_suffix": draw(strategy_for(FIELD_CONSTRAINTS["aux_min_suffix"],
                                                                          cap=T - prefix))}


# CGTConfig fields drawn by a relation in configs(); every other field of FIELD_CONSTRAINTS is drawn by strategy_for
RELATED = {"vocab_size", "input_dim", "output_dim", "block_size", "n_layer", "n_head", "d_x", "n_head_y", "d_y",
           "y_layer", "token_shift", "aux_min_prefix", "aux_min_suffix", "aux_ce", "aux_kl", "memory_layers"}
FIXED = {"extra": {}}           # free-form metadata: no invariant reads it
CAPS = {"n_templates": 5, "template_rank": 3, "aux_suffix_len": T, "aux_kl_top_k": 24, "memory_rank": 4}   # small


@st.composite
def configs(draw):
    mode = draw(st.sampled_from(["tokens", "vectors"]))
    n_layer = draw(strategy_for(FIELD_CONSTRAINTS["n_layer"], cap=4))
    n_head = draw(st.sampled_from([1, 2, 4]))
    n_head_y = draw(st.sampled_from([1, 2]))
    shifts = [s for s in FIELD_CONSTRAINTS["token_shift"].choices if mode == "tokens" or s != "pair"]  # pair: tokens
    y_layer = draw(st.integers(1, n_layer - 1))
    related = {
        **({"vocab_size": draw(st.integers(2, 20)), "input_dim": None, "output_dim": None} if mode == "tokens"
           else {"vocab_size": None, "input_dim": draw(st.integers(1, 6)), "output_dim": draw(st.integers(1, 4))}),
        "block_size": draw(st.integers(T, T + 4)), "n_layer": n_layer, "y_layer": y_layer,
        # a token memory writes output-embedding rows (tokens only), in at most the layers above ℓ
        "memory_layers": draw(st.integers(0, n_layer - y_layer)) if mode == "tokens" else 0,
        "n_head": n_head, "d_x": n_head * draw(st.sampled_from([4, 8])),
        "n_head_y": n_head_y, "d_y": n_head_y * draw(st.sampled_from([2, 4])),
        "token_shift": draw(st.sampled_from(shifts)), **_split_bounds(draw), **_aux_weights(draw)}
    assert set(related) == RELATED, set(related) ^ RELATED
    drawn = {name: draw(strategy_for(constraint, CAPS.get(name))) for name, constraint in FIELD_CONSTRAINTS.items()
             if name not in RELATED and name not in FIXED}
    return CGTConfig(**related, **drawn, **FIXED)


# CGTLM's arguments beyond CGTConfig's fields, checked in its __init__, declared here in the same terms
HF_OWN = {"y_mlp_ratio": Int(1), "pool_half_life": Float(0.0, lo_open=True, none=True), "pooled_only": Bool()}
HF_RELATED = {"y_layer", "n_head_y", "d_y", "smooth", "block_size", "memory_layers", "aux_min_prefix",
              "aux_min_suffix", "aux_ce", "aux_kl"}
HF_FIXED = {"lm": "the tiny 4-layer Llama of tests/families.py"}
HF_CAPS = CAPS


def hf_arguments() -> dict[str, Constraint]:
    """CGTLM's arguments (but lm) drawn from a constraint: a CGTConfig field's own, or HF_OWN's."""
    from cgt_viz import hf
    names = [n for n in inspect.signature(hf.CGTLM.__init__).parameters if n != "self"]
    return {n: HF_OWN.get(n, FIELD_CONSTRAINTS.get(n)) for n in names if n not in HF_RELATED and n not in HF_FIXED}


@st.composite
def hf_configs(draw):
    """Configs of a CGT over a pretrained LM (hf.CGTLM on the tiny 4-layer Llama of tests/families.py)."""
    from cgt_viz.hf.model import MEMORY_SITE
    n_layer = tiny_lm().config.num_hidden_layers
    n_head_y = draw(st.sampled_from([1, 2]))
    y_layer = draw(st.integers(1, n_layer - 1))
    drawn = {name: draw(strategy_for(constraint, HF_CAPS.get(name))) for name, constraint in hf_arguments().items()}
    plain = [k for k in FIELD_CONSTRAINTS["smooth"].choices if not SMOOTHNESS[k].posterior]   # no σ of ȳ here
    related = {"y_layer": y_layer, "n_head_y": n_head_y, "d_y": n_head_y * draw(st.sampled_from([2, 4])),
               "smooth": draw(st.sampled_from(plain)), "block_size": draw(st.integers(T, T + 4)),
               # the memory writes at MEMORY_SITE's map, so not with templates there; at most the layers above ℓ
               "memory_layers": 0 if MEMORY_SITE in drawn["sites"] else draw(st.integers(0, n_layer - y_layer)),
               **_split_bounds(draw), **_aux_weights(draw)}
    assert set(related) == HF_RELATED, set(related) ^ HF_RELATED
    return hf_cfg(**related, **drawn)


def test_every_field_is_drawn_or_fixed():
    """A CGTConfig field that configs() neither draws nor lists as fixed fails here, so a new one cannot be left
    out of the properties; and every declared constraint it draws has a strategy."""
    fields = {f.name for f in dataclasses.fields(CGTConfig)}
    drawn = set(FIELD_CONSTRAINTS) - RELATED - set(FIXED)
    left_out = fields - drawn - RELATED - set(FIXED)
    assert not left_out, f"fields neither drawn nor fixed (add a constraint or a relation): {sorted(left_out)}"
    assert drawn <= fields, f"constraints of no CGTConfig field: {sorted(drawn - fields)}"
    assert RELATED | set(FIXED) <= fields, f"not CGTConfig fields: {sorted((RELATED | set(FIXED)) - fields)}"
    for name in drawn:
        strategy_for(FIELD_CONSTRAINTS[name], CAPS.get(name))


def test_every_cgtlm_argument_is_drawn_or_fixed():
    """The same for hf_configs(): each argument of CGTLM but lm is drawn from a constraint (a CGTConfig field's or
    HF_OWN's) or by a relation."""
    pytest.importorskip("transformers")
    from cgt_viz import hf
    arguments = {n for n in inspect.signature(hf.CGTLM.__init__).parameters if n != "self"}
    missing = {n for n, c in hf_arguments().items() if c is None}
    assert not missing, f"CGTLM arguments with no constraint to draw from (add them to HF_OWN): {sorted(missing)}"
    assert HF_RELATED | set(HF_FIXED) | set(HF_OWN) <= arguments, "HF_RELATED, HF_FIXED and HF_OWN name CGTLM arguments"
    for name, constraint in hf_arguments().items():
        strategy_for(constraint, HF_CAPS.get(name))


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


# invalid values: every declared constraint's, and the relations' (with BASE's n_head=4, n_head_y=2, n_layer=4)
FIELDS = {
    **{name: bad for name, constraint in FIELD_CONSTRAINTS.items() if (bad := invalid_for(constraint)) is not None},
    "y_layer": st.one_of(st.integers(-3, 0), st.integers(4, 9)),
    "d_x": st.one_of(invalid_for(FIELD_CONSTRAINTS["d_x"]), st.sampled_from([3, 5, 6, 7])),   # n_head=4
    "d_y": st.one_of(invalid_for(FIELD_CONSTRAINTS["d_y"]), st.sampled_from([3, 5, 7])),      # n_head_y=2
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
