"""The x stream of a CGT: what a model family supplies, in one small protocol (after PEFT's `LoraVariant`).

A CGT is one y stream, ȳ, templates, loss, named outputs, `specialize` and ablation (`cgt_viz.model.CGT`)
over an x stream. The x stream is a class of static methods that take the model, so its weights stay where
each family's saved models have them (`gpt.*` for a from-scratch CGT, `lm` for one over a pretrained LM):

    run(model, inp, ystep, coeffs, cache, pos_offset, record, stop)
        embed; run layers 1..ℓ, handing each state x_ν (ν = 0..ℓ) to ystep(ν, x_ν) (the y stream), which
        returns the template coefficients at ν = ℓ (unless `coeffs` are given: ȳ frozen, no y stream);
        then layers ℓ+1..N, each site's input h through the seam model._modulate(layer, site, h, coeffs).
        Returns the final outputs (None with stop=True: only ȳ was wanted)
    final_logits(model, final)      the vocabulary (or output) logits of run's final outputs
    y_input(model, inp, pos_offset) y.0, the y stream's input
    readout(model, x_ell, y, cache) the summary before its LayerNorm: ȳ = LN(readout)
    site_maps(model, layer, site)   names of the parameters whose input is the site (merged by specialize)
    base(model)                     the x stream's own module (its parameters are the merged ones' source)
    finish_merged(merged)           what a merged prompt-free copy needs before it is handed back
    no_context(model)               the x stream alone (T = I), called like a GPT: idx -> logits

`refuses` names the features a family lacks, with the reason; `refuse(feature)` raises for them by name.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn

from .outputs import X


class XStream:
    """The protocol (see the module docstring); a family subclasses it and fills in every method."""

    family = "x stream"
    refuses: dict[str, str] = {}
    self_teacher = True    # the aux distillation teacher is the CGT's own full pass (else the family computes it)

    @classmethod
    def refuse(cls, feature: str, hint: str = "") -> None:
        if feature in cls.refuses:
            raise ValueError(f"{feature} is not available for a CGT over {cls.family}: {cls.refuses[feature]}{hint}")


def _at(cache, i):
    return None if cache is None else cache[i]


class GPTStream(XStream):
    """A from-scratch pre-LN GPT (`model.gpt`): token embeddings with optional positions and token shift."""

    family = "a from-scratch GPT"

    @staticmethod
    def run(model, inp, ystep, coeffs=None, cache=None, pos_offset=0, record=None, stop=False):
        gpt, ell, given = model.gpt, model.config.y_layer, coeffs is not None
        x = gpt.embed_inputs(inp, pos_offset, cache)
        if record is not None:
            record[X(0)] = x
        if not given:
            ystep(0, x)
        for n in range(ell):
            x = gpt.blocks[n](x, cache=_at(cache, n))
            if record is not None:
                record[X(n + 1)] = x
            if not given:
                coeffs = ystep(n + 1, x)
        if stop:
            return None
        for layer in model.modulated_layers:
            modulate = lambda site, h, layer=layer: model._modulate(layer, site, h, coeffs)   # noqa: E731
            x = gpt.blocks[layer - 1](x, modulate=modulate, cache=_at(cache, layer - 1))
            if record is not None:
                record[X(layer)] = x
        return gpt.head(gpt.ln_f(x))

    @staticmethod
    def final_logits(model, final):
        return final

    @staticmethod
    def y_input(model, inp, pos_offset):
        y = model.y_embed(inp)
        if model.y_wpe is not None:
            y = y + model.y_wpe(torch.arange(pos_offset, pos_offset + inp.shape[1], device=inp.device))
        return y

    @staticmethod
    def readout(model, x_ell, y, cache):
        if model.y_ema is None:
            return y
        return model.y_ema(x_ell, y, cache=_at(cache, model.config.n_layer + model.config.y_layer))

    @staticmethod
    def site_maps(model, layer, site):
        from .layers import SITE_WEIGHTS
        return [f"blocks.{layer - 1}.{SITE_WEIGHTS[site]}.weight"]

    @staticmethod
    def base(model) -> nn.Module:
        return model.gpt

    @staticmethod
    def finish_merged(merged):
        return merged

    @staticmethod
    def no_context(model) -> nn.Module:
        return copy.deepcopy(model.gpt)
