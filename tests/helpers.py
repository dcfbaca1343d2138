"""Helpers shared by the test modules of every folder (`from helpers import ...`: tests/conftest.py puts tests/ on
sys.path)."""
from __future__ import annotations

import os
import socket

import pytest
import torch

from cgt_viz.tasks.base import Batch, Task


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


class TinyTask(Task):
    """Pairs (u, (u + b) mod P) with a hidden shift b per row; answers use their own tokens P..2P−1."""

    name = "tiny"

    def __init__(self, P: int = 5, n_pairs: int = 5):
        self.P, self.n_pairs = P, n_pairs

    def config_kwargs(self):
        return {"vocab_size": 2 * self.P, "block_size": 2 * self.n_pairs}

    def get_batch(self, batch_size, part="train", generator=None, device="cpu"):
        shift = torch.randint(0, self.P, (batch_size, 1), generator=generator)
        u = torch.randint(0, self.P, (batch_size, self.n_pairs), generator=generator)
        seq = torch.stack([u, (u + shift) % self.P + self.P], dim=-1).flatten(1)   # (b, n, 2) -> (b, 2n)
        targets = torch.full_like(seq, -100)
        targets[:, :-1] = seq[:, 1:]
        mask = torch.zeros_like(seq, dtype=torch.bool)
        mask[:, 0::2] = True
        return Batch(seq, targets, mask, None, {"shift": shift[:, 0]}).to(device)


def need(missing: str | None, fix: str) -> None:
    """Skip a test whose tool is `missing` (a reason, or None when it is there); under CGT_REQUIRE_BROWSER=1
    (CI) fail instead, naming the fix."""
    if missing is None:
        return
    if os.environ.get("CGT_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{missing} and CGT_REQUIRE_BROWSER=1 ({fix})")
    pytest.skip(missing)


class ByteTokenizer:
    """Bytes as tokens: a tokenizer for the tiny Llama (vocabulary 256) that BBCTokens accepts."""

    def encode(self, text, add_special_tokens=False):
        return list(text.encode("utf-8"))

    def decode(self, ids, **kw):
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def __len__(self):
        return 256


def record_png_renders(monkeypatch) -> list:
    """Stand a recorder in for the PNG renderer's Chromium session: every spec it is asked to draw lands in the
    returned list and a tiny PNG comes back. The caller resets `_png` when done (`_png._reset()`)."""
    from cgt_viz.widgets import _png
    drawn = []

    class Recorder:
        def render(self, spec):
            drawn.append(spec)
            return b"\x89PNG\r\n\x1a\n" + b"\0" * 16

    _png._reset()
    monkeypatch.setattr(_png, "_get_session", lambda: Recorder())
    return drawn


def record_model_builds(monkeypatch, *classes, refuse=lambda cls, args, kwargs: False) -> list:
    """Record every construction of the model `classes` as (class name, device type, args, kwargs), and return
    the list. "meta" builds only shapes (no memory); a build on any other device allocates the weights.

    A build off the meta device, or one `refuse` picks, stops at once with an AssertionError instead of
    running: a size check that comes too late then fails the test within a second instead of filling the
    machine's memory. The build stays in the list, so a caller that swallows the error still sees it."""
    builds: list = []
    for cls in classes:
        def recording_init(self, *args, _cls=cls, _init=cls.__init__, **kwargs):
            device = torch.get_default_device().type
            builds.append((_cls.__name__, device, args, kwargs))
            if device != "meta" or refuse(_cls, args, kwargs):
                raise AssertionError(f"{_cls.__name__} was built on the {device} device before the size was refused")
            _init(self, *args, **kwargs)
        monkeypatch.setattr(cls, "__init__", recording_init)
    return builds


def allocated_builds(builds: list) -> list:
    """The builds of record_model_builds that allocated weights (were made off the meta device)."""
    return [build for build in builds if build[1] != "meta"]
