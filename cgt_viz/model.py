"""GPT (the plain baseline) and CGT (Contextually Guided Transformer), per ../shared/CGT_SPEC.md.

Notation (einops letters): b batch, t time, d width of x (d_x), e width of y (d_y), h heads,
k templates (K), r template rank, v output width (vocab or output_dim), ν layer (1-based, as in the spec).

A CGT owns a complete GPT (`cgt.gpt`) for its x stream, so "x is computed exactly as in a plain
Transformer" holds by construction; the y stream, the summary LayerNorm and the templates are extra
modules that only ever *read* x below ℓ and *transform the inputs* of x's linear maps above ℓ.

Named outputs (`CGT.run_with_cache`; shapes for an input of b sequences of length t):
    "x.0"              (b, t, d)  x after the embeddings;  "x.ν" after block ν, ν = 1..N
    "y.0"              (b, t, e)  y after its embeddings;  "y.ν" after y block ν, ν = 1..ℓ
    "ybar"             (b, t, e)  ȳ = LN(y_ℓ), the context summary at every token
    "ybar_sigma"       (b, t, e)  posterior std of ȳ (smooth="vae" only)
    "coeffs.ν.site"    (b, t, K)  template coefficients c^κ(ȳ_t) at layer ν = ℓ+1..N, site in cfg.sites
    "logits"           (b, t, v)
"""
from __future__ import annotations

import copy
from typing import Any, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._checks import check_bool, check_float, check_int, describe
from .config import CGTConfig
from .io import PretrainedMixin
from .layers import SITE_WEIGHTS, Block, EMAReadout, KVCache, SiteTemplates, YBlock

IGNORE_INDEX = -100  # token targets equal to this are not scored (PyTorch's convention)
_AUX_GROUPS = 4      # the auxiliary pass runs rows in up to this many length groups


def _init_weights(module: nn.Module, n_layer: int) -> None:
    """GPT-2 initialisation: N(0, 0.02) weights, zero biases, residual writes (c_proj) scaled by depth."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
    for name, p in module.named_parameters():
        if name.endswith("c_proj.weight"):
            nn.init.normal_(p, 0.0, 0.02 / (2 * n_layer) ** 0.5)


def validate_inputs(cfg: CGTConfig, inp, name: str = "idx", device: torch.device | None = None) -> torch.Tensor:
    """Check a batch of inputs against the config: (b, t) integer tokens or (b, t, input_dim) floats.

    With `device` (the model's), inputs elsewhere are refused with a message saying where to move them:
    moving silently would hide a copy per call in a training loop."""
    if not isinstance(inp, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {describe(inp)}")
    if device is not None and inp.device != device:
        raise ValueError(f"{name} must be on the model's device {str(device)!r}, got a tensor on {str(inp.device)!r}; "
                         f"move it with {name}.to({str(device)!r}) (or move the model)")
    if cfg.mode == "tokens":
        if inp.dtype in (torch.bool,) or inp.is_floating_point() or inp.is_complex():
            raise TypeError(f"{name} must hold integer token ids (torch.long), got dtype {inp.dtype}")
        if inp.dim() != 2:
            raise ValueError(f"{name} must have shape (batch, time), got shape {tuple(inp.shape)}")
    else:
        if not inp.is_floating_point():
            raise TypeError(f"{name} must be a float tensor in vectors mode, got dtype {inp.dtype}")
        if inp.dim() != 3 or inp.shape[-1] != cfg.input_dim:
            raise ValueError(f"{name} must have shape (batch, time, input_dim={cfg.input_dim}), "
                             f"got shape {tuple(inp.shape)}")
    b, t = inp.shape[:2]
    if b == 0 or t == 0:
        raise ValueError(f"{name} must hold at least one sequence of at least one position, got shape {tuple(inp.shape)}")
    if t > cfg.block_size:
        raise ValueError(f"{name} has {t} positions but block_size is {cfg.block_size}; "
                         f"pass at most {cfg.block_size} (nothing is clipped silently)")
    if inp.device.type == "meta":  # shapes only: a meta tensor has no values to check
        return inp.long() if cfg.mode == "tokens" else inp
    if cfg.mode == "tokens":
        lo, hi = int(inp.min()), int(inp.max())
        if lo < 0 or hi >= cfg.vocab_size:
            raise ValueError(f"{name} holds token ids in [{lo}, {hi}], allowed are 0..vocab_size-1 = 0..{cfg.vocab_size - 1}")
        return inp.long()
    if not torch.isfinite(inp).all():
        raise ValueError(f"{name} must be finite, got {int((~torch.isfinite(inp)).sum())} NaN or inf value(s)")
    return inp


def per_position_loss(mode: str, out: torch.Tensor, targets: torch.Tensor,
                      loss_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Loss at every position and whether it counts: out (b, t, v), targets -> ((b, t) float, (b, t) bool).

    Cross-entropy in tokens mode (targets (b, t), −100 not scored), mean squared error over the output
    dims in vectors mode (targets (b, t, v)); loss_mask (b, t) narrows what counts."""
    if mode == "tokens":
        loss = F.cross_entropy(out.flatten(0, 1).float(), targets.flatten().clamp_min(0),
                               reduction="none").view(targets.shape)
        valid = targets != IGNORE_INDEX
    else:
        loss = (out.float() - targets.float()).pow(2).mean(-1)
        valid = torch.ones_like(loss, dtype=torch.bool)
    if loss_mask is not None:
        valid = valid & loss_mask.bool()
    return loss, valid


def masked_loss(cfg: CGTConfig, out: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean cross-entropy (tokens) or MSE (vectors) over positions where mask is true."""
    per_pos, valid = per_position_loss(cfg.mode, out, targets, mask)
    w = valid.to(per_pos.dtype)
    return (per_pos * w).sum() / w.sum().clamp_min(1.0)


def check_targets(cfg: CGTConfig, inp: torch.Tensor, targets, loss_mask, inputs_name: str = "idx") -> None:
    """targets (and loss_mask) as the loss takes them for validated inputs `inp` of shape (b, t[, input_dim])."""
    if not isinstance(targets, torch.Tensor):
        raise TypeError(f"targets must be a torch.Tensor, got {describe(targets)}")
    for name, t in (("targets", targets), ("loss_mask", loss_mask)):
        if isinstance(t, torch.Tensor) and t.device != inp.device:
            raise ValueError(f"{name} must be on the device of {inputs_name} {str(inp.device)!r}, got a tensor on "
                             f"{str(t.device)!r}")
    if cfg.mode == "tokens":
        if targets.shape != inp.shape:
            raise ValueError(f"targets must have the shape of {inputs_name} {tuple(inp.shape)}, got {tuple(targets.shape)}")
        if targets.is_floating_point() or targets.dtype == torch.bool:
            raise TypeError(f"targets must hold integer token ids, got dtype {targets.dtype}")
        bad = (targets != IGNORE_INDEX) & ((targets < 0) | (targets >= cfg.vocab_size))
        if targets.device.type != "meta" and bad.any():
            raise ValueError(f"targets must be in 0..{cfg.vocab_size - 1} or {IGNORE_INDEX} (ignored), "
                             f"got {targets[bad][0].item()}")
    else:
        want = (*inp.shape[:2], cfg.out_dim)
        if tuple(targets.shape) != want:
            raise ValueError(f"targets must have shape (batch, time, output_dim) = {want}, got {tuple(targets.shape)}")
        if not targets.is_floating_point():
            raise TypeError(f"targets must be floats in vectors mode, got dtype {targets.dtype}")
    if loss_mask is not None:
        if not isinstance(loss_mask, torch.Tensor) or tuple(loss_mask.shape) != tuple(inp.shape[:2]):
            raise ValueError(f"loss_mask must be None or a tensor of shape (batch, time) = {tuple(inp.shape[:2])}, "
                             f"got {describe(loss_mask)}")


def _fold_affine_ln_y(module, state_dict, prefix, *args) -> None:
    """Checkpoints written when LN_y had a gain g and bias β: fold them into every coefficient map, exactly:
    A (g ⊙ ŷ + β) + b = (A diag g) ŷ + (A β + b)."""
    gain = state_dict.pop(prefix + "ln_y.weight", None)
    shift = state_dict.pop(prefix + "ln_y.bias", None)
    if gain is None and shift is None:
        return
    for key in [k for k in state_dict if k.startswith(prefix + "templates.") and k.endswith(".coeff.weight")]:
        weight, bias_key = state_dict[key], key[:-len("weight")] + "bias"
        if shift is not None:
            state_dict[bias_key] = state_dict[bias_key] + weight @ shift
        if gain is not None:
            state_dict[key] = weight * gain


def check_task_fits(model: Any, task: Any, name: str = "task", *, needs: str = "get_batch") -> None:
    """TypeError unless `task` is a task object with the method `needs`; ValueError unless its sequences fit the
    model (same mode, tokens < vocab_size or the same input/output dims, block_size no longer than the model's)."""
    if not callable(getattr(task, needs, None)) or not callable(getattr(task, "config_kwargs", None)):
        raise TypeError(f"{name} must be a task with {needs}() and config_kwargs() (e.g. make_task('icl')), "
                        f"got {describe(task)}")
    try:
        want, cfg = task.config_kwargs(), model.config
    except NotImplementedError:   # a custom task that does not say what it fixes: nothing to compare
        return
    if "vocab_size" in want:
        gives = f"tokens (vocab_size={want['vocab_size']})"
    else:
        gives = f"vectors (input_dim={want.get('input_dim')}, output_dim={want.get('output_dim')})"
    reads = (f"tokens (vocab_size={cfg.vocab_size})" if cfg.mode == "tokens"
             else f"vectors (input_dim={cfg.input_dim}, output_dim={cfg.output_dim})")
    fits = (cfg.mode == "tokens" and "vocab_size" in want and want["vocab_size"] <= cfg.vocab_size) or \
           (cfg.mode != "tokens" and "vocab_size" not in want and want.get("input_dim") == cfg.input_dim
            and want.get("output_dim") == cfg.output_dim)
    if not fits:
        raise ValueError(f"{name} does not fit the model: {type(task).__name__} gives {gives} but the model reads "
                         f"{reads}; pass the task the model was trained on")
    trained, used = (cfg.extra or {}).get("tokenizer"), (want.get("extra") or {}).get("tokenizer")
    if isinstance(trained, str) and isinstance(used, str) and trained != used:
        raise ValueError(f"{name} does not fit the model: the model was trained with tokenizer {trained!r} but the task "
                         f"uses {used!r}; rebuild the task with cgt_viz.tasks.task_from_config(model.config)")
    if want.get("block_size", 0) > cfg.block_size:
        raise ValueError(f"{name} does not fit the model: {type(task).__name__} has block_size={want['block_size']} "
                         f"but the model only takes {cfg.block_size} positions; the task's block_size must be "
                         f"<= {cfg.block_size}")


def _take_positions(seq: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """seq (b, t) or (b, t, f), src (b, m) positions (clamped to t−1) -> (b, m) or (b, m, f)."""
    src = src.clamp(max=seq.shape[1] - 1)
    if seq.dim() == 3:
        src = src[..., None].expand(-1, -1, seq.shape[-1])
    return seq.gather(1, src)


def _sample_next(logits: torch.Tensor, temperature: float, top_k: int | None) -> torch.Tensor:
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, [-1]]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(F.softmax(logits.float(), dim=-1), 1)


class _Generation:
    """generate() with an incremental KV cache, shared by GPT and CGT (which define _step)."""

    config: CGTConfig

    @property
    def device(self) -> torch.device:
        """Where the model's parameters are; inputs must be there too."""
        return next(self.parameters()).device

    def new_cache(self) -> list[KVCache]:
        return [KVCache() for _ in range(self._n_attention)]

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, use_cache: bool = True) -> torch.Tensor:
        """Extend idx (b, t) by max_new_tokens tokens; temperature=0 is greedy. Returns (b, t + new)."""
        cfg = self.config
        if cfg.mode != "tokens":
            raise ValueError("generate needs a tokens-mode model (vocab_size set); this one is in vectors mode")
        idx = validate_inputs(cfg, idx, device=self.device)
        room = cfg.block_size - idx.shape[1]
        check_int("max_new_tokens", max_new_tokens, 1, max(room, 1),
                  hint=f" (block_size {cfg.block_size} - prompt length {idx.shape[1]})")
        if room < 1:
            raise ValueError(f"idx already fills block_size = {cfg.block_size}; the prompt must be shorter to generate")
        check_float("temperature", temperature, 0.0, hint=" (0 = greedy)")
        check_int("top_k", top_k, 1, allow_none=True)
        cache = self.new_cache() if use_cache else None
        logits = self._step(idx, cache, 0)[:, -1]
        for i in range(max_new_tokens):
            nxt = _sample_next(logits, temperature, top_k)
            idx = torch.cat([idx, nxt], dim=1)
            if i == max_new_tokens - 1:
                break
            logits = (self._step(nxt, cache, idx.shape[1] - 1) if use_cache else self._step(idx, None, 0))[:, -1]
        return idx


class GPT(PretrainedMixin, _Generation, nn.Module):
    """A plain pre-LN decoder-only Transformer: the x stream of a CGT, and the baseline."""

    def __init__(self, config: CGTConfig):
        super().__init__()
        if not isinstance(config, CGTConfig):
            raise TypeError(f"config must be a CGTConfig, got {describe(config)}")
        self.config = cfg = config
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_x) if cfg.mode == "tokens" else nn.Linear(cfg.input_dim, cfg.d_x)
        self.wpe = nn.Embedding(cfg.block_size, cfg.d_x)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg.d_x, cfg.n_head, cfg.mlp_ratio, cfg.bias, cfg.dropout)
                                    for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_x, bias=cfg.bias)
        self.head = nn.Linear(cfg.d_x, cfg.out_dim, bias=False)
        _init_weights(self, cfg.n_layer)
        self._n_attention = cfg.n_layer

    def embed_inputs(self, inp: torch.Tensor, pos_offset: int = 0) -> torch.Tensor:
        """(b, t) tokens or (b, t, input_dim) vectors -> x.0 (b, t, d); positions start at pos_offset."""
        pos = torch.arange(pos_offset, pos_offset + inp.shape[1], device=inp.device)
        return self.drop(self.embed(inp) + self.wpe(pos))

    def _step(self, inp: torch.Tensor, cache: list[KVCache] | None, pos_offset: int) -> torch.Tensor:
        x = self.embed_inputs(inp, pos_offset)
        for i, block in enumerate(self.blocks):
            x = block(x, cache=None if cache is None else cache[i])
        return self.head(self.ln_f(x))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """idx (b, t) -> logits (b, t, v)."""
        return self._step(validate_inputs(self.config, idx, device=self.device), None, 0)

    def loss(self, idx: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor | None = None,
             split=None) -> dict[str, torch.Tensor]:
        """The same dict as CGT.loss; a GPT has only the main term (`split` is accepted and unused)."""
        idx = validate_inputs(self.config, idx, device=self.device)
        check_targets(self.config, idx, targets, loss_mask)
        main = masked_loss(self.config, self._step(idx, None, 0), targets, loss_mask)
        zero = main.new_zeros(())
        return {"main": main, "aux": zero, "smooth": zero, "total": main}


class CGT(PretrainedMixin, _Generation, nn.Module):
    """Contextually Guided Transformer: a GPT whose layers above ℓ are modulated by the context summary ȳ."""

    def __init__(self, config: CGTConfig):
        super().__init__()
        if not isinstance(config, CGTConfig):
            raise TypeError(f"config must be a CGTConfig, got {describe(config)}")
        self.config = cfg = config
        self.gpt = GPT(cfg)
        self.y_embed = nn.Embedding(cfg.vocab_size, cfg.d_y) if cfg.mode == "tokens" else nn.Linear(cfg.input_dim, cfg.d_y)
        self.y_wpe = nn.Embedding(cfg.block_size, cfg.d_y) if cfg.y_pos else None
        self.y_blocks = nn.ModuleList(YBlock(cfg.d_x, cfg.d_y, cfg.n_head_y, cfg.mlp_ratio, cfg.bias, cfg.dropout)
                                      for _ in range(cfg.y_layer))
        # no learnable gain/bias: ȳ keeps a fixed scale (‖ȳ_t‖² = d_y), so the smoothness penalty cannot be met by
        # shrinking a gain, and c = A ȳ + b absorbs any affine map anyway (old checkpoints are folded on load)
        self.ln_y = nn.LayerNorm(cfg.d_y, elementwise_affine=False)
        self.register_load_state_dict_pre_hook(_fold_affine_ln_y)
        _init_weights(nn.ModuleList([self.y_embed, self.y_blocks] + ([self.y_wpe] if self.y_wpe is not None else [])),
                      cfg.n_layer)
        if cfg.smooth == "vae":  # log σ of the posterior N(μ_t, σ_t²) over ȳ_t
            self.y_logsigma = nn.Linear(cfg.d_y, cfg.d_y)
            nn.init.zeros_(self.y_logsigma.weight)
            nn.init.constant_(self.y_logsigma.bias, float(torch.tensor(cfg.vae_sigma).log()))
        # templates["ν"]["site"] for ν = ℓ+1..N (ModuleDict keys must be strings)
        self.templates = nn.ModuleDict({
            str(layer): nn.ModuleDict({site: SiteTemplates(cfg.site_dim(site), cfg.d_y, cfg.n_templates, cfg.template_rank)
                                       for site in cfg.sites})
            for layer in self.modulated_layers})
        self.y_ema = EMAReadout(cfg.d_x, cfg.d_y) if cfg.y_readout == "ema" else None
        self._n_attention = cfg.n_layer + cfg.y_layer + (self.y_ema is not None)   # the EMA keeps its history in a cache

    # ------------------------------------------------------------------ names
    @property
    def modulated_layers(self) -> list[int]:
        """ν = ℓ+1..N (1-based, as in the spec)."""
        return list(range(self.config.y_layer + 1, self.config.n_layer + 1))

    @property
    def template_sites(self) -> list[tuple[int, str]]:
        """Every site κ as (layer ν, site name), in forward order."""
        return [(layer, site) for layer in self.modulated_layers for site in self.config.sites]

    def cache_names(self) -> list[str]:
        cfg = self.config
        names = [f"x.{n}" for n in range(cfg.n_layer + 1)] + [f"y.{n}" for n in range(cfg.y_layer + 1)] + ["ybar"]
        if cfg.smooth == "vae":
            names.append("ybar_sigma")
        return names + [f"coeffs.{layer}.{site}" for layer, site in self.template_sites] + ["logits"]

    # ------------------------------------------------------------------ the passes
    def _lower(self, inp, cache=None, pos_offset=0, record=None):
        """Layers 1..ℓ: the GPT's own blocks on x, y blocks beside them. Returns x_ℓ, μ = LN(y_ℓ), y_ℓ."""
        cfg, gpt = self.config, self.gpt
        x = gpt.embed_inputs(inp, pos_offset)
        y = self.y_embed(inp)
        if self.y_wpe is not None:
            y = y + self.y_wpe(torch.arange(pos_offset, pos_offset + inp.shape[1], device=inp.device))
        if record is not None:
            record["x.0"], record["y.0"] = x, y
        for n in range(cfg.y_layer):
            x_in = x
            x = gpt.blocks[n](x, cache=None if cache is None else cache[n])
            y = self.y_blocks[n](x if cfg.y_reads == "post" else x_in, y,
                                 cache=None if cache is None else cache[cfg.n_layer + n])
            if record is not None:
                record[f"x.{n + 1}"], record[f"y.{n + 1}"] = x, y
        if self.y_ema is not None:
            y = self.y_ema(x, y, cache=None if cache is None else cache[-1])
        return x, self.ln_y(y), y

    def _upper(self, x, coeffs_of, cache=None, record=None):
        """Layers ℓ+1..N with T(ȳ) applied at each site; coeffs_of(layer, site) -> (b, t|1, K)."""
        for layer in self.modulated_layers:
            coeffs = {site: coeffs_of(layer, site) for site in self.config.sites}
            temps = self.templates[str(layer)]

            def modulate(site, h, coeffs=coeffs, temps=temps):
                return temps[site].apply(h, coeffs[site]) if site in coeffs else h

            x = self.gpt.blocks[layer - 1](x, modulate=modulate, cache=None if cache is None else cache[layer - 1])
            if record is not None:
                record[f"x.{layer}"] = x
                record.update({f"coeffs.{layer}.{s}": c for s, c in coeffs.items()})
        return self.gpt.head(self.gpt.ln_f(x))

    def _full(self, inp, cache=None, pos_offset=0, record=None, noise=False):
        """Full ("not fixed") pass: every token uses its own ȳ_t. Returns logits, ȳ, μ, σ (σ None unless vae)."""
        x, mu, y = self._lower(inp, cache, pos_offset, record)
        sigma = self.y_logsigma(y).exp() if self.config.smooth == "vae" else None
        ybar = mu + sigma * torch.randn_like(mu) if (noise and sigma is not None) else mu
        if record is not None:
            record["ybar"] = mu
            if sigma is not None:
                record["ybar_sigma"] = sigma
        logits = self._upper(x, lambda layer, site: self.templates[str(layer)][site].coefficients(ybar),
                             cache=cache, record=record)
        if record is not None:
            record["logits"] = logits
        return logits, ybar, mu, sigma

    def _specialized(self, inp, ybar_vec, cache=None, pos_offset=0):
        """x-only pass with T(ȳ) frozen per row; ybar_vec (b, e). Positions start at pos_offset."""
        x = self.gpt.embed_inputs(inp, pos_offset)
        for n in range(self.config.y_layer):
            x = self.gpt.blocks[n](x, cache=None if cache is None else cache[n])
        return self._upper(x, lambda layer, site: self.templates[str(layer)][site].coefficients(ybar_vec)[:, None, :],
                           cache=cache)

    def _step(self, inp, cache, pos_offset):
        return self._full(inp, cache, pos_offset)[0]

    # ------------------------------------------------------------------ public API
    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Full ("not fixed") mode: idx (b, t) -> logits (b, t, v)."""
        return self._full(validate_inputs(self.config, idx, device=self.device))[0]

    def context(self, idx: torch.Tensor) -> torch.Tensor:
        """ȳ at every token: idx (b, t) -> (b, t, e). Deterministic (the posterior mean under "vae")."""
        return self._lower(validate_inputs(self.config, idx, device=self.device))[1]

    def run_with_cache(self, idx: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """logits (b, t, v) and every named activation (see the module docstring for names and shapes)."""
        record: dict[str, torch.Tensor] = {}
        logits = self._full(validate_inputs(self.config, idx, device=self.device), record=record)[0]
        return logits, record

    def _check_ybar(self, ybar_vec, batch: int | None = None, name: str = "ybar_vec") -> torch.Tensor:
        e = self.config.d_y
        if not isinstance(ybar_vec, torch.Tensor) or not ybar_vec.is_floating_point():
            raise TypeError(f"{name} must be a float tensor of shape (batch, d_y={e}) or (d_y,), got {describe(ybar_vec)}")
        if ybar_vec.dim() not in (1, 2) or ybar_vec.shape[-1] != e:
            raise ValueError(f"{name} must have shape (batch, d_y={e}) or (d_y,), got shape {tuple(ybar_vec.shape)}")
        if batch is not None and ybar_vec.dim() == 2 and ybar_vec.shape[0] not in (1, batch):
            raise ValueError(f"{name} must have 1 or {batch} rows (one per row of idx), got shape {tuple(ybar_vec.shape)}")
        if ybar_vec.device != self.device:
            raise ValueError(f"{name} must be on the model's device {str(self.device)!r}, got a tensor on "
                             f"{str(ybar_vec.device)!r}; move it with {name}.to({str(self.device)!r})")
        if ybar_vec.device.type != "meta" and not torch.isfinite(ybar_vec).all():
            raise ValueError(f"{name} must be finite, got {int((~torch.isfinite(ybar_vec)).sum())} NaN or inf value(s)")
        return ybar_vec if ybar_vec.dim() == 2 else ybar_vec[None]

    def forward_specialized(self, idx: torch.Tensor, ybar_vec: torch.Tensor) -> torch.Tensor:
        """The specialised model, unmerged: x-only pass over idx (b, t) with T(ȳ) frozen at ybar_vec (b, e)."""
        idx = validate_inputs(self.config, idx, device=self.device)
        ybar_vec = self._check_ybar(ybar_vec, idx.shape[0])
        return self._specialized(idx, ybar_vec.expand(idx.shape[0], -1))

    def coefficients(self, ybar: torch.Tensor) -> dict[str, torch.Tensor]:
        """c^κ(ȳ) for every site: ybar (..., e) -> {"ν.site": (..., K)}."""
        e = self.config.d_y
        if not isinstance(ybar, torch.Tensor) or not ybar.is_floating_point():
            raise TypeError(f"ybar must be a float tensor of shape (..., d_y={e}), got {describe(ybar)}")
        if ybar.dim() == 0 or ybar.shape[-1] != e:
            raise ValueError(f"ybar must have shape (..., d_y={e}), got shape {tuple(ybar.shape)}")
        if ybar.device.type != "meta" and not torch.isfinite(ybar).all():
            raise ValueError(f"ybar must be finite, got {int((~torch.isfinite(ybar)).sum())} NaN or inf value(s)")
        return {f"{layer}.{site}": self.templates[str(layer)][site].coefficients(ybar) for layer, site in self.template_sites}

    def lora_factors(self, ybar_vec: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Per modulated GPT weight name, (A, B) with W' = W + B @ A.

        ybar_vec (e,) -> A (K·r, i), B (o, K·r);  ybar_vec (b, e) -> A (b, K·r, i), B (b, o, K·r).
        Names are GPT state-dict keys, e.g. "blocks.2.attn.c_attn.weight".
        """
        single = isinstance(ybar_vec, torch.Tensor) and ybar_vec.dim() == 1
        ybar_vec = self._check_ybar(ybar_vec)
        out = {}
        for layer, site in self.template_sites:
            name = f"blocks.{layer - 1}.{SITE_WEIGHTS[site]}.weight"
            weight = self.gpt.get_parameter(name)
            temp = self.templates[str(layer)][site]
            lora_a, lora_b = temp.factors(weight, temp.coefficients(ybar_vec))
            out[name] = (lora_a[0], lora_b[0]) if single else (lora_a, lora_b)
        return out

    def x_only(self) -> GPT:
        """A GPT with the same x weights and T = I: the model with no context at all."""
        return copy.deepcopy(self.gpt)

    def merged_gpt(self, ybar_vec: torch.Tensor, share_weights: bool = False) -> GPT:
        """The GPT whose weights are W + B @ A for one ȳ (e,): the specialised model from a summary.

        share_weights=True: the weights no template touches are this CGT's own tensors, not copies. That is
        ~2.6× faster and N specialised models cost N × the modulated weights only. It is for inference:
        training such a model also changes the CGT (and its siblings)."""
        check_bool("share_weights", share_weights)
        ybar_vec = self._check_ybar(ybar_vec)
        if ybar_vec.shape[0] != 1:
            raise ValueError(f"ybar_vec must be one summary (d_y,) or (1, d_y) for merged_gpt, got shape "
                             f"{tuple(ybar_vec.shape)}; use specialize for a batch of prompts")
        # the merged weights go straight into deepcopy's memo: x_only() would clone W only for it to be overwritten
        memo: dict[int, nn.Parameter] = {id(p): p for p in self.gpt.parameters()} if share_weights else {}
        with torch.no_grad():
            for name, (lora_a, lora_b) in self.lora_factors(ybar_vec[0]).items():
                weight = self.gpt.get_parameter(name)
                # W + (B @ A), not addmm: under autocast the sum keeps W's dtype
                memo[id(weight)] = nn.Parameter(weight + lora_b @ lora_a, requires_grad=weight.requires_grad)
        return copy.deepcopy(self.gpt, memo)

    @torch.no_grad()
    def specialize(self, prompt: torch.Tensor | Sequence[torch.Tensor], share_weights: bool = False) -> GPT | list[GPT]:
        """Compile a prompt into the weights: one forward pass, then W' = W + B @ A at every site.

        prompt (t,) or (1, t) -> GPT;  (b, t) with b > 1, or a list of prompts -> list of GPT.
        In vectors mode a prompt is (t, input_dim), (b, t, input_dim) or a list of (t, input_dim).
        share_weights: see merged_gpt (faster and smaller, for inference only).
        """
        cfg = self.config
        check_bool("share_weights", share_weights)
        item_dims = 1 if cfg.mode == "tokens" else 2
        if isinstance(prompt, (list, tuple)):
            if not prompt:
                raise ValueError("prompt must hold at least one prompt, got an empty list []")
            if not all(isinstance(p, torch.Tensor) and p.dim() == item_dims for p in prompt):
                shapes = [tuple(p.shape) if isinstance(p, torch.Tensor) else type(p).__name__ for p in prompt]
                want = "(t,)" if cfg.mode == "tokens" else f"(t, input_dim={cfg.input_dim})"
                raise ValueError(f"each prompt in the list must be a tensor of shape {want}, got {shapes}")
            return [self.specialize(p, share_weights) for p in prompt]
        if not isinstance(prompt, torch.Tensor):
            raise TypeError(f"prompt must be a tensor or a list of tensors, got {describe(prompt)}")
        if prompt.dim() == item_dims:
            if prompt.shape[0] == 0:
                raise ValueError(f"prompt must hold at least one position, got shape {tuple(prompt.shape)}")
            prompt = prompt[None]
            single = True
        else:
            single = prompt.dim() == item_dims + 1 and prompt.shape[0] == 1
        prompt = validate_inputs(cfg, prompt, name="prompt", device=self.device)
        ybar = self._lower(prompt)[1][:, -1]  # (b, e): the summary after the last prompt token
        models = [self.merged_gpt(row, share_weights) for row in ybar]
        return models[0] if single else models

    # ------------------------------------------------------------------ losses
    def sample_split(self, batch: int, length: int, generator: torch.Generator | None = None,
                     device=None) -> torch.Tensor:
        """Per-row split s (number of prefix tokens), uniform in [aux_min_prefix, length − aux_min_suffix]."""
        cfg = self.config
        check_int("batch", batch, 1)
        check_int("length", length, cfg.aux_min_prefix + cfg.aux_min_suffix, cfg.block_size,
                  hint=" (aux_min_prefix + aux_min_suffix .. block_size)")
        lo, hi = cfg.aux_min_prefix, length - cfg.aux_min_suffix
        s = torch.randint(lo, hi + 1, (batch,), generator=generator)
        return s.to(device) if device is not None else s

    def _check_split(self, split, batch: int, length: int) -> torch.Tensor:
        """The split as a CPU LongTensor (batch,): its values decide shapes, so they live on the host (no
        device sync per use on a GPU, and a model on the meta device still runs)."""
        if isinstance(split, bool) or not isinstance(split, (int, torch.Tensor)):
            raise TypeError(f"split must be an int or a LongTensor of shape (batch,), got {describe(split)}")
        if isinstance(split, torch.Tensor) and split.device.type == "meta":
            raise ValueError("split must hold values (an int or a CPU/GPU tensor), got a tensor on the meta device")
        split = torch.as_tensor(split).cpu()
        if split.is_floating_point() or split.dim() > 1 or (split.dim() == 1 and split.shape[0] != batch):
            raise ValueError(f"split must be an int or an integer tensor of shape ({batch},), got {tuple(split.shape)} "
                             f"{split.dtype}")
        split = split.long().expand(batch)
        if int(split.min()) < 1 or int(split.max()) > length - 1:
            raise ValueError(f"split must be in 1..{length - 1} (prefix and suffix non-empty) for length {length}, "
                             f"got values in [{int(split.min())}, {int(split.max())}]")
        return split

    def loss(self, idx: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor | None = None,
             split: int | torch.Tensor | None = None, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """main + w_aux·aux + w_smooth·smooth, each a scalar tensor in the returned dict.

        aux: ỹ = ȳ at token s−1 (the last prefix token) from this same pass, gradients flowing; the
        x-only specialised model runs on the suffix alone (positions from 0) and is scored on it.
        split: None (sampled per row), an int, or a LongTensor (b,) of prefix lengths.
        """
        cfg = self.config
        idx = validate_inputs(cfg, idx, device=self.device)
        check_targets(cfg, idx, targets, loss_mask)
        b, t = idx.shape[:2]
        noise = self.training and cfg.smooth == "vae"
        logits, ybar, mu, sigma = self._full(idx, noise=noise)
        main = masked_loss(cfg, logits, targets, loss_mask)

        if cfg.w_aux > 0 or split is not None:
            s = self.sample_split(b, t, generator) if split is None else self._check_split(split, b, t)
            aux = self._aux_loss(idx, targets, loss_mask, ybar, s)
        else:
            aux = main.new_zeros(())

        if t < 2:
            smooth = main.new_zeros(())
        elif cfg.smooth == "l2":
            smooth = (mu[:, 1:] - mu[:, :-1]).pow(2).sum(-1).mean()
        elif cfg.smooth == "relative":
            # the l2 step over twice the spread of ȳ across all tokens of the batch (≈ 1 − lag-1 autocorrelation):
            # unlike l2 it cannot be met by a constant ȳ plus a small informative part, and it rewards ȳ that
            # differs between sequences while drifting slowly within one
            spread = (mu - mu.mean((0, 1), keepdim=True)).pow(2).sum(-1).mean()
            smooth = (mu[:, 1:] - mu[:, :-1]).pow(2).sum(-1).mean() / (2 * spread + 1e-6)
        else:  # KL( N(μ_t, σ_t²) || N(μ_{t−1}, τ²) ), summed over dims, mean over tokens
            tau2 = cfg.vae_tau ** 2
            var = sigma[:, 1:].pow(2)
            kl = 0.5 * (var / tau2 + (mu[:, 1:] - mu[:, :-1]).pow(2) / tau2 - 1 - torch.log(var / tau2))
            smooth = kl.sum(-1).mean()
        total = main + cfg.w_aux * aux + cfg.w_smooth * smooth
        return {"main": main, "aux": aux, "smooth": smooth, "total": total}

    def _aux_loss(self, idx, targets, loss_mask, ybar, split):
        """split: CPU LongTensor (b,) — its values set the shapes below; a device copy indexes the tensors."""
        b, t = idx.shape[:2]
        split_dev = split.to(idx.device)
        rows = torch.arange(b, device=idx.device)
        ytilde = ybar[rows, split_dev - 1]                           # (b, e)
        m = t - int(split.min())
        if self.config.aux_suffix_len is not None:
            m = min(m, self.config.aux_suffix_len)
        src = split_dev[:, None] + torch.arange(m, device=idx.device)  # (b, m) source positions of the suffix
        valid = src < t                                              # padded slots are masked out below
        suffix, suffix_targets = _take_positions(idx, src), _take_positions(targets, src)
        mask = valid if loss_mask is None else valid & _take_positions(loss_mask.bool(), src)
        # Padding every row to the longest suffix wastes ~45 % of the pass for uniform splits: rows sorted by
        # suffix length run in up to _AUX_GROUPS groups, each only as long as its own longest suffix.
        logits = None
        for group in torch.argsort(split).chunk(_AUX_GROUPS):
            m_group = min(m, t - int(split[group].min()))
            group = group.to(idx.device)
            out = self._specialized(suffix[group, :m_group], ytilde[group])
            if logits is None:
                logits = out.new_zeros(b, m, out.shape[-1])
            logits[group, :m_group] = out                            # the rest is padding, masked out
        return masked_loss(self.config, logits, suffix_targets, mask)

    def aux_logits(self, idx: torch.Tensor, split: int | torch.Tensor) -> torch.Tensor:
        """Logits of the auxiliary path for an explicit split (all rows' suffixes left-aligned, padded at the end
        with the last token): (b, t − min(split), v). Row i's first t − split_i positions are its suffix."""
        idx = validate_inputs(self.config, idx, device=self.device)
        b, t = idx.shape[:2]
        split = self._check_split(split, b, t)
        split_dev = split.to(idx.device)
        ybar = self._lower(idx)[1]
        ytilde = ybar[torch.arange(b, device=idx.device), split_dev - 1]
        src = split_dev[:, None] + torch.arange(t - int(split.min()), device=idx.device)
        return self._specialized(_take_positions(idx, src), ytilde)
