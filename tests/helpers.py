"""Helpers shared by several test modules (`from helpers import ...`: pytest puts tests/ on sys.path)."""
from __future__ import annotations

import socket

import torch


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_inputs(cfg, b=3, t=12, seed=0):
    """Seeded model inputs: (b, t) token ids or (b, t, input_dim) vectors, as the config reads."""
    g = torch.Generator().manual_seed(seed)
    if cfg.mode == "tokens":
        return torch.randint(0, cfg.vocab_size, (b, t), generator=g)
    return torch.randn(b, t, cfg.input_dim, generator=g)


def randomize_templates(model, bias_std: float = 0.5):
    """Random non-zero template coefficients (an untrained CGT has c = 0: T = I); returns the model."""
    with torch.no_grad():
        for layer in model.templates.values():
            for site in layer.values():
                site.coeff.weight.normal_(0, 0.5)
                site.coeff.bias.normal_(0, bias_std)
    return model
