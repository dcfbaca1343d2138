"""The template sites, declared once: what each one's templates act on, which maps read it, where its hook sits.

A site κ is the input of one or more linear maps of a decoder layer; the templates T(ȳ) transform that input,
so W · T(ȳ) = W + B A exactly for every map W that reads it (what `specialize` merges). Everything that
depends on the set of sites — the config's choices and widths, the from-scratch blocks' seam, the hooks on a
pretrained LM, the LoRA factor names, the PEFT targets — reads `SITE_TABLE`; adding a site is one row here.

width        which of a family's three input widths the maps read: "model" (the residual width d),
             "attn" (the concatenated attention heads) or "mlp" (the MLP's hidden width)
gpt_map      the nn.Linear inside a cgt_viz `Block` that reads the site (the from-scratch seam: that map's
             input is transformed, see `layers.SiteLinear`)
hf_at        the module inside a Hugging Face decoder layer (Llama layout) whose output (hf_output True) or
             input (False) is transformed: one hook serves every map that reads it
hf_maps      the nn.Linear maps of that decoder layer that read the site (merged by `specialize`)
"""
from __future__ import annotations

from dataclasses import dataclass

WIDTHS = ("model", "attn", "mlp")


@dataclass(frozen=True)
class Site:
    name: str
    width: str
    gpt_map: str
    hf_at: str
    hf_output: bool
    hf_maps: tuple[str, ...]


SITE_TABLE: tuple[Site, ...] = (
    Site("attn_in", "model", "attn.c_attn", "input_layernorm", True,
         ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    Site("attn_out", "attn", "attn.c_proj", "self_attn.o_proj", False, ("self_attn.o_proj",)),
    Site("mlp_in", "model", "mlp.c_fc", "post_attention_layernorm", True, ("mlp.gate_proj", "mlp.up_proj")),
    Site("mlp_out", "mlp", "mlp.c_proj", "mlp.down_proj", False, ("mlp.down_proj",)),
)
SITE = {s.name: s for s in SITE_TABLE}
SITES = tuple(SITE)


def site_width(site: str, widths: dict[str, int]) -> int:
    """The input width of the maps at `site`, given a family's {"model": d, "attn": ..., "mlp": ...}."""
    return widths[SITE[site].width]
