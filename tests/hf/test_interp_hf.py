"""cgt_viz.hf.interp: the residual stream of a compiled model and of the prompted LM against the LM alone, read
through nnsight (the interp extra), checked against transformers' own hidden states on a tiny random Llama."""
import warnings

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("nnsight")

from cgt_viz import hf  # noqa: E402
from cgt_viz.hf.interp import departure_figure, residual_departures, residual_stream  # noqa: E402
from cgt_viz.sites import SITES  # noqa: E402
from helpers import randomize_templates  # noqa: E402
from test_export_hf import _word_tokenizer  # noqa: E402

VOCAB, Y_LAYER = 96, 2


def _wrap(model):
    from nnsight import LanguageModel
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # LanguageModel is nnsight's deprecated name for TransformersModel
        return LanguageModel(model, tokenizer=_word_tokenizer(VOCAB))


@pytest.fixture(scope="module")
def setup():
    lm = hf.tiny_llama(seed=0)
    torch.manual_seed(0)
    cgt = randomize_templates(hf.CGTLM(lm, y_layer=Y_LAYER, d_y=16, n_head_y=2, n_templates=3, sites=SITES))
    gen = torch.Generator().manual_seed(1)
    prompt, rest = torch.randint(0, VOCAB, (10,), generator=gen), torch.randint(0, VOCAB, (9,), generator=gen)
    return lm, cgt.specialize(prompt), prompt, rest


def _hidden(model, idx):
    """transformers' hidden states after every decoder layer, (N, t, d): output_hidden_states for all but the
    last, whose entry there is after the final norm, so the last layer's own output comes from a hook."""
    last = {}
    handle = model.model.layers[-1].register_forward_hook(
        lambda mod, inp, out: last.setdefault("h", out[0] if isinstance(out, tuple) else out))
    with torch.no_grad():
        states = model(input_ids=idx[None], output_hidden_states=True).hidden_states
    handle.remove()
    return torch.stack(list(states[1:-1]) + [last["h"]])[:, 0]


def test_the_stream_read_through_nnsight_is_transformers_hidden_states(setup):
    lm, spec, prompt, rest = setup
    for model in (lm, spec):
        got = residual_stream(_wrap(model), rest[None])
        assert got.shape == (lm.config.num_hidden_layers, 1, len(rest), lm.config.hidden_size)
        assert torch.allclose(got[:, 0], _hidden(model, rest), atol=1e-6)


def test_reading_through_nnsight_leaves_the_model_as_it_was(setup):
    lm, spec, prompt, rest = setup
    with torch.no_grad():
        before = lm(input_ids=rest[None]).logits.clone()
    residual_departures(_wrap(lm), _wrap(spec), prompt, rest)
    with torch.no_grad():
        assert torch.equal(lm(input_ids=rest[None]).logits, before)


def test_the_stream_of_the_exported_gpt2_is_read_at_its_blocks():
    from cgt_viz import GPT, CGTConfig
    from cgt_viz.hf import to_transformers
    torch.manual_seed(0)
    gpt2 = to_transformers(GPT(CGTConfig(vocab_size=VOCAB, block_size=16, n_layer=3, d_x=32, n_head=4, d_y=16,
                                         n_head_y=2, y_layer=1))).eval()
    idx = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(2))
    got = residual_stream(_wrap(gpt2), idx)
    with torch.no_grad():
        states = gpt2(input_ids=idx, output_hidden_states=True).hidden_states
    assert got.shape == (3, 1, 8, 32)
    assert torch.allclose(got[:-1], torch.stack(states[1:-1]), atol=1e-6)   # the last entry there is after ln_f


def test_departures_are_those_of_transformers_hidden_states(setup):
    lm, spec, prompt, rest = setup
    skip = 2
    dep = residual_departures(_wrap(lm), _wrap(spec), prompt, rest, skip=skip)
    base, comp = _hidden(lm, rest)[:, skip:], _hidden(spec, rest)[:, skip:]
    prompted = _hidden(lm, torch.cat([prompt, rest]))[:, len(prompt) + skip:]
    scale = base.norm(dim=-1)
    want = {"compiled": ((comp - base).norm(dim=-1) / scale).mean(-1),
            "prompted": ((prompted - base).norm(dim=-1) / scale).mean(-1),
            "to_prompted": ((comp - prompted).norm(dim=-1) / scale).mean(-1)}
    for key, value in want.items():
        np.testing.assert_allclose(dep[key], value.numpy(), rtol=1e-5, atol=1e-7, err_msg=key)
    cos = torch.nn.functional.cosine_similarity(comp - base, prompted - base, dim=-1).mean(-1)
    n = lm.config.num_hidden_layers
    assert dep["tokens"] == len(rest) - skip and list(dep["layer"]) == list(range(1, n + 1))
    # the layers up to ℓ are the LM's own weights: no departure there, and no direction to compare
    assert np.all(dep["compiled"][:Y_LAYER] == 0) and np.all(np.isnan(dep["cosine"][:Y_LAYER]))
    assert np.all(dep["compiled"][Y_LAYER:] > 1e-3) and np.all(dep["prompted"] > 1e-3)
    np.testing.assert_allclose(dep["cosine"][Y_LAYER:], cos[Y_LAYER:].numpy(), rtol=1e-4, atol=1e-6)


def test_the_figure_draws_the_arrays(setup):
    dep = {"layer": np.arange(1, 5), "compiled": np.array([0, 0, .2, .3]), "prompted": np.array([.1, .2, .3, .4]),
           "to_prompted": np.array([.1, .2, .25, .3]), "cosine": np.array([np.nan, np.nan, .5, .6]), "tokens": 7}
    fig = departure_figure(dep, y_layer=Y_LAYER)
    drawn = {tr.name: np.asarray(tr.y, dtype=float) for tr in fig.data}
    assert len(fig.data) == 4
    np.testing.assert_array_equal(drawn["compiled − LM"], dep["compiled"])
    np.testing.assert_array_equal(drawn["prompted − LM"], dep["prompted"])
    np.testing.assert_array_equal(drawn["compiled − prompted"], dep["to_prompted"])
    assert any(s.x0 == Y_LAYER + 0.5 for s in fig.layout.shapes) and "7 tokens" in fig.layout.title.text


@pytest.mark.parametrize("call, name", [
    (lambda lm, spec, p, r: residual_departures(lm, spec, p, r.float()), "rest"),
    (lambda lm, spec, p, r: residual_departures(lm, spec, p, r, skip=len(r)), "skip"),
    (lambda lm, spec, p, r: residual_departures(lm, spec, p[None, None], r), "prompt"),
    (lambda lm, spec, p, r: residual_stream(spec, r[None]), "wrapped"),
    (lambda lm, spec, p, r: departure_figure({"layer": [1, 2]}), "departures"),
    (lambda lm, spec, p, r: departure_figure({"layer": [1, 2], "compiled": [0.1], "prompted": [1, 2],
                                              "to_prompted": [1, 2], "cosine": [1, 2]}), "compiled"),
    (lambda lm, spec, p, r: departure_figure({k: [1, 2] for k in ("layer", "compiled", "prompted", "to_prompted",
                                                                  "cosine")}, y_layer=5), "y_layer"),
])
def test_bad_arguments_are_refused_by_name(setup, call, name):
    lm, spec, prompt, rest = setup
    with pytest.raises((TypeError, ValueError), match=name):
        call(_wrap(lm), spec, prompt, rest)


def test_transformerlens_hooks_hold_the_same_stream(setup):
    """The guide's TransformerLens route: blocks.{i}.hook_out of a TransformerBridge is the stream nnsight reads."""
    pytest.importorskip("transformer_lens")
    import copy

    from transformer_lens.model_bridge import TransformerBridge
    lm, spec, prompt, rest = setup
    want = residual_stream(_wrap(spec), rest[None])
    bridge = TransformerBridge.boot_transformers("cgt_viz-compiled", hf_model=copy.deepcopy(spec),
                                                 tokenizer=_word_tokenizer(VOCAB), device="cpu")
    with torch.no_grad():
        _, cache = bridge.run_with_cache(rest[None])
    got = torch.stack([cache[f"blocks.{i}.hook_out"] for i in range(lm.config.num_hidden_layers)])
    assert torch.allclose(got, want, atol=1e-5)
