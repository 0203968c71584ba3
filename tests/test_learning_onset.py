"""Rules that compare the run now with the run then take *then* from after the run began to learn.

An untrained deep network sits on a plateau at chance, then escapes it by itself: its grad norm
rises as learning starts (``FAILURE_MODES.md``, healthy runs that look like failures). Curves are
regenerated from seeds no threshold was chosen on.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import trainsignals as ts
from trainsignals.detectors._learning import FALL, began
from trainsignals.testing import close_state

SEEDS = range(8)


def _escape(seed: int, n: int = 700, later: int | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """A run on a plateau at chance for 60..150 steps that then learns. Leaving a saddle, the
    grad norm grows first (0.5..0.8 decades over the plateau's last 40 steps, the loss still
    flat) and the loss follows, slowly at first (quadratic), while the grad norm rises 1.0..1.2
    decades more over 250 steps: 1.5..2 decades in all, less than 1.5 after learning began.
    ``later``: from that step the grad norm rises 2 more decades within 50 steps while the loss
    keeps falling (the gradients decoupled from the loss)."""
    rng = np.random.default_rng(seed + 71_000)
    t = np.arange(n, dtype=np.float64)
    start = int(rng.integers(60, 151))
    chance = float(np.log(rng.integers(2, 100)))
    ramp = np.clip((t - start) / rng.uniform(200.0, 300.0), 0.0, None)
    loss = (chance * np.exp(-ramp ** 2 - ramp) + 0.05) * np.exp(rng.normal(0.0, 0.01, n))
    pre, post = rng.uniform(0.5, 0.8), rng.uniform(1.0, 1.2)
    decades = pre * np.clip((t - start + 40) / 40.0, 0.0, 1.0) + post * np.clip((t - start) / 250.0, 0.0, 1.0)
    if later is not None:
        decades = decades + 2.0 * np.clip((t - later) / 50.0, 0.0, 1.0)
    grad = rng.uniform(0.05, 0.5) * 10.0 ** decades * np.exp(rng.normal(0.0, 0.2, n))
    return loss, grad, start


def test_began_finds_the_first_level_below_the_start() -> None:
    levels = np.log([2.30, 2.30, 2.25, 2.30, 2.18, 1.5])
    assert began(levels, float(levels[0])) == 4  # 2.25 is within 5 % of 2.30; 2.18 is not
    assert began(levels[:4], float(levels[0])) == -1
    assert began(np.array([]), 0.0) == -1
    assert FALL == pytest.approx(np.log(1.05))


@pytest.mark.parametrize("seed", SEEDS)
def test_a_grad_norm_rising_as_learning_starts_is_no_decoupling_and_a_later_rise_is(seed: int) -> None:
    loss, grad, _ = _escape(seed)
    assert ts.GradLossDecoupling().scan(loss=loss, grad_norm=grad) == []
    later = 380 + 10 * seed
    loss, grad, _ = _escape(seed, later=later)
    got = [(e.kind.value, e.step) for e in ts.GradLossDecoupling().scan(loss=loss, grad_norm=grad)]
    assert got and got[0][0] == "silent_collapse" and later <= got[0][1] <= later + 250, got


@pytest.mark.parametrize("seed", SEEDS)
def test_a_plateau_escape_draws_no_sawtooth_and_a_sawtooth_after_learning_is_named(seed: int) -> None:
    loss, grad, _ = _escape(seed)
    assert ts.LjungBoxSawtooth().scan(loss=loss, grad_norm=grad) == []
    rng = np.random.default_rng(seed + 72_000)
    t = np.arange(500)
    at = int(rng.integers(250, 320))
    saw = np.exp(-np.minimum(t, at) / 100) * np.exp(rng.normal(0.0, 0.02, 500))
    saw[at:] *= np.where(t[at:] % 2 == 0, 1.4, 1 / 1.4)
    got = [e.step for e in ts.LjungBoxSawtooth().scan(loss=saw)]
    assert got and at <= got[0] <= at + 64, (at, got)


def test_a_run_that_never_learns_and_then_swings_is_still_named_by_the_monitor() -> None:
    """No reference from the plateau of a run that never learned: the sawtooth rule stays quiet
    there, and the Monitor still says what is wrong (a stall, then an oscillation)."""
    rng = np.random.default_rng(73_000)
    t = np.arange(600)
    loss = 2.3 * np.exp(rng.normal(0.0, 0.02, 600))
    loss[300:] *= np.where(t[300:] % 2 == 0, 1.4, 1 / 1.4)
    assert ts.LjungBoxSawtooth().scan(loss=loss) == []
    kinds = {e.kind.value for e in ts.Monitor(total_steps=600).scan(loss=loss) if e.severity != "info"}
    assert {"stall", "oscillation"} <= kinds


@pytest.mark.parametrize("cls", [ts.GradLossDecoupling, ts.LjungBoxSawtooth])
@pytest.mark.parametrize("seed", SEEDS[:4])
def test_streaming_scanning_and_resuming_agree_across_the_learning_onset(cls: type, seed: int) -> None:
    loss, grad, start = _escape(seed, later=420)
    whole = cls().scan(loss=loss, grad_norm=grad)
    rng = np.random.default_rng(seed + 74_000)
    cuts = sorted({0, len(loss), *rng.integers(1, len(loss), 6).tolist(), start, start + 20})
    det, chunked = cls(), []
    for a, b in zip(cuts[:-1], cuts[1:], strict=False):
        chunked += det.scan(loss=loss[a:b], grad_norm=grad[a:b], steps=np.arange(a, b))
        det2 = cls()  # a JSON round trip of the state at each cut resumes bit for bit
        det2.load_state_dict(json.loads(json.dumps(det.state_dict())))
        det = det2
    one = cls()
    streamed = [e for s in range(len(loss)) for e in one.update(step=s, loss=float(loss[s]), grad_norm=float(grad[s]))]
    assert whole == chunked == streamed
    assert close_state(det.state_dict(), one.state_dict())  # the onset and the level it stopped at, too
    assert one.state_dict()["state"]["learning"] > 0
