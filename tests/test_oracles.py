"""The detectors' statistics against reference implementations (statsmodels, SciPy, plain loops)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsignals.detectors._layer_levels import middle
from trainsignals.detectors._ops import ewma, ewvar
from trainsignals.detectors._trend import PREFILTER_SLACK, batch_trend, window_trend

statsmodels_api = pytest.importorskip("statsmodels.api")


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), w=st.integers(5, 60), scale=st.floats(1e-3, 1e3))
def test_window_trend_matches_statsmodels_ols(seed, w, scale):
    rng = np.random.default_rng(seed)
    y = scale * (rng.normal(size=w) + rng.normal() * np.arange(w) / w)
    slope, t = window_trend(y.tolist())
    fit = statsmodels_api.OLS(y, statsmodels_api.add_constant(np.arange(w, dtype=float))).fit()
    assert math.isclose(slope, fit.params[1], rel_tol=1e-9, abs_tol=1e-12 * scale)
    if fit.bse[1] > 1e-6 * scale:
        assert math.isclose(t, fit.tvalues[1], rel_tol=1e-6)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), w=st.integers(5, 60), rows=st.integers(1, 40),
       level=st.floats(-30, 30), noise=st.sampled_from([0.0, 1e-12, 1e-6, 1e-2, 1.0]))
def test_batch_trend_is_window_trend_far_inside_the_prefilter_slack(seed, w, rows, level, noise):
    # the batch paths skip a window only when batch_trend puts it PREFILTER_SLACK below a bar: the
    # two must agree far closer than that, even for exact lines (the variance floor) and big levels
    rng = np.random.default_rng(seed)
    wins = level + rng.normal(0, 0.05, (rows, 1)) * np.arange(w) + noise * rng.standard_t(3, (rows, w))
    slope, t = batch_trend(wins)
    for r in range(rows):
        s1, t1 = window_trend(wins[r].tolist())
        assert math.isclose(slope[r], s1, rel_tol=1e-6, abs_tol=1e-12)
        assert math.isclose(t[r], t1, rel_tol=PREFILTER_SLACK / 100, abs_tol=1e-6)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 300), a=st.floats(0.001, 0.999))
def test_ewma_and_ewvar_match_the_scalar_recurrence(seed, n, a):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n) * 10 ** rng.uniform(-3, 3)
    m0, v0 = float(rng.normal()), float(rng.uniform(0, 2))
    b = 1.0 - a
    m, v, ms, vs = m0, v0, [], []
    for xi in x.tolist():
        d = xi - m
        m = a * xi + b * m
        v = b * v + (b * a) * (d * d)
        ms.append(m)
        vs.append(v)
    got_m = ewma(x, a, b, m0)
    prev = np.r_[m0, got_m[:-1]]
    got_v = ewvar((x - prev) ** 2, a, b, v0)
    np.testing.assert_allclose(got_m, ms, rtol=1e-12, atol=1e-12 * np.abs(x).max())
    np.testing.assert_allclose(got_v, vs, rtol=1e-10, atol=1e-300)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 5), cols=st.integers(1, 50))
def test_middle_is_numpys_median(seed, rows, cols):
    a = np.random.default_rng(seed).normal(size=(rows, cols))
    np.testing.assert_array_equal(middle(a), np.median(a, axis=1))
    np.testing.assert_array_equal(middle(a[0]), np.median(a[0]))
