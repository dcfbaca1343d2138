"""One CGTLM over every LM family with a layout (cgt_viz.hf.layouts): a tiny random Llama, Qwen2 and GPT-2, each
built from a transformers config (offline), through the same invariants. GPT-2's maps are transformers Conv1D,
which store W as (in, out): the merge, lora_factors and the PEFT adapter must transpose where nn.Linear does not."""
import copy
import dataclasses

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from cgt_viz import hf  # noqa: E402
from cgt_viz.hf.layouts import LAYOUTS, LMLayout, SiteAt, layout_of  # noqa: E402
from cgt_viz.sites import SITES  # noqa: E402
from helpers import randomize_templates  # noqa: E402

FAMILIES = {"llama": hf.tiny_llama, "qwen2": hf.tiny_qwen2, "gpt2": hf.tiny_gpt2}
VOCAB = 96


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def lm(request):
    return FAMILIES[request.param](seed=0)


def _model(lm, sites=SITES, seed=0, **kw):
    """A CGTLM with random non-zero template coefficients (T ≠ I) and live y blocks."""
    torch.manual_seed(seed)
    model = randomize_templates(hf.CGTLM(lm, **{"y_layer": 2, "d_y": 16, "n_head_y": 2, "n_templates": 3,
                                                "template_rank": 2, "sites": sites, **kw}))
    with torch.no_grad():
        for block in model.y_blocks:
            for proj in (block.attn.c_proj, block.mlp.c_proj):
                proj.weight.normal_(0, 0.05)
    return model.eval()


def _idx(b=1, t=20, seed=0):
    return torch.randint(0, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


def _logits(net, idx):
    with torch.no_grad():
        return net(input_ids=idx, use_cache=False).logits


def test_each_family_has_a_layout_that_fits_its_tiny_model(lm):
    layout = layout_of(lm)
    assert lm.config.model_type in layout.model_types
    assert layout.problems(lm) is None
    assert len(layout.layers_of(lm)) == lm.config.num_hidden_layers
    assert layout.head_of(lm).weight.shape[0] == VOCAB
    hf.check_lm(lm)


def test_the_lower_layers_are_the_lms_own_hidden_states(lm):
    model, idx = _model(lm), _idx(b=2, t=16)
    _, cache = model.run_with_cache(idx)
    with torch.no_grad():
        ref = lm(input_ids=idx, output_hidden_states=True).hidden_states
    for n in range(model.config.y_layer + 1):
        assert torch.equal(cache[f"x.{n}"], ref[n]), n
    assert (cache[f"x.{model.config.n_layer - 1}"] - ref[model.config.n_layer - 1]).abs().max() > 1e-3


def test_unmerged_equals_specialized_equals_the_peft_adapter(lm, tmp_path):
    """All four sites, attn_out's square map among them: a merge in the wrong orientation would still run."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    model, idx = _model(lm), _idx()
    prompt, query = idx[0, :8], idx[:, 8:]
    before = {k: v.clone() for k, v in lm.state_dict().items()}
    with torch.no_grad():
        unmerged = model.forward_specialized(query, model.prompt_summary(prompt))
    spec = model.specialize(prompt)
    assert type(spec) is type(lm)
    merged = _logits(spec, query)
    plain = _logits(lm, query)
    assert (unmerged - plain).abs().max() > 1e-2                       # the templates do something
    assert (merged - unmerged).abs().max() < 1e-5
    model.export_peft(prompt, tmp_path / "adapter")
    assert all(torch.equal(v, before[k]) for k, v in lm.state_dict().items())      # the base is untouched
    peft_model = PeftModel.from_pretrained(copy.deepcopy(lm), tmp_path / "adapter").eval()
    wrapped = {name.removeprefix("base_model.model.") + ".weight" for name, module in peft_model.named_modules()
               if "default" in getattr(module, "lora_A", {})}
    assert wrapped == set(model.lora_factors(model.prompt_summary(prompt)))     # exactly the merged maps
    assert (_logits(peft_model, query) - merged).abs().max() < 1e-5
    spec.save_pretrained(tmp_path / "spec")
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "spec")
    assert type(back) is type(lm)
    assert torch.equal(_logits(back, idx), _logits(spec, idx))


def test_lora_factors_are_out_by_in_and_rebuild_the_stored_weight(lm):
    from cgt_viz.lora_baseline import lora_shapes
    model = _model(lm)
    ybar = model.prompt_summary(_idx()[0])
    factors, shapes = model.lora_factors(ybar), lora_shapes(model)
    spec = model.merged_lm(ybar)
    flip = layout_of(lm).fan_in_fan_out
    assert set(factors) == set(shapes)
    for name, (a, b) in factors.items():
        o, i = shapes[name]
        assert a.shape == (6, i) and b.shape == (o, 6), name
        stored = lm.get_parameter(name)
        assert stored.shape == ((i, o) if flip else (o, i))
        delta = (b @ a).t() if flip else b @ a
        assert torch.allclose(spec.get_parameter(name), stored + delta, atol=1e-6), name


def test_the_merge_orientation_matters_on_the_square_map(lm, monkeypatch):
    """The control for the test above: ignore the orientation and attn_out (square in every family here) merges
    without an error; over a Conv1D family the result then departs from the unmerged pass."""
    from cgt_viz.hf.stream import HFStream
    model, idx = _model(lm, sites=("attn_out",)), _idx()
    prompt, query = idx[0, :8], idx[:, 8:]
    with torch.no_grad():
        unmerged = model.forward_specialized(query, model.prompt_summary(prompt))
    monkeypatch.setattr(HFStream, "fan_in_fan_out", staticmethod(lambda model, name: False))
    gap = (_logits(model.specialize(prompt), query) - unmerged).abs().max()
    assert (gap > 1e-3) if layout_of(lm).fan_in_fan_out else (gap < 1e-5)


def test_upper_pass_from_layer_states_is_the_specialized_pass(lm):
    from cgt_viz.hf.lora import upper_logits
    model, idx = _model(lm), _idx()
    prompt, query = idx[0, :8], idx[:, 8:]
    ybar = model.prompt_summary(prompt)
    with torch.no_grad():
        x_ell = model.x_at_layer(query)
        upper = model._logits(model._upper_hidden(x_ell, model._fixed_coeffs(ybar[None])))
        want = model.forward_specialized(query, ybar)
        assert torch.allclose(upper, want, atol=1e-5)
        assert torch.allclose(upper_logits(lm, x_ell, model.config.y_layer), _logits(lm, query), atol=1e-5)
    assert len(layout_of(lm).layers_of(lm)) == lm.config.num_hidden_layers      # the whole list is back


def test_no_gradient_into_the_lm(lm):
    model, idx = _model(lm).train(), _idx(b=2, t=16)
    model.loss(idx, idx.roll(-1, 1))["total"].backward()
    assert all(p.grad is None and not p.requires_grad for p in lm.parameters())
    trained = {n.split(".")[0] for n, p in model.named_parameters() if p.grad is not None}
    assert {"y_blocks", "templates", "pool"} <= trained


def test_peft_lora_baseline_starts_at_the_compile(lm):
    """The per-prompt LoRA trained with peft, started from the compile (init "compile"): its factors at step 0,
    merged into the LM (hf.lora.merged_lm), give the specialised logits, orientation and all."""
    from cgt_viz.hf.lora import merged_lm, peft_lora_baseline
    model, idx = _model(lm), _idx()
    prompt, query = idx[0, :8], idx[:, 8:]
    _, checkpoints, _ = peft_lora_baseline(model, prompt, steps=(0,), init="compile", n_samples=2, sample_len=6)
    got = _logits(merged_lm(lm, checkpoints[0].factors), query)
    assert (got - _logits(model.specialize(prompt), query)).abs().max() < 1e-5


def test_heads_save_and_reload_on_the_same_lm(lm, tmp_path):
    model, idx = _model(lm), _idx(b=2, t=12)
    model.save_pretrained(tmp_path / "heads")
    back = hf.CGTLM.from_pretrained(tmp_path / "heads", lm).eval()
    with torch.no_grad():
        assert torch.equal(back(idx), model(idx))


def test_a_family_without_a_layout_is_refused_by_model_type():
    from transformers import OPTConfig, OPTForCausalLM
    opt = OPTForCausalLM(OPTConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, ffn_dim=32,
                                   num_attention_heads=2, max_position_embeddings=32, word_embed_proj_dim=16))
    with pytest.raises(ValueError, match=r"model_type 'opt'.*|.*'opt'"):
        hf.CGTLM(opt)


def test_a_layout_whose_sites_share_a_map_is_refused_naming_both():
    llama = LAYOUTS["llama"]
    sites = dict(llama.sites)
    sites["mlp_out"] = SiteAt("mlp.down_proj", False, ("mlp.down_proj", "mlp.up_proj"))   # up_proj reads mlp_in
    with pytest.raises(ValueError, match=r"'mlp_in' and 'mlp_out' both read the map 'mlp.up_proj'"):
        dataclasses.replace(llama, name="overlap", sites=sites)
    sites = dict(llama.sites)
    sites["attn_out"] = SiteAt("input_layernorm", True, ("self_attn.o_proj",))             # attn_in's hook
    with pytest.raises(ValueError, match=r"'attn_in' and 'attn_out' both read the hook point"):
        dataclasses.replace(llama, name="shared_hook", sites=sites)
    with pytest.raises(ValueError, match="not template sites"):
        dataclasses.replace(llama, name="unknown", sites={"attn_mid": SiteAt("x", True, ("y",))})


def test_every_registered_layout_is_disjoint_covers_every_site_and_has_a_tiny_model_here():
    for layout in {layout.name: layout for layout in LAYOUTS.values()}.values():
        assert isinstance(layout, LMLayout) and set(layout.sites) == set(SITES)
        assert set(layout.model_types) & set(FAMILIES), f"layout {layout.name!r} has no tiny model in FAMILIES"
        maps = [m for where in layout.sites.values() for m in where.maps]
        assert len(maps) == len(set(maps)), layout.name


def test_the_x_stream_protocol_is_declared_and_filled_in_by_both_families():
    from cgt_viz.hf.stream import HFStream
    from cgt_viz.streams import GPTStream, XStream
    declared = [name for name, v in vars(XStream).items() if isinstance(v, staticmethod)]
    assert {"run", "final_logits", "y_input", "readout", "site_maps", "base", "finish_merged", "merged_logits",
            "no_context"} <= set(declared)
    for name in declared:
        if name == "fan_in_fan_out":     # the one method with a default: nn.Linear's (out, in)
            continue
        with pytest.raises(NotImplementedError):
            getattr(XStream, name)(*[None] * getattr(XStream, name).__code__.co_argcount)
        for stream in (GPTStream, HFStream):
            assert name in vars(stream), (stream.__name__, name)


def test_a_cgtlm_is_built_by_cgt_init_with_the_streams_widths(lm, monkeypatch):
    from cgt_viz import CGT
    from cgt_viz.sites import site_width
    calls = []
    init = CGT.__init__
    monkeypatch.setattr(CGT, "__init__", lambda self, *a, **kw: (calls.append(type(self)), init(self, *a, **kw))[1])
    model = _model(lm)
    assert calls == [hf.CGTLM]
    widths = layout_of(lm).widths(lm.config)
    for layer, site in model.template_sites:
        assert model.templates[str(layer)][site].U.shape[1] == site_width(site, widths)
    layout = layout_of(lm)
    for site in SITES:       # every map of a site reads exactly that width (a Conv1D's input is its first axis)
        for linear in layout.sites[site].maps:
            shape = lm.get_parameter(layout.weight_name(1, linear)).shape
            assert shape[0 if layout.fan_in_fan_out else 1] == site_width(site, widths), (site, linear)
