"""cgt_viz.geometry: the explorer's maths without a widget (PCA, box and polygon membership, cosine neighbours)."""
from __future__ import annotations

import numpy as np

from cgt_viz.geometry import PCA, cosine_neighbours, in_box, in_polygon


def test_pca_matches_the_svd_and_fixes_signs():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 6)) * np.array([5.0, 3.0, 2.0, 1.0, 0.5, 0.1])
    pca = PCA(4)
    Y = pca.fit_transform(X.astype(np.float32))
    centered = X - X.mean(0)
    _, s, vt = np.linalg.svd(centered, full_matrices=False)
    for k in range(4):      # the same axes as the SVD's, up to sign; the sign puts the largest loading positive
        assert abs(abs(pca.components_[k] @ vt[k]) - 1) < 1e-6
        assert pca.components_[k][np.abs(pca.components_[k]).argmax()] > 0
    np.testing.assert_allclose(pca.explained_variance_ratio_, (s ** 2 / (s ** 2).sum())[:4], rtol=1e-6)
    np.testing.assert_allclose(np.var(Y, axis=0, ddof=1), s[:4] ** 2 / (len(X) - 1), rtol=1e-4)
    np.testing.assert_allclose(pca.transform(X[:5]), Y[:5], atol=1e-5)   # new points land where fitted ones did


def test_box_and_polygon_membership():
    xy = np.array([[0.5, 0.5], [1.5, 0.5], [0.2, 1.0], [0.5, 1.5], [1.5, 1.5], [-1.0, 0.2]])
    assert in_box(xy, (0.0, 1.0), (0.0, 1.0)).tolist() == [True, False, True, False, False, False]   # edges in
    # an L shape (concave): the notch at (1.5, 1.5) is outside
    xs, ys = np.array([0, 2, 2, 1, 1, 0.0]), np.array([0, 0, 1, 1, 2, 2.0])
    assert in_polygon(xy, xs, ys).tolist() == [True, True, True, True, False, False]
    # a self-crossing bow tie: even-odd, both lobes inside, the points beside the crossing outside
    bow_x, bow_y = np.array([0, 2, 2, 0.0]), np.array([0, 2, 0, 2.0])
    pts = np.array([[0.3, 1.0], [1.7, 1.0], [1.0, 0.3], [1.0, 1.7]])
    assert in_polygon(pts, bow_x, bow_y).tolist() == [True, True, False, False]


def test_cosine_neighbours_are_the_most_similar_rows_in_order():
    rng = np.random.default_rng(1)
    Y = rng.normal(size=(50, 8))
    Y[7] = 0.0                                        # a zero row: cosine 0, never NaN
    idx, cos = cosine_neighbours(Y, 3, 5)
    unit = Y / np.maximum(np.linalg.norm(Y, axis=1, keepdims=True), 1e-12)
    full = unit @ unit[3]
    full[3] = -np.inf
    assert idx.tolist() == np.argsort(-full)[:5].tolist() and 3 not in idx
    np.testing.assert_allclose(cos, full[idx])
    assert np.all(np.diff(cos) <= 0) and np.isfinite(cosine_neighbours(Y, 7, 49)[1]).all()
