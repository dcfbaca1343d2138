"""The x stream of a CGT: what a model family supplies, in one small protocol (after PEFT's `LoraVariant`).

A CGT is one y stream, ȳ, templates, loss, named outputs, `specialize` and ablation (`cgt_viz.model.CGT`)
over an x stream. The x stream is a class of static methods that take the model, so its weights stay where
each family's saved models have them (`gpt.*` for a from-scratch CGT, `lm` for one over a pretrained LM).
`XStream` declares every method the CGT calls, each raising NotImplementedError until a family fills it in;
`refuses` names the features a family lacks, with the reason; `refuse(feature)` raises for them by name.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn

from .outputs import X
from .sites import MEMORY_SITE


class XStream:
    """The protocol of an x stream (see the module docstring): a family subclasses it and fills in every method.

    Shapes: b batch, t time, d the x stream's width, e d_y, k templates, v the output width (vocabulary)."""

    family = "x stream"
    refuses: dict[str, str] = {}
    self_teacher = True    # the aux distillation teacher is the CGT's own full pass (else the x stream alone, T = I)

    @classmethod
    def refuse(cls, feature: str, hint: str = "") -> None:
        if feature in cls.refuses:
            raise ValueError(f"{feature} is not available for a CGT over {cls.family}: {cls.refuses[feature]}{hint}")

    @staticmethod
    def run(model, inp, ystep, coeffs=None, cache=None, pos_offset=0, record=None, stop=False):
        """One pass over inp (b, t) tokens (or (b, t, input_dim) vectors) at positions pos_offset.. .

        Embed; run layers 1..ℓ, handing each state x_ν (b, t, d), ν = 0..ℓ, to ystep(ν, x_ν) (the y stream), which
        returns the coefficients {"ν.site": (b, t, k)} at ν = ℓ; with `coeffs` given ({"ν.site": (b, 1, k)}: ȳ
        frozen) ystep is not called. Then layers ℓ+1..N, each site's input h through the seam
        model._modulate(layer, site, h, coeffs). record: a dict filled with "x.ν" (b, t, d). Returns the final
        outputs (b, t, ·) that final_logits reads, or None with stop=True (only ȳ was wanted: nothing above ℓ runs)."""
        raise NotImplementedError

    @staticmethod
    def final_logits(model, final):
        """run's final outputs (..., ·) -> logits (..., v)."""
        raise NotImplementedError

    @staticmethod
    def y_input(model, inp, pos_offset):
        """y.0 (b, t, e), the y stream's input, for inp (b, t) at positions pos_offset.. ."""
        raise NotImplementedError

    @staticmethod
    def readout(model, x_ell, y, cache):
        """The summary before its LayerNorm (b, t, e) from x_ℓ (b, t, d) and y_ℓ (b, t, e): ȳ = LN(readout)."""
        raise NotImplementedError

    @staticmethod
    def site_maps(model, layer, site) -> list[str]:
        """Names (in base(model)'s state dict) of the weights whose input is `site` of layer ν: merged by specialize."""
        raise NotImplementedError

    @staticmethod
    def output_rows(model) -> torch.Tensor:
        """The output embedding (v, d): row u(t) is what the token memory writes for token t (`layers.TokenMemory`)."""
        raise NotImplementedError

    @staticmethod
    def fan_in_fan_out(model, name) -> bool:
        """Whether the weight `name` of base(model) is stored (in, out), as transformers' Conv1D does, rather than
        (out, in) as nn.Linear: the merge and lora_factors transpose it (PEFT's flag of the same name)."""
        return False

    @staticmethod
    def base(model) -> nn.Module:
        """The x stream's own module: its parameters are the merged ones' source, its class the merged model's."""
        raise NotImplementedError

    @staticmethod
    def finish_merged(merged):
        """What a merged prompt-free copy of base(model) needs before it is handed back -> that model."""
        raise NotImplementedError

    @staticmethod
    def merged_logits(merged, idx):
        """A merged model's (specialize's) logits (b, t, v) on idx (b, t), whatever that model returns."""
        raise NotImplementedError

    @staticmethod
    def no_context(model) -> nn.Module:
        """The x stream alone (T = I), called like a GPT: idx (b, t) -> logits (b, t, v)."""
        raise NotImplementedError

    @staticmethod
    def widths(model) -> dict[str, int]:
        """The input widths of the x stream's site maps, {"model": d, "attn": ..., "mlp": ...} (`sites.WIDTHS`):
        how wide the templates are."""
        raise NotImplementedError

    @staticmethod
    def caches(model) -> int:
        """How many KV-cache entries the x stream holds in a cached pass (its layers, and any history it keeps)."""
        raise NotImplementedError


class Seam:
    """What a from-scratch block's site maps (`layers.SiteLinear`) call in one modulated layer ν: `seam(site, h)`
    is T(ȳ) h (model._modulate); `seam.write(site, h, out)` adds the token memory's ΔW h to the output of the map
    reading `sites.MEMORY_SITE` (model._remember; other maps' outputs pass as they are)."""

    def __init__(self, model, layer: int, coeffs: dict | None):
        self.model, self.layer, self.coeffs = model, layer, coeffs

    def __call__(self, site: str, h: torch.Tensor) -> torch.Tensor:
        return self.model._modulate(self.layer, site, h, self.coeffs)

    def write(self, site: str, h: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        if site != MEMORY_SITE:
            return out
        return self.model._remember(self.layer, h, out, self.coeffs)


def cache_entry(cache, i):
    """The KV cache of block i from a model's list of per-block caches; None (no caching) when `cache` is None."""
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
            x = gpt.blocks[n](x, cache=cache_entry(cache, n))
            if record is not None:
                record[X(n + 1)] = x
            if not given:
                coeffs = ystep(n + 1, x)
        if stop:
            return None
        for layer in model.modulated_layers:
            x = gpt.blocks[layer - 1](x, modulate=Seam(model, layer, coeffs), cache=cache_entry(cache, layer - 1))
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
        return model.y_ema(x_ell, y, cache=cache_entry(cache, model.config.n_layer + model.config.y_layer))

    @staticmethod
    def site_maps(model, layer, site):
        from .layers import SITE_WEIGHTS
        return [f"blocks.{layer - 1}.{SITE_WEIGHTS[site]}.weight"]

    @staticmethod
    def output_rows(model):
        return model.gpt.head.weight

    @staticmethod
    def base(model) -> nn.Module:
        return model.gpt

    @staticmethod
    def finish_merged(merged):
        return merged

    @staticmethod
    def merged_logits(merged, idx):
        return merged(idx)

    @staticmethod
    def no_context(model) -> nn.Module:
        return copy.deepcopy(model.gpt)

    @staticmethod
    def widths(model):
        return model.config.widths

    @staticmethod
    def caches(model):
        return model.gpt._n_attention
