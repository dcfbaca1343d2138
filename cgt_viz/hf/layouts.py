"""Where a pretrained LM keeps its modules, declared once per architecture (after TransformerLens's
`supported_architectures`): nothing else in cgt_viz spells a module path of a Hugging Face model.

An `LMLayout` names, inside a transformers causal LM of one family,

body, layers     the decoder stack (`lm.<body>`) and its list of decoder layers (`lm.<body>.<layers>`)
embedding, norm  the token embedding and the final norm inside the body
head             the vocabulary head inside the causal LM
sites            per template site (`cgt_viz.sites`): the module of a decoder layer whose output (output True)
                 or input (False) is the site, one hook serving every map that reads it, and those maps
fan_in_fan_out   how the maps store W: False for nn.Linear, (out, in); True for transformers' Conv1D (GPT-2),
                 (in, out). One flag per layout, as PEFT's LoraConfig has one for all its targets
mlp_width        the MLP's hidden width from the model's config

and `LAYOUTS` registers a layout per `config.model_type`. A layout refuses, where it is declared, two sites that
read one map or share one hook (see `check_disjoint`): the merge writes each map once per site, so an overlap
would be overwritten without a word, and a shared hook would transform the input twice.

Adding a family is one layout here plus a tiny random model of that class in `hf.tiny` for the tests.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch.nn as nn

from ..sites import SITES, check_disjoint


@dataclass(frozen=True)
class SiteAt:
    """One site inside a decoder layer: the module hooked (its output or its input) and the maps reading it."""
    at: str
    output: bool
    maps: tuple[str, ...]


@dataclass(frozen=True)
class LMLayout:
    """The module paths of one LM family (see the module docstring)."""
    name: str
    model_types: tuple[str, ...]
    body: str
    layers: str
    embedding: str
    norm: str
    head: str
    sites: Mapping[str, SiteAt]
    fan_in_fan_out: bool
    mlp_width: Callable[[Any], int] = field(compare=False)

    def __post_init__(self):
        unknown = sorted(set(self.sites) - set(SITES))
        if unknown:
            raise ValueError(f"layout {self.name!r}: sites {unknown} are not template sites (one of {SITES})")
        check_disjoint(f"layout {self.name!r}", {s: where.maps for s, where in self.sites.items()}, "map")
        check_disjoint(f"layout {self.name!r}", {s: ((where.at, where.output),) for s, where in self.sites.items()},
                       "hook point")

    # ------------------------------------------------------------------ the modules of one LM
    def body_of(self, lm: nn.Module) -> nn.Module:
        """The decoder stack: called with input_ids or inputs_embeds it returns the final normed hidden states."""
        return lm.get_submodule(self.body)

    def layers_of(self, lm: nn.Module) -> nn.ModuleList:
        """The decoder layers, in order (layer ν is index ν − 1)."""
        return self.body_of(lm).get_submodule(self.layers)

    def embedding_of(self, lm: nn.Module) -> nn.Module:
        return self.body_of(lm).get_submodule(self.embedding)

    def head_of(self, lm: nn.Module) -> nn.Module:
        """The vocabulary head: final hidden states (..., d) -> logits (..., v)."""
        return lm.get_submodule(self.head)

    def site_module(self, lm: nn.Module, layer: int, site: str) -> nn.Module:
        """The module of decoder layer ν (1-based) whose output or input is `site`."""
        return self.layers_of(lm)[layer - 1].get_submodule(self.sites[site].at)

    def final_hidden(self, lm: nn.Module, input_ids) -> Any:
        """The body's final normed hidden states (b, t, d) over input_ids (b, t), without a KV cache."""
        return self.body_of(lm)(input_ids=input_ids, use_cache=False).last_hidden_state

    # ------------------------------------------------------------------ names
    def weight_name(self, layer: int, linear: str) -> str:
        """The causal LM's parameter name of map `linear` in decoder layer ν (1-based)."""
        return f"{self.body}.{self.layers}.{layer - 1}.{linear}.weight"

    def widths(self, config) -> dict[str, int]:
        """The input widths the site maps read: {"model": d, "attn": heads · head_dim, "mlp": the MLP's width}."""
        d, heads = config.hidden_size, config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or d // heads
        return {"model": d, "attn": heads * head_dim, "mlp": int(self.mlp_width(config))}

    def peft_targets(self, sites) -> list[str]:
        """PEFT target_modules for the maps of `sites`: each map's shortest trailing path that names no other
        map of this layout (GPT-2's two c_proj are "attn.c_proj" and "mlp.c_proj"; Llama's are its last names)."""
        every = [m for where in self.sites.values() for m in where.maps]

        def short(linear):
            parts = linear.split(".")
            for n in range(1, len(parts) + 1):
                tail = ".".join(parts[-n:])
                if sum(m == tail or m.endswith("." + tail) for m in every) == 1:
                    return tail
            return linear
        return sorted({short(m) for s in sites for m in self.sites[s].maps})

    # ------------------------------------------------------------------ the check of one LM
    def problems(self, lm: nn.Module) -> str | None:
        """What in lm does not follow this layout (None: everything a CGTLM hooks and merges is there)."""
        try:
            layers = self.layers_of(lm)
        except AttributeError:
            return f"no decoder layers at {self.body}.{self.layers}"
        if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
            return f"{self.body}.{self.layers} is not a non-empty ModuleList"
        try:
            head = self.head_of(lm)
        except AttributeError:
            return f"no head at {self.head}"
        if not isinstance(head, nn.Linear):
            return f"{self.head} is a {type(head).__name__}, not an nn.Linear"
        kind = _conv1d() if self.fan_in_fan_out else nn.Linear
        for site, where in self.sites.items():
            for part in (where.at, *where.maps):
                try:
                    module = layers[0].get_submodule(part)
                except AttributeError:
                    return f"{self.body}.{self.layers}[0] has no {part!r} (needed by site {site!r})"
                if part in where.maps and not isinstance(module, kind):
                    return (f"{self.body}.{self.layers}[0].{part} is a {type(module).__name__}, the layout reads it "
                            f"as a {kind.__name__}")
        return None


def _conv1d() -> type:
    from transformers.pytorch_utils import Conv1D
    return Conv1D


def _llama_mlp(config) -> int:
    return config.intermediate_size


def _gpt2_mlp(config) -> int:
    return config.n_inner if config.n_inner is not None else 4 * config.n_embd


LLAMA = LMLayout(
    name="llama", model_types=("llama", "mistral", "qwen2", "qwen3"),
    body="model", layers="layers", embedding="embed_tokens", norm="norm", head="lm_head",
    sites={"attn_in": SiteAt("input_layernorm", True, ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
           "attn_out": SiteAt("self_attn.o_proj", False, ("self_attn.o_proj",)),
           "mlp_in": SiteAt("post_attention_layernorm", True, ("mlp.gate_proj", "mlp.up_proj")),
           "mlp_out": SiteAt("mlp.down_proj", False, ("mlp.down_proj",))},
    fan_in_fan_out=False, mlp_width=_llama_mlp)

GPT2 = LMLayout(
    name="gpt2", model_types=("gpt2",),
    body="transformer", layers="h", embedding="wte", norm="ln_f", head="lm_head",
    sites={"attn_in": SiteAt("ln_1", True, ("attn.c_attn",)),           # q, k, v fused in one map
           "attn_out": SiteAt("attn.c_proj", False, ("attn.c_proj",)),
           "mlp_in": SiteAt("ln_2", True, ("mlp.c_fc",)),
           "mlp_out": SiteAt("mlp.c_proj", False, ("mlp.c_proj",))},
    fan_in_fan_out=True, mlp_width=_gpt2_mlp)

LAYOUTS: dict[str, LMLayout] = {t: layout for layout in (LLAMA, GPT2) for t in layout.model_types}
SUPPORTED_MODEL_TYPES = tuple(LAYOUTS)


def layout_of(lm: Any) -> LMLayout:
    """The layout of a transformers causal LM by its config.model_type; a TypeError (not a model with a config) or
    ValueError (a family without a layout) naming lm and the supported model types otherwise."""
    model_type = getattr(getattr(lm, "config", None), "model_type", None)
    layout = LAYOUTS.get(model_type) if isinstance(model_type, str) else None
    if layout is None:
        from .._checks import describe, refuse
        want = f"a transformers causal LM of a family with a layout (config.model_type one of {SUPPORTED_MODEL_TYPES})"
        if model_type is None:
            raise refuse("lm", want, describe(lm), TypeError)
        raise refuse("lm", want, f"{type(lm).__name__} with model_type {model_type!r}")
    return layout
