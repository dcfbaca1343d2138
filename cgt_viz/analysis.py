"""What the views compute: arrays in, arrays out (no plotting, no widgets).

Every function reads a model only through its public API (`context`, `run_with_cache`, `coefficients`,
`lora_factors`, `forward_specialized`, `x_only`, the template modules' `coeff`) and returns numpy arrays.

Letters in shape comments: n sequences, t positions, e = d_y, N selected tokens (points), K templates,
L labels, m suffix positions.
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from ._checks import (Choice, Int, Names, check_array, check_choice, check_float, check_indices, check_int,
                      checked, describe, is_int, refuse)
from .layers import SITE_WEIGHTS
from .comparison import comparison_logits
from .contracts import Inputs, Model, check_ybar_array
from .geometry import PCA
from .losses import LOSS_TERMS, per_position_loss
from .sequences import (IGNORE_INDEX, ByteTokenizer, Sequences, as_model_input, model_device, concat_sequences, eval_mode,  # noqa: F401
                        label_boundary, model_task, prepare_sequences, require_cgt, token_strings,
                        Baseline, Site, check_lengths, check_scored, check_templates, parse_site_unchecked)

PROJECTIONS = ("pca", "umap", "tsne")


# ---------------------------------------------------------------------------------------------- ȳ
@checked(model=Model(), inputs=Inputs("model"), batch_size=Int(1))
def collect_ybar(model, inputs: torch.Tensor, batch_size: int = 64) -> np.ndarray:
    """ȳ at every position: inputs (n, t) -> (n, t, e) float32, in chunks of batch_size sequences."""
    return _collect_ybar(model, inputs, batch_size)


@torch.no_grad()
def _collect_ybar(model, inputs: torch.Tensor, batch_size: int = 64) -> np.ndarray:
    """collect_ybar for arguments its caller checked: nothing is checked again (a range check of the ids
    per chunk would be a host sync per chunk on a GPU)."""
    dev = next(model.parameters()).device
    with eval_mode(model):
        chunks = [model._context(inputs[i:i + batch_size].to(dev)).float().cpu()
                  for i in range(0, inputs.shape[0], batch_size)]
    return torch.cat(chunks).numpy()


@torch.no_grad()
@checked(model=Model(), inputs=Inputs("model"), names=Names(lambda args: args["model"].cache_names(), "cache names",
                                                           " (e.g. ['ybar'])"), batch_size=Int(1))
def collect_cache(model, inputs: torch.Tensor, names: Sequence[str], batch_size: int = 64) -> dict[str, np.ndarray]:
    """The named outputs of `run_with_cache` (e.g. "ybar", "coeffs.3.attn_in"): {name: (n, t, ...)}."""
    dev = next(model.parameters()).device
    out: dict[str, list[torch.Tensor]] = {nm: [] for nm in names}
    with eval_mode(model):
        for i in range(0, inputs.shape[0], batch_size):
            _, cache = model.run_with_cache(inputs[i:i + batch_size].to(dev), names=list(names))
            for nm in names:
                out[nm].append(cache[nm].float().cpu())
    return {nm: torch.cat(v).numpy() for nm, v in out.items()}


def select_positions(lengths: np.ndarray, positions: Any = "all",
                     boundary: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Which tokens become points: -> (seq (N,), pos (N,)) int64.

    positions: "all"; "ends" (the last token of each excerpt: boundary−1 and the last position);
    an int k (every k-th position, starting at k−1); or a list of positions (those that exist per row).
    """
    lengths = check_lengths(lengths)
    want = "'all', 'ends', an int k >= 1 (every k-th token) or a non-empty list of positions (ints >= 0)"
    ok = True
    if isinstance(positions, str):
        check_choice("positions", positions, ("all", "ends"))
    elif is_int(positions):
        ok = positions >= 1
    elif isinstance(positions, (list, tuple, np.ndarray, torch.Tensor)):
        flat = np.asarray(positions.detach().cpu() if isinstance(positions, torch.Tensor) else positions, dtype=object)
        ok = flat.ndim == 1 and len(flat) > 0 and all(is_int(q) for q in flat) and min(flat) >= 0
        listed = np.asarray(flat.tolist(), dtype=np.int64) if ok else None
    else:
        ok = False
    if not ok:
        raise refuse("positions", want, describe(positions))
    if boundary is not None:
        boundary = np.asarray(boundary)
        if boundary.shape != lengths.shape or not np.issubdtype(boundary.dtype, np.integer):
            raise refuse("boundary", f"one int per sequence ({len(lengths)})", describe(boundary))
    seqs, poss = [], []
    for i, length in enumerate(lengths):
        if isinstance(positions, str) and positions == "all":
            p = np.arange(length)
        elif isinstance(positions, str):          # "ends"
            b = -1 if boundary is None else int(boundary[i])
            p = np.unique([q for q in (b - 1, length - 1) if 0 <= q < length])
        elif is_int(positions):
            p = np.arange(positions - 1, length, positions)
        else:                                     # a list: the positions each row has
            p = np.unique(listed[listed < length])
        seqs.append(np.full(len(p), i, dtype=np.int64))
        poss.append(np.asarray(p, dtype=np.int64))
    seq, pos = np.concatenate(seqs), np.concatenate(poss)
    if len(seq) == 0:   # a cross-argument check: the positions against these lengths
        raise refuse("positions", f"below the longest length {int(lengths.max(initial=0))}",
                     f"positions={positions!r}, which selects no token of these sequences (lengths "
                     f"{lengths.tolist()[:8]})")
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
        rows = check_indices("rows", rows, len(self.ybar))
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


def _escape_map(full: str) -> tuple[str, np.ndarray]:
    """full HTML-escaped as plotly hover wants it (quote=False) and where each of its characters starts
    there: escaping is a per-character substitution, so escape(full[i:j]) == escaped[at[i]:at[j]]."""
    code = np.frombuffer(full.encode("utf-32-le"), dtype=np.uint32)
    width = 1 + 4 * (code == ord("&")) + 3 * ((code == ord("<")) | (code == ord(">")))
    at = np.zeros(len(code) + 1, dtype=np.int64)
    np.cumsum(width, out=at[1:])
    return html.escape(full, quote=False), at


def _hover_snippets(text: list[str], joiner: str, pos: np.ndarray, width: int, head: str = "") -> list[str]:
    """head + '…before [token] after…' around each position of one row, HTML-escaped for plotly hover
    (plotly's hover labels decode &lt; &gt; &amp; but show &quot; and &#x27; literally: quote=False).
    head may hold "{p}", replaced by the position. The row is escaped once, not once per point."""
    lens = np.fromiter((len(s) for s in text), dtype=np.int64, count=len(text))
    offsets = np.concatenate([[0], np.cumsum(lens + len(joiner))])     # char offset of each token
    full = joiner.join(text)
    esc, at = _escape_map(full)
    pos = np.asarray(pos, dtype=np.int64)
    a = offsets[pos]
    b = a + lens[pos]
    lo, hi = at[np.maximum(0, a - width)], at[np.minimum(b + width, len(full))]
    ea, eb = at[a], at[b]
    before, after = (a > width).tolist(), (b + width < len(full)).tolist()
    first, _, rest = head.partition("{p}")
    heads = [f"{first}{p}{rest}" for p in pos.tolist()] if "{p}" in head else [head] * len(pos)
    return [f"{h}{'…' if bf else ''}{esc[l:x]}<b>[{esc[x:y]}]</b>{esc[y:r]}{'…' if af else ''}"
            for h, bf, l, x, y, r, af in zip(heads, before, lo.tolist(), ea.tolist(), eb.tolist(), hi.tolist(), after)]


def collect_points(seqs: Sequences, ybar_full: np.ndarray, positions: Any = "all", context_chars: int = 24) -> Points:
    """Select tokens of `seqs` (see select_positions) and gather their ȳ (N, e) and hover text."""
    seq, pos = select_positions(seqs.lengths, positions, seqs.boundary)
    return points_at(seqs, ybar_full, seq, pos, context_chars)


def points_at(seqs: Sequences, ybar_full: np.ndarray, seq: np.ndarray, pos: np.ndarray, context_chars: int = 24,
              seq_offset: int = 0) -> Points:
    """The points at given (sequence, position) pairs (N,) each: ȳ from ybar_full (n, t, e), token strings,
    hover text (token in context), labels, excerpt half. seq_offset is added to printed/stored sequence ids."""
    seq, pos = np.asarray(seq, dtype=np.int64), np.asarray(pos, dtype=np.int64)
    ybar = ybar_full[seq, pos]                                          # (N, e)
    inputs = seqs.inputs
    token_id = (inputs[seq, pos].numpy().astype(np.int64) if inputs.dim() == 2 else np.full(len(seq), -1))
    token = np.empty(len(seq), dtype=object)
    hover = np.empty(len(seq), dtype=object)
    order = np.argsort(seq, kind="stable")                              # group the points by sequence
    starts = np.searchsorted(seq[order], np.unique(seq))
    for rows in np.split(order, starts[1:]):
        i = int(seq[rows[0]])
        text = seqs.token_text[i]
        token[rows] = [text[p] for p in pos[rows].tolist()]
        hover[rows] = _hover_snippets(text, seqs.joiner, pos[rows], context_chars, f"seq {i + seq_offset} · pos {{p}}<br>")
    label = None if seqs.token_labels is None else seqs.token_labels[seq, pos]
    if label is not None:   # each distinct label escaped once
        names, which = np.unique(np.array([str(lab) for lab in label], dtype=object), return_inverse=True)
        tails = ["<br>label: " + html.escape(nm, quote=False) for nm in names.tolist()]
        hover = np.array([h + tails[j] for h, j in zip(hover.tolist(), which.tolist())], dtype=object)
    # which excerpt: split at the row's boundary, or at the middle of rows that have none
    split = seqs.lengths[seq] / 2 if seqs.boundary is None else \
        np.where(seqs.boundary[seq] >= 0, seqs.boundary[seq], seqs.lengths[seq] / 2)
    half = (pos >= split).astype(np.int8)
    return Points(np.ascontiguousarray(ybar, dtype=np.float32), seq + seq_offset, pos, token_id, token, hover, label, half)


# ---------------------------------------------------------------------------------------------- projection
def _as_points(X: Any, name: str = "X", cols: int | None = None) -> np.ndarray:
    """Finite points (N, e) with e >= 1 (or exactly `cols` columns) -> float32."""
    X = check_array(name, X, 2, cols=cols, what="2-D (points, features)")
    if X.shape[1] == 0:
        raise refuse(name, "at least one feature column", f"shape {X.shape}", verb="have")
    return X.astype(np.float32)


class Projector:
    """2-D (or, with dims=3, 3-D) projection of ȳ points by PCA, UMAP or t-SNE; keeps the fitted reducer to
    place new points.

    fit_transform(X (N, e)) -> (N, dims) float32;  transform(X_new (M, e)) -> (M, dims): PCA and UMAP use
    their own transform, t-SNE (which has none) places a new point at the distance-weighted mean of the
    embeddings of its 5 nearest fitted neighbours.
    """

    @checked(method=Choice(*PROJECTIONS), seed=Int(0), dims=Int(2, 3, hint=" (a 2-D or 3-D projection)"))
    def __init__(self, method: str = "pca", seed: int = 0, dims: int = 2, **params):
        self.dims = dims
        if method == "pca" and params:
            raise refuse("params", "empty for a pca projection (it has no settings)", str(sorted(params)), TypeError)
        if "n_components" in params:
            raise refuse("params", "n_components: dims sets the projection's dimensions",
                         describe(params["n_components"]), TypeError, verb="not set")
        if method == "umap" and "n_neighbors" in params:
            check_int("n_neighbors", params["n_neighbors"], 2)
        if method == "tsne" and "perplexity" in params:
            check_float("perplexity", params["perplexity"], 0.0, lo_open=True)
        self.method, self.seed, self.params = method, seed, params
        self.reducer = None
        self._fit_X = self._fit_Y = None
        self._width: int | None = None

    def _check_params(self, reducer_cls, n: int) -> None:
        """Unknown settings and settings that do not fit n points, refused here with the value shown."""
        import inspect
        known = set(inspect.signature(reducer_cls).parameters) - {"n_components"}
        unknown = sorted(set(self.params) - known)
        if unknown:
            raise refuse("params", f"{self.method} settings", str(unknown), TypeError, f"allowed: {sorted(known)}",
                         verb="name")
        if "n_neighbors" in self.params:
            check_int("n_neighbors", self.params["n_neighbors"], 2, n - 1, hint=f" (fewer than the {n} points)")
        if "perplexity" in self.params:
            check_float("perplexity", self.params["perplexity"], 0.0, n, lo_open=True, hi_open=True,
                        hint=f" (the number of points, {n})")

    def fit_transform(self, X) -> np.ndarray:
        """X (N, e) finite -> (N, 2) float32; N >= 2 for pca, >= 4 for umap and tsne."""
        X = _as_points(X)
        n = X.shape[0]
        need = 2 if self.method == "pca" else 4
        if n < need:
            raise refuse("X", f"at least {need} points", f"{n} (a {self.method} projection; shape {X.shape})",
                         verb="have")
        self._width = X.shape[1]
        if self.method != "pca":   # identical points crash t-SNE (a segfault in scikit-learn) and make UMAP NaN
            spread = float(np.ptp(X, axis=0).max()) if X.size else 0.0
            distinct = len(np.unique(X, axis=0)) if spread > 0 else 1
            if spread <= 1e-12 * max(1.0, float(np.abs(X).max())) or distinct < need:
                raise refuse("X", f"at least {need} distinct points with some spread for a {self.method} projection",
                             f"{n} points of which {distinct} distinct (largest range per dimension {spread:.3g})",
                             hint="ȳ is constant here (an untrained or collapsed model?); use projection='pca', or "
                                  "points from a trained model", verb="hold")
        if self.method == "pca":
            self.reducer = PCA(self.dims)
            Y = self.reducer.fit_transform(X)
        elif self.method == "umap":
            import umap
            self._check_params(umap.UMAP, n)
            # PCA init and fewer optimisation epochs than UMAP's defaults: several times faster with the same
            # clusters (benchmarks/bench_explorer.py times the fits); override through params
            kw = dict(n_neighbors=min(15, n - 1), min_dist=0.1, random_state=self.seed, n_jobs=1,
                      init="pca" if n > 16 else "random", n_epochs=200 if n <= 10_000 else 100,
                      negative_sample_rate=3)
            kw.update(self.params)
            self.reducer = umap.UMAP(n_components=self.dims, **kw)
            Y = self.reducer.fit_transform(X)
        else:
            from sklearn.manifold import TSNE
            self._check_params(TSNE, n)
            kw = dict(perplexity=min(30.0, (n - 1) / 3), init="pca", random_state=self.seed)
            kw.update(self.params)
            if self.dims == 3 and "method" not in self.params:
                kw["method"] = "barnes_hut"         # supports up to 3 components
            self.reducer = TSNE(n_components=self.dims, **kw)
            Y = self.reducer.fit_transform(X)
            self._fit_X, self._fit_Y = X, Y
        if not np.isfinite(Y).all():
            raise ValueError(f"the {self.method} projection of X ({n} points) gave NaN/inf coordinates; X is too "
                             f"degenerate for it (too few distinct points?): use projection='pca'")
        return _pad2(Y, self.dims)

    def transform(self, X) -> np.ndarray:
        if self.reducer is None:
            raise ValueError(f"this {self.method} projector is not fitted yet; call fit_transform first")
        X = _as_points(X, cols=self._width)
        if self.method != "tsne":
            return _pad2(self.reducer.transform(X), self.dims)
        from sklearn.neighbors import NearestNeighbors
        k = min(5, len(self._fit_X))
        dist, idx = NearestNeighbors(n_neighbors=k).fit(self._fit_X).kneighbors(X)
        w = 1.0 / (dist + 1e-6)
        return _pad2((self._fit_Y[idx] * w[..., None]).sum(1) / w.sum(1, keepdims=True), self.dims)


def _pad2(Y: np.ndarray, dims: int = 2) -> np.ndarray:
    Y = np.asarray(Y, dtype=np.float32)
    if Y.shape[1] < dims:   # d_y < dims (fewer PCA components): flat further axes
        Y = np.concatenate([Y, np.zeros((len(Y), dims - Y.shape[1]), np.float32)], axis=1)
    return Y


@checked(cap=Int(1), seed=Int(0))
def stratified_subsample(strata: np.ndarray, cap: int, seed: int = 0) -> np.ndarray:
    """At most `cap` indices, sorted, with every stratum represented in proportion (at least one each when
    cap allows). strata (N,) any hashable labels -> (≤ cap,) int64. N ≤ cap returns all indices."""
    if isinstance(strata, torch.Tensor):
        strata = strata.detach().cpu().numpy()
    strata = np.asarray(strata) if not isinstance(strata, (str, bytes)) else np.asarray(None)
    if strata.ndim != 1:
        raise refuse("strata", "a 1-D array with one label per point", describe(strata))
    n = len(strata)
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
    """‖ȳ_t − ȳ_{t−1}‖ and cosine(ȳ_t, ȳ_{t−1}) along the sequence: (t, e) -> two (t,) arrays (or
    (n, t, e) -> two (n, t)), NaN at t = 0 (no predecessor)."""
    ybar = check_array("ybar", ybar, range(8))            # numbers, finite; the shape is checked next
    if ybar.ndim not in (2, 3) or ybar.shape[-2] < 1 or ybar.shape[-1] < 1:   # t = 1 is all NaN: a one-token text
        raise refuse("ybar", "shape (t, e) or (n, t, e) with t, e >= 1", f"shape {ybar.shape}", verb="have")
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
    return parse_site_unchecked(model, site)


@torch.no_grad()
def site_coefficients(model, ybar: np.ndarray, site: Any) -> np.ndarray:
    """c^κ(ȳ) for one site: ybar (..., e) -> (..., K)."""
    site = parse_site(model, site)
    return _site_coefficients(model, check_ybar_array(model.config, ybar, "ybar", (1, 2, 3), "(..., d_y)"), site)


def _site_coefficients(model, ybar: np.ndarray, site: tuple[int, str]) -> np.ndarray:
    """site_coefficients for arguments its caller checked (a view's own ȳ)."""
    with torch.no_grad():
        return model._coefficients(as_model_input(model, ybar))["{}.{}".format(*site)].float().cpu().numpy()


def mean_abs_by_label(coeffs: np.ndarray, labels: np.ndarray) -> tuple[list, np.ndarray]:
    """Mean |c_k| per label: coeffs (N, K), labels (N,) -> (label names (L,), (L, K))."""
    coeffs, labels = np.asarray(coeffs), np.asarray(labels)
    if coeffs.ndim != 2 or len(labels) != len(coeffs):
        raise refuse("coeffs", "(N, K) and labels (N,)", f"{coeffs.shape} and {labels.shape}")
    keys = labels.astype(str)
    names = list(dict.fromkeys(keys.tolist()))
    table = np.stack([np.abs(coeffs[keys == nm]).mean(0) for nm in names]) if names else np.zeros((0, coeffs.shape[1]))
    return names, table


@torch.no_grad()
def delta_w_singular_values(model, ybar_vec: np.ndarray, site: Any) -> np.ndarray:
    """Singular values of the effective update ΔW(ȳ) = B @ A at one site for one summary ȳ (e,) -> (K·r,)."""
    site = parse_site(model, site)
    y = check_ybar_array(model.config, ybar_vec, "ybar_vec", (1, 2, 3), "(d_y,)")
    if y.ndim != 1:
        raise refuse("ybar_vec", "one summary of shape (d_y,)", f"shape {y.shape}")
    return _delta_w_singular_values(model, y, site)


@torch.no_grad()
def _delta_w_singular_values(model, ybar_vec: np.ndarray, site: tuple[int, str]) -> np.ndarray:
    """delta_w_singular_values for arguments its caller checked (a view's own ȳ (e,))."""
    layer, name = site
    weight_name = f"blocks.{layer - 1}.{SITE_WEIGHTS[name]}.weight"
    y = as_model_input(model, ybar_vec)
    lora_a, lora_b = model.lora_factors(y)[weight_name]                 # A (K·r, i), B (o, K·r)
    # ΔW = B A has rank ≤ K·r: its singular values are those of R_B R_Aᵀ from two thin QRs (cheap)
    r_b = torch.linalg.qr(lora_b.double())[1]
    r_a = torch.linalg.qr(lora_a.double().T)[1]
    return torch.linalg.svdvals(r_b @ r_a.T).float().cpu().numpy()


def _masked_mean(loss: torch.Tensor, valid: torch.Tensor, dim=None) -> torch.Tensor:
    w = valid.float()
    if dim is None:
        return (loss * w).sum() / w.sum().clamp_min(1.0)
    s = w.sum(dim)
    return torch.where(s > 0, (loss * w).sum(dim) / s.clamp_min(1.0), torch.full_like(s, float("nan")))


@checked(model=Model(), site=Site())
def template_ablation(model, inputs: torch.Tensor, targets: torch.Tensor, site: Any,
                      loss_mask: torch.Tensor | None = None, templates: Sequence[int] | None = None) -> dict:
    """Δ main loss when one template is switched off (c_k = 0, `model(..., ablate=...)`): {"base": float,
    "templates": (k,), "delta": (k,)}. inputs, targets, loss_mask as for `model.loss`; nothing in the model changes."""
    K = model.config.n_templates
    ks = list(range(K)) if templates is None else check_templates(templates, K)
    inputs, targets, loss_mask = check_scored(model, inputs, targets, loss_mask)
    return _template_ablation(model, inputs, targets, site, loss_mask, ks)


@torch.no_grad()
def _template_ablation(model, inputs: torch.Tensor, targets: torch.Tensor, site: tuple[int, str],
                       loss_mask: torch.Tensor | None, ks: list[int]) -> dict:
    """template_ablation for arguments its caller checked: every pass is the model's unchecked `_full`, so the
    ids are not checked again once per template."""
    layer, name = site
    dev = model_device(model)
    inputs, targets = inputs.to(dev), targets.to(dev)
    loss_mask = None if loss_mask is None else loss_mask.to(dev)

    def main_loss(ablate=None) -> float:
        logits = model._full(inputs, ablate=ablate)[0]
        return float(_masked_mean(*per_position_loss(model.config.mode, logits, targets, loss_mask)))

    with eval_mode(model):
        base = main_loss()
        delta = [main_loss({f"{layer}.{name}": [k]}) - base for k in ks]
    return {"base": base, "templates": np.array(ks), "delta": np.array(delta)}


# ---------------------------------------------------------------------------------------------- compare
@checked(model=Model(), no_context=Baseline("model"))
def compare_losses(model, inputs: torch.Tensor, targets: torch.Tensor, split: int,
                   loss_mask: torch.Tensor | None = None, no_context: torch.nn.Module | None = None) -> dict:
    """Per-position loss after the split s, averaged over rows: prompted (full model, prompt in context),
    specialized (ȳ frozen at token s−1, suffix alone), no_context (`x_only()`, suffix alone); see `comparison`.

    inputs (n, t), targets (n, t), split int in 1..t−1 -> {"position": (m,) = s..t−1, "prompted",
    "specialized", "no_context": (m,) each (NaN where no row scores that position)}.
    no_context: a cached `model.x_only()` to reuse (made here when None).
    """
    inputs, targets, loss_mask = check_scored(model, inputs, targets, loss_mask)
    t = inputs.shape[1]
    if t < 2:
        raise refuse("inputs", "at least 2 positions to split into a prefix and a suffix", f"shape {tuple(inputs.shape)}",
                     verb="have")
    split = check_int("split", split, 1, t - 1, hint=" (prefix and suffix non-empty)")
    return _compare_losses(model, inputs, targets, split, loss_mask, no_context)


@torch.no_grad()
def _compare_losses(model, inputs: torch.Tensor, targets: torch.Tensor, split: int, loss_mask: torch.Tensor | None,
                    no_context: torch.nn.Module | None) -> dict:
    """compare_losses for arguments its caller checked (`comparison_logits` checks nothing again)."""
    t = inputs.shape[1]
    dev, mode = model_device(model), model.config.mode
    inputs, targets = inputs.to(dev), targets.to(dev)
    mask = None if loss_mask is None else loss_mask.to(dev)
    tail = targets[:, split:]
    tail_mask = None if mask is None else mask[:, split:]
    no_context = model.x_only() if no_context is None else no_context
    with eval_mode(model), eval_mode(no_context):
        outs = comparison_logits(model, inputs, split, no_context)
    out = {"position": np.arange(split, t)}
    for key, logits in outs.items():
        out[key] = _masked_mean(*per_position_loss(mode, logits, tail, tail_mask), dim=0).cpu().numpy()
    return out


# ---------------------------------------------------------------------------------------------- training
NOT_PLOTTED = ("kind", "step", "lr", "grad_norm")   # record fields that are not loss curves


Series = dict[str, tuple[np.ndarray, np.ndarray]]   # name -> (steps, values)


def training_series(history: Any) -> tuple[Series, Series]:
    """Loss curves from a training history -> ({term: (steps, values)}, {eval metric: (steps, values)}).

    history: a `TrainHistory` (attributes step, main, ..., evals), a dict of equal-length lists (with "step"),
    or a list of callback records ({"kind": "step" | "eval" | "end", "step": ..., ...}).
    """
    steps: dict[str, list] = {}
    evals: dict[str, list] = {}
    if isinstance(history, (list, tuple)):
        for rec in history:
            if not isinstance(rec, dict) or "step" not in rec:
                raise refuse("history records", "dicts with a 'step'", repr(rec))
            target = evals if rec.get("kind") == "eval" else steps if rec.get("kind", "step") == "step" else None
            if target is None:
                continue
            for k, v in rec.items():
                if k not in NOT_PLOTTED and isinstance(v, (int, float)) and not isinstance(v, bool):
                    target.setdefault(k, []).append((rec["step"], float(v)))
    elif isinstance(history, dict) or hasattr(history, "step"):
        def get(key, default=None):
            return history.get(key, default) if isinstance(history, dict) else getattr(history, key, default)
        step = list(get("step", []) or [])
        for k in LOSS_TERMS:
            vals = get(k)
            if vals is not None and len(vals):
                if len(vals) != len(step):
                    raise ValueError(f"history[{k!r}] has {len(vals)} values but history['step'] has {len(step)}; "
                                     f"every series must have one value per step")
                steps[k] = list(zip(step, vals))
        for rec in get("evals", []) or []:
            for k, v in rec.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    evals.setdefault(k, []).append((rec.get("step", len(evals.get(k, []))), float(v)))
    else:
        raise refuse("history", "a TrainHistory, a dict of lists or a list of callback records", type(history).__name__,
                     TypeError)

    def arrays(d):
        return {k: (np.array([s for s, _ in v], dtype=np.int64), np.array([x for _, x in v], dtype=np.float64))
                for k, v in d.items()}
    return arrays(steps), arrays(evals)
