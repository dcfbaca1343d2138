"""Input contracts of the model's tensors, declared once and applied at each public entry point.

The model (`model.py`), the views (`analysis`, `figures`, widgets), `evaluate`, `train` and the tasks all
call these, in one line each, at their boundary; the algorithm behind the boundary takes valid tensors.
Scalar checks (ints, floats, choices, devices) live in `_checks`. Every message names the argument,
shows the value (or its shape and dtype) and says what is allowed (`_checks.refuse` writes it).

The contracts a public function's arguments need are also constraints for `@checked` declarations, beside
`Int`, `Float`, `Choice`: `Model()` (a CGT with weights) and `Inputs("model")` (a batch of inputs for that
model's config), e.g.

    @checked(model=Model(), inputs=Inputs("model"), batch_size=Int(1))
    def collect_ybar(model, inputs, batch_size=64): ...

A public function checks; the private passes it calls (`_collect_ybar`, `CGT._context`, ...) do not again.

Notation: b batch, t time, e width of ȳ (d_y), v output width.
"""
from __future__ import annotations

import fnmatch
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ._checks import Constraint, check_array, describe, is_int, refuse

IGNORE_INDEX = -100  # token targets equal to this are not scored (PyTorch's convention)


def _on_device(name: str, tensor: torch.Tensor, device: torch.device | None) -> None:
    # moving silently would hide a copy per call in a training loop
    if device is not None and tensor.device != device:
        raise refuse(name, f"on the model's device {str(device)!r}", f"a tensor on {str(tensor.device)!r}",
                     hint=f"move it with {name}.to({str(device)!r}) (or move the model)")


def _finite(name: str, tensor: torch.Tensor) -> None:
    if tensor.device.type != "meta" and not torch.isfinite(tensor).all():
        raise refuse(name, "finite", f"{int((~torch.isfinite(tensor)).sum())} NaN or inf value(s)")


def require_cgt(model: Any, name: str = "model") -> None:
    """TypeError unless `model` has a y stream (a CGT): a plain GPT has no ȳ to look at."""
    if not (isinstance(model, torch.nn.Module) and callable(getattr(model, "context", None))
            and callable(getattr(model, "run_with_cache", None)) and hasattr(model, "templates")):
        raise refuse(name, "a CGT (a model with a y stream and a context summary ȳ)", type(model).__name__,
                     TypeError, "a plain GPT has no ȳ to show — train or load a CGT")


def require_weights(model: torch.nn.Module, name: str = "model") -> torch.device:
    """The device of a model that holds weights (a view computes with them) -> that device."""
    device = next(model.parameters()).device
    if device.type == "meta":
        raise refuse(name, "a model that holds weights to be viewed", "parameters on the meta device (shapes only)",
                     hint=f"move it with {name}.to('cpu') / {name}.to('cuda') after loading weights")
    return device


class Model(Constraint):
    """A CGT (`require_cgt`); with weights=True (the default: views compute with them) not on the meta device."""

    refuses_only = True

    def __init__(self, *, weights: bool = True, none: bool = False):
        self.weights, self.none = weights, none

    def check(self, name, value, args=None):
        if value is None and self.none:
            return None
        require_cgt(value, name)
        if self.weights:
            require_weights(value, name)
        return value

    def bad_values(self):
        return ["m", 5, torch.nn.Linear(2, 2)] + ([] if self.none else [None])

    def shown(self, value):
        return type(value).__name__


class Inputs(Constraint):
    """A batch of inputs for the config of the model passed as argument `of` ("self" in a method):
    `check_inputs`; on that model's device too when on_device=True."""

    def __init__(self, of: str = "model", *, on_device: bool = False):
        self.of, self.on_device = of, on_device

    def check(self, name, value, args=None):
        model = args[self.of]
        return check_inputs(model.config, value, name, device=model.device if self.on_device else None)

    def trusted(self, name, value, args=None):
        # check_inputs but for its look at the values (token range, finiteness): a host sync per call
        model = args[self.of]
        check_input_layout(model.config, value, name, device=model.device if self.on_device else None)
        return value.long() if model.config.mode == "tokens" else value

    def bad_values(self):   # refused by any tokens-mode config (the audit's models)
        return ["text", torch.zeros(2, 4), torch.full((2, 4), 10 ** 6), torch.zeros(2, 0, dtype=torch.long),
                torch.zeros(4, dtype=torch.long)]

    def shown(self, value):
        if not isinstance(value, torch.Tensor):
            return type(value).__name__
        if value.is_floating_point():
            return str(value.dtype).removeprefix("torch.")
        return str(tuple(value.shape)) if value.dim() != 2 or 0 in value.shape else str(int(value.max()))


def check_inputs(cfg, inp: Any, name: str = "idx", device: torch.device | None = None) -> torch.Tensor:
    """A batch of inputs for the config: (b, t) integer tokens or (b, t, input_dim) floats, t <= block_size."""
    check_input_layout(cfg, inp, name, device)
    tokens = cfg.mode == "tokens"
    if inp.device.type == "meta":  # shapes only: a meta tensor has no values to check
        return inp.long() if tokens else inp
    if tokens:
        lo, hi = int(inp.min()), int(inp.max())
        if lo < 0 or hi >= cfg.vocab_size:
            raise refuse(name, f"token ids in 0..vocab_size-1 = 0..{cfg.vocab_size - 1}",
                         f"token ids in [{lo}, {hi}]", verb="hold")
        return inp.long()
    _finite(name, inp)
    return inp


def check_input_layout(cfg, inp: Any, name: str = "idx", device: torch.device | None = None) -> None:
    """check_inputs without looking at the values (no host sync): the type, device, dtype and shape."""
    tokens = cfg.mode == "tokens"
    shape = "(batch, time)" if tokens else f"(batch, time, input_dim={cfg.input_dim})"
    if not isinstance(inp, torch.Tensor):
        raise refuse(name, "a torch.Tensor", describe(inp), TypeError)
    _on_device(name, inp, device)
    if tokens and (inp.dtype == torch.bool or inp.is_floating_point() or inp.is_complex()):
        raise refuse(name, "integer token ids (torch.long)", f"dtype {inp.dtype}", TypeError, verb="hold")
    if not tokens and not inp.is_floating_point():
        raise refuse(name, "a float tensor in vectors mode", f"dtype {inp.dtype}", TypeError)
    if inp.dim() != (2 if tokens else 3) or (not tokens and inp.shape[-1] != cfg.input_dim):
        raise refuse(name, f"shape {shape}", f"shape {tuple(inp.shape)}", verb="have")
    b, t = inp.shape[:2]
    if b == 0 or t == 0:
        raise refuse(name, f"shape {shape} with at least one sequence of at least one position",
                     f"shape {tuple(inp.shape)}", verb="have")
    if t > cfg.block_size:
        raise refuse(name, f"at most block_size = {cfg.block_size} positions", f"{t} positions",
                     hint="nothing is clipped silently", verb="have")


def check_targets(cfg, inp: torch.Tensor, targets: Any, loss_mask: Any, inputs_name: str = "idx") -> None:
    """targets (and loss_mask) as the loss takes them, for checked inputs `inp` of shape (b, t[, input_dim])."""
    check_loss_targets(cfg, inp, targets, inputs_name)
    check_loss_mask(inp, loss_mask, inputs_name)


def _on_device_of(name: str, tensor: Any, inp: torch.Tensor, inputs_name: str) -> None:
    if isinstance(tensor, torch.Tensor) and tensor.device != inp.device:
        raise refuse(name, f"on the device of {inputs_name} {str(inp.device)!r}", f"a tensor on {str(tensor.device)!r}")


def check_loss_targets(cfg, inp: torch.Tensor, targets: Any, inputs_name: str = "idx") -> None:
    """targets as the loss takes them, for checked inputs `inp` of shape (b, t[, input_dim])."""
    if not isinstance(targets, torch.Tensor):
        raise refuse("targets", "a torch.Tensor", describe(targets), TypeError)
    _on_device_of("targets", targets, inp, inputs_name)
    if cfg.mode == "tokens":
        if targets.shape != inp.shape:
            raise refuse("targets", f"the shape of {inputs_name} {tuple(inp.shape)}", str(tuple(targets.shape)), verb="have")
        if targets.is_floating_point() or targets.dtype == torch.bool:
            raise refuse("targets", "integer token ids", f"dtype {targets.dtype}", TypeError, verb="hold")
        bad = (targets != IGNORE_INDEX) & ((targets < 0) | (targets >= cfg.vocab_size))
        if targets.device.type != "meta" and bad.any():
            raise refuse("targets", f"in 0..{cfg.vocab_size - 1} or {IGNORE_INDEX} (ignored)", str(targets[bad][0].item()))
    else:
        want = (*inp.shape[:2], cfg.out_dim)
        if tuple(targets.shape) != want:
            raise refuse("targets", f"shape (batch, time, output_dim) = {want}", str(tuple(targets.shape)), verb="have")
        if not targets.is_floating_point():
            raise refuse("targets", "floats in vectors mode", f"dtype {targets.dtype}", TypeError)


def check_loss_mask(inp: torch.Tensor, loss_mask: Any, inputs_name: str = "idx") -> None:
    """None, or which positions the loss scores: (b, t) for checked inputs `inp` of shape (b, t[, input_dim])."""
    _on_device_of("loss_mask", loss_mask, inp, inputs_name)
    if loss_mask is not None:
        if not isinstance(loss_mask, torch.Tensor) or tuple(loss_mask.shape) != tuple(inp.shape[:2]):
            raise refuse("loss_mask", f"None or a tensor of shape (batch, time) = {tuple(inp.shape[:2])}", describe(loss_mask))


def check_summary(cfg, ybar_vec: Any, device: torch.device, batch: int | None = None,
                  name: str = "ybar_vec", finite: bool = True) -> torch.Tensor:
    """One frozen summary per row: (e,) or (b, e) with b in (1, batch) -> (1 or b, e); finite unless finite=False
    (the values are not looked at: no host sync)."""
    e = cfg.d_y
    if not isinstance(ybar_vec, torch.Tensor) or not ybar_vec.is_floating_point():
        raise refuse(name, f"a float tensor of shape (batch, d_y={e}) or (d_y,)", describe(ybar_vec), TypeError)
    if ybar_vec.dim() not in (1, 2) or ybar_vec.shape[-1] != e:
        raise refuse(name, f"shape (batch, d_y={e}) or (d_y,)", f"shape {tuple(ybar_vec.shape)}", verb="have")
    if batch is not None and ybar_vec.dim() == 2 and ybar_vec.shape[0] not in (1, batch):
        raise refuse(name, f"1 or {batch} rows (one per row of idx)", f"shape {tuple(ybar_vec.shape)}", verb="have")
    _on_device(name, ybar_vec, device)
    if finite:
        _finite(name, ybar_vec)
    return ybar_vec if ybar_vec.dim() == 2 else ybar_vec[None]


def check_summaries(cfg, ybar: Any, name: str = "ybar") -> torch.Tensor:
    """Summaries of any leading shape: (..., e), finite."""
    e = cfg.d_y
    if not isinstance(ybar, torch.Tensor) or not ybar.is_floating_point():
        raise refuse(name, f"a float tensor of shape (..., d_y={e})", describe(ybar), TypeError)
    if ybar.dim() == 0 or ybar.shape[-1] != e:
        raise refuse(name, f"shape (..., d_y={e})", f"shape {tuple(ybar.shape)}", verb="have")
    _finite(name, ybar)
    return ybar


def check_ybar_array(cfg, ybar: Any, name: str = "ybar", ndim: Sequence[int] | int = (1, 2, 3),
                     shape: str = "(..., d_y)", want: tuple[int, ...] | None = None, finite: bool = True) -> np.ndarray:
    """Summaries handed to a view as an array: d_y values last (or exactly the shape `want`), finite unless
    finite=False -> float32."""
    if want is not None and isinstance(ybar, np.ndarray) and ybar.dtype == np.float32 and ybar.shape == want:
        return ybar   # the views' own collect_ybar output: no copy
    arr = check_array(name, ybar, ndim, finite=finite, what=shape)
    if want is not None and arr.shape != want:
        raise refuse(name, f"shape {shape} = {want}", f"shape {arr.shape}", verb="have")
    if arr.shape[-1] != cfg.d_y:
        raise refuse(name, f"shape {shape} with d_y = {cfg.d_y} values last", f"shape {arr.shape}", verb="have")
    return arr.astype(np.float32)


def check_aux_length(cfg, inp: torch.Tensor, inputs_name: str = "idx") -> None:
    """The loss samples an auxiliary split per row: `inp` (b, t, ...) needs t ≥ aux_min_prefix + aux_min_suffix."""
    need = cfg.aux_min_prefix + cfg.aux_min_suffix
    if inp.shape[1] < need:
        raise refuse(inputs_name, f"at least aux_min_prefix + aux_min_suffix = {need} tokens per row for the auxiliary "
                     f"loss (w_aux {cfg.w_aux} > 0 splits each row into a prefix and a suffix)",
                     f"shape {tuple(inp.shape)}", hint="use longer sequences, or w_aux=0", verb="have")


def check_split(split: Any, batch: int, length: int) -> torch.Tensor:
    """The auxiliary split as a CPU LongTensor (batch,) in 1..length−1. Its values decide shapes, so they live on
    the host (no device sync per use on a GPU, and a model on the meta device still runs)."""
    if isinstance(split, bool) or not isinstance(split, (int, torch.Tensor)):
        raise refuse("split", "an int or a LongTensor of shape (batch,)", describe(split), TypeError)
    if isinstance(split, torch.Tensor) and split.device.type == "meta":
        raise refuse("split", "values (an int or a CPU/GPU tensor)", "a tensor on the meta device", verb="hold")
    split = torch.as_tensor(split).cpu()
    if split.is_floating_point() or split.dim() > 1 or (split.dim() == 1 and split.shape[0] != batch):
        raise refuse("split", f"an int or an integer tensor of shape ({batch},)", f"{tuple(split.shape)} {split.dtype}")
    split = split.long().expand(batch)
    if int(split.min()) < 1 or int(split.max()) > length - 1:
        raise refuse("split", f"in 1..{length - 1} (prefix and suffix non-empty) for length {length}",
                     f"values in [{int(split.min())}, {int(split.max())}]")
    return split


def check_prompts(cfg, prompt: Any, device: torch.device) -> tuple[list[torch.Tensor] | torch.Tensor, bool]:
    """What `specialize` takes -> (a list of single prompts, or one (b, t[, input_dim]) batch; whether one model
    comes back). A prompt is (t,) tokens or (t, input_dim) vectors; a batch adds a leading b."""
    item_dims = 1 if cfg.mode == "tokens" else 2
    if isinstance(prompt, (list, tuple)):
        if not prompt:
            raise refuse("prompt", "at least one prompt", "an empty list []", verb="hold")
        if not all(isinstance(p, torch.Tensor) and p.dim() == item_dims for p in prompt):
            shapes = [tuple(p.shape) if isinstance(p, torch.Tensor) else type(p).__name__ for p in prompt]
            want = "(t,)" if cfg.mode == "tokens" else f"(t, input_dim={cfg.input_dim})"
            raise refuse("each prompt in the list", f"a tensor of shape {want}", str(shapes))
        return list(prompt), False
    one, batch = ("(t,)", "(b, t)") if cfg.mode == "tokens" else ("(t, input_dim)", "(b, t, input_dim)")
    if not isinstance(prompt, torch.Tensor):
        what = "token ids" if cfg.mode == "tokens" else "vectors"
        raise refuse("prompt", f"a tensor of {what} {one} or {batch}, or a list of them", describe(prompt), TypeError)
    if prompt.dim() not in (item_dims, item_dims + 1):
        raise refuse("prompt", f"shape {one} or {batch}", f"shape {tuple(prompt.shape)}", verb="have")
    if prompt.dim() == item_dims:
        if prompt.shape[0] == 0:
            raise refuse("prompt", "at least one position", f"shape {tuple(prompt.shape)}", verb="hold")
        prompt, single = prompt[None], True
    else:
        single = prompt.dim() == item_dims + 1 and prompt.shape[0] == 1
    return check_inputs(cfg, prompt, name="prompt", device=device), single


def check_ablate(model, ablate: Any) -> dict[str, list[int]] | None:
    """None or {"ν.site": template index or indices} for the model's sites -> {"ν.site": [k, ...]}."""
    sites, K = [f"{layer}.{site}" for layer, site in model.template_sites], model.config.n_templates
    want = f'None or {{"layer.site": [template indices in 0..{K - 1}]}} with sites among {sites}'
    if ablate is None:
        return None
    if not isinstance(ablate, dict):
        raise refuse("ablate", want, describe(ablate), TypeError)
    out = {}
    for key, ks in ablate.items():
        ks = [ks] if is_int(ks) else ks
        if key not in sites or not isinstance(ks, (list, tuple, range)) or not ks \
                or not all(is_int(k) and 0 <= k < K for k in ks):
            raise refuse("ablate", want, describe(ablate))
        out[key] = [int(k) for k in ks]
    return out


def cache_name_filter(known: Sequence[str], names: Any) -> Callable[[str], bool]:
    """`run_with_cache`'s names: None (all), a name or glob pattern, a list of them, or a predicate."""
    if names is None:
        return lambda name: True
    if callable(names):
        return names
    patterns = [names] if isinstance(names, str) else names
    if not isinstance(patterns, (list, tuple)) or not all(isinstance(p, str) for p in patterns):
        raise refuse("names", "None, a cache name or glob pattern, a list of them, or a predicate", describe(names),
                     TypeError)
    for p in patterns:
        if not fnmatch.filter(known, p):
            raise refuse("names", f"cache names or patterns matching one: allowed names {list(known)}",
                         f"{p!r}, which matches no cache name")
    return lambda name: any(fnmatch.fnmatchcase(name, p) for p in patterns)


# ---------------------------------------------------------------------------------------------- as constraints
# The contracts above as `@checked` constraints; `of` names the argument holding the model ("self" in a
# method), read from the arguments bound before this one.
class Summary(Constraint):
    """ybar_vec: (e,) or (b, e), finite, on the model's device -> (1 or b, e); with rows_of, b in (1, rows of
    that argument); with one_for (the function's name), b = 1; with keep_shape, returned as it came ((e,) too)."""

    def __init__(self, of: str = "self", *, rows_of: str | None = None, one_for: str | None = None,
                 keep_shape: bool = False):
        self.of, self.rows_of, self.one_for, self.keep_shape = of, rows_of, one_for, keep_shape

    def check(self, name, value, args=None):
        return self._summary(name, value, args, finite=True)

    def trusted(self, name, value, args=None):
        # check but for the finiteness of the values: a host sync per call
        return self._summary(name, value, args, finite=False)

    def _summary(self, name, value, args, finite):
        model = args[self.of]
        rows = args[self.rows_of].shape[0] if self.rows_of else None
        clean = check_summary(model.config, value, model.device, rows, name, finite)
        if self.one_for and clean.shape[0] != 1:
            raise refuse(name, f"one summary (d_y,) or (1, d_y) for {self.one_for}", f"shape {tuple(clean.shape)}",
                         hint="use specialize for a batch of prompts")
        return value if self.keep_shape else clean

    def bad_values(self):
        return ["y", torch.zeros(1), torch.full((1, 1), float("nan"))]

    def shown(self, value):
        return type(value).__name__ if not isinstance(value, torch.Tensor) else str(tuple(value.shape))


class Summaries(Summary):
    """ybar: (..., e), finite."""

    refuses_only = True

    def check(self, name, value, args=None):
        return check_summaries(args[self.of].config, value, name)

    def trusted(self, name, value, args=None):
        return value


class Targets(Constraint):
    """The loss's targets for the checked inputs in argument `inputs` (`check_loss_targets`)."""

    refuses_only = True

    def __init__(self, of: str = "self", inputs: str = "idx"):
        self.of, self.inputs = of, inputs

    def check(self, name, value, args=None):
        check_loss_targets(args[self.of].config, args[self.inputs], value, self.inputs)
        return value

    def bad_values(self):   # refused for the audit's (2, 8) token ids
        return [[1, 2], torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 8)]

    def shown(self, value):
        if not isinstance(value, torch.Tensor):
            return type(value).__name__
        return str(value.dtype).removeprefix("torch.") if value.is_floating_point() else str(tuple(value.shape))


class LossMask(Constraint):
    """None or the positions the loss scores, (b, t) for the checked inputs in argument `inputs`."""

    refuses_only = True

    def __init__(self, inputs: str = "idx"):
        self.inputs = inputs

    def check(self, name, value, args=None):
        check_loss_mask(args[self.inputs], value, self.inputs)
        return value

    def bad_values(self):
        return [[1, 0], torch.ones(2, 3, dtype=torch.bool)]

    def shown(self, value):
        return str(tuple(value.shape)) if isinstance(value, torch.Tensor) else type(value).__name__


class Split(Constraint):
    """None or the auxiliary split for the checked inputs in argument `inputs` -> a CPU LongTensor (b,)
    (`check_split`)."""

    def __init__(self, inputs: str = "idx"):
        self.inputs = inputs

    def check(self, name, value, args=None):
        if value is None:
            return None
        return check_split(value, *args[self.inputs].shape[:2])

    def bad_values(self):   # refused for the audit's (2, 8) token ids
        return [0, 8, 1.5, "3"]


class Prompts(Constraint):
    """What `specialize` takes (`check_prompts`) -> a list of single prompts, or one (b, t[, input_dim]) batch."""

    def __init__(self, of: str = "self"):
        self.of = of

    def check(self, name, value, args=None):
        model = args[self.of]
        return check_prompts(model.config, value, model.device)[0]

    def bad_values(self):
        return ["hello", [], torch.zeros(0, dtype=torch.long)]

    def shown(self, value):
        return {str: "str", list: "[]"}.get(type(value)) or str(tuple(value.shape))


class Ablate(Constraint):
    """None or {"ν.site": template index or indices} for the model's sites -> {"ν.site": [k, ...]}."""

    normalizes = True

    def __init__(self, of: str = "self"):
        self.of = of

    def check(self, name, value, args=None):
        return check_ablate(args[self.of], value)

    def bad_values(self):
        return ["2.attn_in", {"9.nope": [0]}, {"2.attn_in": []}]

    def shown(self, value):
        return "str" if isinstance(value, str) else str(value)[1:-1].split(":")[0]


class CacheNames(Constraint):
    """run_with_cache's names for the model `of` -> a predicate name -> bool (`cache_name_filter`)."""

    normalizes = True

    def __init__(self, of: str = "self"):
        self.of = of

    def check(self, name, value, args=None):
        return cache_name_filter(args[self.of].cache_names(), value)

    def bad_values(self):
        return ["ybar2", 3, [b"ybar"]]

    def shown(self, value):
        return "ybar2" if value == "ybar2" else type(value).__name__
