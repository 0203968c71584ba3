"""Shared fixtures: every detector of the package with a stream it can read."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import trainsignals as ts

# `python -m pytest` (as .ci/run runs it) puts the checkout's root on sys.path, where the labeled
# runs' folder `datasets/` imports as a namespace package and passes for Hugging Face `datasets`
# (transformers then fails on `datasets.Dataset`). The package is installed: the root is not needed.
_ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _ROOT]


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


def scalar_streams(det: ts.Detector, n: int = 600, seed: int = 0) -> dict[str, np.ndarray]:
    """One array per input the detector reads, by input name."""
    rng = np.random.default_rng(seed + 1)
    loss = failing_stream(n, seed)
    if isinstance(det, ts.CUSUMPlateau):
        x = np.exp(np.log(2.0) - np.minimum(np.arange(n), 250) / 100 + rng.normal(0, 0.01, n))
        x[400] = np.nan
        g = np.exp(rng.normal(0, 0.05, n))
        g[250:] *= 0.1
        g[::9] = np.nan
        return {"loss": x, "grad_norm": g}
    if isinstance(det, (ts.LjungBoxSawtooth, ts.SwingRatioEdgeOfStability, ts.LRRiseEdgeOfStability)):
        # the loss lifted 4x from 300 while the learning rate rises 3x (with gaps) and the grad norm 2x
        grad = np.exp(rng.normal(0, 0.1, n)) * np.where(np.arange(n) < 300, 1.0, 2.0)
        grad[300] *= 4.0
        lr = np.where(np.arange(n) < 300, 1e-3, 3e-3)
        lr[::11] = np.nan
        x = loss * np.where(np.arange(n) < 300, 1.0, 4.0)
        return {i.name: v for i in det.inputs for k, v in (("loss", x), ("grad_norm", grad), ("lr", lr))
                if i.name == k}
    if isinstance(det, ts.LossGradCoupling):
        grad = np.exp(rng.normal(0, 0.1, n))
        grad[350:] *= 10.0 ** (-np.arange(n - 350) / 40)
        return {"loss": loss, "grad_norm": grad}
    if isinstance(det, ts.LRAnomaly):
        lr = np.full(n, 1e-3)
        lr[200:] = 0.1
        lr[400:] = 1e-6
        return {"lr": lr}
    if isinstance(det, ts.UpdateRatioBand):
        r = 3e-4 * np.exp(rng.normal(0, 0.2, n))
        r[250:320] = 0.3
        r[450:] = 1e-8
        lr = np.full(n, 1e-3)
        lr[::7] = np.nan
        return {"update_ratio": r, "lr": lr}
    return {det.inputs[0].name: loss}


SCALAR_FACTORIES: dict[str, Callable[[], Any]] = {
    "EWMASpike": ts.EWMASpike,
    "EWMASpike-linear-both": lambda: ts.EWMASpike(log=False, direction="both", threshold=4.0, min_ratio=1.2),
    "EWMASpike-persist": lambda: ts.EWMASpike(persist_kind="divergence", hold=5),
    "SlopeDivergence": ts.SlopeDivergence,
    "CUSUMPlateau": lambda: ts.CUSUMPlateau(patience=40),
    "CUSUMPlateau-strided": lambda: ts.CUSUMPlateau(patience=150),
    "LjungBoxSawtooth": ts.LjungBoxSawtooth,
    "SwingRatioEdgeOfStability": ts.SwingRatioEdgeOfStability,
    "LRRiseEdgeOfStability": ts.LRRiseEdgeOfStability,
    "LossGradCoupling": ts.LossGradCoupling,
    "NonFinite": ts.NonFinite,
    "LRAnomaly": ts.LRAnomaly,
    "UpdateRatioBand": ts.UpdateRatioBand,
}


@pytest.fixture(params=sorted(SCALAR_FACTORIES))
def scalar_detector(request: pytest.FixtureRequest) -> Any:
    return SCALAR_FACTORIES[request.param]()


def feed(det: Any, arrays: dict[str, np.ndarray], start: int = 0, stop: int | None = None) -> list[ts.Event]:
    """Feed ``det.update`` step by step with the arrays' values (keywords by input name)."""
    out: list[ts.Event] = []
    stop = len(next(iter(arrays.values()))) if stop is None else stop
    for t in range(start, stop):
        out.extend(det.update(step=t, **{k: float(a[t]) for k, a in arrays.items()}))
    return out
