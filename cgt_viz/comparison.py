"""The one comparison behind evaluation, the views and the figures: a row's continuation scored four ways.

For rows `inputs` (b, t) cut at `split` s (prompt = positions < s, continuation = positions s..t−1):

    prompted     the full CGT on the whole row: the prompt is in context
    specialized  ȳ at token s−1, then the x-only model with T(ȳ) frozen, on the continuation alone
                 (what `specialize(prompt)` compiles, unmerged)
    no_context   the x-only model (T = I, `CGT.x_only()`) on the continuation alone
    baseline     a separately trained plain GPT on the whole row (evaluation only, when one is given)
    other_row    (a control, when asked) the specialized model with ȳ of another row's prompt: row i gets
                 row i−1's (rows rolled by one), so a prompt that is not the row's own
"""
from __future__ import annotations

import torch

MODES = ("prompted", "specialized", "no_context", "baseline")


@torch.no_grad()
def comparison_logits(model, inputs: torch.Tensor, split: int, no_context: torch.nn.Module,
                      baseline: torch.nn.Module | None = None, other_row: bool = False) -> dict[str, torch.Tensor]:
    """{mode: logits (b, t − s, v) on the continuation} for the modes above (checked inputs, model's device).

    Its callers check the model and the rows at their door: the passes here are the models' unchecked ones,
    so the rows are not checked again once per mode."""
    suffix = inputs[:, split:]
    if getattr(model, "memory", None) is not None:    # the compile holds the prompt's slots too (layers.TokenMemory)
        coeffs = model._prompt_coeffs(inputs[:, :split])
        specialized = model._logits(model._hidden(suffix, coeffs)[0])
        # another row's prompt: its ȳ and its memory, the whole compile swapped
        rolled = {key: (c.roll(1, 0) if isinstance(c, torch.Tensor) else tuple(f.roll(1, 0) for f in c))
                  for key, c in coeffs.items()}
        other = (lambda: model._logits(model._hidden(suffix, rolled)[0]))
    else:
        ybar = model._context(inputs[:, :split])[:, -1]             # (b, e): the summary of the prompt
        specialized = model._specialized(suffix, ybar)
        other = (lambda: model._specialized(suffix, ybar.roll(1, 0)))
    out = {"prompted": model._full(inputs)[0][:, split:],
           "specialized": specialized,
           "no_context": _unchecked(no_context, suffix)}
    if baseline is not None:
        out["baseline"] = _unchecked(baseline, inputs)[:, split:]
    if other_row:
        out["other_row"] = other()
    return out


def _unchecked(gpt: torch.nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """A plain model's logits: a cgt_viz GPT's unchecked pass, or a call (the LM of a CGTLM checks nothing)."""
    step = getattr(gpt, "_step", None)
    return step(inputs, None, 0) if callable(step) else gpt(inputs)
