"""A from-scratch cgt_viz GPT as a transformers GPT-2 (cgt_viz.hf.export_hf, export_hf_peft): AutoModelForCausalLM opens the folder with our logits, for a plain GPT, a compiled CGT and the
baseline of notebook 01. Bad arguments (a CGT, vectors mode, a token shift) are audit rows in test_audit."""
import copy
import json
import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM  # noqa: E402

from cgt_viz import CGT, GPT, CGTConfig  # noqa: E402
from cgt_viz import hf  # noqa: E402
from cgt_viz.hf import export_hf, to_transformers  # noqa: E402
from cgt_viz.layers import SITE_WEIGHTS  # noqa: E402
from cgt_viz.outputs import OUTPUTS  # noqa: E402
from cgt_viz.sites import SITES  # noqa: E402
from cgt_viz.tasks.icl import SyntheticICL  # noqa: E402
from helpers import make_inputs, randomize_templates  # noqa: E402

TOL = 1e-4   # float32: the same arithmetic in another order


def _perturbed(model, seed=0, std=0.05):
    """Every parameter moved off its initial value (biases and LayerNorms start at 0 / 1, where a bias that
    went to the wrong place, or a missing transpose of a square map, would not show)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * std)
    return model.eval()


def _opened(model, folder):
    export_hf(model, folder)
    return AutoModelForCausalLM.from_pretrained(folder).eval()


def _max_delta(ours, theirs, idx) -> float:
    with torch.no_grad():
        return float((ours(idx) - theirs(idx).logits).abs().max())


def _cfg(**kw):
    return CGTConfig(**{"vocab_size": 40, "block_size": 16, "n_layer": 3, "d_x": 32, "n_head": 4, "d_y": 16,
                        "n_head_y": 2, "y_layer": 1, **kw})


@pytest.mark.parametrize("kw", [{}, {"bias": False}, {"mlp_ratio": 2, "dropout": 0.1}])
def test_a_plain_gpt_opens_in_transformers_with_its_logits(tmp_path, kw):
    gpt = _perturbed(GPT(_cfg(**kw)))
    lm = _opened(gpt, tmp_path / "gpt2")
    assert type(lm).__name__ == "GPT2LMHeadModel"
    assert lm.config.activation_function == "gelu" and not lm.config.tie_word_embeddings
    idx = make_inputs(gpt.config, b=3, t=16)
    assert _max_delta(gpt, lm, idx) < TOL
    # the logits are not trivially close: the same folder with the tanh GELU GPT-2 ships by default differs
    # (what the exact-GELU setting guards)
    tanh = AutoModelForCausalLM.from_pretrained(tmp_path / "gpt2", activation_function="gelu_new").eval()
    assert _max_delta(gpt, tanh, idx) > 10 * _max_delta(gpt, lm, idx)


def test_a_compiled_cgt_opens_in_transformers_with_the_compiled_logits(tmp_path):
    """specialize(prompt) merges the templates into the GPT's weights at every site: the GPT-2 of it gives
    those logits, and they are not the logits of the model without the prompt."""
    torch.manual_seed(0)
    cgt = randomize_templates(_perturbed(CGT(_cfg(sites=SITES, y_layer=1))))
    prompt, idx = make_inputs(cgt.config, b=1, t=10, seed=1)[0], make_inputs(cgt.config, b=2, t=8, seed=2)
    compiled = cgt.specialize(prompt)
    lm = _opened(compiled, tmp_path / "compiled")
    assert _max_delta(compiled, lm, idx) < TOL
    with torch.no_grad():
        unmerged = cgt.forward_specialized(idx, cgt.prompt_summary(prompt)[None])
        assert float((unmerged - lm(idx).logits).abs().max()) < TOL
        assert float((cgt.x_only()(idx) - lm(idx).logits).abs().max()) > 100 * TOL   # the prompt is in the weights


@pytest.mark.parametrize("sites", [SITES, ("attn_out",)])
def test_the_compiled_prompt_as_a_peft_adapter_over_the_exported_base_gives_the_compiled_logits(tmp_path, sites):
    """attn_out alone: attn.c_proj carries the prompt while mlp.c_proj, of the same last name, must not."""
    pytest.importorskip("peft")
    from peft import PeftModel
    torch.manual_seed(0)
    cgt = randomize_templates(_perturbed(CGT(_cfg(sites=sites, n_templates=3, template_rank=2))))
    prompt, idx = make_inputs(cgt.config, b=1, t=10, seed=1)[0], make_inputs(cgt.config, b=2, t=8, seed=2)
    export_hf(cgt.x_only(), tmp_path / "base")
    hf.export_hf_peft(cgt, prompt, tmp_path / "adapter")
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tmp_path / "base"),
                                        str(tmp_path / "adapter")).eval()
    with torch.no_grad():
        ours = cgt.forward_specialized(idx, cgt.prompt_summary(prompt)[None])
        assert float((adapted(idx).logits - ours).abs().max()) < TOL
        base = AutoModelForCausalLM.from_pretrained(tmp_path / "base").eval()
        assert float((base(idx).logits - ours).abs().max()) > 100 * TOL   # the adapter carries the prompt
    lora = {n.split(".lora_")[0] for n, _ in adapted.named_parameters() if ".lora_" in n}
    expected = {f"base_model.model.transformer.h.{layer - 1}.{SITE_WEIGHTS[site]}"
                for layer in cgt.modulated_layers for site in sites}
    assert lora == expected


def test_the_baseline_of_notebook_01_opens_in_transformers(tmp_path):
    task = SyntheticICL()
    cfg = CGTConfig(**task.config_kwargs(), n_layer=4, d_x=64, n_head=4, d_y=32, n_head_y=2, y_layer=2,
                    n_templates=16, template_rank=1, sites=("attn_in", "mlp_in"), w_aux=1.0)
    baseline = _perturbed(GPT(cfg), seed=3)
    lm = _opened(baseline, tmp_path / "baseline")
    batch = task.get_batch(4, generator=torch.Generator().manual_seed(0))
    assert _max_delta(baseline, lm, batch.inputs) < TOL
    assert lm.config.n_positions == cfg.block_size and lm.config.vocab_size == cfg.vocab_size


def test_a_tied_head_stays_tied(tmp_path):
    gpt = _perturbed(GPT(_cfg()))
    gpt.head.weight = gpt.embed.weight
    lm = _opened(gpt, tmp_path / "tied")
    assert lm.config.tie_word_embeddings
    assert lm.lm_head.weight.data_ptr() == lm.transformer.wte.weight.data_ptr()
    assert _max_delta(gpt, lm, make_inputs(gpt.config)) < TOL


def test_the_in_memory_model_is_a_copy(tmp_path):
    gpt = _perturbed(GPT(_cfg()))
    lm = to_transformers(gpt)
    idx = make_inputs(gpt.config)
    assert _max_delta(gpt, lm, idx) < TOL
    with torch.no_grad():
        lm.transformer.h[0].attn.c_attn.weight.zero_()
    assert _max_delta(gpt, lm, idx) > 100 * TOL
    assert gpt.blocks[0].attn.c_attn.weight.detach().abs().sum() > 0


def test_a_folder_of_another_kind_is_refused_and_left_as_it_was(tmp_path):
    gpt = _perturbed(GPT(_cfg()))
    gpt.save_pretrained(tmp_path / "ours")                     # a cgt_viz GPT folder
    before = {p.name: p.read_bytes() for p in (tmp_path / "ours").iterdir()}
    with pytest.raises(ValueError, match=r"path must be .*cgt_viz GPT model"):
        export_hf(gpt, tmp_path / "ours")
    assert {p.name: p.read_bytes() for p in (tmp_path / "ours").iterdir()} == before
    export_hf(gpt, tmp_path / "hf")
    export_hf(_perturbed(GPT(_cfg()), seed=5), tmp_path / "hf")   # a transformers folder may be written again
    with pytest.raises(ValueError, match="path must be"):
        gpt.save_pretrained(tmp_path / "hf")                   # and is no place for a cgt_viz model
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]   # no staging folder is left behind


# ------------------------------------------------------------------ docs/guides/interop.md: the names tables
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "interop.md"


def _table(header: str) -> list[list[str]]:
    """The rows of the markdown table whose header row starts with `header`, as lists of cells."""
    lines = GUIDE.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {header}"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def _names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _at(name: str, layer: int, site: str = "") -> str:
    """A table name at 1-based layer ν (and a site)."""
    return (name.replace("{ν−1}", str(layer - 1)).replace("{ν}", str(layer)).replace("ν", str(layer))
            .replace("site", site))


OUTPUT_ROWS = "cgt_viz (`run_with_cache`)"
SITE_ROWS = "site |"


def _names_cgt():
    """A CGT with every named output (a posterior for ybar_sigma, every site) and a perturbed x stream."""
    torch.manual_seed(0)
    cgt = CGT(_cfg(sites=SITES, smooth="vae", n_layer=3, y_layer=1)).eval()
    with torch.no_grad():
        for p in cgt.gpt.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return cgt   # templates at T = I: the full pass is the x stream's own, the one the export holds


def test_every_cgt_viz_name_in_the_table_exists_and_every_output_has_a_row():
    """Each row's name, read as a pattern (ν a layer, site a site), matches names run_with_cache returns, and
    every name it returns matches a row."""
    cgt = _names_cgt()
    known = cgt.cache_names()
    patterns = {}
    for row in _table(OUTPUT_ROWS):
        name = _names(row[0])[0]
        patterns[name] = re.compile(re.escape(name).replace("ν", r"\d+").replace("site", "(?:" + "|".join(SITES) + ")")
                                    + "$")
        assert any(patterns[name].match(k) for k in known), f"{name!r} is not a name run_with_cache returns"
    unmatched = [k for k in known if not any(p.match(k) for p in patterns.values())]
    assert not unmatched, f"named outputs without a row in {GUIDE.name}: {unmatched}"
    assert all(out.names(cgt) for out in OUTPUTS)   # the model has every kind of named output


def test_every_site_has_a_row_naming_its_map():
    rows = _table(SITE_ROWS)
    assert sorted(_names(row[0])[0] for row in rows) == sorted(SITES)
    gpt = GPT(_cfg())
    for row in rows:
        site, ours = _names(row[0])[0], _names(row[1])[0]
        assert _at(ours, 1) == f"blocks.0.{SITE_WEIGHTS[site]}"
        assert isinstance(gpt.get_submodule(_at(ours, 1)), torch.nn.Linear)


def test_each_transformerlens_hook_in_the_tables_holds_the_tensor_of_its_cgt_viz_name(tmp_path):
    pytest.importorskip("transformer_lens")
    from transformer_lens.model_bridge import TransformerBridge
    cgt = _names_cgt()
    n = cgt.config.n_layer
    export_hf(cgt.x_only(), tmp_path / "gpt2")
    bridge = TransformerBridge.boot_transformers(str(tmp_path / "gpt2"), device="cpu")
    idx = make_inputs(cgt.config, b=2, t=16)
    with torch.no_grad():
        _, ours = cgt.run_with_cache(idx)
        _, theirs = bridge.run_with_cache(idx)
    checked = 0
    for row in _table(OUTPUT_ROWS):
        name, hooks = _names(row[0])[0], _names(row[1])
        for layer in ([0] if name == "x.0" else range(1, n + 1) if "ν" in name else [None]):
            for hook in hooks:
                concrete = _at(hook, layer) if layer is not None else hook
                assert concrete in theirs, f"{concrete!r} ({row[1]}) is not a hook of the bridge"
                assert float((ours[_at(name, layer) if layer else name] - theirs[concrete]).abs().max()) < TOL
                checked += 1
    inputs = {}
    gpt = cgt.gpt
    for row in _table(SITE_ROWS):
        for layer in range(1, n + 1):
            gpt.get_submodule(_at(_names(row[1])[0], layer)).register_forward_hook(
                lambda m, args, out, key=(row[0], layer): inputs.__setitem__(key, args[0]))
    with torch.no_grad():
        gpt(idx)
    for row in _table(SITE_ROWS):
        for layer in range(1, n + 1):
            for hook in _names(row[2]):
                hook = hook if hook.startswith("blocks.") else f"blocks.{{ν−1}}.{hook}"
                tensor = theirs[_at(hook, layer)]
                assert float((inputs[row[0], layer] - tensor.reshape(inputs[row[0], layer].shape)).abs().max()) < TOL
                checked += 1
    assert checked >= 2 * n + 4 * n


# ------------------------------------------------------------------ nnsight and TransformerLens 4 (the interp extra)
def _word_tokenizer(vocab_size: int):
    """A transformers tokenizer over the ids themselves: nnsight wants one for a model passed in memory (a
    folder's own tokenizer is optional); these tests feed token ids."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({str(i): i for i in range(vocab_size)},
                                                                        unk_token="0")))


def _family(family: str):
    """{"compiled": (a transformers model, our logits function), "base": (...)} and token ids, for one family;
    each model is a copy the caller may hand to a library that rebuilds its modules (TransformerBridge does)."""
    if family == "gpt":
        torch.manual_seed(0)
        cgt = randomize_templates(_perturbed(CGT(_cfg(sites=SITES))))
        prompt, idx = make_inputs(cgt.config, b=1, t=10, seed=1)[0], make_inputs(cgt.config, b=2, t=12, seed=2)
        ybar = cgt.prompt_summary(prompt)[None]
        compiled = (to_transformers(cgt.specialize(prompt)), lambda x: cgt.forward_specialized(x, ybar))
        return {"compiled": compiled, "base": (to_transformers(cgt.x_only()), cgt.x_only())}, idx, 40
    from cgt_viz import hf
    lm = hf.tiny_llama(seed=0)
    cgt = randomize_templates(hf.CGTLM(lm, y_layer=2, d_y=16, n_head_y=2, n_templates=3, sites=SITES))
    gen = torch.Generator().manual_seed(1)
    prompt, idx = torch.randint(0, 96, (10,), generator=gen), torch.randint(0, 96, (2, 12), generator=gen)
    ybar = cgt.prompt_summary(prompt)[None]
    compiled = (cgt.specialize(prompt, share_weights=False), lambda x: cgt.forward_specialized(x, ybar))
    return {"compiled": compiled, "base": (copy.deepcopy(lm), lambda x: lm(x).logits)}, idx, 96


def _folder(model, folder, vocab):
    """The model's transformers folder. A Llama folder also gets a tokenizer (the libraries load the one its
    model type names when there is none, and a compiled SmolLM2 is saved with its own); the exported GPT-2 opens
    without one."""
    model.save_pretrained(str(folder))
    if type(model).__name__ != "GPT2LMHeadModel":
        _word_tokenizer(vocab).save_pretrained(str(folder))
    return str(folder)


@pytest.mark.parametrize("source", ["memory", "folder"])
@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_nnsight_opens_a_compiled_model_of_each_family_and_its_base_with_our_logits(tmp_path, family, source):
    pytest.importorskip("nnsight")
    import warnings

    from nnsight import LanguageModel
    models, idx, vocab = _family(family)
    for kind, (model, ours) in models.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # LanguageModel is nnsight's deprecated name for TransformersModel
            wrapped = (LanguageModel(model, tokenizer=_word_tokenizer(vocab)) if source == "memory"
                       else LanguageModel(_folder(model, tmp_path / kind, vocab), dispatch=True))
        with torch.no_grad(), wrapped.trace(idx):
            logits = wrapped.output.logits.save()
        with torch.no_grad():
            delta = float((logits - ours(idx)).abs().max())
        assert delta < TOL, f"{family} {kind} from {source}: max |Δ| {delta}"


@pytest.mark.parametrize("source", ["memory", "folder"])
@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_transformerlens_opens_a_compiled_model_of_each_family_and_its_base_with_our_logits(tmp_path, family,
                                                                                          source):
    pytest.importorskip("transformer_lens")
    from transformer_lens.model_bridge import TransformerBridge
    models, idx, vocab = _family(family)
    for kind, (model, ours) in models.items():
        if source == "memory":
            bridge = TransformerBridge.boot_transformers(f"cgt_viz-{family}-{kind}", hf_model=model,
                                                         tokenizer=_word_tokenizer(vocab), device="cpu")
        else:
            bridge = TransformerBridge.boot_transformers(_folder(model, tmp_path / kind, vocab), device="cpu")
        with torch.no_grad():
            delta = float((bridge(idx) - ours(idx)).abs().max())
        assert delta < TOL, f"{family} {kind} from {source}: max |Δ| {delta}"
