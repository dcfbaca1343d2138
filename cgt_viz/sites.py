"""The template sites, declared once: what each one's templates act on and which map reads it in a cgt_viz GPT.

A site κ is the input of one or more linear maps of a decoder layer; the templates T(ȳ) transform that input,
so W · T(ȳ) = W + B A exactly for every map W that reads it (what `specialize` merges). Everything that
depends on the set of sites — the config's choices and widths, the from-scratch blocks' seam, the LoRA factor
names — reads `SITE_TABLE`; adding a site is one row here, plus its module and maps in each pretrained LM
family's layout (`cgt_viz.hf.layouts`).

width        which of a family's three input widths the maps read: "model" (the residual width d),
             "attn" (the concatenated attention heads) or "mlp" (the MLP's hidden width)
gpt_map      the nn.Linear inside a cgt_viz `Block` that reads the site (the from-scratch seam: that map's
             input is transformed, see `layers.SiteLinear`)

Sites are disjoint: no map reads two sites (`check_disjoint`, applied to this table and to every layout).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Iterable, Mapping

WIDTHS = ("model", "attn", "mlp")


@dataclass(frozen=True)
class Site:
    name: str
    width: str
    gpt_map: str


def check_disjoint(table: str, reads: Mapping[str, Iterable[Hashable]], what: str = "map") -> None:
    """ValueError naming both sites unless no `what` is read by two sites of `table` (reads: site -> its maps).

    Why: a merge writes W + B A once per site and map (`CGT.lora_factors` keys by map name), so a map read by
    two sites would keep the second site's update only, silently; and one hook serving two sites would
    transform the same input twice."""
    owner: dict[Hashable, str] = {}
    for site, maps in reads.items():
        for m in maps:
            if m in owner and owner[m] != site:
                raise ValueError(f"{table}: sites {owner[m]!r} and {site!r} both read the {what} {m!r}; sites must "
                                 f"be disjoint (a merge writes each map once, so one site's update would be lost)")
            owner[m] = site


SITE_TABLE: tuple[Site, ...] = (
    Site("attn_in", "model", "attn.c_attn"),
    Site("attn_out", "attn", "attn.c_proj"),
    Site("mlp_in", "model", "mlp.c_fc"),
    Site("mlp_out", "mlp", "mlp.c_proj"),
)
SITE = {s.name: s for s in SITE_TABLE}
MEMORY_SITE = "mlp_out"   # the token memory (layers.TokenMemory) writes at the map reading this site, in every family
SITES = tuple(SITE)
check_disjoint("sites.SITE_TABLE", {s.name: (s.gpt_map,) for s in SITE_TABLE})


def site_width(site: str, widths: dict[str, int]) -> int:
    """The input width of the maps at `site`, given a family's {"model": d, "attn": ..., "mlp": ...}."""
    return widths[SITE[site].width]
