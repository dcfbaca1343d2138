"""Building blocks shared by GPT and CGT: causal attention with an optional KV cache, MLP, the x block,
the joint y block, and the low-rank templates that modulate x above layer ℓ.

Notation (einops letters): b batch, t query time, s key time, d width of x, e width of y,
h heads, c head width, k templates, r template rank, i input width of a modulated map, o its output width.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import einsum, rearrange, repeat

from .sites import SITE_TABLE

# modulate(site, h) -> h', the hook through which CGT transforms the input of a linear map.
Modulator = Optional[Callable[[str, torch.Tensor], torch.Tensor]]


class KVCache:
    """Keys and values of one attention module, grown one call at a time (generation, no autograd).

    They live in buffers with spare room that grow by half when full: appending a token writes one slot
    instead of copying the whole cache (torch.cat per token made every step cost O(length) copies).
    """

    def __init__(self) -> None:
        self._k: torch.Tensor | None = None  # (b, h, capacity, c); the first `length` slots are filled
        self._v: torch.Tensor | None = None
        self._len = 0

    @property
    def k(self) -> torch.Tensor | None:
        """(b, h, s, c), a view of the filled slots."""
        return None if self._k is None else self._k[:, :, :self._len]

    @property
    def v(self) -> torch.Tensor | None:
        return None if self._v is None else self._v[:, :, :self._len]

    @property
    def length(self) -> int:
        return self._len

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        need = self._len + k.shape[2]
        if self._k is None or need > self._k.shape[2]:
            capacity = need + max(need // 2, 32)
            grown_k = k.new_empty(*k.shape[:2], capacity, k.shape[3])
            grown_v = v.new_empty(*v.shape[:2], capacity, v.shape[3])
            if self._len:
                grown_k[:, :, :self._len] = self.k
                grown_v[:, :, :self._len] = self.v
            self._k, self._v = grown_k, grown_v
        self._k[:, :, self._len:need] = k
        self._v[:, :, self._len:need] = v
        self._len = need
        return self.k, self.v

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v) if t is not None)


class SiteLinear(nn.Linear):
    """An nn.Linear whose input can be a template site: with `site` set (by `Block`, from sites.SITE_TABLE) and
    a modulator given, the input h becomes modulate(site, h) before the map. Same parameters as nn.Linear.

    A modulator with a `write(site, h, out)` method also adds to the map's output a term of its own, read from
    the untransformed input h (the token memory: then W T(ȳ) h + ΔW h, which merges as W + B A + B' A').
    """

    site: str | None = None

    def forward(self, h: torch.Tensor, modulate: Modulator = None) -> torch.Tensor:
        if modulate is None or self.site is None:
            return super().forward(h)
        out = super().forward(modulate(self.site, h))
        write = getattr(modulate, "write", None)
        return out if write is None else write(self.site, h, out)


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention reading width `d_in` and writing width `d_model`."""

    def __init__(self, d_in: int, d_model: int, n_head: int, bias: bool, dropout: float):
        super().__init__()
        self.n_head, self.dropout = n_head, dropout
        self.c_attn = SiteLinear(d_in, 3 * d_model, bias=bias)
        self.c_proj = SiteLinear(d_model, d_model, bias=bias)

    def forward(self, h: torch.Tensor, modulate: Modulator = None, cache: KVCache | None = None) -> torch.Tensor:
        # (b, t, 3·h·c) -> three tensors (b, h, t, c)
        q, k, v = rearrange(self.c_attn(h, modulate), "b t (three h c) -> three b h t c", three=3, h=self.n_head)
        past = 0 if cache is None else cache.length
        if cache is not None:
            k, v = cache.append(k, v)
        t, s = q.shape[2], k.shape[2]
        # no past: plain causal attention (right for one query too; a Python bool, so torch.compile does not
        # break the graph on a symbolic t > 1)
        mask, causal = None, past == 0
        if past and t > 1:  # several new queries after a cached past: query i sees keys ≤ past + i
            mask = torch.arange(s, device=h.device)[None, :] <= (past + torch.arange(t, device=h.device))[:, None]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                             dropout_p=self.dropout if self.training else 0.0)
        return self.c_proj(rearrange(out, "b h t c -> b t (h c)"), modulate)


class MLP(nn.Module):
    def __init__(self, d_in: int, d_hidden: int, d_out: int, bias: bool):
        super().__init__()
        self.c_fc = SiteLinear(d_in, d_hidden, bias=bias)
        self.c_proj = SiteLinear(d_hidden, d_out, bias=bias)

    def forward(self, h: torch.Tensor, modulate: Modulator = None) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(h, modulate)), modulate)


class Block(nn.Module):
    """A pre-LN GPT block on x. `modulate` (CGT, layers above ℓ) transforms the inputs of its linear maps."""

    def __init__(self, d: int, n_head: int, mlp_ratio: int, bias: bool, dropout: float):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d, bias=bias)
        self.attn = CausalSelfAttention(d, d, n_head, bias, dropout)
        self.ln_2 = nn.LayerNorm(d, bias=bias)
        self.mlp = MLP(d, mlp_ratio * d, d, bias)
        self.drop = nn.Dropout(dropout)
        for site in SITE_TABLE:   # the maps whose inputs are the template sites (sites.py)
            self.get_submodule(site.gpt_map).site = site.name

    def forward(self, x: torch.Tensor, modulate: Modulator = None, cache: KVCache | None = None) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln_1(x), modulate, cache))
        x = x + self.drop(self.mlp(self.ln_2(x), modulate))
        return x


class YBlock(nn.Module):
    """The y half of a joint layer: heads and MLP that read [x; y] and write into y only."""

    def __init__(self, d: int, e: int, n_head_y: int, mlp_ratio: int, bias: bool, dropout: float):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d + e, bias=bias)
        self.attn = CausalSelfAttention(d + e, e, n_head_y, bias, dropout)
        self.ln_2 = nn.LayerNorm(d + e, bias=bias)
        self.mlp = MLP(d + e, mlp_ratio * e, e, bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, y: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        # x is read, never written: detach nothing (gradients into x's weights are how y learns to read x)
        y = y + self.drop(self.attn(self.ln_1(torch.cat([x, y], dim=-1)), cache=cache))
        y = y + self.drop(self.mlp(self.ln_2(torch.cat([x, y], dim=-1))))
        return y


class SiteTemplates(nn.Module):
    """K rank-r templates at one site κ:  T(ȳ) h = h + Σ_k c_k(ȳ) U_k V_kᵀ h,  c(ȳ) = A ȳ + b.

    `coeff` (A, b) starts at zero, so T = I at initialisation and the untrained CGT is a plain GPT.
    """

    def __init__(self, d_in: int, d_y: int, n_templates: int, rank: int):
        super().__init__()
        self.U = nn.Parameter(torch.randn(n_templates, d_in, rank) / math.sqrt(rank))   # (k, i, r) writes
        self.V = nn.Parameter(torch.randn(n_templates, d_in, rank) / math.sqrt(d_in))   # (k, i, r) reads
        self.coeff = nn.Linear(d_y, n_templates)
        nn.init.zeros_(self.coeff.weight)
        nn.init.zeros_(self.coeff.bias)

    def coefficients(self, ybar: torch.Tensor) -> torch.Tensor:
        """(..., e) -> (..., k)"""
        return self.coeff(ybar)

    def apply(self, h: torch.Tensor, coeffs: torch.Tensor) -> torch.Tensor:
        """h (b, t, i), coeffs (b, t, k) per token or (b, 1, k) frozen -> T(ȳ) h, (b, t, i).

        All K templates at once as two plain matmuls over their k·r columns: h V (i, k·r), scaled by c, times
        Uᵀ (k·r, i). The same values as einsum "b t i, k i r -> b t k r" then "b t k r, k i r -> b t i", at
        less time forward + backward (tests/model/test_model.py compares the values)."""
        reads = rearrange(self.V, "k i r -> i (k r)")
        writes = rearrange(self.U, "k i r -> (k r) i")
        scale = coeffs if self.V.shape[-1] == 1 else repeat(coeffs, "... k -> ... (k r)", r=self.V.shape[-1])
        return h + ((h @ reads) * scale) @ writes

    def factors(self, weight: torch.Tensor, coeffs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """For W (o, i) and coeffs (b, k): A (b, k·r, i), B (b, o, k·r) with W T(ȳ) = W + B @ A."""
        w_u = einsum(weight, self.U, "o i, k i r -> o k r")
        lora_b = rearrange(w_u * coeffs[:, None, :, None], "b o k r -> b o (k r)")
        lora_a = repeat(self.V, "k i r -> b (k r) i", b=coeffs.shape[0])
        return lora_a, lora_b


# which nn.Linear inside a Block reads the input of each site
SITE_WEIGHTS = {site.name: site.gpt_map for site in SITE_TABLE}


def init_weights(module: nn.Module, n_layer: int) -> None:
    """GPT-2 initialisation: N(0, 0.02) weights, zero biases, residual writes (c_proj) scaled by depth."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
    for name, p in module.named_parameters():
        if name.endswith("c_proj.weight"):
            nn.init.normal_(p, 0.0, 0.02 / (2 * n_layer) ** 0.5)


class EMAReadout(nn.Module):
    """ȳ read-out that starts as a causal running mean of LN(x_ℓ): y_ℓ ← g·y_ℓ + EMA_t(P · LN(x_ℓ)).

    EMA_t is a normalised exponential mean over positions s ≤ t, per channel e of the projection P (d → e):
        m_t,e = Σ_{s≤t} λ_e^{t−s} h_s,e / Σ_{s≤t} λ_e^{t−s},   λ_e = sigmoid(θ_e)
    with half-lives 1/(−log₂ λ_e) spread geometrically over [min_half_life, max_half_life] tokens at
    initialisation (θ is learned). The gate g on the y stream starts at 0, so at initialisation ȳ = LN(m_t):
    a multi-timescale mean of the states of layer ℓ. With a KVCache (generation), the projected history is
    kept in it and the mean is recomputed over the whole history.
    """

    def __init__(self, d: int, e: int, min_half_life: float = 16.0, max_half_life: float = 256.0):
        super().__init__()
        self.ln = nn.LayerNorm(d, elementwise_affine=False)
        self.proj = nn.Linear(d, e, bias=False)
        nn.init.normal_(self.proj.weight, 0.0, 1.0 / math.sqrt(d))
        half = torch.logspace(math.log10(min_half_life), math.log10(max_half_life), e)
        lam = torch.exp2(-1.0 / half)
        self.theta = nn.Parameter(torch.log(lam / (1 - lam)))     # logit of λ
        self.gate = nn.Parameter(torch.zeros(()))

    def weights(self, t_new: int, s_total: int, device) -> torch.Tensor:
        """(e, t_new, s_total): the normalised weights of the last t_new positions over all s_total."""
        log_lam = F.logsigmoid(self.theta)                                             # (e,)
        t_pos = torch.arange(s_total - t_new, s_total, device=device)[:, None]
        s_pos = torch.arange(s_total, device=device)[None, :]
        lag = (t_pos - s_pos).float()                                                  # (t, s)
        logits = lag[None] * log_lam[:, None, None]
        logits = logits.masked_fill((lag < 0)[None], float("-inf"))
        return torch.softmax(logits, dim=-1)                                           # Σ_s = 1: the normalised mean

    def forward(self, x: torch.Tensor, y: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        h = self.proj(self.ln(x))                                                      # (b, t, e)
        t = h.shape[1]
        if cache is not None:
            hist, _ = cache.append(h[:, None], h[:, None])
            h = hist[:, 0]                                                             # (b, s, e)
        w = self.weights(t, h.shape[1], h.device).to(h.dtype)
        mean = einsum(w, h, "e t s, b s e -> b t e")
        return self.gate * y + mean


PAIR_BUCKETS = 1 << 16   # "pair" token shift: pairs beyond this many share rows (hashed)


class TokenShift(nn.Module):
    """What came before each position, embedded and added to x.0 (RWKV's token shift, on the embeddings).

    "previous"  E_prev(input_{t−1}): tokens or vectors; a start row (tokens) or 0 (vectors) at position 0
    "pair"      E_pair(input_{t−1}, input_t): one row per (previous, current) token pair (tokens mode;
                hashed into PAIR_BUCKETS rows when there are more pairs), like a two-token vocabulary
    An answer position then already holds its query: pairing them needs no previous-token attention head.
    With a KVCache the raw inputs are kept in it, so token-by-token generation gives the same x.0.
    """

    def __init__(self, kind: str, vocab_size: int | None, input_dim: int | None, d: int):
        super().__init__()
        self.kind, self.vocab_size = kind, vocab_size
        if kind == "pair":
            self.buckets = min((vocab_size + 1) * vocab_size, PAIR_BUCKETS)
            self.embed = nn.Embedding(self.buckets, d)
        else:
            self.embed = nn.Embedding(vocab_size + 1, d) if vocab_size is not None else nn.Linear(input_dim, d, bias=False)

    def forward(self, inp: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        tokens = self.vocab_size is not None
        b, t = inp.shape[:2]
        before = None                                                                  # the input before inp[:, 0]
        if cache is not None:
            raw = (inp.float() if tokens else inp).reshape(b, 1, t, -1)               # (b, 1, t, c)
            hist, _ = cache.append(raw, raw)
            if hist.shape[2] > t:
                before = hist[:, 0, -t - 1]                                            # (b, c)
        if tokens:
            start = torch.full((b, 1), self.vocab_size, dtype=inp.dtype, device=inp.device)
            first = start if before is None else before.long()
            prev = torch.cat([first, inp[:, :-1]], dim=1)                              # (b, t), V = no previous
            if self.kind == "previous":
                return self.embed(prev)
            exact = self.buckets == (self.vocab_size + 1) * self.vocab_size
            return self.embed(prev * self.vocab_size + inp if exact else (prev * 1_000_003 + inp) % self.buckets)
        first = torch.zeros_like(inp[:, :1]) if before is None else before[:, None]
        return self.embed(torch.cat([first, inp[:, :-1]], dim=1))                      # (b, t, input_dim) -> (b, t, d)


class TokenMemory(nn.Module):
    """Update directions read from the prompt's own tokens: a compiled memory of what the prompt said.

    At the map W (o, i) of each memory layer ν (the map that reads the MLP's hidden state, writing the residual):

        W' = W + s_ν / m · Σ_j u(t_{j+1}) (a_ν,j − ā_ν)ᵀ,     a_ν,j = D_ν K_ν R LN(x_ℓ,j),   ā_ν = mean_j a_ν,j

    one rank-one term per prompt position j = 1..p−2 (m = p − 2; position 0, the attention sink, is left out).
    Its key a_ν,j (i,) is read from the prompt's layer-ℓ state at j; its value u(t) (o,) is the LM's output
    embedding row of the token t_{j+1} that followed position j in the prompt. So the compiled model, in a state
    like the one the prompt was in before t_{j+1}, raises t_{j+1}: the document's own names and words, where the
    pooled templates can only carry its topic. ΔW = B A with A (m, i) the keys and B (o, m) the scaled values: a
    LoRA of rank m (its rank grows with the prompt), merged, exported and costing what any LoRA does.

    The keys are centred over the prompt's slots, so a slot writes only as far as the state it is read at is
    more like its own position than like the prompt's average one: without that, a · h is dominated by what all
    positions share (the top layers' MLP inputs have a few very large features), and the memory becomes a
    broad boost of every prompt token whatever the context. D_ν (the buffer `in_scale`, 1 until
    `calibrate_memory` sets it to the inverse variance of each input feature) makes a · h a similarity in
    units of each feature's spread. Both are linear in h, so the compile stays one low-rank ΔW.

    R (d → rank) is shared by the layers, K_ν (rank → i) is each layer's; s_ν starts at 0, so an untrained
    memory leaves the model as it is. s_ν is counted in units (the buffer `unit`, 1 until `calibrate_memory`
    sets it) in which s = 1 writes about as much as the layer's MLP does, so that an optimizer's step size means
    the same at every layer and width. In the full (per-token) mode position t uses the slots j ≤ t − 1 (their
    next token already read), centred over those, with m = t − 1: the same map as the compile of the prefix
    ending at t.

    `CGT` builds it from `CGTConfig.memory_layers`/`memory_rank` in both families (a from-scratch GPT stream or
    `hf.CGTLM`) and owns its compile, merge and training; an x stream supplies only the map (`sites.MEMORY_SITE`'s)
    and the output-embedding rows u.
    """

    def __init__(self, d: int, d_in: int, layers: list[int], rank: int):
        super().__init__()
        self.layers = [int(layer) for layer in layers]
        self.read = nn.Linear(d, rank, bias=False)                                    # R, shared
        self.keys = nn.ModuleDict({str(layer): nn.Linear(rank, d_in, bias=False) for layer in self.layers})   # K_ν
        self.scale = nn.Parameter(torch.zeros(len(self.layers)))                      # s_ν
        self.register_buffer("unit", torch.ones(len(self.layers)))
        self.register_buffer("in_scale", torch.ones(len(self.layers), d_in))          # D_ν
        self.norm = 1.0 / math.sqrt(d_in)      # keeps a · h of order one at any width

    def slot_keys(self, layer: int, states: torch.Tensor) -> torch.Tensor:
        """states (b, s, d): LN(x_ℓ) of the prompt's positions -> keys a_ν (b, s, i), not yet centred, with D_ν
        and the 1/√i scale folded in."""
        return self.keys[str(layer)](self.read(states)) * (self.in_scale[self.layers.index(layer)] * self.norm)

    def gain(self, layer: int) -> torch.Tensor:
        at = self.layers.index(layer)
        return self.scale[at] * self.unit[at]

    def factors(self, layer: int, states: torch.Tensor, values: torch.Tensor,
                mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The compiled update of one layer from m slots: states (b, m, d), values (b, m, o) (u(t_{j+1}) of each
        slot) -> A (b, m, i), B (b, o, m) with ΔW = B @ A. mask (b, m) bool: only those slots count (rows whose
        prompts differ in length, padded to m); the others get zero rows in A and columns in B."""
        keys = self.slot_keys(layer, states)
        if mask is None:
            lora_a = keys - keys.mean(1, keepdim=True)                                # centred over the slots
            lora_b = rearrange(values, "b m o -> b o m") * (self.gain(layer) / max(states.shape[1], 1))
            return lora_a, lora_b
        keep = mask.to(keys.dtype)[..., None]                                         # (b, m, 1)
        count = keep.sum(1, keepdim=True).clamp_min(1)                                # (b, 1, 1): each row's m
        lora_a = (keys - (keys * keep).sum(1, keepdim=True) / count) * keep           # centred over its own slots
        lora_b = rearrange(values * keep, "b m o -> b o m") * (self.gain(layer) / count)
        return lora_a, lora_b

    @staticmethod
    def apply_fixed(h: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor) -> torch.Tensor:
        """ΔW h for a compiled memory: h (b, t, i), A (b, m, i), B (b, o, m) -> (b, t, o)."""
        return (h @ lora_a.transpose(1, 2)) @ lora_b.transpose(1, 2)

    def apply_causal(self, layer: int, h: torch.Tensor, states: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """ΔW_t h_t of the full mode, each position with the memory of its own prefix: h (b, t, i), states
        (b, t, d) LN(x_ℓ) of this pass, values (b, t, o) u(t_{j+1}) per position j (the last one unused) -> (b, t, o)."""
        t = h.shape[1]
        scores = h @ self.slot_keys(layer, states).transpose(1, 2)                    # (b, t query, t slot)
        j = torch.arange(t, device=h.device)
        usable = (j[None, :] >= 1) & (j[None, :] <= j[:, None] - 1)                   # slot j at query q: 1 ≤ j ≤ q − 1
        count = (j - 1).clamp_min(1).to(h.dtype)                                      # (t,): m at each query
        usable = usable.to(h.dtype)
        centre = (scores * usable).sum(2, keepdim=True) / count[:, None]              # a_j · h averaged over q's slots
        weights = (scores - centre) * usable / count[:, None]
        return self.gain(layer) * (weights @ values)
