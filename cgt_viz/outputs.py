"""The named outputs of a CGT (`run_with_cache`), declared once: each name is typed only here.

The passes write `record[X(n)] = x`, `cache_names()` enumerates `OUTPUTS` for a model, and the table below
(`help(cgt_viz.outputs)`, and the model docstrings that point here) is generated from the same list, so the
three cannot drift (after TransformerLens' hook points). Adding a named output is one row in `OUTPUTS` plus
the line of the pass that computes it. Shapes for an input of b sequences of length t:

"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

from .losses import SMOOTHNESS


@dataclass(frozen=True)
class Output:
    """One named output, or one per index: `pattern` is formatted with the index ("x.{}" -> "x.3")."""
    pattern: str
    shape: str
    meaning: str
    indices: Callable[[Any], Iterable[tuple]]

    def __call__(self, *index) -> str:
        return self.pattern.format(*index)

    def names(self, model) -> list[str]:
        return [self(*index) for index in self.indices(model)]


def _one(model) -> list[tuple]:
    return [()]


X = Output("x.{}", "(b, t, d)", "x after the embeddings (x.0) and after block ν, ν = 1..N",
           lambda m: [(n,) for n in range(m.config.n_layer + 1)])
Y = Output("y.{}", "(b, t, e)", "y after its embeddings (y.0; zeros over a pretrained LM) and after y block ν, "
           "ν = 1..ℓ (none with pooled_only)", lambda m: [(n,) for n in range(len(m.y_blocks) + 1)])
YBAR = Output("ybar", "(b, t, e)", "ȳ, the context summary at every token", _one)
YBAR_SIGMA = Output("ybar_sigma", "(b, t, e)", "posterior std of ȳ (a smoothness kind with a posterior: 'vae')",
                    lambda m: [()] if SMOOTHNESS[m.config.smooth].posterior else [])
COEFFS = Output("coeffs.{}.{}", "(b, t, K)", "template coefficients c^κ(ȳ_t) at layer ν = ℓ+1..N, site in "
                "config.sites", lambda m: m.template_sites)
LOGITS = Output("logits", "(b, t, v)", "the outputs", _one)
OUTPUTS = (X, Y, YBAR, YBAR_SIGMA, COEFFS, LOGITS)


def cache_names(model) -> list[str]:
    """Every named output of `model`, in OUTPUTS order."""
    return [name for out in OUTPUTS for name in out.names(model)]


def table() -> str:
    """The OUTPUTS as an indented text table: pattern, shape, meaning."""
    return "\n".join(f"    {out.pattern.replace('{}', 'ν', 1).replace('{}', 'site'):<15}{out.shape:<11}{out.meaning}"
                     for out in OUTPUTS)


if __doc__:   # None under python -OO
    __doc__ += table() + "\n"
