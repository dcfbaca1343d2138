"""Argument contracts of the pretrained-LM side, declared once for `@checked` (see `cgt_viz._checks`).

    @checked(model=HeadModel(), tokens=Windows(), prefix_len=Int(1))
    def window_losses(model, tokens, prefix_len, ...): ...

The model class is imported when a value is checked, not here: `cgt_viz.hf.*` stays importable without
transformers, and the modules that use these contracts import none of each other at load time.
"""
from __future__ import annotations

from typing import Any

import torch

from .._checks import Constraint, describe, refuse


class HeadModel(Constraint):
    """A `cgt_viz.hf.CGTLM` (`check_cgtlm`); with pooled_only=True a CGTLM(pooled_only=True) (the feature cache)."""

    def __init__(self, *, pooled_only: bool = False):
        self.pooled_only = pooled_only

    def check(self, name, value, args=None):
        from .model import check_cgtlm
        check_cgtlm(value, name, pooled_only=self.pooled_only)
        return value

    def bad_values(self):
        return ["m", 5, None, torch.nn.Linear(2, 2)]

    def shown(self, value):
        return type(value).__name__


class Windows(Constraint):
    """Token windows (n, length), n >= 1, integer ids: what `BBCTokens.document_windows` cuts."""

    def check(self, name, value, args=None):
        want = "an integer tensor of token windows (n, prefix + suffix + 1)"
        if not isinstance(value, torch.Tensor) or value.is_floating_point() or value.is_complex() \
                or value.dtype == torch.bool:
            raise refuse(name, want, describe(value), TypeError)
        if value.dim() != 2 or 0 in value.shape:
            raise refuse(name, want + " with at least one window", f"shape {tuple(value.shape)}")
        return value

    def bad_values(self):
        return ["windows", torch.zeros(2, 8), torch.zeros(8, dtype=torch.long), torch.zeros(0, 8, dtype=torch.long)]

    def shown(self, value):
        if not isinstance(value, torch.Tensor):
            return type(value).__name__
        return str(value.dtype).removeprefix("torch.") if value.is_floating_point() else str(tuple(value.shape))


class PerWindow(Constraint):
    """One entry per window of the tensor argument `of` (topics, document ids): a tensor (n,)."""

    def __init__(self, of: str = "tokens", *, none: bool = False):
        self.of, self.none = of, none

    def check(self, name, value, args=None):
        if value is None and self.none:
            return None
        n = args[self.of].shape[0]
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != (n,):
            raise refuse(name, ("None or " if self.none else "") + f"a tensor ({n},), one entry per window of "
                         f"{self.of}", describe(value), TypeError if not isinstance(value, torch.Tensor) else ValueError)
        return value

    def bad_values(self):
        return ["ids", torch.zeros(1, dtype=torch.long)] + ([] if self.none else [None])

    def shown(self, value):
        return "(1,)" if isinstance(value, torch.Tensor) else type(value).__name__


COMPARISON_KEYS = ("n_documents", "n_windows")   # what every summarize_comparison result holds


def check_comparison(name: str, value: Any, need: tuple[str, ...] = COMPARISON_KEYS) -> dict:
    """One result of `summarize_comparison` (a dict holding the keys `need`)."""
    if not isinstance(value, dict):
        raise refuse(name, "a result of compile_comparison / summarize_comparison (a dict)", describe(value), TypeError)
    missing = [k for k in need if k not in value]
    if missing:
        raise refuse(name, f"a result of summarize_comparison, with keys {list(need)}",
                     f"a dict without {missing}")
    return value


class Comparison(Constraint):
    """One `summarize_comparison` result holding the keys `need`."""

    def __init__(self, *need: str):
        self.need = need or COMPARISON_KEYS

    def check(self, name, value, args=None):
        return check_comparison(name, value, self.need)

    def bad_values(self):
        return [5, "p=64", {"G": 0.5}]

    def shown(self, value):
        return "['n_documents'" if isinstance(value, dict) else type(value).__name__


class Comparisons(Constraint):
    """compile_comparison's result: a non-empty dict {label ("p=64"): summarize_comparison result}."""

    def check(self, name, value, args=None):
        if not isinstance(value, dict) or not value:
            raise refuse(name, "the non-empty dict compile_comparison returns ({'p=64': result, ...})", describe(value),
                         TypeError if not isinstance(value, dict) else ValueError)
        for label, result in value.items():
            check_comparison(f"{name}[{label!r}]", result)
        return value

    def bad_values(self):
        return [5, {}, {"p=64": 0.5}, [{"n_documents": 2}]]

    def shown(self, value):
        return {dict: "{}" if not value else "'p=64'", int: "int", list: "list"}[type(value)] \
            if isinstance(value, (dict, int, list)) else type(value).__name__
