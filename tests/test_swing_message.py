"""``SwingRatioEdgeOfStability``'s message writes a swing ratio past the float range as a number, never ``inf``.

The ratio is the residual scales' ratio times ``exp`` of the median log-loss's rise: a loss that
jumps from 1e-150 to 1e+160 rises by 714 in natural log, and ``exp(714)`` is beyond a float
(1.8e308). The event's value is then ``inf``; its message says ``1.21e+310x``, as the other
detectors' messages write such factors (``_factors.times``).
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from trainsignals.detectors import SwingRatioEdgeOfStability

pytestmark = pytest.mark.filterwarnings("error")  # no NumPy or Python overflow warning on the way

N, AT = 700, 400


def _run(low: float, high: float, with_grad: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    t = np.arange(N)
    signals = {"loss": np.where(t >= AT, high, low) * np.exp(rng.normal(0, 0.1, N))}
    if with_grad:
        signals["grad_norm"] = np.where(t >= AT, 2.0, 1.0) * np.exp(rng.normal(0, 0.1, N))
    return signals


def _factor(message: str) -> str:
    found = re.match(r"loss swings (\S+)x as wide", message)
    assert found, message
    return found.group(1)


@pytest.mark.parametrize("with_grad", [False, True])
def test_a_ratio_past_the_float_range_is_written_as_a_number(with_grad: bool) -> None:
    signals = _run(1e-150, 1e160, with_grad)
    events = SwingRatioEdgeOfStability().scan(**signals)
    assert [e.step for e in events] == [448]
    (e,) = events
    assert e.value == math.inf  # the ratio itself is past the range
    assert "inf" not in e.message, e.message
    factor = _factor(e.message)
    mantissa, exponent = factor.split("e+")
    assert int(exponent) == 310 and 1.0 <= float(mantissa) < 10.0, factor
    assert ("the grad norm moved" in e.message) == with_grad


def test_update_writes_the_same_message_as_scan() -> None:
    signals = _run(1e-150, 1e160, with_grad=True)
    d = SwingRatioEdgeOfStability()
    events = [e for i in range(N) for e in d.update(**{k: float(v[i]) for k, v in signals.items()})]
    assert [e.message for e in events] == [e.message for e in SwingRatioEdgeOfStability().scan(**signals)]
    assert events and "inf" not in events[0].message


def test_a_ratio_in_range_reads_as_before() -> None:
    """Within the float range the message's factor is the event's value in ``.3g``."""
    rng = np.random.default_rng(0)
    t = np.arange(N)
    loss = (2.3 * np.exp(-t / 120) + 0.3) * np.where(t >= AT, 4.0, 1.0) * np.exp(rng.normal(0, 0.1, N))
    grad = np.where(t >= AT, 2.0, 1.0) * np.exp(rng.normal(0, 0.1, N))
    (e,) = SwingRatioEdgeOfStability().scan(loss=loss, grad_norm=grad)
    assert math.isfinite(e.value) and _factor(e.message) == f"{e.value:.3g}"
