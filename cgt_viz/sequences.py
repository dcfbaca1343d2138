"""What the views look at, normalised: token tensors, strings, batches or tasks -> `Sequences`.

Used by `cgt_viz.analysis` (re-exported there) and the widgets. Shapes: n sequences, t positions.
"""
from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ._checks import Choice, Constraint, Int, checked, describe, is_int, refuse
from .contracts import IGNORE_INDEX, Model, check_inputs, check_targets, require_cgt, require_weights  # noqa: F401
from .model import GPT
from .tasks.base import check_task_fits
from .tasks.tokenizer import ByteTokenizer


# ---------------------------------------------------------------------------------------------- checks
class TextTask(Constraint):
    """A text task: one whose get_batch takes `boundary` (e.g. TextMixture)."""

    def check(self, name, value, args=None):
        get_batch = getattr(value, "get_batch", None)
        try:
            takes = callable(get_batch) and "boundary" in inspect.signature(get_batch).parameters
        except (TypeError, ValueError):
            takes = False
        if not takes:
            raise refuse(name, "a text task (one whose get_batch takes boundary, e.g. TextMixture)", describe(value),
                         TypeError)
        return value

    def bad_values(self):
        return [5, "text", None]

    def shown(self, value):
        return type(value).__name__


def model_device(model: torch.nn.Module) -> torch.device:
    """Where the model is now (asked on every call: a model may move between views); refused on the meta device."""
    return require_weights(model)


def as_model_input(model: torch.nn.Module, array: np.ndarray) -> torch.Tensor:
    """A float array as a tensor on the model's device and in its parameters' dtype (a model may have been
    moved to float64 or bfloat16 after a view was built)."""
    return torch.as_tensor(array).to(device=model_device(model), dtype=next(model.parameters()).dtype)


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Run in eval mode (no dropout, no VAE noise) and restore the caller's mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def check_lengths(lengths: Any) -> np.ndarray:
    """Sequence lengths: a 1-D array of ints >= 1 -> (n,) int64."""
    if isinstance(lengths, torch.Tensor):
        lengths = lengths.detach().cpu().numpy()
    want = "a non-empty 1-D array of ints >= 1 (one per sequence)"
    arr = np.asarray(lengths) if not isinstance(lengths, (str, bytes)) else np.asarray(None)
    if not np.issubdtype(arr.dtype, np.integer) or arr.ndim != 1 or arr.size == 0:
        raise refuse("lengths", want, describe(lengths), TypeError if not np.issubdtype(arr.dtype, np.integer)
                     else ValueError)
    if arr.min() < 1:
        raise refuse("lengths", want, f"a length {int(arr.min())} in {describe(lengths)}")
    return arr.astype(np.int64)


def check_templates(templates: Any, K: int) -> list[int]:
    """None or a non-empty list of template indices in 0..K−1."""
    want = f"None or a non-empty list of template indices in 0..{K - 1}"
    if isinstance(templates, torch.Tensor):
        templates = templates.tolist()
    listed = not isinstance(templates, (str, bytes)) and isinstance(templates, (list, tuple, range, np.ndarray))
    ks = ([] if not listed else list(np.asarray(templates, dtype=object).ravel())
          if isinstance(templates, np.ndarray) else list(templates))
    if not ks or not all(is_int(k) and 0 <= k < K for k in ks):
        raise refuse("templates", want, describe(templates), ValueError if listed else TypeError)
    return [int(k) for k in ks]


def check_scored(model, inputs: Any, targets: Any, loss_mask: Any):
    """inputs, targets and loss_mask as `model.loss` takes them (shapes, dtypes, token range) -> the tensors."""
    inputs = check_inputs(model.config, inputs, "inputs")
    check_targets(model.config, inputs, targets, loss_mask, inputs_name="inputs")
    return inputs, targets, None if loss_mask is None else loss_mask.bool()


def check_baseline(model, baseline: Any, name: str = "baseline") -> None:
    """A GPT (e.g. `model.x_only()`, or one trained alone) that reads and predicts what the model does."""
    if not isinstance(baseline, GPT):
        raise refuse(name, "None or a plain GPT such as model.x_only()", describe(baseline), TypeError)
    for field in ("mode", "vocab_size", "input_dim", "output_dim"):
        mine, theirs = getattr(model.config, field), getattr(baseline.config, field)
        if mine != theirs:
            raise refuse(name, "what the model does", f"its {field} {theirs!r}, the model's {mine!r}",
                         verb="read and predict")


class Baseline(Constraint):
    """None or a plain GPT reading and predicting what the model in argument `of` does (`check_baseline`)."""

    def __init__(self, of: str = "model"):
        self.of = of

    def check(self, name, value, args=None):
        if value is not None:
            check_baseline(args[self.of], value, name)
        return value

    def bad_values(self):
        return ["gpt", 5]


def parse_site_unchecked(model, site: Any, arg: str = "site") -> tuple[int, str]:
    """parse_site for a model its caller checked: a site κ ("ν.name" or (ν, name)) -> (layer ν, name); ValueError
    naming `arg` and listing the model's sites."""
    allowed = list(model.template_sites)
    if isinstance(site, str) and "." in site:
        layer, _, name = site.partition(".")
        key = (int(layer), name) if layer.isdigit() else None
    elif isinstance(site, (tuple, list)) and len(site) == 2 and is_int(site[0]) and isinstance(site[1], str):
        key = (int(site[0]), site[1])
    else:
        key = None
    if key not in allowed:
        raise refuse(arg, f"one of {[f'{lay}.{s}' for lay, s in allowed]} (or a (layer, site) pair)", describe(site))
    return key


class Site(Constraint):
    """A template site κ of the model in argument `of` (declared before it): "ν.name" or (ν, name) -> (ν, name)."""

    def __init__(self, of: str = "model", *, none: bool = False):
        self.of, self.none = of, none

    def check(self, name, value, args=None):
        return None if value is None and self.none else parse_site_unchecked(args[self.of], value, name)

    def bad_values(self):
        return ["9.attn_in", "nope", 5]


# ---------------------------------------------------------------------------------------------- tokens
def model_task(model: Any):
    """The task the views read token text from: one attached at run time (`model.task = task`, e.g. a
    `hf.BBCTokens` whose tokenizer is the LM's), else the one recorded in `model.config.extra["task"]`, rebuilt;
    None when there is none."""
    attached = getattr(model, "task", None)
    if attached is not None and callable(getattr(attached, "decode", None)):
        return attached
    extra = getattr(getattr(model, "config", None), "extra", None) or {}
    if "task" not in extra:
        return None
    try:
        from .tasks import task_from_config
        return task_from_config(model.config)
    except (ImportError, ValueError, TypeError, KeyError):
        return None


def _byte_text(t: int) -> str:
    s = chr(t) if 32 <= t < 127 or t in (9, 10) else f"\\x{t:02x}"
    return s.replace("\n", "⏎").replace("\t", "⇥")


_BYTE_TEXT = [_byte_text(t) for t in range(256)]   # token_strings of a byte, looked up instead of built per token


def token_strings(tokens: Sequence[int], task=None, vocab_size: int | None = None) -> list[str]:
    """Printable per-token strings: the task's `decode`, else bytes as characters, else the ids."""
    if task is not None and callable(getattr(task, "decode", None)):
        out = [str(s) for s in task.decode([int(t) for t in tokens])]
    elif vocab_size is not None and 128 < vocab_size <= 256:   # bytes: printable ASCII as is, the rest escaped
        return [_BYTE_TEXT[int(t)] if 0 <= int(t) < 256 else _byte_text(int(t)) for t in tokens]
    else:
        out = [str(int(t)) for t in tokens]
    return [s.replace("\n", "⏎").replace("\t", "⇥") for s in out]


# ---------------------------------------------------------------------------------------------- sequences
@dataclass
class Sequences:
    """A set of sequences to look at, normalised from whatever the user passed.

    inputs        (n, t) long tokens, right-padded with 0 past each row's length; or (n, t, f) floats
    lengths       (n,) number of real positions per row
    token_text    per row, one printable string per real position
    token_labels  (n, t) object array of labels per token, or None
    boundary      (n,) first position of the second excerpt (−1: none), or None
    targets       (n, t) long (−100 = not scored) or (n, t, o) floats; None: next token (tokens mode)
    loss_mask     (n, t) bool or None
    """

    inputs: torch.Tensor
    lengths: np.ndarray
    token_text: list[list[str]]
    token_labels: np.ndarray | None = None
    boundary: np.ndarray | None = None
    targets: torch.Tensor | None = None
    loss_mask: torch.Tensor | None = None
    joiner: str = ""
    label_name: str = "label"          # "topic" when the labels are a task's topics

    @property
    def n(self) -> int:
        return int(self.inputs.shape[0])

    @property
    def t(self) -> int:
        return int(self.inputs.shape[1])

    def scoring(self, mode: str = "tokens") -> tuple[torch.Tensor, torch.Tensor | None]:
        """(targets, loss_mask) for losses; next-token targets with padding ignored when none were given."""
        if self.targets is not None:
            return self.targets, self.loss_mask
        if mode != "tokens":
            raise ValueError("these sequences carry no targets; vectors-mode losses need a task batch "
                             "(pass a Task or a Batch as data)")
        targets = torch.full_like(self.inputs, IGNORE_INDEX)
        targets[:, :-1] = self.inputs[:, 1:]
        real_next = torch.arange(self.t)[None, :] < torch.as_tensor(self.lengths)[:, None] - 1   # (n, t)
        return targets.masked_fill(~real_next, IGNORE_INDEX), self.loss_mask


def concat_sequences(a: Sequences, b: Sequences) -> Sequences:
    """Rows of a, then rows of b, right-padded to the longer t (padding is never scored)."""
    t = max(a.t, b.t)

    def pad(x: torch.Tensor | None, n: int, fill) -> torch.Tensor | None:
        return None if x is None else F.pad(x, (0, 0) * (x.dim() - 2) + (0, t - x.shape[1]), value=fill)

    def labels(s: Sequences) -> np.ndarray | None:
        if a.token_labels is None and b.token_labels is None:
            return None
        out = np.full((s.n, t), None, dtype=object)
        if s.token_labels is not None:
            out[:, :s.t] = s.token_labels
        return out

    def scoring(s: Sequences):
        if a.targets is None and b.targets is None:
            return None, None
        tg, mk = s.scoring("tokens" if s.inputs.dim() == 2 else "vectors")
        return pad(tg, s.n, IGNORE_INDEX), pad(mk if mk is not None else torch.ones(s.n, s.t, dtype=torch.bool), s.n, False)

    (ta, ma), (tb, mb) = scoring(a), scoring(b)
    bound = None
    if a.boundary is not None or b.boundary is not None:
        bound = np.concatenate([s.boundary if s.boundary is not None else np.full(s.n, -1) for s in (a, b)])
    la, lb = labels(a), labels(b)
    return Sequences(torch.cat([pad(a.inputs, a.n, 0), pad(b.inputs, b.n, 0)]), np.concatenate([a.lengths, b.lengths]),
                     a.token_text + b.token_text, None if la is None else np.concatenate([la, lb]), bound,
                     None if ta is None else torch.cat([ta, tb]), None if ma is None else torch.cat([ma, mb]),
                     a.joiner if a.joiner == b.joiner else " ", a.label_name)


def label_boundary(row_labels: np.ndarray | None, length: int) -> int | None:
    """The first position whose label differs from position 0's (a topic switch), or None."""
    if row_labels is None or length < 2:
        return None
    first = row_labels[0]
    for p in range(1, length):
        if row_labels[p] != first:
            return p
    return None


def _check_labels(labels: Any, lengths: np.ndarray, t: int) -> np.ndarray | None:
    """labels: one per sequence (n,) or one per token (n, t) / ragged per-row lists -> (n, t) object."""
    if labels is None:
        return None
    n = len(lengths)
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().cpu().numpy()
    if isinstance(labels, (str, bytes)) or not hasattr(labels, "__len__"):
        raise refuse("labels", f"a sequence with one label per sequence ({n}) or per token ({n}, t)", describe(labels),
                     TypeError)
    if len(labels) != n:
        raise refuse("labels", f"one entry per sequence (n = {n}) or shape (n, t) = ({n}, {t})",
                     f"{len(labels)} entries ({describe(labels)})", verb="have")
    out = np.empty((n, t), dtype=object)
    for i, lab in enumerate(labels):
        if isinstance(lab, (str, bytes)) or np.ndim(lab) == 0:
            out[i, :] = lab.item() if isinstance(lab, np.generic) else lab
            continue
        lab = list(np.asarray(lab).tolist())
        if len(lab) < lengths[i]:
            raise ValueError(f"labels[{i}] has {len(lab)} entries but sequence {i} has {int(lengths[i])} tokens; "
                             f"per-token labels need one label per token")
        out[i, :len(lab[:t])] = lab[:t]
    return out


def _check_boundary(boundary: Any, lengths: np.ndarray) -> np.ndarray | None:
    """boundary: None, one int for every row, or one int per row: the first position of the second excerpt,
    in 0..length (length: it starts in the targets only), or −1 for a row without one -> (n,) int64."""
    if boundary is None:
        return None
    n = len(lengths)
    if isinstance(boundary, torch.Tensor):
        boundary = boundary.detach().cpu().numpy()
    if is_int(boundary):
        b = np.full(n, int(boundary), dtype=np.int64)
    else:
        b = np.asarray(boundary) if not isinstance(boundary, (str, bytes)) else np.asarray(None)
        ints = np.issubdtype(b.dtype, np.integer)
        b = np.full(n, int(b)) if ints and b.ndim == 0 else b
        if not ints or b.shape != (n,):
            raise refuse("boundary", f"an int or {n} ints (one per sequence)", describe(boundary),
                         ValueError if ints else TypeError)
        b = b.astype(np.int64)
    bad = (b != -1) & ((b < 0) | (b > lengths))
    if bad.any():
        i = int(np.argmax(bad))
        raise refuse("boundary", "-1 (none) or a position in 0..length (the first token of the second excerpt)",
                     f"{int(b[i])} for sequence {i} of length {int(lengths[i])}")
    return b


@checked(model=Model(weights=False), n_batches=Int(1), batch_size=Int(1), seed=Int(0), part=Choice("train", "val"))
def prepare_sequences(model, data, labels=None, boundary=None, *, n_batches: int = 4, batch_size: int = 32,
                      seed: int = 0, part: str = "val") -> Sequences:
    """Normalise `data` into `Sequences`.

    data: LongTensor (n, t) of tokens; a float tensor (n, t, input_dim) in vectors mode; a list of strings
    (encoded with the model's task tokenizer, bytes when the config names no task); a `Batch`; or a Task
    (n_batches batches of batch_size drawn with `seed`; `info["topic"]` becomes per-token labels and
    `info["boundary"]` the excerpt boundary).
    labels: None, one per sequence, or one per token. boundary: None, an int, or one int per sequence.
    """
    return prepare_sequences_unchecked(model, data, labels, boundary, n_batches, batch_size, seed, part)


def prepare_sequences_unchecked(model, data, labels, boundary, n_batches: int, batch_size: int, seed: int,
                                part: str) -> Sequences:
    """prepare_sequences for a model its caller checked; `data` (the one argument not declared: it takes many
    forms) is checked here, its token ids once (`check_inputs`, on the host)."""
    from .tasks.base import Batch, Task
    cfg = model.config
    task = model_task(model)
    token_labels_from_data = None
    targets = loss_mask = None
    if isinstance(data, Task):
        check_task_fits(model, data, "data")
        task = data
        g = torch.Generator().manual_seed(seed)
        batches = [data.get_batch(batch_size, part=part, generator=g) for _ in range(n_batches)]
        data = Batch(torch.cat([b.inputs for b in batches]), torch.cat([b.targets for b in batches]),
                     None if batches[0].loss_mask is None else torch.cat([b.loss_mask for b in batches]),
                     None, {k: torch.cat([b.info[k] for b in batches]) for k in batches[0].info
                            if isinstance(batches[0].info[k], torch.Tensor)})
    if isinstance(data, Batch):
        info = data.info
        targets, loss_mask = data.targets.cpu(), None if data.loss_mask is None else data.loss_mask.cpu()
        if labels is None and isinstance(info.get("topic"), torch.Tensor):
            names = getattr(task, "topics", None)
            topic = info["topic"].cpu().numpy()
            token_labels_from_data = (np.asarray(names, dtype=object)[topic] if names is not None
                                      else topic.astype(object))
        if boundary is None and isinstance(info.get("boundary"), torch.Tensor):
            boundary = info["boundary"].cpu()
        data = data.inputs
    if isinstance(data, np.ndarray):
        data = torch.from_numpy(data)
    if isinstance(data, (list, tuple)):
        if len(data) == 0:
            raise refuse("data", "at least one string or sequence", "an empty list", verb="hold")
        if not all(isinstance(s, str) for s in data):
            raise refuse("data as a list", "strings", str(sorted({type(s).__name__ for s in data})), TypeError,
                         verb="hold")
        if cfg.mode != "tokens":   # the data against the model: strings need a model that reads tokens
            raise refuse("data", "a float tensor (n, t, input_dim) or a Task for a vectors-mode model",
                         "a list of strings", TypeError)
        tokenizer = getattr(task, "tokenizer", None)
        if tokenizer is None:
            if cfg.vocab_size < 256:
                raise refuse("data", "token ids for this model: its config names no task tokenizer and vocab_size="
                                     f"{cfg.vocab_size} < 256 cannot hold bytes", "a list of strings")
            tokenizer = ByteTokenizer()
        encoded = [list(tokenizer.encode(s)) for s in data]
        too_long = [(i, len(ids)) for i, ids in enumerate(encoded) if not 1 <= len(ids) <= cfg.block_size]
        if too_long:
            i, n_ids = too_long[0]
            raise refuse("each string of data", f"1..block_size={cfg.block_size} tokens (nothing is clipped "
                         f"silently)", f"data[{i}], which encodes to {n_ids} tokens", verb="give")
        lengths = np.array([len(ids) for ids in encoded], dtype=np.int64)
        inputs = torch.zeros(len(encoded), int(lengths.max()), dtype=torch.long)
        for i, ids in enumerate(encoded):
            inputs[i, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        inputs = check_inputs(cfg, inputs, "data")   # a tokenizer's ids against the model's vocabulary
    elif isinstance(data, torch.Tensor):
        inputs = data.detach().cpu()
        if inputs.dim() == (1 if cfg.mode == "tokens" else 2):
            inputs = inputs[None]
        inputs = check_inputs(cfg, inputs, "data")   # once, on the host
        lengths = np.full(inputs.shape[0], inputs.shape[1], dtype=np.int64)
    else:
        raise refuse("data", "a LongTensor (n, t), a list of strings, a Batch or a Task", type(data).__name__, TypeError)
    n, t = inputs.shape[:2]
    if cfg.mode == "tokens":
        text = [token_strings(inputs[i, :lengths[i]].tolist(), task, cfg.vocab_size) for i in range(n)]
    else:
        text = [[f"x{p}" for p in range(int(lengths[i]))] for i in range(n)]
    joiner = getattr(task, "joiner", None)   # a task whose tokens carry their own spaces says so ("")
    if not isinstance(joiner, str):
        joiner = "" if all(len(s) <= 1 for row in text[:8] for s in row) else " "
    token_labels = _check_labels(labels, lengths, t)
    label_name = "label"
    if token_labels is None and token_labels_from_data is not None:
        token_labels, label_name = token_labels_from_data, "topic"
    if targets is not None and tuple(targets.shape[:2]) != (n, t):
        raise refuse("the targets of data", f"the shape (n, t) = ({n}, {t}) of its inputs", str(tuple(targets.shape)),
                     verb="have")
    return Sequences(inputs, lengths, text, token_labels, _check_boundary(boundary, lengths), targets, loss_mask, joiner,
                     label_name)
