"""UpdateGapStall on fresh streams: a frozen optimizer is named, a run's own measuring cadence is not."""

from __future__ import annotations

import numpy as np
import pytest

import trainsignals as ts
from trainsignals.detectors.update_gap_stall import LONGEST_MULT, MISSING


def _run(rng: np.random.Generator, n: int, every: int, frozen_at: int | None) -> dict[str, np.ndarray]:
    """A loss every step, an update ratio every ``every`` steps with a few isolated skipped steps (a
    GradScaler lowering its scale), none from ``frozen_at`` on."""
    t = np.arange(n)
    loss = (2.0 * np.exp(-t / 300) + 0.3) * np.exp(rng.normal(0, 0.05, n))
    ratio = np.where(t % every == 0, 1e-3 * np.exp(rng.normal(0, 0.3, n)), np.nan)
    skipped = rng.choice(n, size=n // 100, replace=False)
    ratio[skipped] = np.nan
    if frozen_at is not None:
        ratio[frozen_at:] = np.nan if rng.random() < 0.5 else 0.0  # no ratio, or weights that do not move
    return {"loss": loss, "update_ratio": ratio}


@pytest.mark.parametrize("seed", range(8))
def test_a_frozen_optimizer_is_named_within_its_cadence(seed: int) -> None:
    rng = np.random.default_rng(1000 + seed)
    for every in (1, 2, 5, 10, 25):
        frozen = int(rng.integers(200, 1500))
        mon = ts.Monitor(total_steps=2000)
        run = _run(rng, 2000, every, frozen)
        evs = [e for e in mon.scan(**run) if e.detector == "UpdateGapStall"]
        assert evs, (every, frozen)
        e = evs[0]
        assert e.kind.value == "stall" and e.severity == "warning"
        assert frozen - 2 * every <= e.onset_step <= frozen
        # within four times the longest gap the run had before (a skipped step doubles a gap), plus one
        measured = np.flatnonzero(np.isfinite(run["update_ratio"][:frozen]) & (run["update_ratio"][:frozen] > 0))
        longest = int(np.diff(measured).max()) - 1
        assert e.step - e.onset_step + 1 == max(MISSING, LONGEST_MULT * longest + 1)


@pytest.mark.parametrize("seed", range(8))
def test_a_run_measured_at_its_own_cadence_stays_quiet(seed: int) -> None:
    rng = np.random.default_rng(2000 + seed)
    for every in (1, 3, 10, 50):
        mon = ts.Monitor(total_steps=3000)
        assert not [e for e in mon.scan(**_run(rng, 3000, every, None)) if e.detector == "UpdateGapStall"]


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
    for kw, name in (({"missing": 0}, "missing"), ({"cooldown": -1}, "cooldown"), ({"missing": 2.5}, "missing")):
        with pytest.raises(ValueError, match=name):
            ts.UpdateGapStall(**kw)  # type: ignore[arg-type]
