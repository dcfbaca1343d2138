"""CGTConfig: every size and switch of a Contextually Guided Transformer, validated on creation.

The same config describes the plain baseline: `GPT(cfg)` reads only the x-stream fields
(input mode, block_size, n_layer, d_x, n_head, mlp_ratio, bias, dropout).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

SITES = ("attn_in", "attn_out", "mlp_in", "mlp_out")
SMOOTH_KINDS = ("l2", "vae")
Y_READS = ("post", "pre")


def _check_int(name: str, value: Any, lo: int | None = None, hi: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if lo is not None and value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise ValueError(f"{name} must be <= {hi}, got {value}")


def _check_float(name: str, value: Any, lo: float = 0.0, lo_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be finite, got {value}")
    if (value <= lo) if lo_open else (value < lo):
        raise ValueError(f"{name} must be {'>' if lo_open else '>='} {lo}, got {value}")


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
    # --- y stream: narrow, lives in layers 1..y_layer, reads x, never writes into x ---
    d_y: int = 64                      # width of y and of the summary ybar
    n_head_y: int = 2                  # y heads (d_y / n_head_y per head)
    y_layer: int = 2                   # ℓ: ybar = LN(y_ℓ); layers ℓ+1..N are modulated
    y_reads: str = "post"              # y block ν reads x_ν after its x block ("post") or x_{ν−1} ("pre")
    y_pos: bool = True                 # y gets its own position embedding (else only a token embedding)
    # --- templates: per modulated site, K rank-r operators mixed by c(ybar) = A ybar + b ---
    n_templates: int = 8               # K
    template_rank: int = 1             # r
    sites: tuple[str, ...] = ("attn_in", "mlp_in")   # subset of SITES
    # --- losses: total = main + w_aux * aux + w_smooth * smooth ---
    w_aux: float = 1.0                 # w_C, auxiliary specialisation loss
    w_smooth: float = 0.0              # w_D, smoothness of ybar along the sequence
    smooth: str = "l2"                 # "l2": mean ||ybar_t − ybar_{t−1}||²; "vae": noisy ybar + KL
    vae_sigma: float = 0.1             # "vae": initial posterior std of ybar
    vae_tau: float = 1.0               # "vae": random-walk prior std
    aux_min_prefix: int = 1            # s_min: the split leaves at least this many prefix tokens
    aux_min_suffix: int = 1            # m_min: ... and at least this many suffix tokens
    aux_suffix_len: int | None = None  # if set, the aux pass sees only this many suffix tokens
    extra: dict = field(default_factory=dict)  # free-form metadata (task name, tokenizer, ...)

    def __post_init__(self) -> None:
        if isinstance(self.sites, str):
            raise TypeError(f"sites must be a tuple of site names from {SITES}, got the string {self.sites!r}")
        self.sites = tuple(self.sites)
        self.validate()

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        if (self.vocab_size is None) == (self.input_dim is None):
            raise ValueError(
                "set exactly one of vocab_size (tokens mode) or input_dim (vectors mode); "
                f"got vocab_size={self.vocab_size!r}, input_dim={self.input_dim!r}")
        if self.vocab_size is not None:
            _check_int("vocab_size", self.vocab_size, lo=1)
            if self.output_dim is not None:
                raise ValueError(f"output_dim is for vectors mode only; got output_dim={self.output_dim} "
                                 f"with vocab_size={self.vocab_size}")
        else:
            _check_int("input_dim", self.input_dim, lo=1)
            if self.output_dim is not None:
                _check_int("output_dim", self.output_dim, lo=1)
        _check_int("block_size", self.block_size, lo=1)
        _check_int("n_layer", self.n_layer, lo=2)
        _check_int("d_x", self.d_x, lo=1)
        _check_int("n_head", self.n_head, lo=1)
        if self.d_x % self.n_head:
            raise ValueError(f"d_x must be divisible by n_head; got d_x={self.d_x}, n_head={self.n_head}")
        _check_int("mlp_ratio", self.mlp_ratio, lo=1)
        _check_float("dropout", self.dropout)
        if self.dropout >= 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        _check_int("d_y", self.d_y, lo=1)
        _check_int("n_head_y", self.n_head_y, lo=1)
        if self.d_y % self.n_head_y:
            raise ValueError(f"d_y must be divisible by n_head_y; got d_y={self.d_y}, n_head_y={self.n_head_y}")
        _check_int("y_layer", self.y_layer)
        if not 1 <= self.y_layer <= self.n_layer - 1:
            raise ValueError(f"y_layer must be in 1..n_layer-1 = 1..{self.n_layer - 1}, got {self.y_layer}")
        if self.y_reads not in Y_READS:
            raise ValueError(f"y_reads must be one of {Y_READS}, got {self.y_reads!r}")
        _check_int("n_templates", self.n_templates, lo=1)
        _check_int("template_rank", self.template_rank, lo=1)
        if not self.sites:
            raise ValueError(f"sites must name at least one of {SITES}, got an empty tuple")
        for s in self.sites:
            if s not in SITES:
                raise ValueError(f"unknown site {s!r} in sites; allowed: {SITES}")
        if len(set(self.sites)) != len(self.sites):
            raise ValueError(f"sites must not repeat a name, got {self.sites}")
        _check_float("w_aux", self.w_aux)
        _check_float("w_smooth", self.w_smooth)
        if self.smooth not in SMOOTH_KINDS:
            raise ValueError(f"smooth must be one of {SMOOTH_KINDS}, got {self.smooth!r}")
        _check_float("vae_sigma", self.vae_sigma, lo_open=True)
        _check_float("vae_tau", self.vae_tau, lo_open=True)
        _check_int("aux_min_prefix", self.aux_min_prefix, lo=1)
        _check_int("aux_min_suffix", self.aux_min_suffix, lo=1)
        if self.aux_suffix_len is not None:
            _check_int("aux_suffix_len", self.aux_suffix_len, lo=1)
        if not isinstance(self.extra, dict):
            raise TypeError(f"extra must be a dict, got {type(self.extra).__name__}")

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
        return self.mlp_ratio * self.d_x if site == "mlp_out" else self.d_x

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["sites"] = list(self.sites)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "CGTConfig":
        if not isinstance(d, dict):
            raise TypeError(f"config must be a dict, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown config keys {unknown}; allowed: {sorted(known)}")
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def replace(self, **changes) -> "CGTConfig":
        return dataclasses.replace(self, **changes)
