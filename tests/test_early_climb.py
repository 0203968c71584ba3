"""EarlyClimbDivergence: a climb must take the loss above where it just was.

A character model's first steps fall fast and noisily: a low draw followed by four higher ones
is a rebound within the range the loss just covered, not geometric growth. Curves are built
from seeds no threshold was chosen on.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import trainsignals as ts
from trainsignals.testing import close_state

SEEDS = range(8)


def _rebound(seed: int) -> tuple[np.ndarray, int]:
    """A loss falling smoothly from 4.5, then a noisy stretch whose low draw is followed by four
    rises that end below the highest of the values just before them (at step ``at``)."""
    rng = np.random.default_rng(seed + 81_000)
    base = 4.5 * np.exp(-np.arange(12) / 60)
    hi = base[-1] * rng.uniform(1.0, 1.05)
    low = hi * rng.uniform(0.70, 0.75)
    climb = low * np.cumprod(rng.uniform(1.06, 1.09, 4))  # +27..41 %, still under hi
    climb = np.minimum(climb, hi * 0.98)
    tail = climb[-1] * np.exp(-np.arange(1, 30) / 80)
    loss = np.concatenate((base, [hi, hi * 0.93, low], climb, tail))
    return loss, len(base) + 2 + 4


@pytest.mark.parametrize("seed", SEEDS)
def test_a_rebound_within_the_recent_range_is_no_divergence(seed: int) -> None:
    loss, at = _rebound(seed)
    assert np.all(np.diff(loss[at - 4:at + 1]) > 0) and loss[at] / loss[at - 4] > 1.25  # four rises, > 25 %
    assert loss[at] < loss[at - 6:at - 4].max()  # but below where the loss just was
    assert ts.EarlyClimbDivergence().scan(loss=loss) == []


@pytest.mark.parametrize("seed", SEEDS)
def test_geometric_growth_past_the_recent_range_is_named(seed: int) -> None:
    """The same run, its loss then growing 1.3x a step: named within five steps of the climb's start."""
    loss, at = _rebound(seed)
    grow = loss[-1] * 1.3 ** np.arange(1, 12)
    got = [(e.step, e.onset_step) for e in ts.EarlyClimbDivergence().scan(loss=np.concatenate((loss, grow)))]
    assert got and len(loss) - 1 <= got[0][1] and got[0][0] <= len(loss) + 4, got


def test_the_classroom_blow_up_is_still_named_at_its_fifth_value() -> None:
    w, losses = 10.0, []
    for _ in range(10):
        w -= 1.1 * 2 * (w - 3)
        losses.append((w - 3) ** 2)
    assert [(e.step, e.onset_step) for e in ts.EarlyClimbDivergence().scan(loss=losses)] == [(4, 0)]


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_streaming_scanning_and_resuming_agree(seed: int) -> None:
    loss, _ = _rebound(seed)
    loss = np.concatenate((loss, loss[-1] * 1.3 ** np.arange(1, 12), np.full(20, 1e3)))
    whole = ts.EarlyClimbDivergence().scan(loss=loss)
    rng = np.random.default_rng(seed + 82_000)
    cuts = sorted({0, len(loss), *rng.integers(1, len(loss), 5).tolist()})
    det, chunked = ts.EarlyClimbDivergence(), []
    for a, b in zip(cuts[:-1], cuts[1:], strict=False):
        chunked += det.scan(loss=loss[a:b], steps=np.arange(a, b))
        det2 = ts.EarlyClimbDivergence()
        det2.load_state_dict(json.loads(json.dumps(det.state_dict())))
        det = det2
    one = ts.EarlyClimbDivergence()
    streamed = [e for s in range(len(loss)) for e in one.update(step=s, loss=float(loss[s]))]
    assert whole == chunked == streamed and whole
    assert close_state(det.state_dict(), one.state_dict())


def test_the_noise_scale_starts_as_the_plain_mean_of_the_second_differences():
    """Fresh noise (seed 5210): until its weight falls to ``noise_alpha`` the divergence rules' noise
    scale is the mean of the second differences so far, then the EWMA goes on from there; the
    streaming and the batch paths agree across the boundary."""
    from trainsignals.detectors._trend import noise_step, noise_warming

    rng = np.random.default_rng(5210)
    y = np.concatenate((np.log(4.5) - 0.01 * np.arange(8), np.log(4.0) + 0.1 * rng.standard_normal(40)))
    d2 = np.abs(np.diff(y, 2))
    a = 0.05
    noise, nd, buf = 0.0, 0, []
    for t, v in enumerate(y.tolist()):
        noise, nd = noise_step(v, buf, noise, nd, a, 1.0 - a)
        buf.append(v)
        if 2 <= t and noise_warming(nd - 1, a):
            assert noise == pytest.approx(d2[:nd].mean(), rel=1e-12)
    assert nd == len(d2) and not noise_warming(nd, a)
    warm = int(np.ceil(1 / a))  # 20 second differences as a plain mean, then the EWMA
    expect = d2[:warm].mean()
    for v in d2[warm:]:
        expect = a * v + (1 - a) * expect
    assert noise == pytest.approx(expect, rel=1e-12)
    for det in (ts.EarlyClimbDivergence(), ts.TrendDivergence()):
        scanned = det.clone()
        scanned.scan(loss=np.exp(y))
        for t, v in enumerate(np.exp(y).tolist()):
            det.update(loss=v, step=t)
        assert close_state(det.state_dict(), scanned.state_dict())


def test_a_rebound_after_a_smooth_start_is_judged_against_the_noise_since():
    """A healthy character model's first 30 losses (a held-out draw, 7 December 2026): steps 0-8
    fall smoothly, then the minibatch noise sets in, and a low draw at step 18 is followed by four
    rises (+29 %) back above the values before it. Seeded by the smooth steps, an EWMA of the
    second differences held a third of its weight there and put the noise at 0.041 (six times it:
    0.25, under the climb): a critical divergence at step 22. The plain mean of those steps (0.051)
    keeps it quiet, and the same start followed by a blow-up is still named within five values."""
    loss = [4.555, 4.494, 4.457, 4.454, 4.442, 4.379, 4.330, 4.319, 4.177, 4.003, 4.060, 3.999, 4.202, 3.809,
            3.637, 3.796, 3.816, 3.636, 3.150, 3.534, 3.699, 3.938, 4.056, 3.514, 2.305, 3.163, 3.527, 3.544,
            3.193, 3.814]
    assert ts.EarlyClimbDivergence().scan(loss=loss) == []
    blown = np.concatenate((loss[:25], loss[24] * 1.6 ** np.arange(1, 11)))
    assert [(e.step, e.onset_step) for e in ts.EarlyClimbDivergence().scan(loss=blown)] == [(28, 24)]
