"""Sampling with an incremental KV cache, shared by GPT and CGT (each defines `_step`)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._checks import Bool, Float, Int, checked, check_int, refuse
from .contracts import check_inputs
from .layers import KVCache


def sample_next(logits: torch.Tensor, temperature: float, top_k: int | None) -> torch.Tensor:
    """logits (b, v) -> next tokens (b, 1); temperature 0 is greedy, top_k keeps the k largest."""
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, [-1]]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(F.softmax(logits.float(), dim=-1), 1)


class Generation:
    """generate() for a model with `config`, `_n_attention` attention layers and `_step(inp, cache, pos_offset)`."""

    @property
    def device(self) -> torch.device:
        """Where the model's parameters are; inputs must be there too."""
        return next(self.parameters()).device

    def new_cache(self) -> list[KVCache]:
        return [KVCache() for _ in range(self._n_attention)]

    @torch.no_grad()
    @checked(temperature=Float(0.0, hint=" (0 = greedy)"), top_k=Int(1, none=True), use_cache=Bool())
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, use_cache: bool = True) -> torch.Tensor:
        """Extend idx (b, t) by max_new_tokens tokens; temperature=0 is greedy. Returns (b, t + new)."""
        cfg = self.config
        if cfg.mode != "tokens":
            raise ValueError("generate needs a tokens-mode model (vocab_size set); this one is in vectors mode")
        if use_cache and "a KV cache" in getattr(getattr(self, "stream", None), "refuses", {}):
            raise refuse("use_cache", "False", "True", hint=f"a KV cache is not available for a CGT over "
                         f"{self.stream.family}: {self.stream.refuses['a KV cache']}")
        idx = check_inputs(cfg, idx, device=self.device)
        room = cfg.block_size - idx.shape[1]
        check_int("max_new_tokens", max_new_tokens, 1, max(room, 1),
                  hint=f" (block_size {cfg.block_size} - prompt length {idx.shape[1]})")
        if room < 1:
            raise refuse("idx", f"fewer than block_size = {cfg.block_size} positions to generate after",
                         f"{idx.shape[1]} positions (it already fills the block)", verb="have")
        cache = self.new_cache() if use_cache else None
        logits = self._step(idx, cache, 0)[:, -1]
        for i in range(max_new_tokens):
            nxt = sample_next(logits, temperature, top_k)
            idx = torch.cat([idx, nxt], dim=1)
            if i == max_new_tokens - 1:
                break
            logits = (self._step(nxt, cache, idx.shape[1] - 1) if use_cache else self._step(idx, None, 0))[:, -1]
        return idx
