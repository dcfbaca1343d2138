"""GPT (the plain baseline) and CGT (Contextually Guided Transformer); docs/CGT.md explains the model.

Notation (einops letters): b batch, t time, d width of x (d_x), e width of y (d_y), h heads,
k templates (K), r template rank, v output width (vocab or output_dim), ν layer (1-based).

A CGT owns a complete GPT (`cgt.gpt`) for its x stream, so "x is computed exactly as in a plain
Transformer" holds by construction; the y stream, the summary LayerNorm and the templates are extra
modules that only ever *read* x below ℓ and *transform the inputs* of x's linear maps above ℓ. What a
model family supplies is the x-stream protocol of `streams.py` (`GPTStream` here; `hf.CGTLM` is this same
CGT over a pretrained LM, `hf.stream.HFStream`); everything else is written once in `CGT`.

Named outputs (`CGT.run_with_cache`): `cgt_viz.outputs.OUTPUTS`, where each name is declared once.
Input contracts (shapes, dtypes, devices, ranges) live in `contracts.py`; each entry point applies them once.
"""
from __future__ import annotations

import copy
import itertools
import math
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._checks import Bool, Folder, Generator, Instance, Int, check_int, checked, describe, refuse
from .config import CGTConfig
from .contracts import (IGNORE_INDEX, Ablate, CacheNames, Inputs, LossMask, Prompts, Split, Summaries, Summary, Targets,
                        check_aux_length, check_inputs, check_prompts, check_split, check_targets)
from .generation import Generation
from .io import PretrainedMixin, fold_affine_ln_y
from .layers import SITE_WEIGHTS, Block, EMAReadout, SiteTemplates, TokenMemory, TokenShift, YBlock, init_weights
from .sites import MEMORY_SITE, site_width
from .streams import GPTStream, cache_entry
from .distill import aux_objective
from .losses import SMOOTHNESS, aux_length_groups, masked_loss, per_position_loss, smoothness_penalty, take_positions
from . import outputs
from .outputs import COEFFS, LOGITS, Y, YBAR, YBAR_SIGMA


class GPT(PretrainedMixin, Generation, nn.Module):
    """A plain pre-LN decoder-only Transformer: the x stream of a CGT, and the baseline."""

    @checked(config=Instance(CGTConfig, "a CGTConfig"))
    def __init__(self, config: CGTConfig):
        super().__init__()
        self.config = cfg = config
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_x) if cfg.mode == "tokens" else nn.Linear(cfg.input_dim, cfg.d_x)
        self.wpe = nn.Embedding(cfg.block_size, cfg.d_x)
        self.shift = TokenShift(cfg.token_shift, cfg.vocab_size, cfg.input_dim, cfg.d_x) if cfg.token_shift != "none" else None
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg.d_x, cfg.n_head, cfg.mlp_ratio, cfg.bias, cfg.dropout)
                                    for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_x, bias=cfg.bias)
        self.head = nn.Linear(cfg.d_x, cfg.out_dim, bias=False)
        init_weights(self, cfg.n_layer)
        self._n_attention = cfg.n_layer + (self.shift is not None)   # the token shift keeps its inputs in the last cache

    def embed_inputs(self, inp: torch.Tensor, pos_offset: int = 0, cache=None) -> torch.Tensor:
        """(b, t) tokens or (b, t, input_dim) vectors -> x.0 (b, t, d); positions start at pos_offset."""
        pos = torch.arange(pos_offset, pos_offset + inp.shape[1], device=inp.device)
        x = self.embed(inp) + self.wpe(pos)
        if self.shift is not None:
            x = x + self.shift(inp, None if cache is None else cache[-1])
        return self.drop(x)

    def _step(self, inp: torch.Tensor, cache, pos_offset: int) -> torch.Tensor:
        x = self.embed_inputs(inp, pos_offset, cache)
        for i, block in enumerate(self.blocks):
            x = block(x, cache=None if cache is None else cache[i])
        return self.head(self.ln_f(x))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """idx (b, t) -> logits (b, t, v)."""
        return self._step(check_inputs(self.config, idx, device=self.device), None, 0)

    def loss(self, idx: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor | None = None,
             split=None) -> dict[str, torch.Tensor]:
        """The same dict as CGT.loss; a GPT has only the main term (`split` is accepted and unused)."""
        idx = check_inputs(self.config, idx, device=self.device)
        check_targets(self.config, idx, targets, loss_mask)
        main = masked_loss(self.config, self._step(idx, None, 0), targets, loss_mask)
        zero = main.new_zeros(())
        return {"main": main, "aux": zero, "smooth": zero, "total": main}


class CGT(PretrainedMixin, Generation, nn.Module):
    """Contextually Guided Transformer: a GPT whose layers above ℓ are modulated by the context summary ȳ.

    The x stream is a `streams.XStream`: here a from-scratch GPT (`self.gpt`); `hf.CGTLM` is the same model
    over a pretrained LM."""

    stream = GPTStream

    @checked(config=Instance(CGTConfig, "a CGTConfig"))
    def __init__(self, config: CGTConfig, **x_parts):
        """x_parts: what a family's x stream is built from besides the config (`hf.CGTLM`: lm); see _build_x."""
        super().__init__()
        self.config = cfg = config
        self._build_x(cfg, **x_parts)
        self.y_blocks = nn.ModuleList(YBlock(cfg.d_x, cfg.d_y, cfg.n_head_y, cfg.mlp_ratio, cfg.bias, cfg.dropout)
                                      for _ in range(self._n_y_blocks(cfg)))
        # no learnable gain/bias: ȳ keeps a fixed scale (‖ȳ_t‖² = d_y), so the smoothness penalty cannot be met by
        # shrinking a gain, and c = A ȳ + b absorbs any affine map anyway (old checkpoints are folded on load)
        self.ln_y = nn.LayerNorm(cfg.d_y, elementwise_affine=False)
        self.register_load_state_dict_pre_hook(fold_affine_ln_y)
        self._init_y(cfg)
        if SMOOTHNESS[cfg.smooth].posterior:  # log σ of the posterior N(μ_t, σ_t²) over ȳ_t
            self.y_logsigma = nn.Linear(cfg.d_y, cfg.d_y)
            nn.init.zeros_(self.y_logsigma.weight)
            nn.init.constant_(self.y_logsigma.bias, float(torch.tensor(cfg.vae_sigma).log()))
        # templates["ν"]["site"] for ν = ℓ+1..N (ModuleDict keys must be strings), as wide as the x stream's maps
        widths = self.stream.widths(self)
        self.templates = nn.ModuleDict({
            str(layer): nn.ModuleDict({site: SiteTemplates(site_width(site, widths), cfg.d_y, cfg.n_templates,
                                                           cfg.template_rank)
                                       for site in cfg.sites})
            for layer in self.modulated_layers})
        self.y_ema = EMAReadout(cfg.d_x, cfg.d_y) if cfg.y_readout == "ema" else None
        # caches: x stream (blocks, and the token shift's history when present), y blocks, the EMA's history
        self._n_attention = self.stream.caches(self) + cfg.y_layer + (self.y_ema is not None)
        # the token memory at the map reading MEMORY_SITE of the top memory_layers layers: built last, so every other
        # weight draws the same random numbers as in the same CGT without one
        self.memory = (TokenMemory(cfg.d_x, site_width(MEMORY_SITE, widths), self.modulated_layers[-cfg.memory_layers:],
                                   cfg.memory_rank) if cfg.memory_layers else None)

    # ------------------------------------------------------------------ what a family builds (hf.CGTLM overrides)
    def _build_x(self, cfg: CGTConfig) -> None:
        """The x stream's modules and the y stream's input: a from-scratch GPT, y's token (and position) embedding."""
        self.gpt = GPT(cfg)
        self.y_embed = nn.Embedding(cfg.vocab_size, cfg.d_y) if cfg.mode == "tokens" else nn.Linear(cfg.input_dim, cfg.d_y)
        self.y_wpe = nn.Embedding(cfg.block_size, cfg.d_y) if cfg.y_pos else None

    def _n_y_blocks(self, cfg: CGTConfig) -> int:
        """How many y blocks read x_1..x_ℓ (one per layer below the templates)."""
        return cfg.y_layer

    def _init_y(self, cfg: CGTConfig) -> None:
        """The y stream's initialisation, after its blocks are built (and any read-out modules of the family's own)."""
        init_weights(nn.ModuleList([self.y_embed, self.y_blocks] + ([self.y_wpe] if self.y_wpe is not None else [])),
                     cfg.n_layer)

    # ------------------------------------------------------------------ names
    @property
    def modulated_layers(self) -> list[int]:
        """ν = ℓ+1..N (1-based)."""
        return list(range(self.config.y_layer + 1, self.config.n_layer + 1))

    @property
    def template_sites(self) -> list[tuple[int, str]]:
        """Every site κ as (layer ν, site name), in forward order."""
        return [(layer, site) for layer in self.modulated_layers for site in self.config.sites]

    def cache_names(self) -> list[str]:
        """Every name run_with_cache can return (cgt_viz.outputs.OUTPUTS for this model)."""
        return outputs.cache_names(self)

    # ------------------------------------------------------------------ the passes
    def _y_stream(self, inp, cache=None, pos_offset=0, record=None, noise=False, ablate=None, stop=False):
        """The y stream as the x stream's ystep(ν, x_ν), ν = 0..ℓ, and the dict it fills at ℓ: "x" (x_ℓ), "pre"
        (the summary before its LayerNorm), "mu" (ȳ's mean), "sigma" (None unless the smoothness kind has a
        posterior), "ybar" (sampled with noise). At ℓ it returns the coefficients (None with stop)."""
        cfg, out = self.config, {}
        posterior = SMOOTHNESS[cfg.smooth].posterior

        def ystep(nu, x):
            if nu == 0:
                out["y"] = self.stream.y_input(self, inp, pos_offset)
                if record is not None:
                    record[Y(0)] = out["y"]
            elif nu <= len(self.y_blocks):   # y block ν reads x_ν ("post") or x_{ν−1} ("pre"), writes y only
                read = x if cfg.y_reads == "post" else out["x"]
                out["y"] = self.y_blocks[nu - 1](read, out["y"], cache=cache_entry(cache, cfg.n_layer + nu - 1))
                if record is not None:
                    record[Y(nu)] = out["y"]
            out["x"] = x
            if nu < cfg.y_layer:
                return None
            out["pre"] = pre = self.stream.readout(self, x, out["y"], cache)
            out["mu"] = mu = self.ln_y(pre)
            out["sigma"] = sigma = self.y_logsigma(pre).exp() if posterior else None
            out["ybar"] = mu + sigma * torch.randn_like(mu) if (noise and sigma is not None) else mu
            if record is not None:
                record[YBAR()] = mu
                if sigma is not None:
                    record[YBAR_SIGMA()] = sigma
            if stop:
                return None
            coeffs = self._coefficients(out["ybar"], ablate)
            if record is not None:
                for layer, site in self.template_sites:
                    record[COEFFS(layer, site)] = coeffs[f"{layer}.{site}"]
            if self.memory is not None:   # the full mode: every position reads the memory of its own prefix
                if cache is not None:
                    raise refuse("use_cache", "False for a CGT with a token memory", "True",
                                 hint="the full mode's memory reads every earlier position again at each step; "
                                      "generate(..., use_cache=False)")
                after = torch.cat([inp[:, 1:], inp[:, -1:]], dim=1)       # (b, t): the token after each position
                coeffs = {**coeffs, "memory": (self._memory_states(x), self._memory_values(after))}
            return coeffs

        return ystep, out

    def _lower(self, inp, cache=None, pos_offset=0, record=None):
        """Layers 1..ℓ and the y stream only. Returns x_ℓ, μ = LN(summary), the summary before its LayerNorm."""
        ystep, out = self._y_stream(inp, cache, pos_offset, record, stop=True)
        self.stream.run(self, inp, ystep, cache=cache, pos_offset=pos_offset, record=record, stop=True)
        return out["x"], out["mu"], out["pre"]

    def _coefficients(self, ybar, ablate=None) -> dict[str, torch.Tensor]:
        """c^κ(ȳ) at every site "ν.site": ybar (..., e) -> (..., K); the templates in `ablate` give 0."""
        out = {}
        for layer, site in self.template_sites:
            key = f"{layer}.{site}"
            coeffs = self.templates[str(layer)][site].coefficients(ybar)
            if ablate and key in ablate:
                keep = torch.ones(coeffs.shape[-1], dtype=coeffs.dtype, device=coeffs.device)
                keep[list(ablate[key])] = 0
                coeffs = coeffs * keep
            out[key] = coeffs
        return out

    def _fixed_coeffs(self, ybar_vec: torch.Tensor, ablate=None) -> dict:
        """ȳ frozen per row: ybar_vec (b, e) -> {"ν.site": (b, 1, K)}."""
        return {key: c[:, None, :] for key, c in self._coefficients(ybar_vec, ablate).items()}

    def _modulate(self, layer: int, site: str, h: torch.Tensor, coeffs: dict) -> torch.Tensor:
        """The seam of every x stream: T(ȳ) h at one site, coeffs {"ν.site": (b, t|1, K)} (h as it is if absent).
        Outside autocast the templates compute in their own dtype (a bf16 LM keeps float32 templates)."""
        c = coeffs.get(f"{layer}.{site}")
        if c is None:
            return h
        temp = self.templates[str(layer)][site]
        if torch.is_autocast_enabled():
            return temp.apply(h, c)
        return temp.apply(h.to(temp.U.dtype), c.to(temp.U.dtype)).to(h.dtype)

    def _hidden(self, inp, coeffs=None, record=None, ablate=None, cache=None, pos_offset=0, noise=False):
        """The x stream's final outputs (b, t, ·) and ȳ (None when coeffs are given: ȳ frozen)."""
        ystep, out = self._y_stream(inp, cache, pos_offset, record, noise, ablate)
        final = self.stream.run(self, inp, ystep, coeffs, cache, pos_offset, record)
        return final, out.get("ybar")

    def _logits(self, final: torch.Tensor) -> torch.Tensor:
        return self.stream.final_logits(self, final)

    def _full(self, inp, cache=None, pos_offset=0, record=None, noise=False, ablate=None):
        """Full ("not fixed") pass: every token uses its own ȳ_t. Returns logits, ȳ, μ, σ (σ None unless the
        smoothness kind has a posterior)."""
        ystep, out = self._y_stream(inp, cache, pos_offset, record, noise, ablate)
        logits = self._logits(self.stream.run(self, inp, ystep, None, cache, pos_offset, record))
        if record is not None:
            record[LOGITS()] = logits
        return logits, out["ybar"], out["mu"], out["sigma"]

    def _specialized(self, inp, ybar_vec, cache=None, pos_offset=0, ablate=None):
        """x-only pass with T(ȳ) frozen per row; ybar_vec (b, e). Positions start at pos_offset."""
        return self._logits(self._hidden(inp, self._fixed_coeffs(ybar_vec, ablate), cache=cache,
                                         pos_offset=pos_offset)[0])

    def _step(self, inp, cache, pos_offset):
        return self._full(inp, cache, pos_offset)[0]

    # ------------------------------------------------------------------ the token memory (layers.TokenMemory)
    def memory_map(self, layer: int) -> str:
        """The weight of the x stream's module (a state-dict key of stream.base) the token memory of layer ν writes."""
        return self.stream.site_maps(self, layer, MEMORY_SITE)[0]

    def _memory_states(self, x: torch.Tensor) -> torch.Tensor:
        """LN(x_ℓ) (no gain or bias) in the memory's dtype: what its slots read. x (b, t, d) -> (b, t, d)."""
        x = x.to(self.memory.read.weight.dtype)
        return F.layer_norm(x, x.shape[-1:])

    def _memory_values(self, tokens: torch.Tensor) -> torch.Tensor:
        """u(t): the output embedding rows of tokens (b, m) -> (b, m, o), in the memory's dtype."""
        return self.stream.output_rows(self)[tokens.long()].to(self.memory.read.weight.dtype)

    def memory_slots(self, states: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A prompt's slots j = 1..p−2: states (b, p, d) its x_ℓ, tokens (b, p) -> LN(x_ℓ,j) (b, p−2, d) and the
        output embedding row of the token after each, u(t_{j+1}) (b, p−2, o)."""
        return self._memory_states(states[:, 1:-1]), self._memory_values(tokens[:, 2:])

    def memory_coeffs(self, states: torch.Tensor, tokens: torch.Tensor,
                      lengths: torch.Tensor | None = None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """The compiled memory of prompts (states (b, p, d) x_ℓ, tokens (b, p)) as entries of a pass's coeffs:
        {"ν.memory": (A (b, m, i), B (b, o, m))}, ΔW = B @ A at layer ν's memory map ({} without a memory).
        lengths (b,): row i's prompt is its first lengths[i] positions only (the aux loss's splits)."""
        if self.memory is None:
            return {}
        slots, values = self.memory_slots(states, tokens)
        mask = None
        if lengths is not None:   # slot j (at index j − 1) belongs to a prompt of length s when j ≤ s − 2
            j = torch.arange(1, slots.shape[1] + 1, device=slots.device)
            mask = j[None, :] <= lengths.to(slots.device)[:, None] - 2                          # (b, m)
        return {f"{layer}.memory": self.memory.factors(layer, slots, values, mask) for layer in self.memory.layers}

    def _remember(self, layer: int, h: torch.Tensor, out: torch.Tensor, coeffs: dict | None) -> torch.Tensor:
        """The output of layer ν's memory map plus the memory's term: h its input (b, t, i), out (b, t, o).
        coeffs holds "ν.memory" (a compiled memory, ȳ frozen) or "memory" (the full mode's causal memory); a
        "memory.seen" dict there receives h by layer (what memory_reads and calibrate_memory look at)."""
        if self.memory is None or layer not in self.memory.layers or not coeffs:
            return out
        seen = coeffs.get("memory.seen")
        if seen is not None:
            seen[layer] = h
        if "memory" not in coeffs and f"{layer}.memory" not in coeffs:
            return out
        dtype = out.dtype if torch.is_autocast_enabled() else self.memory.read.weight.dtype
        fixed = coeffs.get(f"{layer}.memory")
        if fixed is not None:
            delta = TokenMemory.apply_fixed(h.to(dtype), fixed[0].to(dtype), fixed[1].to(dtype))
        else:
            delta = self.memory.apply_causal(layer, h.to(dtype), *coeffs["memory"])
        return out + delta.to(out.dtype)

    def _prompt_coeffs(self, prompt: torch.Tensor, ablate=None) -> dict:
        """Everything a compile freezes, per row of prompt (b, p), from one pass over layers 1..ℓ: the templates'
        {"ν.site": (b, 1, K)} at ȳ after the last token and, with a token memory, {"ν.memory": (A, B)}."""
        x, ybar, _ = self._lower(prompt)
        return {**self._fixed_coeffs(ybar[:, -1], ablate), **self.memory_coeffs(x, prompt)}

    @torch.no_grad()
    def compiled_coeffs(self, prompt: torch.Tensor) -> dict:
        """Everything a compile freezes, for one prompt (t,) or (1, t), from one pass over it (layers 1..ℓ):
        {"ν.site": (1, 1, K)} the templates' coefficients at ȳ after the prompt and, with a token memory,
        {"ν.memory": (A (1, m, i), B (1, o, m))}. A pass with these coeffs is specialize(prompt), unmerged."""
        rows, x, ybar = self._compile_pass(prompt)
        return {**self._fixed_coeffs(ybar), **self.memory_coeffs(x, rows)}

    def _compile_pass(self, prompt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The one pass a compile makes over one prompt (t,) or (1, t), layers 1..ℓ: -> its ids (1, t), x_ℓ
        (1, t, d) (what a token memory reads) and ȳ after its last token (1, e)."""
        rows, single = check_prompts(self.config, prompt, self.device)
        if not single:
            raise refuse("prompt", "one prompt (t,) or (1, t) here", describe(prompt))
        x, ybar, _ = self._lower(rows)
        return rows, x, ybar[:, -1]

    def forward_compiled(self, idx: torch.Tensor, prompt: torch.Tensor) -> torch.Tensor:
        """The compiled model of one prompt, unmerged: idx (b, t) -> logits (b, t, v), the logits of
        specialize(prompt)(idx) (with or without a token memory)."""
        coeffs = self.compiled_coeffs(prompt)
        idx = check_inputs(self.config, idx, device=self.device)
        return self._logits(self._hidden(idx, coeffs)[0])

    @torch.no_grad()
    def memory_reads(self, prompt: torch.Tensor, idx: torch.Tensor, layer: int | None = None) -> dict[str, torch.Tensor]:
        """What the compiled memory of one prompt (t,) or (1, t) does over a text idx (c,) or (1, c) at memory
        layer ν (default the top one): {"written": (m,) the token each slot writes (t_{j+1}), "read_at": (m,) the
        token at the slot's own position j, "weights": (c, m) the slot's weight s/m · a_j · h at each position of
        idx (its write there is weights @ u(written))}. What the memory reads from the prompt and writes."""
        if self.memory is None:
            raise refuse("model", f"a {type(self).__name__} with a token memory (memory_layers > 0)", "memory_layers=0")
        layer = self.memory.layers[-1] if layer is None else layer
        if layer not in self.memory.layers:
            raise refuse("layer", f"one of the memory layers {self.memory.layers}", repr(layer))
        rows, single = check_prompts(self.config, prompt, self.device)
        if not isinstance(idx, torch.Tensor):
            raise refuse("idx", "a tensor of token ids (c,) or (1, c)", describe(idx), TypeError)
        text = check_inputs(self.config, idx if idx.dim() == 2 else idx[None], name="idx", device=self.device)
        if not single or text.shape[0] != 1:
            raise refuse("prompt and idx", "one prompt and one text", f"{tuple(rows.shape)} and {tuple(text.shape)}")
        coeffs = self.compiled_coeffs(rows)
        seen: dict[int, torch.Tensor] = {}
        self._hidden(text, {**coeffs, "memory.seen": seen})
        lora_a, lora_b = coeffs[f"{layer}.memory"]
        h = seen[layer].to(lora_a.dtype)
        scale = self.memory.gain(layer) / max(lora_a.shape[1], 1)
        return {"written": rows[0, 2:], "read_at": rows[0, 1:-1], "weights": (h @ lora_a.transpose(1, 2))[0] * scale}

    @torch.no_grad()
    def prompt_factors(self, prompt: torch.Tensor) -> "LoraFactors":
        """The whole compiled update of one prompt (t,) or (1, t): {weight name: (A (r, i), B (o, r))} with
        W' = W + B @ A. The templates' factors at ȳ after the prompt (`lora_factors`) and, with a token memory,
        its slots' at each memory map (a map both write gets both, stacked along r)."""
        rows, x, ybar = self._compile_pass(prompt)
        factors = self.lora_factors(ybar[0])
        for key, (lora_a, lora_b) in self.memory_coeffs(x, rows).items():
            name = self.memory_map(int(key.split(".")[0]))
            lora_a, lora_b = lora_a[0], lora_b[0]
            if name in factors:
                lora_a = torch.cat([factors[name][0], lora_a])
                lora_b = torch.cat([factors[name][1], lora_b], dim=1)
            factors[name] = (lora_a, lora_b)
        return factors

    @torch.no_grad()
    @checked(idx=Inputs("self", on_device=True), batch_size=Int(1))
    def calibrate_memory(self, idx: torch.Tensor, batch_size: int = 16) -> "CGT":
        """Data-dependent start for the token memory's keys from full-mode passes over the rows of idx (n, t):
        as `_fit_memory`, on LN(x_ℓ) and the input of each memory map at every position."""
        if self.memory is None:
            raise refuse("model", f"a {type(self).__name__} with a token memory (memory_layers > 0) to calibrate it",
                         "memory_layers=0")
        states, inputs = [], {layer: [] for layer in self.memory.layers}
        for rows in idx.split(batch_size):
            record: dict[str, torch.Tensor] = {}
            ystep, out = self._y_stream(rows, record=record)
            seen: dict[int, torch.Tensor] = {}

            def with_seen(nu, x, ystep=ystep, seen=seen):
                coeffs = ystep(nu, x)
                return None if coeffs is None else {**coeffs, "memory.seen": seen}
            self.stream.run(self, rows, with_seen)
            states.append(self._memory_states(out["x"]).flatten(0, 1).float())
            for layer in self.memory.layers:
                inputs[layer].append(seen[layer].flatten(0, 1).float())
        base = self.stream.base(self)
        h = {layer: torch.cat(v) for layer, v in inputs.items()}
        # the map's own write W h (+ bias), as the MLP writes it: what s = 1 is scaled to
        outputs = {layer: F.linear(v, base.get_parameter(self.memory_map(layer)).float(),
                                   None if (b := base.get_submodule(self.memory_map(layer)[:-len(".weight")]).bias)
                                   is None else b.float()) for layer, v in h.items()}
        return self._fit_memory(torch.cat(states), h, outputs)

    @torch.no_grad()
    def _fit_memory(self, x: torch.Tensor, h: dict[int, torch.Tensor], outputs: dict[int, torch.Tensor]) -> "CGT":
        """Set the token memory's keys from N positions: x (N, d) LN(x_ℓ), h {ν: (N, i)} the input of each memory
        map there, outputs {ν: (N, o)} its output.

        The keys K_ν R LN(x_ℓ,j) are fit (least squares, rank memory_rank shared over the layers) to the centred
        input h_ν,j − h̄_ν of each memory map at the same position, and D_ν is set to the inverse variance of each
        input feature: a slot then starts as the state its position reaches at layer ν, and a · h measures how
        alike two positions are there in units of each feature's spread, instead of a random number.
        `unit` is set so that s = 1 writes about as much as the layer's MLP."""
        mem = self.memory
        x_mean = x.mean(0)
        h_mean = {layer: v.mean(0) for layer, v in h.items()}
        xc = x - x_mean
        target = torch.cat([h[layer] - h_mean[layer] for layer in mem.layers], dim=1)        # (N, L·i)
        weights = torch.linalg.lstsq(xc, target).solution                                    # (d, L·i)
        u, sv, vt = torch.linalg.svd(weights, full_matrices=False)
        r = min(mem.read.weight.shape[0], sv.shape[0])
        read = torch.zeros_like(mem.read.weight)
        read[:r] = u[:, :r].t()                                                              # (rank, d)
        keys = (sv[:r, None] * vt[:r]).split(h[mem.layers[0]].shape[1], dim=1)              # L × (r, i)
        mem.read.weight.copy_(read)
        for at, (layer, k) in enumerate(zip(mem.layers, keys)):
            variance = h[layer].var(0)
            # a feature that barely varies would otherwise dominate: its variance is floored at a share of the mean
            mem.in_scale[at] = 1.0 / (variance + 0.01 * variance.mean())
            linear = mem.keys[str(layer)]
            linear.weight.zero_()
            linear.weight[:, :r] = k.t() / mem.norm
        # s = 1: the memory's write (values of unit norm, as the output rows are about) as large as the MLP's
        for at, layer in enumerate(mem.layers):
            a = mem.slot_keys(layer, x[:512][None])[0]                                       # (n, i)
            scores = h[layer][:512] @ (a - a.mean(0)).t() / a.shape[0]                       # (n, n)
            row = self.stream.output_rows(self).float().norm(dim=1).mean()
            write = scores.abs().sum(1).mean() * row
            mem.unit[at] = (outputs[layer].norm(dim=1).mean() / write.clamp_min(1e-12)).item()
        return self

    # ------------------------------------------------------------------ public API
    @checked(idx=Inputs("self", on_device=True), ablate=Ablate())
    def forward(self, idx: torch.Tensor, ablate: dict[str, Sequence[int]] | None = None) -> torch.Tensor:
        """Full ("not fixed") mode: idx (b, t) -> logits (b, t, v). ablate {"ν.site": [k, ...]} switches
        those templates off for this call only (c_k = 0); nothing in the model changes."""
        return self._full(idx, ablate=ablate)[0]

    @checked(idx=Inputs("self", on_device=True))
    def context(self, idx: torch.Tensor) -> torch.Tensor:
        """ȳ at every token: idx (b, t) -> (b, t, e). Deterministic (the posterior mean under "vae"); runs only
        layers 1..ℓ."""
        return self._context(idx)

    def _context(self, idx: torch.Tensor) -> torch.Tensor:
        """context for ids its caller checked (`analysis.collect_ybar`): nothing is checked again."""
        return self._lower(idx)[1]

    @checked(idx=Inputs("self", on_device=True), names=CacheNames(), ablate=Ablate())
    def run_with_cache(self, idx: torch.Tensor, names: str | Sequence[str] | Callable[[str], bool] | None = None,
                       ablate: dict[str, Sequence[int]] | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """logits (b, t, v) and the named activations (names and shapes: cgt_viz.outputs), in cache_names order.

        names: None (all), a name or glob pattern ("coeffs.*"), a list of them, or a predicate name -> bool."""
        known = self.cache_names()
        record = _Record(names)
        logits = self._full(idx, record=record, ablate=ablate)[0]
        return logits, {name: record[name] for name in known if name in record}

    @checked(idx=Inputs("self", on_device=True), ybar_vec=Summary(rows_of="idx"), ablate=Ablate())
    def forward_specialized(self, idx: torch.Tensor, ybar_vec: torch.Tensor,
                            ablate: dict[str, Sequence[int]] | None = None) -> torch.Tensor:
        """The specialized model, unmerged: x-only pass over idx (b, t) with T(ȳ) frozen at ybar_vec (b, e). The
        templates only: with a token memory the compiled model of a prompt is `forward_compiled(idx, prompt)`."""
        return self._specialized(idx, ybar_vec.expand(idx.shape[0], -1), ablate=ablate)

    @checked(ybar=Summaries())
    def coefficients(self, ybar: torch.Tensor) -> dict[str, torch.Tensor]:
        """c^κ(ȳ) for every site: ybar (..., e) -> {"ν.site": (..., K)}."""
        return self._coefficients(ybar)

    @checked(ybar_vec=Summary(keep_shape=True))
    def lora_factors(self, ybar_vec: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Per modulated weight name of the x stream's module, (A, B) with W' = W + B @ A.

        ybar_vec (e,) -> A (K·r, i), B (o, K·r);  ybar_vec (b, e) -> A (b, K·r, i), B (b, o, K·r), whatever the
        orientation W is stored in (a Conv1D's (i, o) is transposed first: B @ A is always (o, i), as PEFT's).
        Names are state-dict keys of that module (a GPT: "blocks.2.attn.c_attn.weight"); the maps that read one
        site share A. A GPT name of a site's map resolves in every family (see LoraFactors).
        """
        single = ybar_vec.dim() == 1
        ybar_vec = ybar_vec[None] if single else ybar_vec
        base, out, aliases = self.stream.base(self), {}, {}
        for layer, site in self.template_sites:
            temp = self.templates[str(layer)][site]
            coeffs = temp.coefficients(ybar_vec.to(temp.U.dtype))
            names = self.stream.site_maps(self, layer, site)
            aliases[f"blocks.{layer - 1}.{SITE_WEIGHTS[site]}.weight"] = names
            for name in names:
                weight = base.get_parameter(name)   # (o, i); stored (i, o) by a Conv1D (the stream says which)
                weight = weight.t() if self.stream.fan_in_fan_out(self, name) else weight
                lora_a, lora_b = temp.factors(weight.to(temp.U.dtype), coeffs)
                out[name] = (lora_a[0], lora_b[0]) if single else (lora_a, lora_b)
        return LoraFactors(out, aliases)

    def x_only(self) -> nn.Module:
        """The x stream with T = I: the model with no context at all (a copy of the GPT; the LM itself)."""
        return self.stream.no_context(self)

    @checked(ybar_vec=Summary(one_for="merged_gpt"), share_weights=Bool())
    def merged_gpt(self, ybar_vec: torch.Tensor, share_weights: bool = True) -> nn.Module:
        """The x stream's model (a GPT, or the LM's own class) whose weights are W + B @ A for one ȳ (e,): the
        specialized model from a summary.

        share_weights=True (the default, in both families): the weights no template touches are this model's own
        tensors, not copies, so N specialized models cost N × the modulated weights only (over a pretrained LM a
        copy per prompt would cost the LM each time). It is for inference: training such a model, or moving it
        to another device in place, also changes the CGT (and its siblings); share_weights=False copies
        everything."""
        return self._merged(self.lora_factors(ybar_vec[0]), share_weights)

    def _merged(self, factors: dict[str, tuple[torch.Tensor, torch.Tensor]], share_weights: bool) -> nn.Module:
        """The x stream's model with W + B @ A at every weight named in factors {name: (A (r, i), B (o, r))}."""
        base = self.stream.base(self)
        # the merged weights go straight into deepcopy's memo: a full copy would clone W only for it to be overwritten
        memo: dict[int, Any] = ({id(t): t for t in itertools.chain(base.parameters(), base.buffers())}
                                if share_weights else {})
        with torch.no_grad():
            for name, (lora_a, lora_b) in factors.items():
                weight = base.get_parameter(name)
                delta = lora_b @ lora_a                                    # (o, i)
                delta = delta.t() if self.stream.fan_in_fan_out(self, name) else delta
                # W + (B @ A) in W's dtype, not addmm: under autocast the sum keeps W's dtype
                memo[id(weight)] = nn.Parameter(weight + delta.to(weight.dtype),
                                                requires_grad=weight.requires_grad)
        return self.stream.finish_merged(copy.deepcopy(base, memo))

    @torch.no_grad()
    @checked(prompt=Prompts(), share_weights=Bool())
    def specialize(self, prompt: torch.Tensor | Sequence[torch.Tensor], share_weights: bool = True):
        """Compile a prompt into the weights: one pass over it, then W' = W + B @ A at every site.

        prompt (t,) or (1, t) -> a model of the x stream's class (a GPT, or e.g. a LlamaForCausalLM);  (b, t) with
        b > 1, or a list of prompts -> a list of them. In vectors mode a prompt is (t, input_dim),
        (b, t, input_dim) or a list of (t, input_dim).
        share_weights: see merged_gpt (True: for inference; False: an independent copy to train or move).
        """
        if isinstance(prompt, list):
            return [self.specialize(p, share_weights) for p in prompt]
        if self.memory is not None:   # each prompt's own slots as well: one compile per row
            models = [self._merged(self.prompt_factors(row), share_weights) for row in prompt]
            return models[0] if len(models) == 1 else models
        ybar = self._lower(prompt)[1][:, -1]  # (b, e): the summary after the last prompt token
        models = [self.merged_gpt(row, share_weights) for row in ybar]
        return models[0] if len(models) == 1 else models   # one prompt, (t,) or (1, t): one model

    @torch.no_grad()
    def prompt_summary(self, prompt: torch.Tensor) -> torch.Tensor:
        """ȳ after the last token of one prompt (t,) or (1, t) -> (e,)."""
        rows, single = check_prompts(self.config, prompt, self.device)
        if not single:
            raise refuse("prompt", "one prompt (t,) or (1, t) here", describe(prompt))
        return self._lower(rows)[1][0, -1]

    # ------------------------------------------------------------------ losses
    @checked(batch=Int(1))
    def sample_split(self, batch: int, length: int, generator: torch.Generator | None = None,
                     device=None) -> torch.Tensor:
        """Per-row split s (number of prefix tokens), uniform in [aux_min_prefix, length − aux_min_suffix]."""
        cfg = self.config
        check_int("length", length, cfg.aux_min_prefix + cfg.aux_min_suffix, cfg.block_size,
                  hint=" (aux_min_prefix + aux_min_suffix .. block_size)")
        s = torch.randint(cfg.aux_min_prefix, length - cfg.aux_min_suffix + 1, (batch,), generator=generator)
        return s.to(device) if device is not None else s

    @checked(idx=Inputs("self", on_device=True), targets=Targets(), loss_mask=LossMask(), split=Split(),
             generator=Generator())
    def loss(self, idx: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor | None = None,
             split: int | torch.Tensor | None = None, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """main + w_aux·aux + w_smooth·smooth, each a scalar tensor in the returned dict.

        aux: ỹ = ȳ at token s−1 (the last prefix token) from this same pass, gradients flowing; the
        x-only specialized model runs on the suffix alone (positions from 0) and is scored on it.
        split: None (sampled per row), an int, or a LongTensor (b,) of prefix lengths.
        """
        cfg = self.config
        b, t = idx.shape[:2]
        ystep, out = self._y_stream(idx, noise=self.training and SMOOTHNESS[cfg.smooth].posterior)
        final = self.stream.run(self, idx, ystep)
        main = self._main_loss(final, targets, loss_mask)

        if cfg.w_aux > 0 or split is not None:
            if split is None:
                check_aux_length(cfg, idx)
            s = self.sample_split(b, t, generator) if split is None else split
            n_aux = max(1, math.ceil(cfg.aux_row_fraction * b)) if self.training else b
            keep = torch.randperm(b, generator=generator)[:n_aux] if n_aux < b else None   # a cheaper step
            teacher = final if cfg.aux_kl > 0 and self.stream.self_teacher else None
            # with a token memory, each row's compile also holds the slots of its own prefix (this pass's x_ℓ)
            memory = self.memory_coeffs(out["x"], idx, s) if self.memory is not None else {}
            aux = self._aux_loss(idx, targets, loss_mask, out["ybar"], s, keep, teacher, memory)
        else:
            aux = main.new_zeros(())

        smooth = smoothness_penalty(cfg.smooth, out["mu"], out["sigma"], cfg.vae_tau) if t >= 2 else main.new_zeros(())
        total = main + cfg.w_aux * aux + cfg.w_smooth * smooth
        return {"main": main, "aux": aux, "smooth": smooth, "total": total}

    def _main_loss(self, final, targets, loss_mask):
        """The main term from the full pass's final outputs: the masked mean of per_position_loss."""
        return masked_loss(self.config, final, targets, loss_mask)

    def _aux_scores(self, final, targets, mask, teacher, rows, src):
        """The aux term per suffix position from the specialised pass's final outputs (n, m, ·) -> loss (n, m),
        scored (n, m). teacher: this pass's full-mode outputs at the suffix (self_teacher families); rows (n, t)
        and src (n, m) the kept rows and their suffix positions (a family that computes its own teacher)."""
        loss, scored = per_position_loss(self.config.mode, final, targets, mask)
        return aux_objective(self.config, loss, final, teacher), scored

    def _aux_loss(self, idx, targets, loss_mask, ybar, split, keep=None, teacher=None, memory=None):
        """split: CPU LongTensor (b,) — its values set the shapes below; a device copy indexes the tensors.
        keep: CPU rows (n,) that run the pass (None: all); their loss sum × b/n over the scored positions of
        every row is an unbiased estimate of the all-rows loss (both families; a mean over the kept rows' own
        positions would weigh a row by its share of those, and be biased).
        teacher: the full-mode outputs (b, t, v) of this pass (the model that saw the prefix), for the
        distillation part of the aux term (aux_kl > 0); detached, so it only pulls the specialised model.
        memory: {"ν.memory": (A (b, m, i), B (b, o, m))}, each row's compiled prefix (a token memory; else {})."""
        b, t = idx.shape[:2]
        split_dev = split.to(idx.device)
        ytilde = ybar[torch.arange(b, device=idx.device), split_dev - 1]   # (b, e)
        m = t - int(split.min())
        if self.config.aux_suffix_len is not None:
            m = min(m, self.config.aux_suffix_len)
        src = split_dev[:, None] + torch.arange(m, device=idx.device)  # (b, m) source positions of the suffix
        valid = src < t                                              # padded slots are masked out below
        suffix, suffix_targets = take_positions(idx, src), take_positions(targets, src)
        mask = valid if loss_mask is None else valid & take_positions(loss_mask.bool(), src)
        if self.config.mode == "tokens":
            mask = mask & (suffix_targets != IGNORE_INDEX)
        count = mask.sum().clamp_min(1).to(ybar.dtype)
        teacher = None if teacher is None else take_positions(teacher, src)     # (b, m, v): saw the prefix
        rows = idx
        if keep is not None:
            k = keep.to(idx.device)
            split, suffix, suffix_targets, mask, ytilde = split[keep], suffix[k], suffix_targets[k], mask[k], ytilde[k]
            teacher = None if teacher is None else teacher[k]
            rows, src = idx[k], src[k]
            memory = {key: (a[k], b_[k]) for key, (a, b_) in (memory or {}).items()}
        n = suffix.shape[0]
        # Padding every row to the longest suffix wastes much of the pass (benchmarks/bench_aux_layouts.py): rows sorted by
        # suffix length run in up to losses.AUX_LENGTH_GROUPS groups, each only as long as its own longest suffix.
        final = None
        for group in aux_length_groups(split):
            m_group = min(m, t - int(split[group].min()))
            group = group.to(idx.device)
            coeffs = {**self._fixed_coeffs(ytilde[group]),
                      **{key: (a[group], b_[group]) for key, (a, b_) in (memory or {}).items()}}
            out = self._hidden(suffix[group, :m_group], coeffs)[0]
            if final is None:
                final = out.new_zeros(n, m, out.shape[-1])
            final[group, :m_group] = out                             # the rest is padding, masked out
        loss, scored = self._aux_scores(final, suffix_targets, mask, teacher, rows, src)
        return (loss * scored).sum() * (b / n) / count

    def aux_logits(self, idx: torch.Tensor, split: int | torch.Tensor) -> torch.Tensor:
        """Logits of the auxiliary path for an explicit split (all rows' suffixes left-aligned, padded at the end
        with the last token): (b, t − min(split), v). Row i's first t − split_i positions are its suffix."""
        idx = check_inputs(self.config, idx, device=self.device)
        b, t = idx.shape[:2]
        split = check_split(split, b, t)
        split_dev = split.to(idx.device)
        x, mu, _ = self._lower(idx)
        ytilde = mu[torch.arange(b, device=idx.device), split_dev - 1]                   # (b, e)
        src = split_dev[:, None] + torch.arange(t - int(split.min()), device=idx.device)
        # with a token memory, each row's compile holds its own prefix's slots, as in the loss
        coeffs = {**self._fixed_coeffs(ytilde), **self.memory_coeffs(x, idx, split)}
        return self._logits(self._hidden(take_positions(idx, src), coeffs)[0])


class LoraFactors(dict):
    """{weight name: (A, B)}, iterated by those names only. A cgt_viz GPT name of a site's map
    ("blocks.{ν−1}.attn.c_attn.weight", as the analysis functions ask) also resolves in every family: the maps
    that read that site, stacked (A shared, B's output rows concatenated, like GPT's fused c_attn)."""

    def __init__(self, items: dict, aliases: dict[str, list[str]]):
        super().__init__(items)
        self.aliases = aliases

    def __missing__(self, key):
        if key not in self.aliases:
            raise KeyError(key)
        names = self.aliases[key]
        return self[names[0]][0], torch.cat([self[n][1] for n in names], dim=-2)


class _Record(dict):
    """A dict that keeps only the names its filter accepts (activations that are not asked for are not held)."""

    def __init__(self, keep: Callable[[str], bool]):
        super().__init__()
        self.keep = keep

    def __setitem__(self, name: str, value: torch.Tensor) -> None:
        if self.keep(name):
            super().__setitem__(name, value)
