"""The token memory (layers.TokenMemory, CGTLM(memory_layers=...)): update directions read from the prompt's own
tokens, merged, exported and trained like the templates."""
import pytest
import torch

from cgt_viz.layers import TokenMemory

transformers = pytest.importorskip("transformers")
from cgt_viz import hf  # noqa: E402
from cgt_viz.hf import distill as hfd  # noqa: E402
from cgt_viz.hf.tiny import tiny_llama  # noqa: E402


@pytest.fixture(scope="module")
def lm():
    return tiny_llama()


def _head(lm, memory_layers=2, scale=0.7, **kw):
    torch.manual_seed(0)
    model = hf.CGTLM(lm, y_layer=2, d_y=16, n_head_y=2, n_templates=4, template_rank=2, pooled_only=True,
                     memory_layers=memory_layers, memory_rank=8, **kw)
    with torch.no_grad():             # templates and memory switched on (both start as the identity)
        for layer, site in model.template_sites:
            temp = model.templates[str(layer)][site]
            temp.coeff.weight.normal_(0, 0.3)
            temp.coeff.bias.normal_(0, 0.3)
        if model.memory is not None:
            model.memory.scale.fill_(scale)
    return model.eval()


def _ids(*shape, seed=0):
    return torch.randint(0, 96, shape, generator=torch.Generator().manual_seed(seed))


def test_the_compiled_memory_is_the_unmerged_pass_and_its_peft_adapter(lm, tmp_path):
    peft = pytest.importorskip("peft")
    model = _head(lm)
    prompt, idx = _ids(13), _ids(2, 9, seed=1)
    unmerged = model.forward_compiled(idx, prompt)
    merged = model.specialize(prompt)
    assert type(merged) is type(lm)
    torch.testing.assert_close(merged(input_ids=idx).logits, unmerged, rtol=1e-4, atol=1e-5)
    # the memory changes the model: without it (s = 0) the logits differ
    without = _head(lm, scale=0.0)
    assert (without.forward_compiled(idx, prompt) - unmerged).abs().max() > 1e-3
    # rank of the memory's update: one slot per prompt position 1..p−2
    factors = model.prompt_factors(prompt)
    down = model.memory_map(model.memory.layers[-1])
    assert factors[down][0].shape[0] == 13 - 2 and torch.linalg.matrix_rank(factors[down][1] @ factors[down][0]) <= 11
    path = model.export_peft(prompt, tmp_path / "adapter")
    adapted = peft.PeftModel.from_pretrained(tiny_llama(), str(path)).eval()
    torch.testing.assert_close(adapted(input_ids=idx).logits, unmerged, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("family", ["qwen2", "gpt2"])
def test_the_compiled_memory_merges_and_exports_in_every_family(family, tmp_path):
    peft = pytest.importorskip("peft")
    build = getattr(hf, f"tiny_{family}")
    model = _head(build())
    prompt, idx = _ids(12), _ids(2, 8, seed=6)
    unmerged = model.forward_compiled(idx, prompt)
    torch.testing.assert_close(model.specialize(prompt)(input_ids=idx).logits, unmerged, rtol=1e-4, atol=1e-5)
    path = model.export_peft(prompt, tmp_path / "adapter")
    adapted = peft.PeftModel.from_pretrained(build(), str(path)).eval()
    torch.testing.assert_close(adapted(input_ids=idx).logits, unmerged, rtol=1e-4, atol=1e-5)


def test_a_memory_at_zero_gain_is_the_head_without_one(lm):
    model, plain = _head(lm, scale=0.0), _head(lm, memory_layers=0)
    model.load_state_dict({**model.state_dict(), **plain.state_dict()})    # the same templates and read-out
    prompt, idx = _ids(10), _ids(2, 12, seed=2)
    torch.testing.assert_close(model(idx), plain(idx))
    torch.testing.assert_close(model.forward_compiled(idx, prompt), plain.forward_compiled(idx, prompt))


def test_the_full_mode_reads_at_each_position_the_memory_of_its_own_prefix():
    torch.manual_seed(0)
    memory = TokenMemory(d=8, d_in=12, layers=[3], rank=4)
    with torch.no_grad():
        memory.scale.fill_(1.3)
    t = 7
    h, states, values = torch.randn(2, t, 12), torch.randn(2, t, 8), torch.randn(2, t, 5)
    causal = memory.apply_causal(3, h, states, values)
    for q in range(t):
        # compiling the prefix 0..q: slots 1..q−1, the value of slot j the token after it (values[j])
        a, b = memory.factors(3, states[:, 1:q], values[:, 1:q])
        torch.testing.assert_close(causal[:, q], TokenMemory.apply_fixed(h[:, q:q + 1], a, b)[:, 0])


def test_the_cache_holds_the_prefix_states_and_gives_the_uncached_gradients(lm, tmp_path):
    model = _head(lm)
    tokens = _ids(6, 6 + 8 + 1)
    cache = hfd.build_feature_cache(model, tokens, 6, top_k=7, root=tmp_path, store_dtype="float32", progress=False)
    assert cache.tensors["prefix_x"].shape == (6, 6, lm.config.hidden_size)
    assert cache.manifest["settings"]["prefix_states"] is True
    params = hfd.trainable_parameters(model)
    cached = hfd.cached_loss(model, cache.batch(torch.arange(6)))["aux"]
    direct = hfd.uncached_loss(model, tokens, 6, top_k=7)["aux"]
    torch.testing.assert_close(cached, direct, rtol=1e-5, atol=1e-6)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    for name, g_c, g_d in zip(names, torch.autograd.grad(cached, params), torch.autograd.grad(direct, params)):
        torch.testing.assert_close(g_c, g_d, rtol=1e-4, atol=1e-6)
    grads = dict(zip(names, torch.autograd.grad(hfd.cached_loss(model, cache.batch(torch.arange(6)))["aux"], params)))
    assert grads["memory.scale"].abs().sum() > 0 and grads["memory.read.weight"].abs().sum() > 0
    # a head without a memory keeps the old cache key (no prefix states); one with a memory refuses such a cache
    plain = hfd.build_feature_cache(_head(lm, memory_layers=0), tokens, 6, top_k=7, root=tmp_path,
                                    store_dtype="float32", progress=False)
    assert "prefix_x" not in plain.tensors and plain.path != cache.path
    with pytest.raises(ValueError, match="prefix states"):
        hfd.cached_loss(model, plain.batch(torch.arange(2)))


def test_save_and_load_keep_the_memory(lm, tmp_path):
    model = _head(lm)
    with torch.no_grad():
        model.memory.unit.fill_(2.5)
    model.save_pretrained(tmp_path / "head")
    back = hf.CGTLM.from_pretrained(tmp_path / "head", lm)
    assert back.memory is not None and back.memory.layers == model.memory.layers
    prompt, idx = _ids(9), _ids(1, 8, seed=3)
    torch.testing.assert_close(back.forward_compiled(idx, prompt), model.forward_compiled(idx, prompt))


def test_memory_arguments_are_checked_by_name(lm):
    with pytest.raises(ValueError, match="memory_layers"):
        hf.CGTLM(lm, y_layer=2, memory_layers=3, pooled_only=True)       # 4 layers: at most 2 above y_layer
    with pytest.raises(ValueError, match="sites"):
        hf.CGTLM(lm, y_layer=2, memory_layers=1, sites=("attn_in", "mlp_out"), pooled_only=True)
    with pytest.raises(ValueError, match="memory_rank"):
        hf.CGTLM(lm, y_layer=2, memory_layers=1, memory_rank=0, pooled_only=True)


def test_calibration_fits_keys_that_predict_the_memory_maps_input(lm, tmp_path):
    model = _head(lm, scale=0.0)
    tokens = _ids(8, 6 + 8 + 1, seed=4)
    cache = hfd.build_feature_cache(model, tokens, 6, top_k=7, root=tmp_path, store_dtype="float32", progress=False)
    model.calibrate_memory(cache.tensors["suffix_x"], cache.tensors["pooled"])
    layer = model.memory.layers[0]
    inputs = []
    module = model.lm.get_submodule(model.memory_map(layer)[:-len(".weight")])
    handle = module.register_forward_hook(lambda m, args, out: inputs.append(args[0]))
    try:
        model._upper_hidden(cache.tensors["suffix_x"], model._fixed_coeffs(model.summary_of_pooled(cache.tensors["pooled"])))
    finally:
        handle.remove()
    h = inputs[0].flatten(0, 1)
    scale = model.memory.in_scale[0]
    keys = model.memory.slot_keys(layer, model.ln_x(cache.tensors["suffix_x"])).flatten(0, 1) / scale
    centred, keys = h - h.mean(0), keys - keys.mean(0)     # the memory centres its keys over the slots
    residual = ((centred - keys).pow(2).sum() / centred.pow(2).sum()).item()
    assert residual < 1.0                               # better than the mean alone: R² > 0 on the fitted states
    # D is each feature's inverse spread: the most varied feature weighs least
    variance = h.var(0)
    assert scale.argmin() == variance.argmax() and scale.argmax() == variance.argmin()
    assert torch.isfinite(model.memory.unit).all() and (model.memory.unit > 0).all()


def test_a_memory_of_identical_slots_writes_nothing():
    """Centred keys: slots read at one and the same state carry no context, so whatever they hold, the
    compiled memory and the full mode's memory are zero (without the centring they boosted every prompt token)."""
    from cgt_viz.layers import TokenMemory
    torch.manual_seed(0)
    memory = TokenMemory(d=6, d_in=5, layers=[3], rank=4)
    with torch.no_grad():
        memory.scale.fill_(1.0)
    states = torch.randn(2, 1, 6).expand(2, 7, 6)                      # every slot at one state per row
    values, h = torch.randn(2, 7, 4), torch.randn(2, 7, 5)
    lora_a, lora_b = memory.factors(3, states, values)
    assert lora_a.abs().max() < 1e-6
    assert memory.apply_causal(3, h, states, values).abs().max() < 1e-6
    # distinct states do write
    states = torch.randn(2, 7, 6)
    assert memory.apply_causal(3, h, states, values).abs().max() > 1e-3


def test_memory_reads_are_what_the_compiled_memory_writes_and_the_figure_escapes_tokens(lm):
    from cgt_viz.figures import memory_figure
    model = _head(lm)
    prompt, text = _ids(11), _ids(7, seed=5)
    reads = model.memory_reads(prompt, text)
    layer = model.memory.layers[-1]
    assert reads["weights"].shape == (7, 9) and torch.equal(reads["written"], prompt[2:])
    # the weights times the written tokens' output rows are the memory's whole write at that layer
    coeffs = model.compiled_coeffs(prompt)
    seen = {}
    module = model.lm.get_submodule(model.memory_map(layer)[:-len(".weight")])
    handle = module.register_forward_hook(lambda m, args, out: seen.__setitem__("h", args[0]))
    try:
        model._hidden(text[None], coeffs)
    finally:
        handle.remove()
    write = TokenMemory.apply_fixed(seen["h"], *coeffs[f"{layer}.memory"])[0]
    torch.testing.assert_close(reads["weights"] @ model.lm.lm_head.weight[reads["written"]], write)
    names = ["<b>x</b>"] * 9
    fig = memory_figure(reads["weights"].numpy(), names, ["t"] * 7, read_at=names, layer=layer)
    assert "<b>" not in str(fig.layout.xaxis.ticktext) and "&lt;b&gt;" in str(fig.layout.xaxis.ticktext)
    with pytest.raises(ValueError, match="written, read_at and positions"):
        memory_figure(reads["weights"].numpy(), names[:3], ["t"] * 7)
    with pytest.raises(ValueError, match="layer"):
        model.memory_reads(prompt, text, layer=1)


def test_a_head_starts_from_a_saved_one_and_only_its_new_memory_is_new(lm, tmp_path):
    from cgt_viz.hf.head_run import init_from
    plain = _head(lm, memory_layers=0)
    plain.save_pretrained(tmp_path / "plain")
    model = _head(lm, scale=0.0)
    loaded = init_from(model, tmp_path / "plain", lm)
    assert set(model.state_dict()) - set(loaded) == {k for k in model.state_dict() if k.startswith("memory.")}
    prompt, idx = _ids(10), _ids(2, 9, seed=7)
    torch.testing.assert_close(model.forward_compiled(idx, prompt), plain.forward_compiled(idx, prompt))
    other = hf.CGTLM(lm, y_layer=2, d_y=8, n_head_y=2, n_templates=4, template_rank=2, pooled_only=True,
                     memory_layers=1)
    with pytest.raises(ValueError, match="--init-from"):
        init_from(other, tmp_path / "plain", lm)          # d_y differs: named, not loaded half


def test_freeze_init_needs_init_from():
    from cgt_viz.hf.head_run import check_args, parse_args
    with pytest.raises(ValueError, match="--freeze-init"):
        check_args(parse_args(["--out", "x", "--freeze-init"]))
