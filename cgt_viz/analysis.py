"""What the views compute: arrays in, arrays out (no plotting, no widgets).

Every function reads a model only through its public API (`context`, `run_with_cache`, `coefficients`,
`lora_factors`, `forward_specialized`, `x_only`, the template modules' `coeff`) and returns numpy arrays.

Letters in shape comments: n sequences, t positions, e = d_y, N selected tokens (points), K templates,
L labels, m suffix positions.
"""
from __future__ import annotations

import contextlib
import html
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .layers import SITE_WEIGHTS

IGNORE_INDEX = -100
PROJECTIONS = ("pca", "umap", "tsne")


# ---------------------------------------------------------------------------------------------- checks
def require_cgt(model: Any, name: str = "model") -> None:
    """TypeError unless `model` has a y stream (a CGT): a plain GPT has no ȳ to look at."""
    if not (isinstance(model, torch.nn.Module) and callable(getattr(model, "context", None))
            and callable(getattr(model, "run_with_cache", None)) and hasattr(model, "templates")):
        raise TypeError(f"{name} must be a CGT (a model with a y stream and a context summary ȳ), got "
                        f"{type(model).__name__}; a plain GPT has no ȳ to show — train or load a CGT")


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Run in eval mode (no dropout, no VAE noise) and restore the caller's mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


# ---------------------------------------------------------------------------------------------- tokens
class ByteTokenizer:
    """UTF-8 bytes as tokens 0..255: the fallback when a model's config names no task."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, tokens) -> str:
        return bytes(int(t) for t in tokens).decode("utf-8", errors="replace")


def model_task(model: Any):
    """The task recorded in `model.config.extra["task"]`, rebuilt; None when there is none."""
    extra = getattr(getattr(model, "config", None), "extra", None) or {}
    if "task" not in extra:
        return None
    try:
        from .tasks import task_from_config
        return task_from_config(model.config)
    except (ImportError, ValueError, TypeError, KeyError):
        return None


def token_strings(tokens: Sequence[int], task=None, vocab_size: int | None = None) -> list[str]:
    """Printable per-token strings: the task's `decode`, else bytes as characters, else the ids."""
    if task is not None and callable(getattr(task, "decode", None)):
        out = [str(s) for s in task.decode([int(t) for t in tokens])]
    elif vocab_size is not None and 128 < vocab_size <= 256:   # bytes: printable ASCII as is, the rest escaped
        out = [chr(int(t)) if 32 <= int(t) < 127 or int(t) in (9, 10) else f"\\x{int(t):02x}" for t in tokens]
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
                     a.joiner if a.joiner == b.joiner else " ")


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
        raise TypeError(f"labels must be a sequence with one label per sequence ({n}) or per token ({n}, t), "
                        f"got {type(labels).__name__}")
    if len(labels) != n:
        raise ValueError(f"labels must have one entry per sequence (n = {n}) or shape (n, t) = ({n}, {t}); "
                         f"got {len(labels)} entries")
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


def _check_boundary(boundary: Any, n: int) -> np.ndarray | None:
    if boundary is None:
        return None
    b = np.asarray(boundary.detach().cpu() if isinstance(boundary, torch.Tensor) else boundary)
    if np.ndim(b) == 0:
        b = np.full(n, int(b))
    if b.shape != (n,) or not np.issubdtype(b.dtype, np.integer):
        raise ValueError(f"boundary must be an int or {n} ints (one per sequence), got shape {b.shape} {b.dtype}")
    return b.astype(np.int64)


def prepare_sequences(model, data, labels=None, boundary=None, *, n_batches: int = 4, batch_size: int = 32,
                      seed: int = 0, part: str = "val") -> Sequences:
    """Normalise `data` into `Sequences`.

    data: LongTensor (n, t) of tokens; a float tensor (n, t, input_dim) in vectors mode; a list of strings
    (encoded with the model's task tokenizer, bytes when the config names no task); a `Batch`; or a Task
    (n_batches batches of batch_size drawn with `seed`; `info["topic"]` becomes per-token labels and
    `info["boundary"]` the excerpt boundary).
    labels: None, one per sequence, or one per token. boundary: None, an int, or one int per sequence.
    """
    require_cgt(model)
    from .tasks.base import Batch, Task
    cfg = model.config
    task = model_task(model)
    token_labels_from_data = None
    targets = loss_mask = None
    if isinstance(data, Task):
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
            raise ValueError("data is an empty list; pass at least one string or sequence")
        if not all(isinstance(s, str) for s in data):
            raise TypeError(f"data as a list must hold strings, got {sorted({type(s).__name__ for s in data})}")
        if cfg.mode != "tokens":
            raise TypeError("data is a list of strings but the model is in vectors mode; pass a float tensor "
                            "(n, t, input_dim) or a Task")
        tokenizer = getattr(task, "tokenizer", None)
        if tokenizer is None:
            if cfg.vocab_size < 256:
                raise ValueError(f"data is a list of strings but the model's config names no task tokenizer and "
                                 f"vocab_size={cfg.vocab_size} < 256 cannot hold bytes; pass token ids instead")
            tokenizer = ByteTokenizer()
        encoded = [list(tokenizer.encode(s)) for s in data]
        for i, ids in enumerate(encoded):
            if not 1 <= len(ids) <= cfg.block_size:
                raise ValueError(f"data[{i}] encodes to {len(ids)} tokens; each string must give 1..block_size="
                                 f"{cfg.block_size} tokens (nothing is clipped silently)")
        lengths = np.array([len(ids) for ids in encoded], dtype=np.int64)
        inputs = torch.zeros(len(encoded), int(lengths.max()), dtype=torch.long)
        for i, ids in enumerate(encoded):
            inputs[i, :len(ids)] = torch.tensor(ids, dtype=torch.long)
    elif isinstance(data, torch.Tensor):
        inputs = data.detach().cpu()
        want = "(n, t) token ids" if cfg.mode == "tokens" else f"(n, t, input_dim={cfg.input_dim}) floats"
        if inputs.dim() == (1 if cfg.mode == "tokens" else 2):
            inputs = inputs[None]
        if inputs.dim() != (2 if cfg.mode == "tokens" else 3) or inputs.shape[0] == 0 or inputs.shape[1] == 0:
            raise ValueError(f"data must have shape {want} with n, t >= 1, got shape {tuple(data.shape)}")
        if cfg.mode == "tokens" and inputs.is_floating_point():
            raise TypeError(f"data must hold integer token ids for a tokens-mode model, got dtype {inputs.dtype}")
        if inputs.shape[1] > cfg.block_size:
            raise ValueError(f"data has {inputs.shape[1]} positions but block_size is {cfg.block_size}")
        if cfg.mode == "tokens":
            inputs = inputs.long()
            lo, hi = int(inputs.min()), int(inputs.max())
            if lo < 0 or hi >= cfg.vocab_size:
                raise ValueError(f"data holds token ids in [{lo}, {hi}]; allowed are 0..{cfg.vocab_size - 1}")
        lengths = np.full(inputs.shape[0], inputs.shape[1], dtype=np.int64)
    else:
        raise TypeError(f"data must be a LongTensor (n, t), a list of strings, a Batch or a Task, "
                        f"got {type(data).__name__}")
    n, t = inputs.shape[:2]
    if cfg.mode == "tokens":
        text = [token_strings(inputs[i, :lengths[i]].tolist(), task, cfg.vocab_size) for i in range(n)]
    else:
        text = [[f"x{p}" for p in range(int(lengths[i]))] for i in range(n)]
    joiner = "" if all(len(s) <= 1 for row in text[:8] for s in row) else " "
    token_labels = _check_labels(labels, lengths, t)
    if token_labels is None and token_labels_from_data is not None:
        token_labels = token_labels_from_data
    if targets is not None and tuple(targets.shape[:2]) != (n, t):
        raise ValueError(f"targets have shape {tuple(targets.shape)} but data has (n, t) = ({n}, {t})")
    return Sequences(inputs, lengths, text, token_labels, _check_boundary(boundary, n), targets, loss_mask, joiner)


# ---------------------------------------------------------------------------------------------- ȳ
@torch.no_grad()
def collect_ybar(model, inputs: torch.Tensor, batch_size: int = 64) -> np.ndarray:
    """ȳ at every position: inputs (n, t) -> (n, t, e) float32, in chunks of batch_size sequences."""
    require_cgt(model)
    dev = _device(model)
    with eval_mode(model):
        chunks = [model.context(inputs[i:i + batch_size].to(dev)).float().cpu()
                  for i in range(0, inputs.shape[0], batch_size)]
    return torch.cat(chunks).numpy()


@torch.no_grad()
def collect_cache(model, inputs: torch.Tensor, names: Sequence[str], batch_size: int = 64) -> dict[str, np.ndarray]:
    """The named outputs of `run_with_cache` (e.g. "ybar", "coeffs.3.attn_in"): {name: (n, t, ...)}."""
    require_cgt(model)
    allowed = model.cache_names()
    unknown = [nm for nm in names if nm not in allowed]
    if unknown:
        raise ValueError(f"names {unknown} are not cache names of this model; allowed: {allowed}")
    dev = _device(model)
    out: dict[str, list[torch.Tensor]] = {nm: [] for nm in names}
    with eval_mode(model):
        for i in range(0, inputs.shape[0], batch_size):
            _, cache = model.run_with_cache(inputs[i:i + batch_size].to(dev))
            for nm in names:
                out[nm].append(cache[nm].float().cpu())
    return {nm: torch.cat(v).numpy() for nm, v in out.items()}


def select_positions(lengths: np.ndarray, positions: Any = "all",
                     boundary: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Which tokens become points: -> (seq (N,), pos (N,)) int64.

    positions: "all"; "ends" (the last token of each excerpt: boundary−1 and the last position);
    an int k (every k-th position, starting at k−1); or a list of positions (those that exist per row).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    seqs, poss = [], []
    for i, length in enumerate(lengths):
        if isinstance(positions, str) and positions == "all":
            p = np.arange(length)
        elif isinstance(positions, str) and positions == "ends":
            b = -1 if boundary is None else int(boundary[i])
            p = np.unique([q for q in (b - 1, length - 1) if 0 <= q < length])
        elif isinstance(positions, (int, np.integer)) and not isinstance(positions, bool) and positions >= 1:
            p = np.arange(positions - 1, length, positions)
        elif isinstance(positions, (list, tuple, np.ndarray)) and len(positions) > 0:
            p = np.unique([int(q) for q in positions if 0 <= int(q) < length])
        else:
            raise ValueError(f"positions must be 'all', 'ends', an int k >= 1 (every k-th token) or a non-empty "
                             f"list of positions, got {positions!r}")
        seqs.append(np.full(len(p), i, dtype=np.int64))
        poss.append(np.asarray(p, dtype=np.int64))
    seq, pos = np.concatenate(seqs), np.concatenate(poss)
    if len(seq) == 0:
        raise ValueError(f"positions={positions!r} selects no token of these sequences (lengths {lengths.tolist()[:8]})")
    return seq, pos


@dataclass
class Points:
    """The tokens shown as points: N rows, each a (sequence, position) with its ȳ and what to print.

    ybar (N, e) float32; seq, pos, token_id (N,) int64; token, hover (N,) str; label (N,) object or None;
    half (N,) int8 (0: first excerpt, 1: second; without a boundary the first/second half of the row).
    """

    ybar: np.ndarray
    seq: np.ndarray
    pos: np.ndarray
    token_id: np.ndarray
    token: np.ndarray
    hover: np.ndarray
    label: np.ndarray | None
    half: np.ndarray

    def __len__(self) -> int:
        return len(self.seq)

    def take(self, rows: np.ndarray) -> "Points":
        """The subset of points `rows` (an index array), in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        return Points(self.ybar[rows], self.seq[rows], self.pos[rows], self.token_id[rows], self.token[rows],
                      self.hover[rows], None if self.label is None else self.label[rows], self.half[rows])

    @staticmethod
    def concat(a: "Points", b: "Points") -> "Points":
        """a's points then b's (labels become None where one side has none)."""
        label = None
        if a.label is not None or b.label is not None:
            la = a.label if a.label is not None else np.full(len(a), None, dtype=object)
            lb = b.label if b.label is not None else np.full(len(b), None, dtype=object)
            label = np.concatenate([la.astype(object), lb.astype(object)])
        return Points(*(np.concatenate([getattr(a, f), getattr(b, f)]) for f in
                        ("ybar", "seq", "pos", "token_id", "token", "hover")), label, np.concatenate([a.half, b.half]))

    def frame(self, rows: np.ndarray, coords: np.ndarray | None = None):
        """A pandas DataFrame of the given rows: point, sequence, position, token, token_id, label, x, y."""
        import pandas as pd
        rows = np.asarray(rows, dtype=np.int64)
        df = pd.DataFrame({"point": rows, "sequence": self.seq[rows], "position": self.pos[rows],
                           "token": self.token[rows].astype(str), "token_id": self.token_id[rows],
                           "label": None if self.label is None else self.label[rows]})
        if coords is not None:
            df["x"], df["y"] = coords[rows, 0], coords[rows, 1]
        return df


def _hover_snippets(text: list[str], joiner: str, pos: np.ndarray, width: int) -> list[str]:
    """'…before [token] after…' around each position of one row, HTML-escaped for plotly hover."""
    offsets = np.cumsum([0] + [len(s) + len(joiner) for s in text])    # char offset of each token
    full = joiner.join(text)
    out = []
    for p in pos:
        a, b = offsets[p], offsets[p] + len(text[p])
        left, right = full[max(0, a - width):a], full[b:b + width]
        out.append(f"{'…' if a > width else ''}{html.escape(left)}<b>[{html.escape(text[p])}]</b>"
                   f"{html.escape(right)}{'…' if b + width < len(full) else ''}")
    return out


def collect_points(seqs: Sequences, ybar_full: np.ndarray, positions: Any = "all", context_chars: int = 24) -> Points:
    """Select tokens of `seqs` (see select_positions) and gather their ȳ (N, e) and hover text."""
    seq, pos = select_positions(seqs.lengths, positions, seqs.boundary)
    ybar = ybar_full[seq, pos]                                          # (N, e)
    inputs = seqs.inputs
    token_id = (inputs[seq, pos].numpy().astype(np.int64) if inputs.dim() == 2 else np.full(len(seq), -1))
    token = np.empty(len(seq), dtype=object)
    hover = np.empty(len(seq), dtype=object)
    for i in np.unique(seq):
        rows = np.nonzero(seq == i)[0]
        text = seqs.token_text[i]
        token[rows] = [text[p] for p in pos[rows]]
        snips = _hover_snippets(text, seqs.joiner, pos[rows], context_chars)
        hover[rows] = [f"seq {i} · pos {p}<br>{s}" for p, s in zip(pos[rows], snips)]
    label = None if seqs.token_labels is None else seqs.token_labels[seq, pos]
    if label is not None:
        hover = np.array([f"{h}<br>label: {html.escape(str(lab))}" for h, lab in zip(hover, label)], dtype=object)
    # which excerpt: split at the row's boundary, or at the middle of rows that have none
    split = seqs.lengths[seq] / 2 if seqs.boundary is None else \
        np.where(seqs.boundary[seq] >= 0, seqs.boundary[seq], seqs.lengths[seq] / 2)
    half = (pos >= split).astype(np.int8)
    return Points(np.ascontiguousarray(ybar, dtype=np.float32), seq, pos, token_id, token, hover, label, half)


# ---------------------------------------------------------------------------------------------- projection
def _as_points(X: Any, name: str = "X") -> np.ndarray:
    X = np.asarray(X.detach().cpu() if isinstance(X, torch.Tensor) else X, dtype=np.float32)
    if X.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array (points, features), got shape {X.shape}")
    if not np.isfinite(X).all():
        raise ValueError(f"{name} holds NaN or inf values")
    return X


class Projector:
    """2-D projection of ȳ points by PCA, UMAP or t-SNE; keeps the fitted reducer to place new points.

    fit_transform(X (N, e)) -> (N, 2) float32;  transform(X_new (M, e)) -> (M, 2): PCA and UMAP use their
    own transform, t-SNE (which has none) places a new point at the distance-weighted mean of the
    embeddings of its 5 nearest fitted neighbours.
    """

    def __init__(self, method: str = "pca", seed: int = 0, **params):
        if method not in PROJECTIONS:
            raise ValueError(f"method must be one of {PROJECTIONS}, got {method!r}")
        self.method, self.seed, self.params = method, seed, params
        self.reducer = None
        self._fit_X = self._fit_Y = None

    def fit_transform(self, X) -> np.ndarray:
        X = _as_points(X)
        n = X.shape[0]
        need = 2 if self.method == "pca" else 4
        if n < need:
            raise ValueError(f"a {self.method} projection needs at least {need} points, got {n}")
        if self.method == "pca":
            self.reducer = _PCA()
            Y = self.reducer.fit_transform(X)
        elif self.method == "umap":
            import umap
            kw = dict(n_neighbors=min(15, n - 1), min_dist=0.1, random_state=self.seed, n_jobs=1)
            kw.update(self.params)
            self.reducer = umap.UMAP(n_components=2, init="spectral" if n > 16 else "random", **kw)
            Y = self.reducer.fit_transform(X)
        else:
            from sklearn.manifold import TSNE
            kw = dict(perplexity=min(30.0, (n - 1) / 3), init="pca", random_state=self.seed)
            kw.update(self.params)
            self.reducer = TSNE(n_components=2, **kw)
            Y = self.reducer.fit_transform(X)
            self._fit_X, self._fit_Y = X, Y
        return _pad2(Y)

    def transform(self, X) -> np.ndarray:
        if self.reducer is None:
            raise ValueError(f"this {self.method} projector is not fitted yet; call fit_transform first")
        X = _as_points(X)
        if self.method != "tsne":
            return _pad2(self.reducer.transform(X))
        from sklearn.neighbors import NearestNeighbors
        k = min(5, len(self._fit_X))
        dist, idx = NearestNeighbors(n_neighbors=k).fit(self._fit_X).kneighbors(X)
        w = 1.0 / (dist + 1e-6)
        return _pad2((self._fit_Y[idx] * w[..., None]).sum(1) / w.sum(1, keepdims=True))


class _PCA:
    """Two principal components by an eigendecomposition of the e × e covariance (no sklearn import on
    the first paint). Signs are fixed so that each component's largest loading is positive."""

    def fit_transform(self, X: np.ndarray) -> np.ndarray:
        X64 = X.astype(np.float64)
        self.mean_ = X64.mean(0)
        centered = X64 - self.mean_
        evals, evecs = np.linalg.eigh(centered.T @ centered / max(len(X) - 1, 1))
        order = np.argsort(evals)[::-1][:2]
        comps = evecs[:, order].T                                             # (k, e)
        comps *= np.sign(comps[np.arange(len(comps)), np.abs(comps).argmax(1)])[:, None]
        self.components_ = comps
        self.explained_variance_ratio_ = evals[order] / max(evals.sum(), 1e-12)
        return (centered @ comps.T).astype(np.float32)

    def transform(self, X: np.ndarray) -> np.ndarray:
        return ((X.astype(np.float64) - self.mean_) @ self.components_.T).astype(np.float32)


def _pad2(Y: np.ndarray) -> np.ndarray:
    Y = np.asarray(Y, dtype=np.float32)
    if Y.shape[1] < 2:   # d_y = 1 or a single PCA component: a flat second axis
        Y = np.concatenate([Y, np.zeros((len(Y), 2 - Y.shape[1]), np.float32)], axis=1)
    return Y


def stratified_subsample(strata: np.ndarray, cap: int, seed: int = 0) -> np.ndarray:
    """At most `cap` indices, sorted, with every stratum represented in proportion (at least one each when
    cap allows). strata (N,) any hashable labels -> (≤ cap,) int64. N ≤ cap returns all indices."""
    strata = np.asarray(strata)
    n = len(strata)
    if isinstance(cap, bool) or not isinstance(cap, (int, np.integer)) or cap < 1:
        raise ValueError(f"cap must be an int >= 1, got {cap!r}")
    if n <= cap:
        return np.arange(n)
    _, inverse, counts = np.unique(strata.astype(str) if strata.dtype == object else strata,
                                   return_inverse=True, return_counts=True)
    quota = counts / n * cap
    take = np.floor(quota).astype(np.int64)
    if cap >= len(counts):
        take = np.maximum(take, 1)
    rest = cap - take.sum()
    if rest > 0:                                   # largest remainders get the leftover slots
        order = np.argsort(-(quota - np.floor(quota)))
        for j in order[:rest]:
            take[j] += 1
    elif rest < 0:                                 # the at-least-one rule overshot: trim the biggest strata
        for j in np.argsort(-take)[:-rest]:
            take[j] -= 1
    rng = np.random.default_rng(seed)
    chosen = [rng.choice(np.nonzero(inverse == j)[0], size=min(int(take[j]), int(counts[j])), replace=False)
              for j in range(len(counts)) if take[j] > 0]
    return np.sort(np.concatenate(chosen))


# ---------------------------------------------------------------------------------------------- smoothness
def token_smoothness(ybar: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """‖ȳ_t − ȳ_{t−1}‖ and cosine(ȳ_t, ȳ_{t−1}) along the sequence: (..., t, e) -> two (..., t) arrays,
    NaN at t = 0 (no predecessor)."""
    ybar = np.asarray(ybar, dtype=np.float64)
    if ybar.ndim < 2 or ybar.shape[-2] < 1:
        raise ValueError(f"ybar must have shape (..., t, e) with t >= 1, got {ybar.shape}")
    prev, cur = ybar[..., :-1, :], ybar[..., 1:, :]
    step = np.linalg.norm(cur - prev, axis=-1)
    denom = np.linalg.norm(cur, axis=-1) * np.linalg.norm(prev, axis=-1)
    cos = (cur * prev).sum(-1) / np.maximum(denom, 1e-12)
    nan = np.full(ybar.shape[:-2] + (1,), np.nan)
    return np.concatenate([nan, step], -1), np.concatenate([nan, cos], -1)


# ---------------------------------------------------------------------------------------------- templates
def parse_site(model, site: Any) -> tuple[int, str]:
    """A site κ as (layer ν, name) from "ν.name" or (ν, name); ValueError listing the model's sites."""
    require_cgt(model)
    allowed = list(model.template_sites)
    if isinstance(site, str) and "." in site:
        layer, _, name = site.partition(".")
        key = (int(layer), name) if layer.isdigit() else None
    elif isinstance(site, (tuple, list)) and len(site) == 2:
        key = (int(site[0]), str(site[1]))
    else:
        key = None
    if key not in allowed:
        raise ValueError(f"site must be one of {[f'{lay}.{s}' for lay, s in allowed]} (or a (layer, site) pair), "
                         f"got {site!r}")
    return key


@torch.no_grad()
def site_coefficients(model, ybar: np.ndarray, site: Any) -> np.ndarray:
    """c^κ(ȳ) for one site: ybar (..., e) -> (..., K)."""
    layer, name = parse_site(model, site)
    temp = model.templates[str(layer)][name]
    y = torch.as_tensor(np.asarray(ybar, dtype=np.float32), device=_device(model))
    return temp.coefficients(y).float().cpu().numpy()


def mean_abs_by_label(coeffs: np.ndarray, labels: np.ndarray) -> tuple[list, np.ndarray]:
    """Mean |c_k| per label: coeffs (N, K), labels (N,) -> (label names (L,), (L, K))."""
    coeffs, labels = np.asarray(coeffs), np.asarray(labels)
    if coeffs.ndim != 2 or len(labels) != len(coeffs):
        raise ValueError(f"coeffs must be (N, K) and labels (N,); got {coeffs.shape} and {labels.shape}")
    keys = labels.astype(str)
    names = list(dict.fromkeys(keys.tolist()))
    table = np.stack([np.abs(coeffs[keys == nm]).mean(0) for nm in names]) if names else np.zeros((0, coeffs.shape[1]))
    return names, table


@torch.no_grad()
def delta_w_singular_values(model, ybar_vec: np.ndarray, site: Any) -> np.ndarray:
    """Singular values of the effective update ΔW(ȳ) = B @ A at one site for one summary ȳ (e,) -> (K·r,)."""
    layer, name = parse_site(model, site)
    weight_name = f"blocks.{layer - 1}.{SITE_WEIGHTS[name]}.weight"
    y = torch.as_tensor(np.asarray(ybar_vec, dtype=np.float32), device=_device(model))
    if y.dim() != 1:
        raise ValueError(f"ybar_vec must be one summary of shape (d_y,), got shape {tuple(y.shape)}")
    lora_a, lora_b = model.lora_factors(y)[weight_name]                 # A (K·r, i), B (o, K·r)
    # ΔW = B A has rank ≤ K·r: its singular values are those of R_B R_Aᵀ from two thin QRs (cheap)
    r_b = torch.linalg.qr(lora_b.double())[1]
    r_a = torch.linalg.qr(lora_a.double().T)[1]
    return torch.linalg.svdvals(r_b @ r_a.T).float().cpu().numpy()


@contextlib.contextmanager
def ablated_template(model, site: Any, k: int) -> Iterator[None]:
    """Zero template k's coefficient at one site (row k of A and b in c = A ȳ + b), restore on exit."""
    layer, name = parse_site(model, site)
    coeff = model.templates[str(layer)][name].coeff
    K = coeff.weight.shape[0]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k < K:
        raise ValueError(f"k must be a template index in 0..{K - 1}, got {k!r}")
    saved_w = coeff.weight.data[k].clone()
    saved_b = None if coeff.bias is None else coeff.bias.data[k].clone()
    with torch.no_grad():
        coeff.weight[k] = 0
        if coeff.bias is not None:
            coeff.bias[k] = 0
    try:
        yield
    finally:
        with torch.no_grad():
            coeff.weight[k] = saved_w
            if saved_b is not None:
                coeff.bias[k] = saved_b


def per_position_loss(mode: str, out: torch.Tensor, targets: torch.Tensor,
                      loss_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Loss at every position and whether it counts: out (b, t, v), targets (b, t) -> ((b, t), (b, t) bool).
    Cross-entropy in tokens mode (−100 ignored), mean squared error in vectors mode."""
    if mode == "tokens":
        loss = F.cross_entropy(out.flatten(0, 1).float(), targets.flatten().clamp_min(0),
                               reduction="none").view(targets.shape)
        valid = targets != IGNORE_INDEX
    else:
        loss = (out.float() - targets.float()).pow(2).mean(-1)
        valid = torch.ones_like(loss, dtype=torch.bool)
    if loss_mask is not None:
        valid = valid & loss_mask.bool()
    return loss, valid


def _masked_mean(loss: torch.Tensor, valid: torch.Tensor, dim=None) -> torch.Tensor:
    w = valid.float()
    if dim is None:
        return (loss * w).sum() / w.sum().clamp_min(1.0)
    s = w.sum(dim)
    return torch.where(s > 0, (loss * w).sum(dim) / s.clamp_min(1.0), torch.full_like(s, float("nan")))


@torch.no_grad()
def template_ablation(model, inputs: torch.Tensor, targets: torch.Tensor, site: Any,
                      loss_mask: torch.Tensor | None = None, templates: Sequence[int] | None = None) -> dict:
    """Δ main loss when one template's coefficient is zeroed: {"base": float, "templates": (k,), "delta": (k,)}.
    inputs, targets, loss_mask as for `model.loss`; the model's weights are restored afterwards."""
    layer, name = parse_site(model, site)
    K = model.templates[str(layer)][name].coeff.weight.shape[0]
    ks = list(range(K)) if templates is None else [int(k) for k in templates]
    dev = _device(model)
    inputs, targets = inputs.to(dev), targets.to(dev)
    loss_mask = None if loss_mask is None else loss_mask.to(dev)

    def main_loss() -> float:
        return float(_masked_mean(*per_position_loss(model.config.mode, model(inputs), targets, loss_mask)))

    with eval_mode(model):
        base = main_loss()
        delta = []
        for k in ks:
            with ablated_template(model, (layer, name), k):
                delta.append(main_loss() - base)
    return {"base": base, "templates": np.array(ks), "delta": np.array(delta)}


# ---------------------------------------------------------------------------------------------- compare
@torch.no_grad()
def compare_losses(model, inputs: torch.Tensor, targets: torch.Tensor, split: int,
                   loss_mask: torch.Tensor | None = None, baseline: torch.nn.Module | None = None) -> dict:
    """Per-position loss after the split s, averaged over rows: prompted (full model, prompt in context),
    specialised (ȳ frozen at token s−1, suffix alone), no_context (`x_only()`, suffix alone).

    inputs (n, t), targets (n, t), split int in 1..t−1 -> {"position": (m,) = s..t−1, "prompted",
    "specialised", "no_context": (m,) each (NaN where no row scores that position)}.
    baseline: a cached `model.x_only()` to reuse (made here when None).
    """
    require_cgt(model)
    t = inputs.shape[1]
    if isinstance(split, bool) or not isinstance(split, (int, np.integer)) or not 1 <= split <= t - 1:
        raise ValueError(f"split must be an int in 1..{t - 1} (prefix and suffix non-empty), got {split!r}")
    dev, mode = _device(model), model.config.mode
    inputs, targets = inputs.to(dev), targets.to(dev)
    mask = None if loss_mask is None else loss_mask.to(dev)
    suffix, tail = inputs[:, split:], targets[:, split:]
    tail_mask = None if mask is None else mask[:, split:]
    baseline = model.x_only() if baseline is None else baseline
    with eval_mode(model), eval_mode(baseline):
        full = model(inputs)[:, split:]
        ybar = model.context(inputs[:, :split])[:, -1]                      # (n, e): summary of the prefix
        spec = model.forward_specialized(suffix, ybar)
        plain = baseline(suffix)
    out = {"position": np.arange(split, t)}
    for key, logits in (("prompted", full), ("specialised", spec), ("no_context", plain)):
        out[key] = _masked_mean(*per_position_loss(mode, logits, tail, tail_mask), dim=0).cpu().numpy()
    return out


# ---------------------------------------------------------------------------------------------- training
TRAIN_TERMS = ("main", "aux", "smooth", "total")
NOT_PLOTTED = ("kind", "step", "lr", "grad_norm")   # record fields that are not loss curves


def training_series(history: Any) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Loss curves from a training history -> ({term: (steps, values)}, {eval metric: (steps, values)}).

    history: a `TrainHistory` (attributes step, main, ..., evals), a dict of equal-length lists (with "step"),
    or a list of callback records ({"kind": "step" | "eval" | "end", "step": ..., ...}).
    """
    steps: dict[str, list] = {}
    evals: dict[str, list] = {}
    if isinstance(history, (list, tuple)):
        for rec in history:
            if not isinstance(rec, dict) or "step" not in rec:
                raise ValueError(f"history records must be dicts with a 'step', got {rec!r}")
            target = evals if rec.get("kind") == "eval" else steps if rec.get("kind", "step") == "step" else None
            if target is None:
                continue
            for k, v in rec.items():
                if k not in NOT_PLOTTED and isinstance(v, (int, float)) and not isinstance(v, bool):
                    target.setdefault(k, []).append((rec["step"], float(v)))
    elif isinstance(history, dict) or hasattr(history, "step"):
        get = (lambda k, d=None: history.get(k, d)) if isinstance(history, dict) else (lambda k, d=None: getattr(history, k, d))
        step = list(get("step", []) or [])
        for k in TRAIN_TERMS:
            vals = get(k)
            if vals is not None and len(vals):
                if len(vals) != len(step):
                    raise ValueError(f"history[{k!r}] has {len(vals)} values but history['step'] has {len(step)}")
                steps[k] = list(zip(step, vals))
        for rec in get("evals", []) or []:
            for k, v in rec.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    evals.setdefault(k, []).append((rec.get("step", len(evals.get(k, []))), float(v)))
    else:
        raise TypeError(f"history must be a TrainHistory, a dict of lists or a list of callback records, "
                        f"got {type(history).__name__}")

    def arrays(d):
        return {k: (np.array([s for s, _ in v], dtype=np.int64), np.array([x for _, x in v], dtype=np.float64))
                for k, v in d.items()}
    return arrays(steps), arrays(evals)
