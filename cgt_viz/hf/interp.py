"""Where a compiled prompt acts in the layers: the residual stream of a compiled model and of the LM reading the
prompt, each against the LM alone, on the prompt's continuation (read through nnsight, the interp extra).

    from nnsight import LanguageModel
    base, compiled = LanguageModel(lm, tokenizer=tok), LanguageModel(cgt.specialize(prompt), tokenizer=tok)
    dep = residual_departures(base, compiled, prompt, rest)      # per decoder layer, averaged over rest's tokens
    departure_figure(dep, y_layer=cgt.config.y_layer)

The functions take models already wrapped by nnsight and never import it, so `cgt_viz.hf` imports without it.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .._checks import check_height, check_int, refuse


def _decoder_layers(wrapped) -> Any:
    """The decoder layers of an nnsight-wrapped causal LM, wherever a family's layout (`hf.layouts`) keeps them
    (Llama and its kin, GPT-2 and so the from-scratch export)."""
    from .layouts import LAYOUTS
    places = list(dict.fromkeys((layout.body, layout.layers) for layout in LAYOUTS.values()))
    for outer, inner in places:
        try:
            return getattr(getattr(wrapped, outer), inner)
        except AttributeError:
            continue
    raise refuse("wrapped", "an nnsight-wrapped causal LM with decoder layers at "
                 + " or ".join(f"{outer}.{inner}" for outer, inner in places),
                 type(wrapped).__name__, TypeError, verb="be")


def _check_wrapped(name: str, wrapped: Any) -> None:
    if not hasattr(wrapped, "trace"):
        raise refuse(name, "an nnsight-wrapped model (nnsight.LanguageModel(model, tokenizer=tok))",
                     type(wrapped).__name__, TypeError, verb="be")


def residual_stream(wrapped, idx: torch.Tensor) -> torch.Tensor:
    """The residual stream after every decoder layer, read with nnsight's `trace`: (layers, b, t, d), float32.

    wrapped: an nnsight `LanguageModel` (or `TransformersModel`); idx: token ids (b, t). The last entry is the last
    layer's output before the final norm (transformers' last hidden state is after it)."""
    _check_wrapped("wrapped", wrapped)
    layers = _decoder_layers(wrapped)
    saved: list = []
    with torch.no_grad(), wrapped.trace(idx):
        for layer in layers:           # a loop, not a comprehension: nnsight reads the block's own source
            saved.append(layer.output.save())
    # a decoder layer returns a tensor in current transformers, a tuple whose first entry is it in older ones
    return torch.stack([(s[0] if isinstance(s, tuple) else s).float() for s in saved])


def _ids(name: str, value: Any, least: int) -> torch.Tensor:
    """Token ids as a 1-D long tensor of at least `least` tokens ((1, t) is taken as one sequence)."""
    if not isinstance(value, torch.Tensor) or value.dtype.is_floating_point or value.dtype == torch.bool:
        raise refuse(name, "a tensor of token ids (integers)",
                     type(value).__name__ if not isinstance(value, torch.Tensor) else f"dtype {value.dtype}",
                     TypeError, verb="be")
    ids = value[0] if value.dim() == 2 and value.shape[0] == 1 else value
    if ids.dim() != 1 or ids.numel() < least:
        raise refuse(name, f"one sequence of at least {least} tokens, shape (t,) or (1, t)",
                     f"shape {tuple(value.shape)}", verb="be")
    return ids.long()


def residual_departures(base, compiled, prompt: torch.Tensor, rest: torch.Tensor, *, skip: int = 1) -> dict:
    """How far the compiled model's residual stream, and that of the LM reading the prompt, move from the LM's
    own on the continuation, per decoder layer.

    base, compiled: nnsight-wrapped models with the same layers (the LM, and `specialize(prompt)`); prompt,
    rest: token ids. The compiled model and the LM read `rest` alone, the prompted run reads prompt + rest; each
    stream is taken at rest's positions, h after every decoder layer. skip: rest's first tokens left out of the
    means: the first token of a sequence is the attention sink of the runs without the prompt, with a residual
    norm the prompted run, where it is not first, does not have, so it would measure position, not context.

    Returns {"layer": 1..N, "compiled": mean ‖h_compiled − h_base‖ / ‖h_base‖, "prompted": mean
    ‖h_prompted − h_base‖ / ‖h_base‖, "to_prompted": mean ‖h_compiled − h_prompted‖ / ‖h_base‖ (below
    "prompted": the compiled stream is nearer the prompted one than the LM's is), "cosine": mean cosine of the two
    departures (NaN at layers where the compiled model does not depart: a weight it does not change),
    "tokens": the number of positions averaged}, numpy arrays of length N."""
    rest = _ids("rest", rest, 1)
    skip = check_int("skip", skip, 0, len(rest) - 1, hint=f" (rest has {len(rest)} tokens)")
    prompt = _ids("prompt", prompt, 1).to(rest.device)
    _check_wrapped("base", base)          # named as the caller passed them, before any pass runs
    _check_wrapped("compiled", compiled)
    h_base = residual_stream(base, rest[None])[:, 0, skip:]
    h_comp = residual_stream(compiled, rest[None])[:, 0, skip:]
    if h_comp.shape != h_base.shape:
        raise refuse("compiled", f"a model with the base's {h_base.shape[0]} layers of width {h_base.shape[-1]}",
                     f"{h_comp.shape[0]} of width {h_comp.shape[-1]}", verb="be")
    h_prompted = residual_stream(base, torch.cat([prompt, rest])[None])[:, 0, len(prompt) + skip:]
    d_comp, d_prompted = h_comp - h_base, h_prompted - h_base
    scale = h_base.norm(dim=-1)                                   # (N, t)
    n_comp, n_prompted = d_comp.norm(dim=-1), d_prompted.norm(dim=-1)
    cosine = (d_comp * d_prompted).sum(-1) / (n_comp * n_prompted)
    cosine = torch.where(n_comp > 0, cosine, torch.full_like(cosine, float("nan")))   # 0/0: no departure
    mean = lambda v: v.double().mean(-1).cpu().numpy()            # noqa: E731
    return {"layer": np.arange(1, h_base.shape[0] + 1), "compiled": mean(n_comp / scale),
            "prompted": mean(n_prompted / scale), "to_prompted": mean((h_comp - h_prompted).norm(dim=-1) / scale),
            "cosine": cosine.double().nanmean(-1).cpu().numpy(), "tokens": int(h_base.shape[1])}


DEPARTURE_KEYS = ("layer", "compiled", "prompted", "to_prompted", "cosine")


def departure_figure(departures: dict, *, y_layer: int | None = None, title: str | None = None,
                     height: int = 460):
    """The per-layer departures of `residual_departures` as a plotly Figure: the relative distances from the LM
    alone on top (compiled red, prompted blue as in `compare_figure`, compiled − prompted grey dotted), the
    cosine of the two departures below. y_layer: ℓ, where the head reads (a dotted line: the layers above it are
    the modulated ones)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from ..figures._style import check_1d, finish, vline
    missing = [k for k in DEPARTURE_KEYS if not isinstance(departures, dict) or k not in departures]
    if missing:
        raise refuse("departures", f"the dict residual_departures returns, with keys {list(DEPARTURE_KEYS)}",
                     f"{type(departures).__name__} without {missing}", verb="be")
    layer = check_1d("departures['layer']", departures["layer"])
    series = {k: check_1d(f"departures[{k!r}]", departures[k], len(layer)) for k in DEPARTURE_KEYS[1:]}
    y_layer = check_int("y_layer", y_layer, 0, int(layer.max()) if len(layer) else 0, allow_none=True)
    height = check_height("height", height)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.65, 0.35], vertical_spacing=0.06)
    lines = {"compiled": ("compiled − LM", "#d62728", "solid"), "prompted": ("prompted − LM", "#1f77b4", "solid"),
             "to_prompted": ("compiled − prompted", "#7f7f7f", "dot")}
    for key, (name, color, dash) in lines.items():
        fig.add_trace(go.Scatter(x=layer, y=series[key], mode="lines+markers", name=name, marker=dict(size=4),
                                 line=dict(color=color, dash=dash),
                                 hovertemplate=f"layer %{{x}}<br>{name}: %{{y:.3f}}<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=layer, y=series["cosine"], mode="lines+markers", name="cos(compiled − LM, prompted − LM)",
                             line=dict(color="#9467bd"), marker=dict(size=4), showlegend=True,
                             hovertemplate="layer %{x}<br>cosine: %{y:.3f}<extra></extra>"), row=2, col=1)
    fig.add_hline(y=0, line=dict(color="#bbbbbb", width=1), row=2, col=1)
    if y_layer is not None:
        vline(fig, y_layer + 0.5, "black", "dot", "y_layer")
        fig.add_annotation(x=y_layer + 0.5, y=1, yref="paper", text=f"ℓ = {y_layer}: modulated above",
                           showarrow=False, xanchor="left", xshift=4)
    n = departures.get("tokens")
    fig.update_layout(title=dict(text=title or "Residual stream on the continuation: departure from the LM alone"
                                 + (f" ({n} tokens)" if isinstance(n, int) else ""), x=0.01),
                      height=height, margin=dict(l=60, r=20, t=70, b=40),
                      legend=dict(orientation="h", y=1.08, x=1, xanchor="right"))
    fig.update_yaxes(title_text="‖Δh‖ / ‖h_LM‖", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="cosine", range=[-1.05, 1.05], row=2, col=1)
    fig.update_xaxes(title_text="decoder layer (its output)", row=2, col=1)
    return finish(fig)
