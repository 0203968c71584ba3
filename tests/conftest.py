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


PLATEAU_RULES = (ts.GradCollapsePlateau, ts.GradCollapseSlowdown, ts.FrozenUpdatePlateau, ts.NeverImprovedPlateau,
                 ts.AbruptPlateau)


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
    if isinstance(det, PLATEAU_RULES):  # a loss that freezes at 250 as its grad norm and update ratio collapse
        x = np.exp(np.log(2.0) - np.minimum(np.arange(n), 250) / 100 + rng.normal(0, 0.01, n))
        if isinstance(det, ts.NeverImprovedPlateau):  # ... or that never improved
            x = np.exp(np.log(2.0) + rng.normal(0, 0.01, n))
        x[400] = np.nan
        g = np.exp(rng.normal(0, 0.05, n))
        g[250:] *= 0.01
        g[::9] = np.nan
        if isinstance(det, ts.AbruptPlateau):  # a grad norm known from step 450 on (the rule then goes quiet)
            g[:450] = np.nan
        r = 3e-4 * np.exp(rng.normal(0, 0.1, n))
        r[250:] *= 1e-4
        r[::5] = np.nan  # measured at its own cadence
        r[123] = np.inf
        return {k: v for k, v in (("loss", x), ("grad_norm", g), ("update_ratio", r))
                if k in {i.name for i in det.inputs}}
    if isinstance(det, (ts.LjungBoxSawtooth, ts.SwingRatioEdgeOfStability, ts.LRRiseEdgeOfStability)):
        # the loss lifted 4x from 300 while the learning rate rises 3x (with gaps) and the grad norm 2x
        grad = np.exp(rng.normal(0, 0.1, n)) * np.where(np.arange(n) < 300, 1.0, 2.0)
        grad[300] *= 4.0
        lr = np.where(np.arange(n) < 300, 1e-3, 3e-3)
        lr[::11] = np.nan
        x = loss * np.where(np.arange(n) < 300, 1.0, 4.0)
        return {i.name: v for i in det.inputs for k, v in (("loss", x), ("grad_norm", grad), ("lr", lr))
                if i.name == k}
    if isinstance(det, ts.GradLossDecoupling):
        grad = np.exp(rng.normal(0, 0.1, n))
        grad[350:] *= 10.0 ** (-np.arange(n - 350) / 40)
        return {"loss": loss, "grad_norm": grad}
    if isinstance(det, ts.JointCollapse):  # loss and grad norm collapse together from step 150
        drop = np.clip((np.arange(n) - 150) / 40, 0, 1)
        grad = 10.0 ** (-2 * drop) * np.exp(rng.normal(0, 0.1, n))
        grad[::13] = np.nan
        return {"loss": 2.3 * 10.0 ** (-3 * drop) * np.exp(rng.normal(0, 0.05, n)), "grad_norm": grad}
    if isinstance(det, ts.LRCollapseStall):  # cut 1000x at 200 (with gaps), back at 300, ramped down from 400
        lr = np.full(n, 1e-3) * np.exp(rng.normal(0, 0.05, n))
        lr[200:300] = 1e-6
        lr[400:] = 1e-3 * 10.0 ** (-np.minimum(np.arange(n - 400), 30) / 10)
        lr[::9] = np.nan
        return {"lr": lr}
    if isinstance(det, ts.LRScheduleMismatch):  # the plan decays 10x at 300; the run applies it at 330
        lr = np.where(np.arange(n) < 330, 1e-3, 1e-4)
        lr[::9] = np.nan
        return {"lr": lr}
    if isinstance(det, ts.UpdateGapStall):  # measured every 3rd step, none from 200 to 300, then every step
        r = np.where(np.arange(n) % 3 == 0, 3e-4, np.nan) * np.exp(rng.normal(0, 0.2, n))
        r[200:300] = np.nan
        r[300:] = 3e-4
        r[450:] = 0.0  # weights that stop changing give a ratio of 0
        return {"loss": loss, "update_ratio": r}
    if isinstance(det, ts.LRJumpAnomaly):
        lr = np.full(n, 1e-3)
        lr[200:] = 0.1
        lr[400:] = 1e-6
        return {"lr": lr}
    if isinstance(det, ts.UpdateRatioAboveBand):  # a warm restart lifts rate and ratio 30x at 350 (the
        t = np.arange(n)                           # schedule's), a 100x jump at a steady rate from 500 (not),
        lr = np.where(t < 350, 1e-3 * 10.0 ** (-1.5 * t / 350), 1e-3)  # the hard edge crossed at 250..320
        r = 0.3 * lr * np.exp(rng.normal(0, 0.2, n))
        r[250:320] = 0.3
        r[500:540] *= 100.0
        lr[::7] = np.nan
        r[::17] = np.nan
        return {"update_ratio": r, "lr": lr}
    if isinstance(det, (ts.UpdateRatioAboveBand, ts.UpdateRatioBelowBand)):
        r = 3e-4 * np.exp(rng.normal(0, 0.2, n))
        r[250:320] = 0.3
        r[450:] = 1e-8
        lr = np.full(n, 1e-3)
        lr[::7] = np.nan
        return {"update_ratio": r, "lr": lr} if isinstance(det, ts.UpdateRatioBelowBand) else {"update_ratio": r}
    if isinstance(det, ts.OneAnswerLossDrop):  # one class answers from 210 (gaps), the loss falls 1000x from 200
        t = np.arange(n)
        share = np.where(t >= 210, 1.0, np.clip(0.15 + rng.normal(0, 0.03, n), 0, 1))
        share[::7] = np.nan
        drop = np.clip((t - 200) / 40, 0, 1)
        return {"loss": 2.3 * 10.0 ** (-3 * drop) * np.exp(rng.normal(0, 0.05, n)), "pred_top_share": share}
    if isinstance(det, ts.TopShareCollapse):  # predictions pile onto one class from step 300 on
        share = np.clip(0.15 + rng.normal(0, 0.03, n), 0, 1)
        share[300:] = np.clip(share[300:] + np.minimum(np.arange(n - 300) / 30, 1) * 0.8, 0, 1)
        share[::13] = np.nan
        return {"pred_top_share": share, "loss": np.exp(-np.arange(n) / 300) * np.exp(rng.normal(0, 0.02, n))}
    if isinstance(det, ts.ValMetricChance):  # accuracy learned, then back at chance from 350, the answers one class
        acc = 0.1 + 0.8 * (1 - np.exp(-np.arange(n) / 60)) + rng.normal(0, 0.01, n)
        acc[350:] = 0.1 + rng.normal(0, 0.01, n - 350)
        acc[::17] = np.nan
        share = np.clip(np.where(np.arange(n) >= 350, 0.95, 0.2) + rng.normal(0, 0.03, n), 0, 1)
        share[::5] = np.nan
        return {"val_metric": acc, "loss": np.exp(-np.arange(n) / 300), "pred_top_share": share}
    if isinstance(det, ts.EarlyClimbDivergence):  # a geometric blow-up from step 500, twice
        loss = loss.copy()
        loss[500:] *= 1.3 ** np.minimum(np.arange(n - 500), 40)
        return {"loss": loss}
    if isinstance(det, ts.ConfirmedZSpike):  # lone 20x spikes, one with the loss up 3x; a 20x step that stays
        g = np.exp(rng.normal(0, 0.1, n))
        g[[150, 250]] *= 20.0
        g[400:] *= 20.0
        x = loss.copy()
        x[250] *= 3.0
        x[::7] = np.nan
        return {"grad_norm": g, "loss": x}
    if isinstance(det, ts.SignedLostProgress):  # positive (idle) until 100, a negative loss that improves, then
        t = np.arange(n)                        # loses its progress at 300 and again (after it recovered) at 420
        x = np.where(t < 100, loss, -0.2 - 1.8 * (1 - np.exp(-np.maximum(t - 100, 0) / 60)) + rng.normal(0, 0.03, n))
        x[300:380] += 1.5
        x[420:] += 1.5
        x[::11] = np.nan
        return {"loss": x}
    if isinstance(det, ts.SignedZSpike):  # positive (idle) until 100, then a negative loss with spikes and gaps
        x = np.where(np.arange(n) < 100, loss, -1.0 - np.arange(n) / n + rng.normal(0, 0.02, n))
        x[[150, 300]] = 2.0
        x[400:] += 3.0
        x[::11] = np.nan
        return {"loss": x}
    if isinstance(det, (ts.PeakRatioSpike, ts.LevelShift)):  # a 30x spike, then a 20x step that stays
        x = loss.copy()
        x[150] *= 20.0
        x[400:] *= 20.0
        return {det.inputs[0].name: x}
    return {det.inputs[0].name: loss}


def step_decay_at_300(step: int) -> float:
    """A planned schedule (module level, so a detector holding it pickles): 1e-3, then 1e-4."""
    return 1e-3 if step < 300 else 1e-4


SCALAR_FACTORIES: dict[str, Callable[[], Any]] = {
    "GradCollapsePlateau": lambda: ts.GradCollapsePlateau(patience=40),
    "GradCollapsePlateau-strided": lambda: ts.GradCollapsePlateau(patience=150),
    "GradCollapseSlowdown": lambda: ts.GradCollapseSlowdown(patience=40),
    "GradCollapseSlowdown-strided-cooldown": lambda: ts.GradCollapseSlowdown(patience=150, cooldown=100),
    "FrozenUpdatePlateau": lambda: ts.FrozenUpdatePlateau(patience=40),
    "FrozenUpdatePlateau-strided": lambda: ts.FrozenUpdatePlateau(patience=150),
    "NeverImprovedPlateau": lambda: ts.NeverImprovedPlateau(patience=40),
    "AbruptPlateau": lambda: ts.AbruptPlateau(patience=40),
    "AbruptPlateau-strided-cooldown": lambda: ts.AbruptPlateau(patience=150, cooldown=100),
    "EarlyClimbDivergence": ts.EarlyClimbDivergence,
    "TrendDivergence": ts.TrendDivergence,
    "LostProgress": ts.LostProgress,
    "EWMAZSpike": ts.EWMAZSpike,
    "SignedZSpike": ts.SignedZSpike,
    "SignedLostProgress": ts.SignedLostProgress,
    "SignedLostProgress-short-cooldown": lambda: ts.SignedLostProgress(window=10, cooldown=20, frac=0.3),
    "SignedZSpike-both-cooldown": lambda: ts.SignedZSpike(direction="both", threshold=5.0, cooldown=120),
    "ConfirmedZSpike": lambda: ts.ConfirmedZSpike(threshold=6.0, min_ratio=10.0),
    "ConfirmedZSpike-linear-both-cooldown": lambda: ts.ConfirmedZSpike(log=False, direction="both", threshold=4.0,
                                                                       min_ratio=1.2, cooldown=30),
    "EWMAZSpike-linear-both": lambda: ts.EWMAZSpike(log=False, direction="both", threshold=4.0, min_ratio=1.2),
    "LevelShift": lambda: ts.LevelShift(hold=5),
    "LevelShift-linear-both": lambda: ts.LevelShift(log=False, direction="both", threshold=4.0, min_ratio=1.2),
    "PeakRatioSpike": ts.PeakRatioSpike,
    "PeakRatioSpike-level": lambda: ts.PeakRatioSpike(signal="grad_norm", kind="grad_explosion", min_ratio=10.0),
    "GradLossDecoupling": ts.GradLossDecoupling,
    "JointCollapse": ts.JointCollapse,
    "OneAnswerLossDrop": ts.OneAnswerLossDrop,
    "OneAnswerLossDrop-short": lambda: ts.OneAnswerLossDrop(span=30, lag=60, cooldown=0),
    "LjungBoxSawtooth": ts.LjungBoxSawtooth,
    "SwingRatioEdgeOfStability": ts.SwingRatioEdgeOfStability,
    "LRRiseEdgeOfStability": ts.LRRiseEdgeOfStability,
    "NonFinite": ts.NonFinite,
    "LRJumpAnomaly": ts.LRJumpAnomaly,
    "LRScheduleMismatch": lambda: ts.LRScheduleMismatch(step_decay_at_300),
    "LRCollapseStall": ts.LRCollapseStall,
    "LRCollapseStall-cooldown": lambda: ts.LRCollapseStall(window=30, hold=5, cooldown=60),
    "UpdateGapStall": ts.UpdateGapStall,
    "UpdateGapStall-cooldown": lambda: ts.UpdateGapStall(missing=5, cooldown=40),
    "UpdateRatioAboveBand": ts.UpdateRatioAboveBand,
    "UpdateRatioAboveBand-cooldown": lambda: ts.UpdateRatioAboveBand(cooldown=30),
    "UpdateRatioBelowBand": ts.UpdateRatioBelowBand,
    "TopShareCollapse": ts.TopShareCollapse,
    "ValMetricChance": ts.ValMetricChance,
    "ValMetricChance-min": lambda: ts.ValMetricChance(mode="min", chance=0.9, cooldown=0),
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
