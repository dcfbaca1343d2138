"""CGTConfig: every size and switch of a Contextually Guided Transformer, validated on creation.

The same config describes the plain baseline: `GPT(cfg)` reads only the x-stream fields
(input mode, block_size, n_layer, d_x, n_head, mlp_ratio, bias, dropout).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from ._checks import Bool, Choice, Float, Instance, Int, DistinctNames, check_dict, check_divisible, check_int, refuse
from .losses import SMOOTHNESS
from .sites import SITES, site_width

SMOOTH_KINDS = tuple(SMOOTHNESS)

Y_READS = ("post", "pre")
Y_READOUTS = ("stream", "ema")
TOKEN_SHIFTS = ("none", "previous", "pair")
# Fields added after models were first saved, with the value that reproduces a model saved before the field
# existed: loading fills exactly these (an explicit migration); any other missing field is refused.
ADDED_FIELDS = {"aux_row_fraction": 1.0, "y_readout": "stream", "token_shift": "none",
                "aux_ce": 1.0, "aux_kl": 0.0, "aux_kl_top_k": None, "memory_layers": 0, "memory_rank": 64}


def with_added_fields(saved):
    """A saved config dict with exactly the ADDED_FIELDS it lacks filled in (the migration that loading a model
    and resuming a run both apply); anything that is not a dict comes back as it is."""
    if not isinstance(saved, dict):
        return saved
    return {**{k: v for k, v in ADDED_FIELDS.items() if k not in saved}, **saved}

# Each field's own contract; `validate` applies these, then the checks that relate fields to each other.
FIELD_CONSTRAINTS = {
    "block_size": Int(1), "n_layer": Int(2, hint=" (layers 1..y_layer carry y, the rest are modulated)"),
    "d_x": Int(1), "n_head": Int(1), "mlp_ratio": Int(1), "dropout": Float(0.0, 1.0, hi_open=True), "bias": Bool(),
    "token_shift": Choice(*TOKEN_SHIFTS),
    "d_y": Int(1), "n_head_y": Int(1), "y_reads": Choice(*Y_READS), "y_pos": Bool(), "y_readout": Choice(*Y_READOUTS),
    "n_templates": Int(1), "template_rank": Int(1),
    "w_aux": Float(0.0), "w_smooth": Float(0.0), "smooth": Choice(*SMOOTH_KINDS),
    "vae_sigma": Float(0.0, lo_open=True), "vae_tau": Float(0.0, lo_open=True),
    "aux_min_prefix": Int(1), "aux_min_suffix": Int(1), "aux_suffix_len": Int(1, none=True),
    "aux_row_fraction": Float(0.0, 1.0, lo_open=True),
    "aux_ce": Float(0.0), "aux_kl": Float(0.0), "aux_kl_top_k": Int(1, none=True, hint=" (None: the whole vocabulary)"),
    "memory_layers": Int(0, hint=" (0: no token memory)"), "memory_rank": Int(1),
    "sites": DistinctNames(*SITES), "extra": Instance(dict, "a dict (free-form metadata)"),
}


@dataclass
class CGTConfig:
    # --- input mode: set vocab_size for tokens, or input_dim (+ output_dim) for vectors ---
    vocab_size: int | None = None      # tokens mode: embedding table size, cross-entropy head
    input_dim: int | None = None       # vectors mode: linear embedding of R^input_dim
    output_dim: int | None = None      # vectors mode: linear head to R^output_dim (default input_dim)
    block_size: int = 256              # longest sequence (learned absolute positions)
    # --- x stream: an ordinary pre-LN GPT ---
    n_layer: int = 4                   # N, total number of blocks
    d_x: int = 128                     # width of x
    n_head: int = 4                    # x heads (d_x / n_head per head)
    mlp_ratio: int = 4                 # MLP hidden width = mlp_ratio * width
    bias: bool = True                  # biases in Linear and LayerNorm
    dropout: float = 0.0
    token_shift: str = "none"          # x.0_t also embeds input t−1 ("previous") or the pair (t−1, t) ("pair")
    # --- y stream: narrow, lives in layers 1..y_layer, reads x, never writes into x ---
    d_y: int = 64                      # width of y and of the summary ybar
    n_head_y: int = 2                  # y heads (d_y / n_head_y per head)
    y_layer: int = 2                   # ℓ: ybar = LN(y_ℓ); layers ℓ+1..N are modulated
    y_reads: str = "post"              # y block ν reads x_ν after its x block ("post") or x_{ν−1} ("pre")
    y_pos: bool = True                 # y gets its own position embedding (else only a token embedding)
    y_readout: str = "stream"          # ȳ = LN(y_ℓ) ("stream"), or "ema": LN(g·y_ℓ + EMA of P·LN(x_ℓ)), g from 0
    # --- templates: per modulated site, K rank-r operators mixed by c(ybar) = A ybar + b ---
    n_templates: int = 8               # K
    template_rank: int = 1             # r
    sites: tuple[str, ...] = ("attn_in", "mlp_in")   # subset of SITES
    # --- token memory (layers.TokenMemory): update directions read from the prompt's own tokens ---
    memory_layers: int = 0             # the top this many layers get one at their MLP output map (0: none)
    memory_rank: int = 64              # width of the memory's shared key read-out R
    # --- losses: total = main + w_aux * aux + w_smooth * smooth ---
    w_aux: float = 1.0                 # w_C, auxiliary specialization loss
    w_smooth: float = 0.0              # w_D, smoothness of ybar along the sequence
    smooth: str = "l2"                 # a kind of losses.SMOOTHNESS: "l2", "vae" (noisy ybar + KL), "relative"
    vae_sigma: float = 0.1             # "vae": initial posterior std of ybar
    vae_tau: float = 1.0               # "vae": random-walk prior std
    aux_min_prefix: int = 1            # s_min: the split leaves at least this many prefix tokens
    aux_min_suffix: int = 1            # m_min: ... and at least this many suffix tokens
    aux_suffix_len: int | None = None  # if set, the aux pass sees only this many suffix tokens
    aux_row_fraction: float = 1.0      # in training, the aux pass runs on this random share of the rows (>= 1 row)
    # the aux term scores the specialised model on the suffix: aux = aux_ce · cross-entropy to the data
    # + aux_kl · KL to a teacher that saw the prefix (context distillation, see cgt_viz.distill)
    aux_ce: float = 1.0
    aux_kl: float = 0.0
    aux_kl_top_k: int | None = None    # the teacher's top-k tokens + a rest bucket (None: the whole vocabulary)
    extra: dict = field(default_factory=dict)  # free-form metadata (task name, tokenizer, ...)

    def __post_init__(self) -> None:
        self.sites = FIELD_CONSTRAINTS["sites"].check("sites", self.sites)   # a list becomes a tuple
        self.validate()

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        if (self.vocab_size is None) == (self.input_dim is None):
            raise refuse("exactly one of vocab_size (tokens mode) or input_dim (vectors mode)", "set",
                         f"vocab_size={self.vocab_size!r}, input_dim={self.input_dim!r}")
        if self.vocab_size is not None:
            check_int("vocab_size", self.vocab_size, 2)
            if self.output_dim is not None:
                raise refuse("output_dim", "None with vocab_size set (it is for vectors mode only)",
                             f"output_dim={self.output_dim!r} with vocab_size={self.vocab_size}")
        else:
            check_int("input_dim", self.input_dim, 1)
            check_int("output_dim", self.output_dim, 1, allow_none=True)
        for name, constraint in FIELD_CONSTRAINTS.items():
            constraint.check(name, getattr(self, name))
        # the checks that relate fields to each other
        if self.token_shift == "pair" and self.vocab_size is None:
            raise refuse("token_shift", "'previous' or 'none' in vectors mode", "'pair'",
                         hint="token_shift='pair' embeds token pairs and needs tokens mode (vocab_size)")
        check_divisible("d_x", self.d_x, self.n_head, "n_head")
        check_divisible("d_y", self.d_y, self.n_head_y, "n_head_y")
        check_int("y_layer", self.y_layer, 1, self.n_layer - 1, hint=" (1..n_layer-1)")
        check_int("memory_layers", self.memory_layers, 0, self.n_layer - self.y_layer,
                  hint=f" (0: no token memory; at most the n_layer - y_layer = {self.n_layer - self.y_layer} "
                       f"modulated layers)")
        if self.memory_layers and self.vocab_size is None:
            # a slot's value is the output-embedding row of the token that followed it: tokens only
            raise refuse("memory_layers", "0 in vectors mode (the token memory writes output-embedding rows of "
                         "tokens and needs tokens mode, vocab_size)", repr(self.memory_layers))
        if self.aux_min_prefix + self.aux_min_suffix > self.block_size:
            raise refuse("aux_min_prefix + aux_min_suffix", f"<= block_size = {self.block_size} (a split must fit "
                         f"in the longest sequence)", f"aux_min_prefix={self.aux_min_prefix}, "
                         f"aux_min_suffix={self.aux_min_suffix}")
        if self.aux_ce == 0 and self.aux_kl == 0:
            raise refuse("aux_ce and aux_kl", "both be 0 (the aux term would score nothing)",
                         f"aux_ce={self.aux_ce}, aux_kl={self.aux_kl}", hint="to turn the aux term off set w_aux=0",
                         verb="not")

    # ------------------------------------------------------------------ derived
    @property
    def mode(self) -> str:
        """"tokens" or "vectors"."""
        return "tokens" if self.vocab_size is not None else "vectors"

    @property
    def out_dim(self) -> int:
        """Width of the model's output: vocab_size, or output_dim (default input_dim)."""
        if self.vocab_size is not None:
            return self.vocab_size
        return self.output_dim if self.output_dim is not None else self.input_dim

    def site_dim(self, site: str) -> int:
        """Width of the input of the linear map at `site` (what the template acts on)."""
        Choice(*SITES).check("site", site)
        return site_width(site, self.widths)

    @property
    def widths(self) -> dict[str, int]:
        """The input widths a site can have (sites.WIDTHS): x, the concatenated heads, the MLP's hidden layer."""
        return {"model": self.d_x, "attn": self.d_x, "mlp": self.mlp_ratio * self.d_x}

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["sites"] = list(self.sites)
        return d

    @classmethod
    def from_dict(cls, d: dict, source: str | None = None) -> "CGTConfig":
        """The config a to_dict() dict describes. `source` names where the dict came from in messages
        (e.g. "'run/model/config.json': config"); by default "CGTConfig.from_dict's d"."""
        where = source or "CGTConfig.from_dict's d"
        check_dict(where, d, "a dict of CGTConfig fields (as written by to_dict)")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"{where} holds unknown config keys {unknown} (written by a newer cgt_viz, or edited); "
                             f"allowed: {sorted(known)}")
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def replace(self, **changes) -> "CGTConfig":
        return dataclasses.replace(self, **changes)
