"""The numpy maths of a map of points: principal components, which points lie in a box or a polygon, and
each point's nearest neighbours by cosine. Arrays in, arrays out; the explorer (cgt_viz.widgets) and
`analysis.Projector` use these, and they are tested here without a widget.

Letters in shape comments: N points, e features (d_y for ȳ), k components.
"""
from __future__ import annotations

import numpy as np


class PCA:
    """The first k principal components by an eigendecomposition of the e × e covariance (no sklearn import
    on the first paint). Signs are fixed so that each component's largest loading is positive.

    fit_transform(X (N, e)) -> (N, k) float32; then components_ (k, e), mean_ (e,), and
    explained_variance_ratio_ (k,) (each component's share of the total variance)."""

    def __init__(self, k: int = 2):
        self.k = k

    def fit_transform(self, X: np.ndarray) -> np.ndarray:
        X64 = X.astype(np.float64)
        self.mean_ = X64.mean(0)
        centered = X64 - self.mean_
        evals, evecs = np.linalg.eigh(centered.T @ centered / max(len(X) - 1, 1))
        order = np.argsort(evals)[::-1][:self.k]
        comps = evecs[:, order].T                                             # (k, e)
        comps *= np.sign(comps[np.arange(len(comps)), np.abs(comps).argmax(1)])[:, None]
        self.components_ = comps
        self.explained_variance_ratio_ = evals[order] / max(evals.sum(), 1e-12)
        return (centered @ comps.T).astype(np.float32)

    def transform(self, X: np.ndarray) -> np.ndarray:
        return ((X.astype(np.float64) - self.mean_) @ self.components_.T).astype(np.float32)


def in_box(xy: np.ndarray, x: tuple[float, float], y: tuple[float, float]) -> np.ndarray:
    """(N,) bool: the points xy (N, 2) with x[0] <= x <= x[1] and y[0] <= y <= y[1] (edges included)."""
    (x0, x1), (y0, y1) = x, y
    return (xy[:, 0] >= x0) & (xy[:, 0] <= x1) & (xy[:, 1] >= y0) & (xy[:, 1] <= y1)


def in_polygon(xy: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """(N,) bool: the points xy (N, 2) inside the polygon with vertices (xs, ys) (m,) each, closed from the
    last vertex back to the first; by the even-odd rule (a ray to the right crosses the edges an odd number
    of times), so a self-crossing lasso behaves as plotly draws it."""
    px, py = xy[:, 0][:, None], xy[:, 1][:, None]
    x0, y0, x1, y1 = xs, ys, np.roll(xs, -1), np.roll(ys, -1)
    crosses = ((y0 > py) != (y1 > py)) & (px < (x1 - x0) * (py - y0) / np.where(y1 == y0, 1e-12, y1 - y0) + x0)
    return crosses.sum(1) % 2 == 1


def cosine_neighbours(Y: np.ndarray, i: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k rows of Y (N, e) most similar to row i by cosine, most similar first, row i itself left out:
    (indices (k,), cosines (k,)). A zero row has cosine 0 to everything."""
    Y = Y.astype(np.float64)
    norms = np.linalg.norm(Y, axis=1)
    cos = Y @ Y[i] / np.maximum(norms * norms[i], 1e-12)
    cos[i] = -np.inf
    idx = np.argpartition(-cos, min(k, len(Y) - 1) - 1)[:k]
    idx = idx[np.argsort(-cos[idx], kind="stable")]
    return idx, cos[idx]
