"""The vanishing-gradient rules on per-layer grad norms: each alone, and two rules sharing one step's levels."""

from __future__ import annotations

import numpy as np
import pytest

import trainsignals as ts


def _norms(seed: int = 5, n: int = 600, layers: int = 8) -> np.ndarray:
    rng = np.random.default_rng(seed)
    norms = np.exp(rng.normal(0, 0.3, (n, layers))) * np.logspace(0, -1.5, layers)
    norms[200:, 2] *= 1e-4          # one layer's gradients vanish (both rules)
    norms[400:, 7] *= 3e-3          # the lowest layer falls 2.5 decades: its own history only
    norms[300, 4] = np.nan          # one layer not measured at one step
    norms[350, :] = np.nan          # no layer measured
    return norms


def _feed(dets, norms, shared: bool):
    names = tuple(f"l{j}" for j in range(norms.shape[1]))
    out: list[list[ts.Event]] = [[] for _ in dets]
    for t, row in enumerate(norms):
        one = ts.LayerValues(names, row)
        for k, d in enumerate(dets):
            out[k] += d.update(layer_grad_norms=one if shared else ts.LayerValues(names, row.copy()), step=t)
    return out


def test_rules_reading_one_value_give_what_they_give_alone():
    norms = _norms()
    together = _feed([ts.MedianGapGradCliff(), ts.OwnDropGradCliff(), ts.MedianGapGradCliff(gap=2.0)], norms, True)
    alone = _feed([ts.MedianGapGradCliff(), ts.OwnDropGradCliff(), ts.MedianGapGradCliff(gap=2.0)], norms, False)
    assert together == alone
    assert {e.layer for e in together[0]} == {"l2"}
    assert {e.layer for e in together[1]} == {"l2", "l7"}


@pytest.mark.parametrize("cls", [ts.MedianGapGradCliff, ts.OwnDropGradCliff])
def test_cooldown_counts_steps(cls):
    norms = np.tile([1.0, 0.5, 0.3, 0.2], (1000, 1))
    norms[100:, 0] = 1e-6
    fired = [e.step for e in cls(cooldown=150).scan(layer_grad_norms=norms[:, :], steps=np.arange(0, 2000, 2))]
    assert len(fired) >= 2 and all(b - a == 152 for a, b in zip(fired, fired[1:]))  # 150 steps = 75 values here
