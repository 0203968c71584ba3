"""``Monitor.scan(events=...)``: findings made outside the Monitor, given to the batch path as to ``update``."""

from __future__ import annotations

import numpy as np
import pytest

import trainsignals as ts
from trainsignals import _monitor


def stream(seed: int, n: int = 1500) -> tuple[np.ndarray, np.ndarray, dict[int, list[ts.Event]]]:
    """A run that climbs from step 900, and outside findings at random steps (some of them diverging)."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    loss = (2.0 * np.exp(-t / 300) + 0.2) * np.exp(rng.normal(0, 0.03, n))
    loss[900:] *= np.minimum(1.01 ** (t[900:] - 900), 50.0)
    grad = np.exp(rng.normal(0, 0.1, n))
    given: dict[int, list[ts.Event]] = {}
    for s in sorted(set(rng.integers(0, n, 8).tolist())):
        kind, severity = [(ts.Kind.NONFINITE, "critical"), (ts.Kind.UPDATE_RATIO_LOW, "warning"),
                          (ts.Kind.NONFINITE, "info")][s % 3]
        given[s] = [ts.make_event(kind, severity, s, max(0, s - 5), "MyWatcher", "loss", 1.0, 0.0, "outside")]
    return loss, grad, given


def dicts(events: list[ts.Event]) -> list[dict]:
    return [e.to_dict() for e in events]


@pytest.mark.parametrize(("seed", "cuts"), [(1, 1), (2, 4), (3, 9)])
def test_scan_with_given_events_is_update_with_them(seed: int, cuts: int) -> None:
    loss, grad, given = stream(seed)
    n = len(loss)
    live = ts.Monitor(total_steps=n)
    statuses = []
    for s in range(n):
        live.update(step=s, loss=float(loss[s]), grad_norm=float(grad[s]), events=given.get(s))
        statuses.append(live.status)
    batch = ts.Monitor(total_steps=n)
    bounds = np.linspace(0, n, cuts + 1).astype(int)
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        found = [e for s in range(lo, hi) for e in given.get(s, [])]
        batch.scan(step=np.arange(lo, hi), loss=loss[lo:hi], grad_norm=grad[lo:hi], events=found or None)
        assert batch.status == statuses[hi - 1]
    assert dicts(batch.events) == dicts(live.events)
    assert batch.state_dict() == live.state_dict() and batch.should_stop == live.should_stop
    assert any(e.detector == "MyWatcher" for e in batch.events)


def test_a_long_scan_hands_each_chunk_its_events(monkeypatch: pytest.MonkeyPatch) -> None:
    loss, grad, given = stream(4)
    n = len(loss)
    found = [e for s in sorted(given) for e in given[s]]
    whole = ts.Monitor(total_steps=n)
    whole.scan(loss=loss, grad_norm=grad, events=found)
    monkeypatch.setattr(_monitor, "SCAN_CHUNK", 97)  # many chunks, each with the events of its steps
    chunked = ts.Monitor(total_steps=n)
    chunked.scan(loss=loss, grad_norm=grad, events=list(reversed(found)))  # in any order
    assert dicts(chunked.events) == dicts(whole.events) and chunked.state_dict() == whole.state_dict()


def test_bad_given_events_are_refused_and_change_nothing() -> None:
    mon = ts.Monitor()
    mon.scan(loss=np.ones(10))
    before = mon.state_dict()
    late = ts.make_event(ts.Kind.NONFINITE, "critical", 50, 50, "MyWatcher", "loss", 1.0, 0.0, "outside")
    with pytest.raises(ValueError, match="outside the scanned steps"):
        mon.scan(loss=np.ones(10), events=[late])  # steps 10..19
    with pytest.raises(TypeError, match="trainsignals.Event"):
        mon.scan(loss=np.ones(10), events=["nan at step 12"])
    assert mon.state_dict() == before
