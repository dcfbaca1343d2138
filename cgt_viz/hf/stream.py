"""The x stream of a CGT over a frozen Hugging Face causal LM: `streams.XStream` by hooks.

Nothing inside the LM is edited. During a pass, hooks registered for that pass only (so `lm` stays a plain
model between calls) hand the outputs of decoder layers 1..ℓ to the y stream and transform each template
site's input above ℓ at the module the LM family's layout names for it (`hf.layouts`). The LM's parameters
never require gradients and the lower layers see no tensor that does, so autograd records nothing there.

Hooks and the shortened layer list of a short pass are visible to any pass over the same LM, so every pass
cgt_viz makes over one LM holds that LM's `pass_lock` (one pass at a time, whichever thread runs it: the
explorer's background collection and a `specialize` in a cell wait for each other, one pass at a time), and a
hook acts only in the thread that registered it (a plain `lm(...)` of the user's own in another thread runs
past it untouched).
"""
from __future__ import annotations

import contextlib
import threading
import weakref

import torch
import torch.nn as nn

from ..outputs import X
from ..streams import XStream
from .layouts import layout_of
from .source import strip_remote_code


class StopAfterY(Exception):
    """Raised by the layer-ℓ hook when only ȳ is wanted: the layers above ℓ are not run."""


class NoContext(nn.Module):
    """The LM alone (T = I), called like a cgt_viz GPT: idx (b, t) -> logits (b, t, v)."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        with pass_lock(self.lm):
            return self.lm(input_ids=idx, use_cache=False).logits


_LOCKS: "weakref.WeakKeyDictionary[nn.Module, threading.RLock]" = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def pass_lock(lm: nn.Module) -> threading.RLock:
    """The lock every cgt_viz pass over lm holds for its duration (re-entrant: a pass may call another)."""
    with _LOCKS_GUARD:
        lock = _LOCKS.get(lm)
        if lock is None:
            lock = _LOCKS[lm] = threading.RLock()
        return lock


def own_thread(hook):
    """hook, acting only in the thread that made it (elsewhere it returns None: the module's output as it is)."""
    owner = threading.get_ident()

    def guarded(*args):
        return hook(*args) if threading.get_ident() == owner else None
    return guarded


@contextlib.contextmanager
def hooks(model, coeffs: dict | None, ystep=None, record: dict | None = None, stop: bool = False):
    """The hooks of one pass over model.lm. ystep(ν, x_ν) gets layers 1..ℓ's outputs (in the y stream's dtype
    outside autocast) and returns the coefficients at ℓ, which the site hooks then read; with coeffs given
    (ȳ frozen) ystep is None. stop: raise StopAfterY after layer ℓ. Yields the dict holding "coeffs"."""
    layout, ell = layout_of(model.lm), model.config.y_layer
    layers = layout.layers_of(model.lm)
    state, handles = {"coeffs": coeffs}, []
    dtype = model.pool.weight.dtype

    def layer_out(n):
        def hook(module, args, out):
            h = out[0] if isinstance(out, tuple) else out
            if record is not None:
                record[X(n + 1)] = h
            if n < ell and ystep is not None:
                c = ystep(n + 1, h if torch.is_autocast_enabled() else h.to(dtype))
                if n == ell - 1:
                    if stop:
                        raise StopAfterY
                    state["coeffs"] = c
        return hook

    def seam(layer, site, on_output):
        if on_output:
            return lambda module, args, out: model._modulate(layer, site, out, state["coeffs"])
        return lambda module, args: (model._modulate(layer, site, args[0], state["coeffs"]), *args[1:])

    def remembered(layer):
        return lambda module, args, out: model._remember(layer, args[0], out, state["coeffs"])

    with pass_lock(model.lm):
        try:
            if record is not None:   # x.0: what the first layer reads (GPT-2 adds its positions after the embedding)
                handles.append(layers[0].register_forward_pre_hook(
                    own_thread(lambda module, args: record.__setitem__(X(0), args[0]))))
            for n, layer in enumerate(layers):
                if record is not None or (n < ell and ystep is not None):
                    handles.append(layer.register_forward_hook(own_thread(layer_out(n))))
            if not stop:
                for layer_no, site in model.template_sites:
                    output = layout.sites[site].output
                    module = layout.site_module(model.lm, layer_no, site)
                    handles.append(module.register_forward_hook(own_thread(seam(layer_no, site, True)))
                                   if output
                                   else module.register_forward_pre_hook(own_thread(seam(layer_no, site, False))))
                memory = getattr(model, "memory", None)
                for layer_no in (memory.layers if memory is not None else ()):
                    module = model.lm.get_submodule(model.memory_map(layer_no)[:-len(".weight")])
                    handles.append(module.register_forward_hook(own_thread(remembered(layer_no))))
            yield state
        finally:
            for h in handles:
                h.remove()


def upper_hidden(lm: nn.Module, x: torch.Tensor, first: int) -> torch.Tensor:
    """Decoder layers first+1..N of lm over given states x (b, t, d) of layer `first` (positions from 0) ->
    the final normed hidden states (b, t, d). The LM's own loop runs over a shorter list, swapped for this call,
    and the first layer left reads x itself (a pre-hook: GPT-2 would add its position embeddings to inputs_embeds).
    The caller holds lm's pass_lock: no other pass sees the shorter list."""
    layout = layout_of(lm)
    body, full = layout.body_of(lm), layout.layers_of(lm)
    x = x.to(lm.dtype)
    handle = full[first].register_forward_pre_hook(own_thread(lambda module, args: (x, *args[1:])))
    setattr(body, layout.layers, nn.ModuleList(list(full)[first:]))
    try:
        return body(inputs_embeds=x, use_cache=False).last_hidden_state
    finally:
        setattr(body, layout.layers, full)
        handle.remove()


class HFStream(XStream):
    """A frozen pretrained causal LM (`model.lm`); y starts at zero and ȳ reads a pooled mean of LN(x_ℓ)."""

    family = "a pretrained LM (cgt_viz.hf.CGTLM)"
    refuses = {"a KV cache": "the pretrained stream runs every pass from position 0 without one"}
    self_teacher = False   # the distillation teacher is the LM with the prefix in context (CGTLM._aux_scores)

    @staticmethod
    def run(model, inp, ystep, coeffs=None, cache=None, pos_offset=0, record=None, stop=False):
        if cache is not None or pos_offset:
            HFStream.refuse("a KV cache")
        if coeffs is None:
            ystep(0, None)
        with hooks(model, coeffs, ystep if coeffs is None else None, record, stop):
            try:
                return layout_of(model.lm).final_hidden(model.lm, inp)
            except StopAfterY:
                return None

    @staticmethod
    def final_logits(model, final):
        return layout_of(model.lm).head_of(model.lm)(final)

    @staticmethod
    def y_input(model, inp, pos_offset):
        return torch.zeros(*inp.shape[:2], model.config.d_y, dtype=model.pool.weight.dtype, device=inp.device)

    @staticmethod
    def readout(model, x_ell, y, cache):
        return model._read(model._pooled(model.ln_x(x_ell))) + y

    @staticmethod
    def site_maps(model, layer, site):
        layout = layout_of(model.lm)
        return [layout.weight_name(layer, linear) for linear in layout.sites[site].maps]

    @staticmethod
    def output_rows(model):
        return model.lm.get_output_embeddings().weight

    @staticmethod
    def fan_in_fan_out(model, name):
        return layout_of(model.lm).fan_in_fan_out

    @staticmethod
    def base(model) -> nn.Module:
        return model.lm

    @staticmethod
    def finish_merged(merged):
        strip_remote_code(merged.config)   # a compiled model never carries the base LM's custom-code pointer
        return merged.eval()

    @staticmethod
    def merged_logits(merged, idx):
        return merged(input_ids=idx, use_cache=False).logits

    @staticmethod
    def no_context(model) -> nn.Module:
        return NoContext(model.lm)

    @staticmethod
    def widths(model):
        return layout_of(model.lm).widths(model.lm.config)

    @staticmethod
    def caches(model):
        return model.config.n_layer   # counted as before, though the pretrained stream runs without a KV cache

