"""The token memory (layers.TokenMemory) in a from-scratch CGT (CGTConfig(memory_layers=...)): compiled, merged,
read causally in the full mode, trained, saved and refused as in a CGTLM (tests/hf/test_token_memory.py)."""
import pytest
import torch

from cgt_viz import CGT, GPT, CGTConfig
from cgt_viz.io import read_json, write_json
from cgt_viz.layers import TokenMemory

V = 40


def _cfg(**kw) -> CGTConfig:
    base = dict(vocab_size=V, block_size=32, n_layer=4, d_x=32, n_head=2, d_y=16, n_head_y=2, y_layer=2,
                n_templates=3, template_rank=2, sites=("attn_in", "mlp_in"), memory_layers=2, memory_rank=8)
    return CGTConfig(**{**base, **kw})


def _model(scale=0.7, switch_on=True, **kw) -> CGT:
    torch.manual_seed(0)
    model = CGT(_cfg(**kw))
    with torch.no_grad():             # templates and memory switched on (both start as the identity)
        if switch_on:
            for layer, site in model.template_sites:
                temp = model.templates[str(layer)][site]
                temp.coeff.weight.normal_(0, 0.3)
                temp.coeff.bias.normal_(0, 0.3)
        if model.memory is not None:
            model.memory.scale.fill_(scale)
    return model.eval()


def _ids(*shape, seed=0):
    return torch.randint(0, V, shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("sites", [("attn_in", "mlp_in"), ("attn_in", "mlp_out")])
def test_the_specialized_gpt_is_the_unmerged_compiled_pass(sites):
    """Templates and memory both write; with "mlp_out" templates the memory's map is a template map too, and the
    merge stacks the two updates along r."""
    model = _model(sites=sites)
    prompt, idx = _ids(13), _ids(2, 9, seed=1)
    unmerged = model.forward_compiled(idx, prompt)
    merged = model.specialize(prompt)
    assert type(merged) is GPT
    torch.testing.assert_close(merged(idx), unmerged, rtol=1e-4, atol=1e-5)
    # the memory changes the compiled model: at s = 0 the logits differ
    assert (_model(scale=0.0, sites=sites).forward_compiled(idx, prompt) - unmerged).abs().max() > 1e-3
    factors = model.prompt_factors(prompt)
    top = model.memory_map(model.memory.layers[-1])
    assert top == "blocks.3.mlp.c_proj.weight"
    templates = model.config.n_templates * model.config.template_rank if "mlp_out" in sites else 0
    assert factors[top][0].shape[0] == templates + 13 - 2          # one slot per prompt position 1..p−2
    # a batch of prompts: one model per row, each its own compile
    rows = torch.stack([prompt, _ids(13, seed=5)])
    for row, gpt in zip(rows, model.specialize(rows)):
        torch.testing.assert_close(gpt(idx), model.forward_compiled(idx, row), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("q", [3, 7, 11])
def test_the_full_mode_at_a_position_is_the_compile_of_the_prefix_ending_there(q):
    """With the memory at the top layer only, its term reaches the logits only at its own position: the full
    mode's logits at q are those of the full pass whose memory is the compile of the prefix 0..q."""
    model = _model(memory_layers=1)
    idx = _ids(2, 14, seed=3)
    full = model(idx)
    ystep, _ = model._y_stream(idx[:, :q + 1])

    def compiled_memory(nu, x):
        coeffs = ystep(nu, x)
        if coeffs is None:
            return None
        coeffs = {k: v for k, v in coeffs.items() if k != "memory"}             # the templates' per-token c(ȳ_t)
        return {**coeffs, **model.memory_coeffs(x, idx[:, :q + 1])}              # the prefix's compiled memory
    with torch.no_grad():
        compiled = model.stream.run(model, idx[:, :q + 1], compiled_memory)
    torch.testing.assert_close(full[:, q], compiled[:, q], rtol=1e-5, atol=1e-5)


def test_each_rows_prefix_is_compiled_in_the_aux_pass():
    """aux_logits (the loss's aux pass) with a split per row: each row's compile is that of its own prefix
    (the padded slots of shorter prefixes write nothing)."""
    model = _model()
    idx, split = _ids(3, 14, seed=4), torch.tensor([5, 9, 7])
    aux = model.aux_logits(idx, split)
    for i, s in enumerate(split.tolist()):
        want = model.forward_compiled(idx[i:i + 1, s:], idx[i, :s])
        torch.testing.assert_close(aux[i:i + 1, :14 - s], want, rtol=1e-5, atol=1e-5)


def test_a_memory_at_zero_gain_is_bit_equal_to_the_cgt_without_one():
    torch.manual_seed(0)
    plain = CGT(_cfg(memory_layers=0)).eval()
    torch.manual_seed(0)
    model = CGT(_cfg()).eval()                       # built last: every other weight draws the same numbers
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in plain.state_dict().items())
    with torch.no_grad():
        for m in (plain, model):
            for layer, site in m.template_sites:
                torch.manual_seed(layer)
                m.templates[str(layer)][site].coeff.bias.normal_(0, 0.3)
    prompt, idx = _ids(10), _ids(2, 12, seed=2)
    assert torch.equal(model(idx), plain(idx))
    ybar = plain.prompt_summary(prompt)
    assert torch.equal(model.forward_compiled(idx, prompt), plain.forward_specialized(idx, ybar[None]))
    assert torch.equal(model.specialize(prompt)(idx), plain.specialize(prompt)(idx))
    torch.manual_seed(1)
    a = model.train().loss(idx, idx, split=torch.tensor([4, 6]))
    b = plain.train().loss(idx, idx, split=torch.tensor([4, 6]))
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the named outputs are the same: the memory adds none (as over a pretrained LM)
    assert model.cache_names() == plain.cache_names()
    assert all(torch.equal(v, plain.run_with_cache(idx)[1][k]) for k, v in model.run_with_cache(idx)[1].items())


def test_the_memory_trains_through_the_loss():
    model = _model(scale=0.0).train()
    idx = _ids(4, 14, seed=6)
    # at s = 0 only the gain moves first (like a LoRA's B = 0); once s ≠ 0 the keys do too
    assert torch.autograd.grad(model.loss(idx, idx.roll(-1, 1))["total"], model.memory.scale)[0].abs().sum() > 0
    on = _model(scale=0.5).train()
    assert torch.autograd.grad(on.loss(idx, idx.roll(-1, 1))["total"], on.memory.read.weight)[0].abs().sum() > 0
    # the aux term alone reaches the memory too (its compile holds each row's prefix)
    aux = model.loss(idx, idx.roll(-1, 1), split=torch.tensor([5, 6, 7, 8]))["aux"]
    assert torch.autograd.grad(aux, model.memory.scale)[0].abs().sum() > 0


def test_train_and_the_cli_flags_build_a_memory(tmp_path):
    from cgt_viz import train
    from cgt_viz.__main__ import main
    from cgt_viz.tasks.icl import SyntheticICL
    task = SyntheticICL(P=5, n_pairs=6)
    torch.manual_seed(0)
    model = CGT(CGTConfig(**{**task.config_kwargs(), "n_layer": 2, "d_x": 16, "n_head": 2, "d_y": 8, "n_head_y": 1,
                             "y_layer": 1, "n_templates": 2, "memory_layers": 1, "memory_rank": 4}))
    model, history = train(model, task, steps=3, batch_size=4, progress=False, device="cpu")
    assert float(model.memory.scale.detach().abs().sum()) > 0 and len(history.main) == 3
    out = tmp_path / "run"
    assert main(["train", "--task", "icl", "--task-arg", "n_pairs=6", "--task-arg", "P=5", "--n-layer", "2",
                 "--d-x", "16", "--n-head", "2", "--d-y", "8", "--n-head-y", "1", "--y-layer", "1",
                 "--n-templates", "2", "--memory-layers", "1", "--memory-rank", "4", "--no-progress",
                 "--device", "cpu", "--out", str(out), "--steps", "2", "--batch-size", "4"]) == 0
    back = CGT.from_pretrained(out / "model")
    assert back.memory is not None and back.memory.layers == [2] and back.config.memory_rank == 4


def test_save_and_load_keep_the_memory_and_its_buffers(tmp_path):
    model = _model()
    with torch.no_grad():
        model.memory.unit.fill_(2.5)
        model.memory.in_scale.uniform_(0.5, 1.5)
    model.save_pretrained(tmp_path / "m")
    back = CGT.from_pretrained(tmp_path / "m")
    assert back.memory.layers == model.memory.layers
    assert torch.equal(back.memory.unit, model.memory.unit) and torch.equal(back.memory.in_scale, model.memory.in_scale)
    prompt, idx = _ids(9), _ids(1, 8, seed=3)
    torch.testing.assert_close(back.forward_compiled(idx, prompt), model.forward_compiled(idx, prompt), atol=0, rtol=0)
    # a saved config with a bad memory value is refused, naming the field
    meta = read_json(tmp_path / "m" / "config.json")
    meta["config"]["memory_layers"] = 3                          # n_layer 4, y_layer 2: at most 2
    write_json(tmp_path / "m" / "config.json", meta)
    with pytest.raises(ValueError, match="memory_layers"):
        CGT.from_pretrained(tmp_path / "m")
    # a config saved before the fields existed loads as a CGT without a memory
    plain = _model(memory_layers=0)
    plain.save_pretrained(tmp_path / "old")
    meta = read_json(tmp_path / "old" / "config.json")
    del meta["config"]["memory_layers"], meta["config"]["memory_rank"]
    write_json(tmp_path / "old" / "config.json", meta)
    assert CGT.from_pretrained(tmp_path / "old").memory is None


@pytest.mark.parametrize("changes, says", [
    (dict(memory_layers=3), r"memory_layers must be an int in 0\.\.2 \(0: no token memory"),
    (dict(memory_layers=-1), r"memory_layers must be an int >= 0"),
    (dict(memory_rank=0), r"memory_rank must be an int >= 1"),
    (dict(memory_layers=True), r"memory_layers must be an int"),
    (dict(vocab_size=None, input_dim=3, memory_layers=1), r"memory_layers must be 0 in vectors mode"),
])
def test_bad_memory_settings_are_refused_by_name(changes, says):
    with pytest.raises((ValueError, TypeError), match=says):
        _cfg(**changes)


def test_generation_with_a_memory_needs_no_kv_cache():
    model = _model()
    with pytest.raises(ValueError, match="use_cache must be False for a CGT with a token memory"):
        model.generate(_ids(1, 5), 3, temperature=0)
    out = model.generate(_ids(1, 5), 3, temperature=0, use_cache=False)
    assert out.shape == (1, 8) and torch.equal(out[:, 5:6], model(_ids(1, 5))[:, -1].argmax(-1, keepdim=True))


def test_memory_reads_are_what_the_compiled_memory_writes():
    model = _model()
    prompt, text = _ids(11), _ids(7, seed=5)
    reads = model.memory_reads(prompt, text)
    layer = model.memory.layers[-1]
    assert reads["weights"].shape == (7, 9) and torch.equal(reads["written"], prompt[2:])
    coeffs = model.compiled_coeffs(prompt)
    seen = {}
    with torch.no_grad():
        model._hidden(text[None], {**coeffs, "memory.seen": seen})
        write = TokenMemory.apply_fixed(seen[layer], *coeffs[f"{layer}.memory"])[0]
    torch.testing.assert_close(reads["weights"] @ model.gpt.head.weight[reads["written"]], write)
    with pytest.raises(ValueError, match="layer"):
        model.memory_reads(prompt, text, layer=1)


def test_calibration_fits_keys_that_predict_the_memory_maps_input():
    model = _model(scale=0.0)
    idx = _ids(16, 20, seed=7)
    model.calibrate_memory(idx)
    layer = model.memory.layers[0]
    seen, record = {}, {}
    ystep, out = model._y_stream(idx, record=record)
    with torch.no_grad():
        model.stream.run(model, idx, lambda nu, x: None if (c := ystep(nu, x)) is None else {**c, "memory.seen": seen})
        h = seen[layer].flatten(0, 1)
        scale = model.memory.in_scale[0]
        keys = model.memory.slot_keys(layer, model._memory_states(out["x"])).flatten(0, 1) / scale
    centred, keys = h - h.mean(0), keys - keys.mean(0)
    assert ((centred - keys).pow(2).sum() / centred.pow(2).sum()).item() < 1.0     # R² > 0 on the fitted states
    variance = h.var(0)
    assert scale.argmin() == variance.argmax() and scale.argmax() == variance.argmin()
    assert torch.isfinite(model.memory.unit).all() and (model.memory.unit > 0).all()
    with pytest.raises(ValueError, match="token memory"):
        _model(memory_layers=0).calibrate_memory(idx)


def test_masked_factors_are_the_factors_of_each_rows_own_slots():
    torch.manual_seed(0)
    memory = TokenMemory(d=6, d_in=5, layers=[3], rank=4)
    with torch.no_grad():
        memory.scale.fill_(1.1)
    states, values = torch.randn(2, 8, 6), torch.randn(2, 8, 7)
    counts = [5, 8]
    mask = torch.arange(8)[None, :] < torch.tensor(counts)[:, None]
    lora_a, lora_b = memory.factors(3, states, values, mask)
    for i, m in enumerate(counts):
        a, b = memory.factors(3, states[i:i + 1, :m], values[i:i + 1, :m])
        torch.testing.assert_close(lora_b[i] @ lora_a[i], (b @ a)[0])
