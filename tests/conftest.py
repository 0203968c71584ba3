"""Shared fixtures: every detector of the package with a stream it can read."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import trainsignals as ts


def failing_stream(n: int = 600, seed: int = 0) -> np.ndarray:
    """A positive loss-like stream with a spike, a climb and a NaN: makes most detectors fire."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    y = np.log(2.0) - t / 400 + rng.standard_t(5, n) * 0.03
    y[150] += 1.5
    y[300:380] += np.where(np.arange(80) % 2 == 0, 0.5, -0.5)
    y[450:] += 0.04 * np.arange(n - 450)
    x = np.exp(y)
    x[520] = np.nan
    return x


def scalar_streams(det: ts.Detector, n: int = 600, seed: int = 0) -> list[np.ndarray]:
    """One array per signal the detector reads."""
    rng = np.random.default_rng(seed + 1)
    loss = failing_stream(n, seed)
    if isinstance(det, ts.CUSUMPlateau):
        x = np.exp(np.log(2.0) - np.minimum(np.arange(n), 250) / 100 + rng.normal(0, 0.01, n))
        x[400] = np.nan
        g = np.exp(rng.normal(0, 0.05, n))
        g[250:] *= 0.1
        g[::9] = np.nan
        return [x, g]
    if isinstance(det, ts.Oscillation):  # the learning rate rises 3x at 300, with gaps
        grad = np.exp(rng.normal(0, 0.1, n))
        grad[350:] *= 10.0 ** (-np.arange(n - 350) / 40)
        lr = np.where(np.arange(n) < 300, 1e-3, 3e-3)
        lr[::11] = np.nan
        return [loss, grad, lr]
    if det.signals == ("loss", "grad_norm"):
        grad = np.exp(rng.normal(0, 0.1, n))
        grad[350:] *= 10.0 ** (-np.arange(n - 350) / 40)
        return [loss, grad]
    if isinstance(det, ts.LRAnomaly):
        lr = np.full(n, 1e-3)
        lr[200:] = 0.1
        lr[400:] = 1e-6
        return [lr]
    if isinstance(det, ts.UpdateRatioBand):
        r = 3e-4 * np.exp(rng.normal(0, 0.2, n))
        r[250:320] = 0.3
        r[450:] = 1e-8
        lr = np.full(n, 1e-3)
        lr[::7] = np.nan
        return [r, lr]
    return [loss]


SCALAR_FACTORIES: dict[str, Callable[[], Any]] = {
    "EWMASpike": ts.EWMASpike,
    "EWMASpike-linear-both": lambda: ts.EWMASpike(log=False, direction="both", threshold=4.0, min_ratio=1.2),
    "EWMASpike-persist": lambda: ts.EWMASpike(persist_kind="divergence", hold=5),
    "SlopeDivergence": ts.SlopeDivergence,
    "CUSUMPlateau": lambda: ts.CUSUMPlateau(patience=40),
    "CUSUMPlateau-strided": lambda: ts.CUSUMPlateau(patience=150),
    "Oscillation": ts.Oscillation,
    "LossGradCoupling": ts.LossGradCoupling,
    "NonFinite": ts.NonFinite,
    "LRAnomaly": ts.LRAnomaly,
    "UpdateRatioBand": ts.UpdateRatioBand,
}


@pytest.fixture(params=sorted(SCALAR_FACTORIES))
def scalar_detector(request: pytest.FixtureRequest) -> Any:
    return SCALAR_FACTORIES[request.param]()
