"""Argument checks shared by every public entry point.

Each check raises TypeError (wrong kind of value) or ValueError (right kind, wrong value) with a message
that names the argument, shows what was received and says what is allowed, e.g.

    batch_size must be an int >= 1, got float 2.5
    device must be 'auto', 'cpu', 'cuda[:N]' or 'mps' (a device this machine has), got str 'gpu0'

`tests/faults/test_audit.py` feeds every public entry point bad arguments and holds them to this standard.
"""
from __future__ import annotations

import contextvars
import functools
import inspect
import math
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch


def describe(value: Any, limit: int = 60) -> str:
    """A short, readable account of a received value: its type and its value (or shape and dtype)."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    if isinstance(value, np.ndarray):
        return f"an ndarray of shape {value.shape} and dtype {value.dtype}"
    text = repr(value)
    if len(text) > limit:
        text = text[:limit - 3] + "..."
    return f"{type(value).__name__} {text}"


def refuse(name: str, want: str, got: str, error: type[Exception] = ValueError, hint: str = "",
           verb: str = "be") -> Exception:
    """The one message form of every argument check and contract: "<name> must <verb> <what is allowed>, got
    <what came>" (and, after a semicolon, how to fix it). Returns the exception; the caller raises it."""
    return error(f"{name} must {verb} {want}, got {got}" + (f"; {hint}" if hint else ""))


def is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def check_int(name: str, value: Any, lo: int | None = None, hi: int | None = None, *,
              allow_none: bool = False, hint: str = "") -> int | None:
    """An int (not a bool, not a float) in [lo, hi]; returns it as a Python int."""
    if value is None and allow_none:
        return None
    rng = (f" in {lo}..{hi}" if lo is not None and hi is not None else f" >= {lo}" if lo is not None
           else f" <= {hi}" if hi is not None else "")
    want = f"{'None or ' if allow_none else ''}an int{rng}{hint}"
    if not is_int(value):
        raise refuse(name, want, describe(value), TypeError)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise refuse(name, want, str(value))
    return int(value)


def check_float(name: str, value: Any, lo: float | None = None, hi: float | None = None, *,
                lo_open: bool = False, hi_open: bool = False, allow_none: bool = False, hint: str = "") -> float | None:
    """A finite real number in the given (half-)open or closed interval; returns it as a float."""
    if value is None and allow_none:
        return None
    parts = []
    if lo is not None:
        parts.append(f"{'>' if lo_open else '>='} {lo}")
    if hi is not None:
        parts.append(f"{'<' if hi_open else '<='} {hi}")
    want = f"{'None or ' if allow_none else ''}a finite number{' ' + ' and '.join(parts) if parts else ''}{hint}"
    if not is_number(value):
        raise refuse(name, want, describe(value), TypeError)
    v = float(value)
    if not math.isfinite(v):
        raise refuse(name, want, str(v))
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise refuse(name, want, str(v))
    if hi is not None and (v >= hi if hi_open else v > hi):
        raise refuse(name, want, str(v))
    return v


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise refuse(name, "True or False", describe(value), TypeError)
    return bool(value)


def check_choice(name: str, value: Any, choices: Iterable[Any], *, allow_none: bool = False) -> Any:
    choices = tuple(choices)
    if value is None and allow_none:
        return None
    try:
        ok = value in choices
    except TypeError:  # unhashable or incomparable
        ok = False
    if not ok:
        extra = " or None" if allow_none else ""
        raise refuse(name, f"one of {choices}{extra}", describe(value))
    return value


def check_dict(name: str, value: Any, what: str) -> dict:
    """A dict (`what` says which, e.g. "a dict of TrainConfig fields"), else a TypeError."""
    if not isinstance(value, dict):
        raise refuse(name, what, describe(value), TypeError)
    return value


def check_callable(name: str, value: Any, what: str = "a callable") -> Any:
    if not callable(value):
        raise refuse(name, what, describe(value), TypeError)
    return value


def check_device(name: str, device: Any, *, allow_auto: bool = False) -> torch.device:
    """A torch.device or a device string this machine has ("auto" too when allow_auto)."""
    want = ("'auto', " if allow_auto else "") + "'cpu', 'cuda[:N]' or 'mps' (a device this machine has)"
    if isinstance(device, torch.device):
        dev = device
    elif isinstance(device, str):
        if device == "auto" and allow_auto:   # the fastest device here: cuda > mps > cpu
            if torch.cuda.is_available():
                return torch.device("cuda")
            mps = getattr(torch.backends, "mps", None)
            return torch.device("mps") if mps is not None and mps.is_available() else torch.device("cpu")
        try:
            dev = torch.device(device)
        except (RuntimeError, ValueError):
            raise refuse(name, want, describe(device)) from None
    else:
        raise refuse(name, want + " or a torch.device", describe(device), TypeError)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise refuse(name, want, f"{str(dev)!r}, but CUDA is not available here")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise refuse(name, want, f"{str(dev)!r}, but this machine has {torch.cuda.device_count()} CUDA "
                                     f"device(s)")
    elif dev.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise refuse(name, want, "'mps', but MPS is not available here")
    elif dev.type not in ("cpu", "meta"):
        raise refuse(name, want, describe(device))
    return dev


def check_height(name: str, value: Any) -> int:
    """A figure height in pixels (plotly refuses heights below 10)."""
    return check_int(name, value, 10, hint=" (pixels)")


def check_array(name: str, value: Any, ndim: int | Sequence[int], *, finite: bool = True, min_rows: int = 0,
                cols: int | None = None, what: str = "") -> np.ndarray:
    """A numeric array-like (numpy, torch, nested lists) with the given number of dimensions, as float64."""
    dims = (ndim,) if isinstance(ndim, int) else tuple(ndim)
    shape_word = what or " or ".join(f"{d}-D" for d in dims)
    if isinstance(value, (str, bytes)) or value is None:
        raise refuse(name, f"a {shape_word} array of numbers", describe(value), TypeError)
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise refuse(name, f"a {shape_word} array of numbers", describe(value), TypeError) from None
    if arr.ndim not in dims:
        raise refuse(name, f"a {shape_word} array", f"shape {arr.shape}")
    if cols is not None and arr.ndim >= 2 and arr.shape[-1] != cols:
        raise refuse(name, f"{cols} columns (last dimension)", f"shape {arr.shape}", verb="have")
    if arr.ndim >= 1 and arr.shape[0] < min_rows:
        raise refuse(name, f"at least {min_rows} rows", f"shape {arr.shape}", verb="have")
    if finite and arr.size and not np.isfinite(arr).all():
        raise refuse(name, "finite", f"{int((~np.isfinite(arr)).sum())} NaN or inf value(s) in shape {arr.shape}")
    return arr


def check_index(name: str, value: Any, n: int) -> int:
    """An int position in 0..n-1 (negative indices are refused: they hide off-by-one mistakes)."""
    return check_int(name, value, 0, n - 1)


# ---------------------------------------------------------------------------------------------- declared
# Parameter constraints declared once per entry point, scikit-learn style:
#
#     @checked(batch_size=Int(1), part=Choice("train", "val"), device=Device())
#     def get_batch(self, batch_size, part="train", generator=None, device="cpu"): ...
#
# The decorator applies each constraint to the bound argument before the body runs (the body reads clean
# values), and keeps the declarations on `fn.__contracts__`, from which `tests/faults/test_audit.py` generates its
# bad-argument cases: each constraint knows the values that must be refused.
#
# The tensor contracts (`contracts.Model`, `Inputs`, `Split`, `Prompt`, ...) are constraints too; one that
# depends on another argument (token ids need the model's vocabulary) reads it from `args`, the arguments
# bound so far, each already checked (they are checked in declaration order: declare `model` first).
#
# A check is paid once per call from the user (scikit-learn's skip of nested validation): while a checked
# function's body runs, a checked function it calls is handed the library's own values, so its constraints
# convert them and skip the costly refusals (`Constraint.trusted`: a tensor's shape is still checked, its values,
# a host sync, are not). A body that passes on what user code made (a task's batches, callbacks) declares
# `skip_nested=False`, and the calls inside it check again.
_INSIDE_CHECKED = contextvars.ContextVar("cgt_viz_inside_checked", default=False)


class Constraint:
    """One argument's contract: `check(name, value, args)` returns the clean value or raises (the message from
    `refuse`); `bad_values()` lists values it must refuse, `shown(value)` what of one the message shows."""

    normalizes = False   # True: the clean value differs from what came (its default is converted too)
    # True: check() returns every valid value as it came, so a nested call skips it; False (the safe default for
    # a new constraint): a nested call still runs check() (see trusted)
    refuses_only = False

    def check(self, name: str, value: Any, args: dict | None = None) -> Any:
        raise NotImplementedError

    def trusted(self, name: str, value: Any, args: dict | None = None) -> Any:
        """The clean value of an argument the library passes from inside another checked call: check()'s
        conversion without its costly refusals. A constraint that only refuses returns the value; one that converts
        runs check() unless it overrides this to skip what costs (the tensor contracts: the look at the values)."""
        return value if self.refuses_only else self.check(name, value, args)

    def bad_values(self) -> list[Any]:
        raise NotImplementedError

    def shown(self, value: Any) -> str | None:
        """What of a bad value the message must show (None: its str/repr, as the audit's default)."""
        return None


class Int(Constraint):
    def __init__(self, lo: int | None = None, hi: int | None = None, *, none: bool = False, hint: str = ""):
        self.lo, self.hi, self.none, self.hint = lo, hi, none, hint

    def check(self, name, value, args=None):
        return check_int(name, value, self.lo, self.hi, allow_none=self.none, hint=self.hint)

    def bad_values(self):
        out = [2.5, "4", True] + ([] if self.none else [None])
        if self.lo is not None:
            out.append(self.lo - 1)
        if self.hi is not None:
            out.append(self.hi + 1)
        return out


class Height(Int):
    """A figure height in pixels (plotly refuses heights below 10), as `check_height`."""

    def __init__(self):
        super().__init__(10, hint=" (pixels)")


class Float(Constraint):
    def __init__(self, lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
                 hi_open: bool = False, none: bool = False, hint: str = ""):
        self.lo, self.hi, self.lo_open, self.hi_open, self.none, self.hint = lo, hi, lo_open, hi_open, none, hint

    def check(self, name, value, args=None):
        return check_float(name, value, self.lo, self.hi, lo_open=self.lo_open, hi_open=self.hi_open,
                           allow_none=self.none, hint=self.hint)

    def bad_values(self):
        out = [math.nan, math.inf, "0.5"] + ([] if self.none else [None])
        if self.lo is not None:
            out.append(self.lo if self.lo_open else self.lo - 1.0)
        if self.hi is not None:
            out.append(self.hi if self.hi_open else self.hi + 1.0)
        return out


class Choice(Constraint):
    refuses_only = True

    def __init__(self, *choices: Any, none: bool = False):
        self.choices, self.none = choices, none

    def check(self, name, value, args=None):
        return check_choice(name, value, self.choices, allow_none=self.none)

    def bad_values(self):
        return ["nonsense", 3] + ([] if self.none else [None])


class Bool(Constraint):
    def check(self, name, value, args=None):
        return check_bool(name, value)

    def bad_values(self):
        return ["yes", 1, None]


class Device(Constraint):
    def __init__(self, *, auto: bool = False):
        self.auto = auto

    def check(self, name, value, args=None):
        return check_device(name, value, allow_auto=self.auto)

    def bad_values(self):
        return ["nonsense", 5]


class Instance(Constraint):
    """An instance of `cls` (None too when none=True); `what` names it in the message."""

    refuses_only = True

    def __init__(self, cls: type | tuple[type, ...], what: str, *, none: bool = False):
        self.cls, self.what, self.none = cls, what, none

    def check(self, name, value, args=None):
        if not (isinstance(value, self.cls) or (self.none and value is None)):
            raise refuse(name, ("None or " if self.none else "") + self.what, describe(value), TypeError)
        return value

    def bad_values(self):
        return [5, "x"] + ([] if self.none else [None])

    def shown(self, value):
        return type(value).__name__


class Ints(Constraint):
    """An int >= lo, or a non-empty list of them -> a tuple of ints."""

    def __init__(self, lo: int = 1):
        self.lo = lo

    def check(self, name, value, args=None):
        want = f"an int >= {self.lo} or a non-empty list of ints >= {self.lo}"
        many = (value,) if is_int(value) else value
        if isinstance(many, (str, bytes)) or not isinstance(many, Iterable) or not all(is_int(k) for k in many):
            raise refuse(name, want, describe(value), TypeError)
        many = tuple(int(k) for k in many)
        if not many or min(many) < self.lo:
            raise refuse(name, want, str(list(many)))
        return many

    def bad_values(self):
        return [self.lo - 1, [], [self.lo, self.lo - 1], "4", 2.5]

    def shown(self, value):
        return {str: "str", float: "float"}.get(type(value)) or str(value if isinstance(value, list) else [value])


class Folder(Constraint):
    """A folder path (str or os.PathLike) -> a Path; new=True (a folder to write into) also refuses an existing
    file there. Whether a folder to read exists is the reader's question (FileNotFoundError, not a bad argument)."""

    def __init__(self, *, new: bool = False):
        self.new = new

    def check(self, name, value, args=None):
        if not isinstance(value, (str, os.PathLike)):
            raise refuse(name, "a str or os.PathLike folder", describe(value), TypeError)
        path = Path(value)
        if self.new and path.exists() and not path.is_dir():
            raise refuse(name, "a directory (or not exist yet)", f"the file {str(path)!r}")
        return path

    def bad_values(self):
        return [5, None]

    def shown(self, value):
        return type(value).__name__


class Tokens(Constraint):
    """A non-empty list of token strings (one per position): any sized sequence but a str/bytes -> a list."""

    def check(self, name, value, args=None):
        if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
            raise refuse(name, "a non-empty list of strings (one per position)", describe(value), TypeError)
        if not len(value):
            raise refuse(name, "a non-empty list of strings (one per position)", "an empty list")
        return list(value)

    def bad_values(self):
        return ["abc", 5, []]

    def shown(self, value):
        return "an empty list" if isinstance(value, list) else type(value).__name__


class Pair(Constraint):
    """A range (lo, hi) of two finite numbers, in either order -> (min, max)."""

    def check(self, name, value, args=None):
        pair = (not isinstance(value, (str, bytes)) and hasattr(value, "__len__") and len(value) == 2
                and all(is_number(v) for v in value))
        if not pair or not all(math.isfinite(float(v)) for v in value):
            raise refuse(name, "a pair (lo, hi) of finite numbers", describe(value), TypeError if not pair else ValueError)
        lo, hi = (float(v) for v in value)
        return min(lo, hi), max(lo, hi)

    def bad_values(self):
        return [(1,), "ab", (math.nan, 1)]

    def shown(self, value):
        return describe(value)


class Generator(Constraint):
    """None or a torch.Generator (seeded by the caller)."""

    refuses_only = True

    def check(self, name, value, args=None):
        if value is not None and not isinstance(value, torch.Generator):
            raise refuse(name, "None or a torch.Generator", describe(value), TypeError)
        return value

    def bad_values(self):
        return [3, "seed"]


def checked(skip_nested: bool = True, **constraints: Constraint):
    """Decorator: apply the declared constraints to the named arguments at every call (see above).

    skip_nested: the checked functions this body calls only convert their arguments (`Constraint.trusted`); False
    for a body that hands them what user code made (a task's batches): they check it again."""
    def decorate(fn):
        sig = inspect.signature(fn)
        unknown = sorted(set(constraints) - set(sig.parameters))
        if unknown:
            raise TypeError(f"checked() declares {unknown}, which {fn.__qualname__} does not take")

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            bound = sig.bind(*args, **kwargs)
            nested = _INSIDE_CHECKED.get()
            for name, constraint in constraints.items():
                apply = constraint.trusted if nested else constraint.check
                if name in bound.arguments:
                    bound.arguments[name] = apply(name, bound.arguments[name], bound.arguments)
                elif constraint.normalizes:   # the body reads the normal form, of a default too
                    bound.arguments[name] = apply(name, sig.parameters[name].default, bound.arguments)
            if nested == skip_nested:
                return fn(*bound.args, **bound.kwargs)
            token = _INSIDE_CHECKED.set(skip_nested)
            try:
                return fn(*bound.args, **bound.kwargs)
            finally:
                _INSIDE_CHECKED.reset(token)

        wrapper.__contracts__ = dict(constraints)
        return wrapper
    return decorate


# --- constraints added for data (tasks, training, checkpoints, the Hugging Face side)
def check_divisible(name: str, value: int, by: int, what: str) -> None:
    """A check relating two arguments: value a multiple of `by` (`what` says what `by` is)."""
    if value % by:
        raise refuse(name, f"divisible by {what} ({by})", str(value))


class PathArg(Constraint):
    """A path (str or os.PathLike) -> a Path with ~ expanded (None too when none=True); `what` says which.
    Whether it exists is the reader's question (FileNotFoundError, not a bad argument)."""

    normalizes = True

    def __init__(self, what: str = "a path", *, none: bool = False):
        self.what, self.none = what, none

    def check(self, name, value, args=None):
        if value is None and self.none:
            return None
        if not isinstance(value, (str, os.PathLike)):
            raise refuse(name, ("None or " if self.none else "") + f"{self.what} (str or os.PathLike)",
                         describe(value), TypeError)
        return Path(value).expanduser()

    def bad_values(self):
        return [5] + ([] if self.none else [None])

    def shown(self, value):
        return type(value).__name__


class CallableArg(Constraint):
    """A callable (None too when none=True); `what` names it in the message, e.g. "a callable (model, step) -> dict"."""

    refuses_only = True

    def __init__(self, what: str = "a callable", *, none: bool = False):
        self.what, self.none = what, none

    def check(self, name, value, args=None):
        return value if value is None and self.none else check_callable(name, value, self.what)

    def bad_values(self):
        return [5, "print"] + ([] if self.none else [None])


class CallableList(Constraint):
    """An iterable of callables -> a list; `what` names it, e.g. "a list of callables taking one dict"."""

    normalizes = True

    def __init__(self, what: str = "a list of callables"):
        self.what = what

    def check(self, name, value, args=None):
        if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
            raise refuse(name, self.what, describe(value), TypeError)
        return [check_callable(name, fn, self.what) for fn in value]

    def bad_values(self):
        return [5, "print", [print, 5]]

    def shown(self, value):
        return "5" if isinstance(value, list) else None


class Has(Constraint):
    """An object with the named methods (duck-typed: a tokenizer, a task); `what` names it in the message."""

    refuses_only = True

    def __init__(self, *methods: str, what: str):
        self.methods, self.what = methods, what

    def check(self, name, value, args=None):
        if not all(callable(getattr(value, m, None)) for m in self.methods):
            raise refuse(name, self.what, describe(value), TypeError)
        return value

    def bad_values(self):
        return [5, "x", None]

    def shown(self, value):
        return type(value).__name__


class StepCounts(Constraint):
    """A non-empty collection of step counts (ints >= 0) -> a sorted list without repeats."""

    def check(self, name, value, args=None):
        want = "a non-empty list of non-negative step counts (ints >= 0)"
        many = list(value) if isinstance(value, Iterable) and not isinstance(value, (str, bytes)) else None
        if many is None or not all(is_int(s) for s in many):
            raise refuse(name, want, describe(value), TypeError)
        steps = sorted({int(s) for s in many})
        if not steps or steps[0] < 0:
            raise refuse(name, want, str(steps))
        return steps

    def bad_values(self):
        return [[], [-1, 2], "10", 2.5]

    def shown(self, value):
        return describe(value) if isinstance(value, (str, float)) else str(sorted(set(value)))


class DistinctNames(Constraint):
    """A non-empty tuple (or list) of distinct names from `choices` -> a tuple."""

    normalizes = True

    def __init__(self, *choices: str):
        self.choices = choices

    def check(self, name, value, args=None):
        want = f"names from {self.choices}, a non-empty tuple without repeats"
        if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
            raise refuse(name, want, describe(value), TypeError)
        value = tuple(value)
        unknown = [v for v in value if v not in self.choices]
        if not value or unknown or len(set(value)) != len(value):
            got = (f"unknown {unknown[0]!r} in {value}" if unknown else f"{value} (a name repeats)" if value
                   else "an empty tuple ()")
            raise refuse(name, want, got)
        return value

    def bad_values(self):
        return [("nonsense",), "x", (), 5]


class Seq(Constraint):
    """Exactly n values, each held to `item` (named name[i] in its messages) -> a tuple; `what` says it all."""

    normalizes = True

    def __init__(self, item: Constraint, n: int, what: str):
        self.item, self.n, self.what = item, n, what

    def check(self, name, value, args=None):
        if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)) or len(value) != self.n:
            raise refuse(name, self.what, describe(value), TypeError)
        return tuple(self.item.check(f"{name}[{i}]", v, args) for i, v in enumerate(value))

    def bad_values(self):
        return ["ab", [1.0] * (self.n + 1)]

    def shown(self, value):
        return describe(value)


def missing_package(what: str, package: str, hint: str = "") -> ValueError:
    """The error for an optional package that is not installed: "<what> needs the package <package> (pip install
    <package>)" and how else to go on. Returns the exception; the caller raises it (from None)."""
    return ValueError(f"{what} needs the package {package} (pip install {package})" + (f"; {hint}" if hint else ""))


# --- constraints added for views
# Patterns the views (analysis, evaluate, figures, widgets) check at many doors, declared once here.
class Names(Constraint):
    """A non-empty list of names, each from an allowed set -> a list. `allowed` is a tuple, or a function of the
    arguments bound so far when the set depends on one (a model's cache names)."""

    def __init__(self, allowed, what: str = "names", example: str = ""):
        self.allowed, self.what, self.example = allowed, what, example

    def check(self, name, value, args=None):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not value:
            raise refuse(name, f"a non-empty list of {self.what}{self.example}", describe(value), TypeError)
        allowed = list(self.allowed(args) if callable(self.allowed) else self.allowed)
        unknown = [v for v in value if not isinstance(v, str) or v not in allowed]
        if unknown:   # a set read from another argument is that model's ("cache names of this model")
            where = " of this model" if callable(self.allowed) else ""
            raise refuse(name, f"{self.what}{where}", str(unknown), hint=f"allowed: {allowed}")
        return list(value)

    def bad_values(self):
        return ["nonsense", [], ["nonsense"], [5]]

    def shown(self, value):
        return "list" if value == [] else None


class Strings(Constraint):
    """Exactly n strings (a list or tuple) -> a tuple; `what` says what each is, e.g. "(model, other)"."""

    def __init__(self, n: int, what: str = ""):
        self.n, self.what = n, what

    def check(self, name, value, args=None):
        if not (isinstance(value, (tuple, list)) and len(value) == self.n and all(isinstance(s, str) for s in value)):
            raise refuse(name, f"{self.n} strings {self.what}".rstrip(), repr(value))
        return tuple(value)

    def bad_values(self):
        return ["ab", ("a",), ("a", 5)]


class Array(Constraint):
    """A numeric array-like with one of the given numbers of dimensions (`check_array`) -> float64; `what` names
    the shape in the message, e.g. "1-D (t − 1,)"."""

    def __init__(self, ndim, what: str = "", *, finite: bool = True):
        self.ndim, self.what, self.finite = ndim, what, finite

    def check(self, name, value, args=None):
        return check_array(name, value, self.ndim, finite=self.finite, what=self.what)

    def bad_values(self):
        dims = (self.ndim,) if isinstance(self.ndim, int) else tuple(self.ndim)
        return ["x", np.zeros((2,) * (max(dims) + 1))] + ([np.full((2,) * max(dims), np.nan)] if self.finite else [])

    def shown(self, value):
        return "str" if isinstance(value, str) else ""


def check_indices(name: str, value: Any, n: int, *, flatten: bool = False) -> np.ndarray:
    """A list or 1-D array of int positions in 0..n-1 (points, rows) -> (m,) int64 ([] too); flatten=True
    takes any shape of them."""
    want = f"a list of indices (ints in 0..{n - 1})"
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__len__"):
        raise refuse(name, want, describe(value), TypeError)
    idx = np.asarray(value.detach().cpu() if isinstance(value, torch.Tensor) else value)
    idx = idx.reshape(-1) if flatten else idx
    if idx.size == 0:
        return np.zeros(0, dtype=np.int64)
    if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
        raise refuse(name, want, describe(value), TypeError)
    bad = idx[(idx < 0) | (idx >= n)]
    if bad.size:
        raise refuse(name, f"indices in 0..{n - 1}", f"{describe(value)} ({bad.size} out of range, e.g. "
                                                      f"{int(bad[0])})")
    return idx.astype(np.int64)



# --- sizes a user can type, against the memory this machine has
# torch starts every thread it is told to: more than the cores only slows it down, far more ends the process
THREADS_MAX = max(64, 4 * (os.cpu_count() or 1))


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (Linux MemAvailable: free + reclaimable cache), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def gib(nbytes: float) -> str:
    """A size for a message: GiB with two decimals, or a power of ten when it is astronomically large."""
    value = nbytes / 2**30
    return f"{value:.2f} GiB" if value < 1e6 else f"{value:.1e} GiB"


def check_fits(name: str, value: Any, need_bytes: float, what: str, hint: str = "") -> None:
    """A size typed by the user (`name` = `value`) for which `what` needs about `need_bytes` of memory: refused,
    with the estimate, when that is more than this machine has free (checked before anything is allocated, so
    the refusal takes no time and no memory). A machine that does not say what is free is not refused."""
    free = available_memory()
    if free is not None and need_bytes > free:
        raise refuse(name, f"small enough to fit in the {gib(free)} of memory free here",
                     f"{value}, for which {what} needs about {gib(need_bytes)}",
                     hint=hint or "choose a smaller value (or a machine with more memory)")
