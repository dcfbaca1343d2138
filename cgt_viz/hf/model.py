"""CGTLM: a CGT whose x stream is a frozen pretrained Hugging Face causal LM (a family with a layout: Llama,
Mistral, Qwen2/3, GPT-2; `hf.layouts`).

Notation (einops letters): b batch, t time, d width of the LM (x), e width of y (d_y), k templates (K),
r template rank, i input width of a modulated map, o its output width, v vocabulary, ν layer (1-based).

The CGT (`cgt_viz.model.CGT`: y stream, ȳ, templates, loss, named outputs, specialize, ablation) over the
x stream `hf.stream.HFStream`, which runs the LM with hooks for one call at a time. What is this family's own:

* the y stream reads the outputs x_1..x_ℓ of decoder layers 1..ℓ (`YBlock`s reading [x_ν; y], writing y only)
  and starts at y.0 = 0;
* ȳ = LN(y_ℓ + P (mean_{1≤s≤t} LN(x_ℓ,s) − μ)): the y blocks' output projections start at zero, so at
  initialisation ȳ is a projected causal running mean of the layer-ℓ states (position 0, the attention
  sink with a norm many times the others, is left out of the mean once t > 0). The summary pools over
  the whole prefix from the first step instead of reading one token (or, with `pool_half_life`, an
  exponential mean that forgets what came long before). P starts as a random projection and μ at 0;
  `calibrate_pool(tokens)` sets them to the principal directions and mean of a sample.
* above ℓ, each site's input is transformed by T(ȳ) (c = A ȳ + b starts at 0, so the untrained CGTLM is the
  LM) by one hook on the module the LM's layout (`hf.layouts`) names for it, merged into the maps it lists.

Because every map reading a site is linear, W T(ȳ) = W + (W U diag c) Vᵀ exactly: `specialize` merges
that product into copies of the modulated weights only (every other tensor is shared with `lm`; with
share_weights=False into a copy of lm) and hands back a model of lm's own class; `export_peft` writes the
same product as a PEFT LoRA adapter (rank K·r, alpha = rank, so scale 1) for the untouched base.

Named outputs (`run_with_cache`): `cgt_viz.outputs.OUTPUTS`, as for a CGT (y.0 is zeros here, no ybar_sigma).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .._checks import Bool, Device, Folder, check_bool, check_float, check_int, checked, describe, refuse
from ..config import CGTConfig
from ..contracts import IGNORE_INDEX, check_inputs, check_prompts
from ..distill import aux_objective
from ..io import CONFIG_NAME, WEIGHTS_NAME, load_tensors, model_folder, read_json, save_tensors, warn_non_finite, write_json
from ..losses import SMOOTHNESS, take_positions
from ..model import CGT, LoraFactors
from ..outputs import X
from ..sites import MEMORY_SITE
from .layouts import LAYOUTS, SUPPORTED_MODEL_TYPES, layout_of
from .source import require
from .stream import HFStream, StopAfterY, hooks, own_thread, pass_lock, upper_hidden

# site -> (module hooked, its output (True) or input (False), the maps that read it) of the Llama layout: the
# view callers of hf.SITE_MODULES had before layouts (every family's is hf.layouts.LAYOUTS[model_type].sites)
SITE_MODULES: dict[str, tuple[str, bool, tuple[str, ...]]] = {
    site: (where.at, where.output, where.maps) for site, where in LAYOUTS["llama"].sites.items()}
VOCAB_CHUNK = 8192   # the loss computes logits this many vocabulary entries at a time


def check_lm(lm: Any, name: str = "lm") -> None:
    """TypeError/ValueError unless lm is a transformers causal LM of a family with a layout, laid out as it says."""
    transformers = require("transformers")
    if not isinstance(lm, transformers.PreTrainedModel):
        raise refuse(name, "a transformers causal LM (a PreTrainedModel such as LlamaForCausalLM, e.g. from "
                     "cgt_viz.hf.smollm2())", describe(lm), TypeError)
    model_type = getattr(lm.config, "model_type", None)
    if model_type not in LAYOUTS:
        raise refuse(name, f"a causal LM of a family with a layout (config.model_type one of "
                     f"{SUPPORTED_MODEL_TYPES}; cgt_viz.hf.layouts)", f"{type(lm).__name__} with model_type {model_type!r}")
    problem = LAYOUTS[model_type].problems(lm)
    if problem is not None:
        raise refuse(name, f"the {LAYOUTS[model_type].name} decoder layout (cgt_viz.hf.layouts)",
                     f"{type(lm).__name__}: {problem}", verb="have")


def lm_facts(lm) -> dict:
    """What a CGTLM's config records of its LM (and from_pretrained checks against the LM it is given)."""
    c = lm.config
    return {"model_type": c.model_type, "hidden_size": c.hidden_size, "num_hidden_layers": c.num_hidden_layers,
            "vocab_size": c.vocab_size, "intermediate_size": layout_of(lm).widths(c)["mlp"]}


def check_cgtlm(model: Any, name: str = "model", *, pooled_only: bool = False) -> None:
    """TypeError unless model is a CGTLM; ValueError unless it is a CGTLM(pooled_only=True) when that is needed
    (the feature cache: with y blocks ȳ depends on x_1..x_ℓ of every prefix token, which the cache does not hold)."""
    if not isinstance(model, CGTLM):
        raise refuse(name, "a cgt_viz.hf.CGTLM", describe(model), TypeError)
    if pooled_only and not model.pooled_only:
        raise refuse(name, "a CGTLM(pooled_only=True) for the feature cache", "a CGTLM with y blocks",
                     hint="with y blocks ȳ depends on x_1..x_ℓ of every prefix token, which the cache does not hold "
                          "(train it with CGTLM.loss)")


def causal_mean_skip_first(h: torch.Tensor) -> torch.Tensor:
    """h (b, t, d) -> (b, t, d): at t = 0 h_0, at t ≥ 1 the mean of h_1..h_t (position 0 left out)."""
    if h.shape[1] == 1:
        return h
    rest = h[:, 1:].cumsum(1) / torch.arange(1, h.shape[1], device=h.device, dtype=h.dtype)[None, :, None]
    return torch.cat([h[:, :1], rest], dim=1)


def causal_ema_skip_first(h: torch.Tensor, half_life: float, chunk: int = 256) -> torch.Tensor:
    """h (b, t, d) -> (b, t, d): at t = 0 h_0, at t ≥ 1 the normalised exponential mean of h_1..h_t,
    Σ_s λ^(t−s) h_s / Σ_s λ^(t−s) with λ = 2^(−1/half_life): a token half_life positions back weighs half.

    Exact, in chunks: within a chunk a (c, c) lower-triangular weight matrix, across chunks the running
    unnormalised sum and its weight carried over, so memory is O(t · chunk) and nothing overflows."""
    if h.shape[1] == 1:
        return h
    lam = 2.0 ** (-1.0 / half_life)
    rest, out = h[:, 1:].float(), []
    carry, weight = torch.zeros_like(rest[:, 0]), 0.0                        # (b, d), scalar
    for piece in rest.split(chunk, dim=1):                                   # (b, c, d)
        j = torch.arange(piece.shape[1], device=h.device, dtype=torch.float32)
        lag = j[:, None] - j[None, :]                                        # (c, c)
        w = torch.where(lag >= 0, lam ** lag.clamp(min=0), torch.zeros(()))  # (c, c): causal weights
        decay = lam ** (j + 1)                                               # (c,): what the carry keeps
        total = torch.einsum("ts,bsd->btd", w, piece) + decay[None, :, None] * carry[:, None]
        norm = w.sum(1) + decay * weight                                     # (c,)
        out.append(total / norm[None, :, None])
        carry, weight = total[:, -1], float(norm[-1])
    return torch.cat([h[:, :1], torch.cat(out, dim=1).to(h.dtype)], dim=1)


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          chunk: int = VOCAB_CHUNK) -> torch.Tensor:
    """Per-token cross-entropy of logits hidden @ weightᵀ without holding the (n, v) logits.

    hidden (n, d), weight (v, d), targets (n,) in 0..v−1 -> (n,) float32. Each vocabulary chunk's
    log-sum-exp is recomputed in the backward pass (activation checkpointing), so memory is O(n · chunk)."""
    def lse(h, w):
        return (h @ w.t()).float().logsumexp(-1)                     # (n, chunk) -> (n,)

    total = None
    for w in weight.split(chunk):
        part = checkpoint(lse, hidden, w, use_reentrant=False) if torch.is_grad_enabled() else lse(hidden, w)
        total = part if total is None else torch.logaddexp(total, part)
    target_logit = (hidden * weight[targets]).sum(-1).float()        # (n, d) -> (n,)
    return total - target_logit


class CGTLM(CGT):
    """A CGT over a frozen transformers causal LM: y heads read layers 1..ℓ, templates modulate ℓ+1..N.

    lm              a transformers causal LM of a family with a layout (`hf.layouts`: Llama, Qwen2, GPT-2, ...;
                    e.g. `smollm2()[0]`); frozen here (requires_grad False)
    y_layer         ℓ: the y stream reads decoder layers 1..ℓ; layers ℓ+1..N are modulated
    d_y, n_head_y   width and heads of y (d_y divisible by n_head_y)
    n_templates     K templates per site, template_rank r each
    sites           subset of ("attn_in", "attn_out", "mlp_in", "mlp_out")
    w_aux, w_smooth, smooth, aux_min_prefix, aux_min_suffix, aux_suffix_len, aux_row_fraction:
                    the loss terms, as in CGTConfig (smooth: a kind of losses.SMOOTHNESS without a posterior)
    block_size      longest input (default: the LM's max_position_embeddings)
    y_mlp_ratio     hidden width of a y block's MLP = y_mlp_ratio · d_y
    pool_half_life  None: the pooled read-out is the causal mean over the whole prefix; a number h: an
                    exponential mean in which a state h tokens back weighs half, so ȳ follows the recent
                    text (after a topic switch it forgets the old topic instead of averaging it in)
    pooled_only     no y blocks: ȳ = LN(P (pooled read-out − μ)) alone. Then ȳ depends on the prefix only
                    through one pooled vector of layer ℓ, so a feature cache (cgt_viz.hf.distill) can hold
                    everything the head's training needs that does not depend on its parameters
    aux_ce, aux_kl, aux_kl_top_k
                    the aux term: aux_ce · cross-entropy + aux_kl · KL to the LM with the prefix in context
                    (context distillation; the teacher's top-k + a rest bucket, None: the whole vocabulary)

    It is a `cgt_viz.CGT` (so `train`, `evaluate_specialization`, the analysis functions and the widgets
    take it), but `specialize` returns a model of lm's own class and `x_only` the LM itself.
    """

    stream = HFStream

    def __init__(self, lm, y_layer: int = 8, d_y: int = 64, n_head_y: int = 4, n_templates: int = 8,
                 template_rank: int = 2, sites: Sequence[str] = ("attn_in", "mlp_in"), *, w_aux: float = 1.0,
                 w_smooth: float = 0.0, smooth: str = "l2", aux_min_prefix: int = 1, aux_min_suffix: int = 1,
                 aux_suffix_len: int | None = None, aux_row_fraction: float = 1.0, aux_ce: float = 1.0,
                 aux_kl: float = 0.0, aux_kl_top_k: int | None = None, block_size: int | None = None,
                 y_mlp_ratio: int = 4, pool_half_life: float | None = None, pooled_only: bool = False,
                 memory_layers: int = 0, memory_rank: int = 64):
        check_lm(lm)
        c = lm.config
        n_layer = c.num_hidden_layers
        check_int("y_layer", y_layer, 1, n_layer - 1,
                  hint=f" (1..num_hidden_layers-1 = 1..{n_layer - 1}: {type(lm).__name__} has {n_layer} layers)")
        plain = [kind for kind, entry in SMOOTHNESS.items() if not entry.posterior]
        if smooth not in plain:   # a posterior kind needs σ of ȳ, which this y stream does not learn
            raise refuse("smooth", f"{' or '.join(map(repr, plain))} for a CGTLM (a kind with a posterior over ȳ is "
                         f"not implemented here)", repr(smooth))
        max_pos = int(getattr(c, "max_position_embeddings", 2048))
        block_size = max_pos if block_size is None else block_size
        check_int("block_size", block_size, 2, max_pos, hint=f" (the LM's max_position_embeddings is {max_pos})")
        check_int("y_mlp_ratio", y_mlp_ratio, 1)
        if pool_half_life is not None:
            pool_half_life = check_float("pool_half_life", pool_half_life, 0.0, None, lo_open=True,
                                         hint=" (tokens; None for the causal mean over the whole prefix)")
        check_bool("pooled_only", pooled_only)
        check_int("memory_layers", memory_layers, 0, n_layer - y_layer,
                  hint=f" (0: no token memory; at most the {n_layer - y_layer} layers above y_layer={y_layer})")
        check_int("memory_rank", memory_rank, 1)
        if memory_layers and MEMORY_SITE in tuple(sites):
            # the memory reads the input of that site's map, which the templates would transform first: the
            # merged map would then be (W + B A) T, not W T + B A
            raise refuse("sites", f"no {MEMORY_SITE!r} with memory_layers > 0 (the token memory writes at that "
                         f"site's map)", repr(tuple(sites)))
        cfg = CGTConfig(
            vocab_size=c.vocab_size, block_size=block_size, n_layer=n_layer, d_x=c.hidden_size,
            n_head=c.num_attention_heads, mlp_ratio=y_mlp_ratio, bias=True, d_y=d_y, n_head_y=n_head_y,
            y_layer=y_layer, y_pos=False, n_templates=n_templates, template_rank=template_rank, sites=sites,
            w_aux=w_aux, w_smooth=w_smooth, smooth=smooth, aux_min_prefix=aux_min_prefix,
            aux_min_suffix=aux_min_suffix, aux_suffix_len=aux_suffix_len, aux_row_fraction=aux_row_fraction,
            aux_ce=aux_ce, aux_kl=aux_kl, aux_kl_top_k=aux_kl_top_k,
            memory_layers=memory_layers, memory_rank=memory_rank,
            extra={"hf": {"model_type": c.model_type, "class": type(lm).__name__,
                          "name_or_path": str(getattr(c, "_name_or_path", "")), "hidden_size": c.hidden_size,
                          "intermediate_size": lm_facts(lm)["intermediate_size"], "num_hidden_layers": n_layer,
                          "vocab_size": c.vocab_size, "pool_half_life": pool_half_life,
                          "pooled_only": pooled_only, "memory_layers": memory_layers,
                          "memory_rank": memory_rank}})
        CGT.__init__(self, cfg, lm=lm)   # the y stream and templates as every CGT's; the x stream is lm (_build_x)
        self.pool_half_life, self.pooled_only = pool_half_life, pooled_only

    def _build_x(self, cfg: CGTConfig, lm=None) -> None:
        """The x stream is the frozen LM (y starts at zero: no y embedding)."""
        self.lm = lm.requires_grad_(False).eval()

    def _n_y_blocks(self, cfg: CGTConfig) -> int:
        return 0 if cfg.extra["hf"]["pooled_only"] else cfg.y_layer

    def _init_y(self, cfg: CGTConfig) -> None:
        """y blocks that start silent, and the pooled read-out of LN(x_ℓ): ln_x, P and μ."""
        d, e = cfg.d_x, cfg.d_y
        for block in self.y_blocks:
            for m in block.modules():
                if isinstance(m, nn.Linear):
                    nn.init.normal_(m.weight, 0.0, 0.02)
                    nn.init.zeros_(m.bias)
            # y starts at 0 and stays there until trained: ȳ begins as the pooled read-out alone
            for proj in (block.attn.c_proj, block.mlp.c_proj):
                nn.init.zeros_(proj.weight)
        self.ln_x = nn.LayerNorm(d, elementwise_affine=False)
        self.pool = nn.Linear(d, e, bias=False)                      # P: d -> e, a random projection at init
        nn.init.normal_(self.pool.weight, 0.0, d ** -0.5)
        self.pool_center = nn.Parameter(torch.zeros(d))             # μ, subtracted before P (see calibrate_pool)

    # ------------------------------------------------------------------ module plumbing
    def train(self, mode: bool = True) -> "CGTLM":
        """Train/eval the y stream and templates; the LM always stays in eval mode (no dropout)."""
        super().train(mode)
        self.lm.eval()
        return self

    def state_dict(self, *args, **kwargs):
        """The y stream and templates only: the LM's weights are not part of a CGTLM's state."""
        state = super().state_dict(*args, **kwargs)
        prefix = kwargs.get("prefix", args[1] if len(args) > 1 else "") + "lm."   # (destination, prefix, keep_vars)
        for key in [k for k in state if k.startswith(prefix)]:
            del state[key]
        return state

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Load the y stream and templates (keys of the LM, if present, must match it and are ignored)."""
        own = {k: v for k, v in state_dict.items() if not k.startswith("lm.")}
        missing, unexpected = super().load_state_dict(own, strict=False, assign=assign)
        missing = [k for k in missing if not k.startswith("lm.")]
        if strict and (missing or unexpected):
            raise RuntimeError(f"state_dict does not match this CGTLM: missing {missing[:5]}, unexpected {unexpected[:5]}")
        return nn.modules.module._IncompatibleKeys(missing, unexpected)

    @property
    def device(self) -> torch.device:
        return self.pool.weight.device

    # ------------------------------------------------------------------ the pass
    def _read(self, pooled: torch.Tensor) -> torch.Tensor:
        """P (pooled − μ): pooled (..., d) read-out of LN(x_ℓ) -> (..., e), in the y stream's dtype."""
        return self.pool(pooled.to(self.pool.weight.dtype) - self.pool_center)

    def summary_of_pooled(self, pooled: torch.Tensor) -> torch.Tensor:
        """ȳ of a pooled-only head (no y blocks) from a pooled read-out (..., d) -> (..., e): LN(P (pooled − μ)).
        The pooled read-out is pooled_readout's (or the feature cache's "pooled"); it is not checked here."""
        return self.ln_y(self._read(pooled))

    def ybar_from_states(self, xs: list[torch.Tensor], record: dict | None = None) -> torch.Tensor:
        """ȳ (b, t, e) from layer states x_1..x_ℓ already computed (each (b, t, d), e.g. lower_cache's "x.1".."x.ℓ"
        of another head on the same LM): the y stream alone, no LM pass; equal to context() of the ids they came
        from. `record` (a dict) receives the y stream's named outputs. The states are not checked here."""
        ystep, out = self._y_stream(xs[0][..., 0], record=record, stop=True)
        for nu, x in enumerate([None, *xs]):
            ystep(nu, x if x is None or torch.is_autocast_enabled() else x.to(self.pool.weight.dtype))
        return out["mu"]

    @torch.no_grad()
    def pooled_readout(self, idx: torch.Tensor) -> torch.Tensor:
        """The pooled read-out of LN(x_ℓ) after the last token of each row: idx (b, t) -> (b, d). With
        pooled_only, ȳ after the last token is `summary_of_pooled` of it: the one thing about a prompt the head
        reads."""
        idx = check_inputs(self.config, idx, device=self.device)
        return self._pooled_last(self.x_at_layer(idx))

    def _pooled_last(self, x: torch.Tensor) -> torch.Tensor:
        """The pooled read-out of LN(x) after the last position: x (b, t, d) layer-ℓ states -> (b, d)."""
        return self._pooled(self.ln_x(x.to(self.pool.weight.dtype)))[:, -1]

    @torch.no_grad()
    def teacher_pass(self, idx: torch.Tensor, prompt_len: int, states: bool = False) -> tuple[torch.Tensor, ...]:
        """The plain LM (no templates) over idx (b, t): the distillation teacher. -> its final hidden states
        (b, t, d) and, from the same pass, the pooled read-out after the first prompt_len tokens (b, d); with
        states also the prompt's layer-ℓ states x_ℓ (b, prompt_len, d) (what a token memory reads)."""
        grabbed = {}
        with pass_lock(self.lm):
            layout = layout_of(self.lm)
            handle = layout.layers_of(self.lm)[self.config.y_layer - 1].register_forward_hook(own_thread(
                lambda module, args, out: grabbed.__setitem__("x", out[0] if isinstance(out, tuple) else out)))
            try:
                hidden = layout.final_hidden(self.lm, idx)
            finally:
                handle.remove()
        pooled = self._pooled_last(grabbed["x"][:, :prompt_len])
        return (hidden, pooled, grabbed["x"][:, :prompt_len]) if states else (hidden, pooled)

    @torch.no_grad()
    def x_at_layer(self, idx: torch.Tensor, layer: int | None = None) -> torch.Tensor:
        """x_ν (b, t, d), the output of decoder layer ν (default ℓ), from a pass of the plain LM that stops there."""
        layer = self.config.y_layer if layer is None else check_int("layer", layer, 1, self.config.n_layer)
        idx = check_inputs(self.config, idx)
        out = {}

        def grab(module, args, output):
            out["x"] = output[0] if isinstance(output, tuple) else output
            raise StopAfterY

        with pass_lock(self.lm):
            layout = layout_of(self.lm)
            handle = layout.layers_of(self.lm)[layer - 1].register_forward_hook(own_thread(grab))
            try:
                layout.final_hidden(self.lm, idx)
            except StopAfterY:
                pass
            finally:
                handle.remove()
        return out["x"]

    def _upper_hidden(self, x_ell: torch.Tensor, coeffs: dict) -> torch.Tensor:
        """Layers ℓ+1..N only, over given layer-ℓ states x_ell (b, t, d) (positions from 0), with T fixed by
        coeffs {"ν.site": (b, 1, K)} -> final normed hidden states (b, t, d). The short pass of a feature-cache
        step: nothing below ℓ + 1 runs, so autograd records only the modulated layers."""
        with hooks(self, coeffs):      # holds the LM's pass_lock: no other pass sees the shorter list
            return upper_hidden(self.lm, x_ell, self.config.y_layer)

    def _pooled(self, h: torch.Tensor) -> torch.Tensor:
        """The read-out's running mean of LN(x_ℓ): (b, t, d) -> (b, t, d), over the whole prefix or exponential."""
        if self.pool_half_life is None:
            return causal_mean_skip_first(h)
        return causal_ema_skip_first(h, self.pool_half_life)

    @torch.no_grad()
    def calibrate_pool(self, idx: torch.Tensor, batch_size: int = 32) -> "CGTLM":
        """Data-dependent start for the pooled read-out: μ = the mean and P = the top d_y principal directions
        of the running means of LN(x_ℓ) over the rows of idx (n, t) (every position ≥ 1 of every row).

        Without it P is a random projection. A few outlier features of x_ℓ, large in every text, dominate a
        random projection; the principal directions follow what varies between texts instead."""
        idx = check_inputs(self.config, idx, device=self.device)
        check_int("batch_size", batch_size, 1)
        if idx.shape[1] < 2:
            raise refuse("idx", "at least 2 positions per row to calibrate", f"shape {tuple(idx.shape)}", verb="have")
        pooled = []
        for rows in idx.split(batch_size):
            record: dict[str, torch.Tensor] = {}
            self._lower(rows, record=record)
            x = record[X(self.config.y_layer)].to(self.pool.weight.dtype)
            pooled.append(self._pooled(self.ln_x(x))[:, 1:].flatten(0, 1))   # (b·(t−1), d)
        return self.calibrate_pool_from(torch.cat(pooled))

    @torch.no_grad()
    def calibrate_pool_from(self, pooled: torch.Tensor) -> "CGTLM":
        """`calibrate_pool` from pooled read-outs already computed, pooled (n, d) (e.g. a feature cache's)."""
        if not isinstance(pooled, torch.Tensor) or pooled.dim() != 2 or pooled.shape[1] != self.config.d_x:
            raise refuse("pooled", f"a float tensor (n, {self.config.d_x}) of pooled read-outs", describe(pooled))
        pooled = pooled.to(self.pool.weight.device, self.pool.weight.dtype)
        if pooled.shape[0] < self.config.d_y:
            raise refuse("idx", f"at least d_y={self.config.d_y} pooled states, one per direction calibrated (more "
                         f"rows or longer rows)", f"{pooled.shape[0]}", verb="give")
        center = pooled.mean(0)
        _, _, v = torch.linalg.svd(pooled - center, full_matrices=False)    # v (min(n, d), d): principal directions
        self.pool_center.copy_(center)
        self.pool.weight.copy_(v[:self.config.d_y])
        return self

    @torch.no_grad()
    def calibrate_memory(self, suffix_x: torch.Tensor, pooled: torch.Tensor, batch_size: int = 16) -> "CGTLM":
        """Data-dependent start for the token memory's keys, from a feature cache's layer-ℓ states of continuations
        suffix_x (n, m, d) and their prompts' pooled read-outs (n, d) (ȳ as the head has it now): CGT._fit_memory
        on those states and the memory maps' inputs and outputs in the compiled passes over them. (A from-scratch
        CGT's `calibrate_memory(idx)` reads full-mode passes over token rows instead: a CGTLM trains from the
        feature cache, which holds these states.)"""
        if self.memory is None:
            raise refuse("model", "a CGTLM with a token memory (memory_layers > 0) to calibrate it", "memory_layers=0")
        maps = {layer: self.lm.get_submodule(self.memory_map(layer)[:-len(".weight")]) for layer in self.memory.layers}
        inputs: dict[int, list[torch.Tensor]] = {layer: [] for layer in maps}
        outputs: dict[int, list[torch.Tensor]] = {layer: [] for layer in maps}

        def grab(layer):
            def hook(module, args, out):
                inputs[layer].append(args[0].flatten(0, 1).float())
                outputs[layer].append(out.flatten(0, 1).float())
            return own_thread(hook)

        states = []
        with pass_lock(self.lm):
            handles = [module.register_forward_hook(grab(layer)) for layer, module in maps.items()]
            try:
                for i in range(0, len(suffix_x), batch_size):
                    x = suffix_x[i:i + batch_size].to(self.device, self.pool.weight.dtype)
                    ybar = self.summary_of_pooled(pooled[i:i + batch_size].to(self.device))
                    self._upper_hidden(x, self._fixed_coeffs(ybar))
                    states.append(self.ln_x(x).flatten(0, 1).float())
            finally:
                for h in handles:
                    h.remove()
        h = {layer: torch.cat(v) for layer, v in inputs.items()}               # (N, i) per layer
        return self._fit_memory(torch.cat(states), h, {layer: torch.cat(v) for layer, v in outputs.items()})

    def lower_cache(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        """The activations of layers 0..ℓ only, from a pass that stops after ℓ (as context() does):
        idx (b, t) -> {"x.0".."x.ℓ": (b, t, d), "y.0".."y.ℓ": (b, t, e), "ybar": (b, t, e)}, the same tensors
        run_with_cache gives under those names, for a fraction of the cost on a deep LM."""
        record: dict[str, torch.Tensor] = {}
        self._lower(check_inputs(self.config, idx, device=self.device), record=record)
        return record

    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, use_cache: bool = False) -> torch.Tensor:
        """As CGT.generate, in full mode with ȳ recomputed each step: the pretrained stream has no KV cache."""
        return super().generate(idx, max_new_tokens, temperature, top_k, use_cache)

    def merged_lm(self, ybar_vec: torch.Tensor, share_weights: bool = True):
        """merged_gpt under the LM's name: a model of lm's class whose modulated weights are W + B @ A."""
        return self.merged_gpt(ybar_vec, share_weights)

    def peft_config(self, factors: dict | None = None):
        """The peft.LoraConfig of `export_peft`: rank K·r, alpha = rank (scale 1), the layers above ℓ; the
        targets, layer pattern and weight orientation (fan_in_fan_out: GPT-2's Conv1D) from the LM's layout. Given the
        factors of a compile with a token memory: each map named, at its own rank (rank_pattern, alpha_pattern)."""
        peft = require("peft")
        cfg, layout = self.config, layout_of(self.lm)
        rank = cfg.n_templates * cfg.template_rank
        if factors is not None and self.memory is not None:
            import re
            modules = {name[:-len(".weight")]: int(a.shape[0]) for name, (a, _) in factors.items()}
            pattern = {re.escape(m): r for m, r in modules.items() if r != rank}
            return peft.LoraConfig(r=rank, lora_alpha=rank, lora_dropout=0.0, bias="none",
                                   target_modules=sorted(modules), rank_pattern=pattern, alpha_pattern=dict(pattern),
                                   fan_in_fan_out=layout.fan_in_fan_out,
                                   task_type="CAUSAL_LM", base_model_name_or_path=cfg.extra["hf"].get("name_or_path") or None)
        return peft.LoraConfig(r=rank, lora_alpha=rank, lora_dropout=0.0, bias="none",
                               target_modules=layout.peft_targets(cfg.sites), fan_in_fan_out=layout.fan_in_fan_out,
                               layers_to_transform=[layer - 1 for layer in self.modulated_layers],
                               layers_pattern=layout.layers, task_type="CAUSAL_LM",
                               base_model_name_or_path=cfg.extra["hf"].get("name_or_path") or None)

    @torch.no_grad()
    @checked(path=Folder(new=True))
    def export_peft(self, prompt: torch.Tensor, path: str | os.PathLike) -> Path:
        """Write the compiled prompt as a PEFT LoRA adapter folder (adapter_config.json +
        adapter_model.safetensors); `PeftModel.from_pretrained(base, path)` on an untouched copy of the LM
        then gives specialize(prompt)'s logits. lm itself is not modified. Returns the folder."""
        # a folder holding a model (or another tool's weights) is never changed by an adapter
        from ..io import ADAPTER_WEIGHTS_NAME, PEFT_WRITER, check_artefact_folder
        check_artefact_folder(path, "peft", "export_peft", "a PEFT adapter")
        factors = self.prompt_factors(prompt)
        tensors = {}
        for name, (lora_a, lora_b) in factors.items():
            module = name[:-len(".weight")]
            tensors[f"base_model.model.{module}.lora_A.weight"] = lora_a
            tensors[f"base_model.model.{module}.lora_B.weight"] = lora_b
        path.mkdir(parents=True, exist_ok=True)
        save_tensors(path / ADAPTER_WEIGHTS_NAME, tensors, metadata={"format": "pt", "written_by": PEFT_WRITER})
        self.peft_config(factors).save_pretrained(str(path))
        return path

    # ------------------------------------------------------------------ CGT.loss's scoring, in vocabulary chunks
    def _main_loss(self, final, targets, loss_mask):
        return self._masked_ce(final, targets, None if loss_mask is None else loss_mask.bool())

    def _aux_scores(self, final, targets, mask, teacher, rows, src):
        """CGT._aux_scores from the specialised LM's final hidden states (n, m, d): the logits only at scored
        positions. Distillation teacher: the LM itself (T = I) with the whole row in context."""
        valid = mask & (targets != IGNORE_INDEX)
        if not valid.any():
            return final.sum(-1) * 0.0, valid
        if self.config.aux_kl > 0:
            with torch.no_grad():
                teacher = self._logits(take_positions(self.teacher_pass(rows, 1)[0], src)[valid])      # (p, v)
            student = self._logits(final[valid])                                                       # (p, v)
            ce = F.cross_entropy(student.float(), targets[valid], reduction="none")
        else:
            student, ce = None, self._chunked_ce(final[valid], targets[valid])
        per = aux_objective(self.config, ce, student, teacher)
        return torch.zeros(valid.shape, dtype=per.dtype, device=per.device).masked_scatter(valid, per), valid

    def _masked_ce(self, hidden: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Mean cross-entropy over positions with targets ≠ −100 (and mask true); hidden (b, t, d)."""
        valid = targets != IGNORE_INDEX
        if mask is not None:
            valid = valid & mask
        h = hidden[valid]                                                         # (n, d)
        if h.shape[0] == 0:
            return hidden.sum() * 0.0
        return self._chunked_ce(h, targets[valid]).mean()

    def _chunked_ce(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Per-position cross-entropy of the LM head on hidden states h (n, d), targets (n,) -> (n,) float32."""
        head = layout_of(self.lm).head_of(self.lm)
        if head.bias is not None:
            raise NotImplementedError("an LM head with a bias is not supported by the chunked loss")
        return chunked_cross_entropy(h, head.weight, targets)

    # ------------------------------------------------------------------ persistence
    @staticmethod
    def _settings(cfg: CGTConfig, **hf_settings) -> dict:
        """The constructor's keywords that a CGTLM's config holds (hf_settings: the ones read elsewhere)."""
        names = ("y_layer", "d_y", "n_head_y", "n_templates", "template_rank", "sites", "w_aux", "w_smooth", "smooth",
                 "aux_min_prefix", "aux_min_suffix", "aux_suffix_len", "aux_row_fraction", "aux_ce", "aux_kl",
                 "aux_kl_top_k", "block_size")
        return {**{name: getattr(cfg, name) for name in names}, **hf_settings}

    @classmethod
    def from_config(cls, config: CGTConfig, lm) -> "CGTLM":
        """A fresh CGTLM on lm with the settings of another CGTLM's config (`model.config`)."""
        saved = config.extra.get("hf") if isinstance(config, CGTConfig) else None
        if not isinstance(saved, dict):
            raise refuse("config", "the CGTConfig of a CGTLM (with extra['hf'])", describe(config), TypeError)
        return cls(lm, **cls._settings(config, y_mlp_ratio=config.mlp_ratio, pool_half_life=saved.get("pool_half_life"),
                                       pooled_only=saved.get("pooled_only", False),
                                       memory_layers=saved.get("memory_layers", 0),
                                       memory_rank=saved.get("memory_rank", 64)))

    @checked(path=Folder(new=True))
    def save_pretrained(self, path: str | os.PathLike) -> Path:
        """A folder with config.json + model.safetensors holding the y stream and templates only (not the LM)."""
        path = model_folder(path, "cgt_viz:CGTLM", "CGTLM.save_pretrained", "a cgt_viz CGTLM model (the y heads)")
        save_tensors(path / WEIGHTS_NAME, self.state_dict(), metadata={"model_class": "CGTLM"})
        cfg = self.config
        write_json(path / CONFIG_NAME, {"model_class": "CGTLM", "config": cfg.to_dict(),
                                        "y_mlp_ratio": cfg.mlp_ratio})
        return path

    @classmethod
    @checked(path=Folder(), device=Device())
    def from_pretrained(cls, path: str | os.PathLike, lm=None, device: str | torch.device = "cpu") -> "CGTLM":
        """Rebuild a saved CGTLM on `lm` (the same LM it was trained on: architecture and sizes are checked).

        As CGT.from_pretrained: config.json is checked field by field, then against the safetensors header (the
        shapes a model built on the meta device would have: nothing is allocated) and the free memory, before
        anything is built; NaN/inf weights load with a RuntimeWarning naming them."""
        from ..io import (check_memory_fits, check_weight_dtypes, check_weights_match, config_from_saved,
                           safetensors_header)
        if lm is None:
            raise refuse("lm", "the frozen LM the heads were trained on (e.g. cgt_viz.hf.smollm2()[0])", "None",
                         TypeError, hint="CGTLM.from_pretrained(path, lm) needs lm: the folder holds only the y "
                                         "stream and templates")
        if not path.is_dir():
            raise FileNotFoundError(f"path must be a folder written by CGTLM.save_pretrained, got {str(path)!r}")
        file = path / CONFIG_NAME
        meta = read_json(file)
        if not isinstance(meta, dict) or meta.get("model_class") != "CGTLM":
            raise ValueError(f"{str(path)!r} does not hold a CGTLM (model_class "
                             f"{meta.get('model_class') if isinstance(meta, dict) else None!r}); load it with its own class")
        if "config" not in meta:
            raise ValueError(f"{str(file)!r} lacks the field 'config' (the CGTLM's settings); not a complete "
                             f"CGTLM.save_pretrained folder (truncated or tampered?)")
        try:
            cfg = config_from_saved(path, meta["config"])
        except (TypeError, ValueError) as err:
            raise ValueError(str(err) if str(file) in str(err) else f"{str(file)!r}: config: {err}") from None
        saved = cfg.extra.get("hf") if isinstance(cfg.extra, dict) else None
        if not isinstance(saved, dict):
            raise ValueError(f"{str(file)!r}: config.extra.hf must be a dict describing the LM the heads were "
                             f"trained on (written by CGTLM.save_pretrained), got {describe(saved)}")
        lm_keys = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size")
        absent = [k for k in lm_keys if k not in saved]
        if absent:
            raise ValueError(f"{str(file)!r}: config.extra.hf lacks {absent}; it must name the LM the heads were "
                             f"trained on ({list(lm_keys)})")
        y_mlp_ratio = meta.get("y_mlp_ratio", cfg.mlp_ratio)
        pool_half_life = saved.get("pool_half_life")
        pooled_only = saved.get("pooled_only", False)
        if not isinstance(pooled_only, bool):
            raise ValueError(f"{str(file)!r}: config.extra.hf.pooled_only must be true or false, got {describe(pooled_only)}")
        if isinstance(y_mlp_ratio, bool) or not isinstance(y_mlp_ratio, int) or y_mlp_ratio < 1:
            raise ValueError(f"{str(file)!r}: y_mlp_ratio must be an int >= 1, got {describe(y_mlp_ratio)}")
        check_lm(lm)
        now = lm_facts(lm)
        for key in lm_keys:
            if saved.get(key) != now[key]:
                raise refuse("lm", "the LM these heads were trained on", f"an LM whose {key} is "
                             f"{now[key]!r}, the folder says {saved.get(key)!r} "
                             f"({saved.get('name_or_path')!r})")
        memory = {k: saved.get(k, default) for k, default in (("memory_layers", 0), ("memory_rank", 64))}
        for key, value in memory.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{str(file)!r}: config.extra.hf.{key} must be an int >= 0, got {describe(value)}")
        kwargs = cls._settings(cfg, y_mlp_ratio=y_mlp_ratio, pool_half_life=pool_half_life, pooled_only=pooled_only,
                               **memory)
        # the shapes the config builds, on the meta device (no memory, no time), against the file's header
        header = safetensors_header(path / WEIGHTS_NAME)
        try:
            with torch.device("meta"):
                skeleton = cls(lm, **kwargs)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{str(file)!r}: {err}") from None
        want = {k: tuple(v.shape) for k, v in skeleton.state_dict().items()}
        floats = [k for k, v in skeleton.state_dict().items() if v.is_floating_point() and not k.startswith("lm.")]
        del skeleton
        have = {k: shape for k, (shape, _) in header.items() if not k.startswith("lm.")}
        wrong = [f"{k}: the file has {have[k]}, the config builds {want[k]}" for k in want if k in have
                 and have[k] != want[k]]
        missing, unexpected = sorted(set(want) - set(have)), sorted(set(have) - set(want))
        check_weights_match(path / WEIGHTS_NAME, wrong, missing, unexpected, "its config.json and this lm",
                             " (d_y, n_head_y, y_layer, n_templates, template_rank, sites, y_mlp_ratio and the LM's "
                             "widths decide these shapes); the config must be the one saved with these weights, and "
                             "lm the LM they were trained on")
        check_weight_dtypes(path / WEIGHTS_NAME, header, floats)
        check_memory_fits(path, header)
        model = cls(lm, **kwargs)
        state = load_tensors(path / WEIGHTS_NAME, device="cpu")
        model.load_state_dict(state)
        warn_non_finite(state, path / WEIGHTS_NAME)
        return model.to(device)
