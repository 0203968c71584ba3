"""UpdateGapStall on fresh streams: a frozen optimizer (no update ratio) or a backward pass that no longer
reaches the weights (no grad norm) is named, a run's own measuring cadence is not."""

from __future__ import annotations

import numpy as np
import pytest

import trainsignals as ts
from trainsignals.detectors.update_gap_stall import LONGEST_MULT, MISSING

#: the watched signal's typical value in the streams below
LEVEL = {"update_ratio": 1e-3, "grad_norm": 0.5}


def _run(rng: np.random.Generator, n: int, every: int, frozen_at: int | None,
         signal: str = "update_ratio") -> dict[str, np.ndarray]:
    """A loss every step, ``signal`` every ``every`` steps with a few isolated skipped steps (a
    GradScaler lowering its scale), none from ``frozen_at`` on."""
    t = np.arange(n)
    loss = (2.0 * np.exp(-t / 300) + 0.3) * np.exp(rng.normal(0, 0.05, n))
    values = np.where(t % every == 0, LEVEL[signal] * np.exp(rng.normal(0, 0.3, n)), np.nan)
    skipped = rng.choice(n, size=n // 100, replace=False)
    values[skipped] = np.nan
    if frozen_at is not None:
        values[frozen_at:] = np.nan if rng.random() < 0.5 else 0.0  # none, or weights that do not move
    return {"loss": loss, signal: values}


@pytest.mark.parametrize("signal", ["update_ratio", "grad_norm"])
@pytest.mark.parametrize("seed", range(8))
def test_a_frozen_optimizer_is_named_within_its_cadence(seed: int, signal: str) -> None:
    rng = np.random.default_rng(1000 + seed + (100 if signal == "grad_norm" else 0))
    for every in (1, 2, 5, 10, 25):
        frozen = int(rng.integers(200, 1500))
        mon = ts.Monitor(total_steps=2000)
        run = _run(rng, 2000, every, frozen, signal)
        evs = [e for e in mon.scan(**run) if e.detector == "UpdateGapStall"]
        assert evs, (every, frozen)
        e = evs[0]
        assert e.kind.value == "stall" and e.severity == "warning" and e.signal == signal
        assert frozen - 2 * every <= e.onset_step <= frozen
        # within four times the longest gap the run had before (a skipped step doubles a gap), plus one
        measured = np.flatnonzero(np.isfinite(run[signal][:frozen]) & (run[signal][:frozen] > 0))
        longest = int(np.diff(measured).max()) - 1
        assert e.step - e.onset_step + 1 == max(MISSING, LONGEST_MULT * longest + 1)


@pytest.mark.parametrize("signal", ["update_ratio", "grad_norm"])
@pytest.mark.parametrize("seed", range(8))
def test_a_run_measured_at_its_own_cadence_stays_quiet(seed: int, signal: str) -> None:
    rng = np.random.default_rng(2000 + seed + (100 if signal == "grad_norm" else 0))
    for every in (1, 3, 10, 50):
        mon = ts.Monitor(total_steps=3000)
        assert not [e for e in mon.scan(**_run(rng, 3000, every, None, signal)) if e.detector == "UpdateGapStall"]


def test_each_signal_names_its_own_gap() -> None:
    """Backward still runs (a grad norm every step) while the optimizer skips its step: only the update
    ratio's gap is reported; no backward at all: both are, each naming its signal."""
    norm, ratio = np.full(600, 0.5), np.full(600, 1e-3)
    ratio[300:] = np.nan
    evs = ts.Monitor().scan(loss=np.ones(600), grad_norm=norm, update_ratio=ratio)
    assert [(e.signal, e.onset_step) for e in evs if e.detector == "UpdateGapStall"] == [("update_ratio", 300)]
    norm[300:] = np.nan
    evs = ts.Monitor().scan(loss=np.ones(600), grad_norm=norm, update_ratio=ratio)
    assert sorted((e.signal, e.onset_step) for e in evs if e.detector == "UpdateGapStall") == [
        ("grad_norm", 300), ("update_ratio", 300)]


def test_a_run_without_an_update_ratio_is_not_watched() -> None:
    loss = np.exp(-np.arange(500) / 200)
    assert ts.UpdateGapStall().scan(loss=loss) == []
    ratio = np.full(500, np.nan)
    assert ts.UpdateGapStall().scan(loss=loss, update_ratio=ratio) == []


def test_it_reports_once_per_gap_and_rearms_when_updates_come_back() -> None:
    ratio = np.full(600, 1e-3)
    ratio[100:200] = np.nan
    ratio[400:500] = 0.0
    evs = ts.UpdateGapStall().scan(loss=np.ones(600), update_ratio=ratio)
    assert [(e.step, e.onset_step) for e in evs] == [(119, 100), (419, 400)]


def test_bad_settings_name_the_parameter() -> None:
    for kw, name in (({"missing": 0}, "missing"), ({"cooldown": -1}, "cooldown"), ({"missing": 2.5}, "missing"),
                     ({"signal": "loss"}, "signal")):
        with pytest.raises(ValueError, match=name):
            ts.UpdateGapStall(**kw)  # type: ignore[arg-type]
