"""The two model families for the invariant tests: a from-scratch CGT and a CGT over a pretrained LM (hf.CGTLM on
a tiny random Llama). A config names its family: a CGTLM's config carries extra["hf"]. Each helper does what
differs between the families, so an invariant is stated once and checked on both."""
from __future__ import annotations

import functools

import pytest
import torch

from cgt_viz import CGT, GPT, CGTConfig
from cgt_viz.layers import SITE_WEIGHTS
from helpers import randomize_templates


def is_hf(cfg: CGTConfig) -> bool:
    return "hf" in cfg.extra


@functools.lru_cache(maxsize=1)
def tiny_lm():
    pytest.importorskip("transformers")
    from cgt_viz import hf
    return hf.tiny_llama(seed=0)


def hf_cfg(**kw) -> CGTConfig:
    """The config of a CGTLM on the tiny Llama (vocab 96, 4 layers, width 64) with these settings."""
    from cgt_viz import hf
    kw = {"d_y": 16, "n_head_y": 2, "y_layer": 2, "n_templates": 3, **kw}
    return hf.CGTLM(tiny_lm(), **kw).config


def build(cfg: CGTConfig):
    """A fresh (untrained: T = I) model of the config's family."""
    if not is_hf(cfg):
        return CGT(cfg)
    from cgt_viz import hf
    return hf.CGTLM.from_config(cfg, tiny_lm())


def trained_like(cfg: CGTConfig, seed: int = 0):
    """A model with random non-zero template coefficients (not T = I), in eval mode; over an LM, the y blocks'
    output maps (zero at initialisation, so y stays 0) are random too."""
    torch.manual_seed(seed)
    model = randomize_templates(build(cfg).eval())
    if is_hf(cfg):
        with torch.no_grad():
            for block in model.y_blocks:
                for proj in (block.attn.c_proj, block.mlp.c_proj):
                    proj.weight.normal_(0, 0.05)
    return model


def logits(net, x: torch.Tensor) -> torch.Tensor:
    """A specialised model's logits on x: a GPT is called on x, a transformers model on input_ids=x."""
    return net(x) if isinstance(net, (GPT, CGT)) else net(input_ids=x).logits


def x_module(model):
    """The x stream's own module: the CGT's GPT, or the LM."""
    return model.stream.base(model)


def factor_names(model) -> set[str]:
    """The weight names lora_factors must return: GPT names, or the LM's maps of each site."""
    if not is_hf(model.config):
        return {f"blocks.{l - 1}.{SITE_WEIGHTS[s]}.weight" for l, s in model.template_sites}
    from cgt_viz.hf.layouts import layout_of
    layout = layout_of(model.lm)
    return {layout.weight_name(l, m) for l, s in model.template_sites for m in layout.sites[s].maps}


def y_modules(model) -> list:
    """Every module of the y stream and the read-out (x never reads them)."""
    if not is_hf(model.config):
        return [model.y_embed, model.y_blocks, model.ln_y] + ([model.y_wpe] if model.y_wpe is not None else [])
    return [model.y_blocks, model.pool, model.ln_y]


def plain_states(model, inp: torch.Tensor) -> list[torch.Tensor]:
    """x_1..x_ℓ of the plain x stream (no y, no templates) on inp."""
    ell = model.config.y_layer
    if not is_hf(model.config):
        gpt = model.x_only()
        x, out = gpt.embed_inputs(inp), []
        for n in range(ell):
            x = gpt.blocks[n](x)
            out.append(x)
        return out
    with torch.no_grad():
        return list(model.lm(input_ids=inp, output_hidden_states=True).hidden_states[1:ell + 1])


def reload(model, path):
    """model.save_pretrained(path) read back by its family's loader."""
    if not is_hf(model.config):
        return CGT.from_pretrained(path)
    from cgt_viz import hf
    return hf.CGTLM.from_pretrained(path, model.lm)


def reload_specialised(spec, path):
    """A saved specialised model read back as its own class."""
    if isinstance(spec, GPT):
        return GPT.from_pretrained(path)
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path)
