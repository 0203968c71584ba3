"""The label checks that ask a run to be healthy where its label says so: the whole of a healthy
run, and a faulty run until its onset (:func:`~trainsignals.curves.labels.check_before_onset`),
and :func:`~trainsignals.curves.real_runs.recheck`, which applies them to a built suite.

The curves are committed real runs with their validation curves replaced, so every other
check sees the signals it always saw.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trainsignals.curves import HEALTHY, load_suite
from trainsignals.curves.labels import (
    check_before_onset,
    check_healthy,
    kendall_tau,
    label_run,
    validation_climb,
)
from trainsignals.curves.real_runs import recheck


@pytest.fixture(scope="module")
def dev() -> list[Any]:
    return load_suite("real_dev")


def first(curves: list[Any], kind: str, **want: Any) -> Any:
    return next(c for c in curves if c.kind == kind and all(getattr(c, k) == v for k, v in want.items()))


def flat_then_climb(n: int, rise: float, rng: np.random.Generator, climb: int = 4) -> np.ndarray:
    """A validation curve that falls to a floor, holds it (one lucky draw 10 % under it, early),
    then climbs over its last ``climb`` validations to ``rise`` times the floor: past its best
    the values are mostly flat, so Kendall's tau over them stays under 0.5 and only the level
    check sees the climb it ends on."""
    v = np.ones(n)
    v[:4] = [3.0, 2.0, 1.4, 1.1]
    v[5] = 0.9
    v[n - climb:] = 1.0 + (rise - 1.0) * np.arange(1, climb + 1) / climb
    return v * np.exp(rng.normal(0.0, 0.005, n))


# --------------------------------------------------------------------------- the climb


@pytest.mark.parametrize("seed", range(3))
def test_validation_climb_reads_levels_not_single_draws(seed: int) -> None:
    rng = np.random.default_rng(seed)
    # the last level is the median of the climb's last three values: 1 + 0.3 * 3 / 4 of the floor
    assert validation_climb(flat_then_climb(20, 1.3, rng)) == pytest.approx(1.225, rel=0.02)
    calm = flat_then_climb(20, 1.0, rng)
    assert validation_climb(calm) < 1.05
    lucky = calm.copy()
    lucky[12] *= 0.5                      # one more lucky draw sets no level either
    assert validation_climb(lucky) < 1.05
    assert validation_climb(calm[:4]) == 1.0 and validation_climb(np.array([])) == 1.0


# --------------------------------------------------------------------------- healthy runs


def long_run(curves: list[Any], kind: str, validations: int = 20) -> Any:
    """The first run of ``kind`` with at least ``validations`` validations (before its onset, if faulty)."""
    return next(c for c in curves if c.kind == kind and (c.val_steps < (c.onset_step if c.onset_step >= 0
                                                                          else c.total_steps)).sum() >= validations)


def test_a_healthy_run_whose_validation_ends_on_a_climb_is_not_healthy(dev: list[Any]) -> None:
    c = long_run(dev, HEALTHY)
    assert check_healthy(c).passed, check_healthy(c).reason
    n = len(c.val_steps)
    rng = np.random.default_rng(4)
    climbed = dataclasses.replace(c, val_loss=flat_then_climb(n, 1.2, rng).astype(np.float32))
    after_best = climbed.val_loss[int(np.argmin(climbed.val_loss)) + 1:]
    assert kendall_tau(after_best) < 0.5     # no steady rise: the check before this one let it through
    res = check_healthy(climbed)
    assert not res.passed and res.reason.startswith("validation loss ends 1.1"), res.reason
    calm = dataclasses.replace(c, val_loss=flat_then_climb(n, 1.0, rng).astype(np.float32))
    assert check_healthy(calm).passed


# --------------------------------------------------------------------------- faulty runs


def test_a_faulty_run_is_dropped_when_it_climbed_before_its_onset(dev: list[Any]) -> None:
    c = long_run(dev, "vanishing_gradient", validations=10)
    kept, decided, _ = label_run(c)
    assert kept is not None and kept.kind == c.kind and decided.passed
    k = int((c.val_steps < c.onset_step).sum())
    v = c.val_loss.astype(np.float64).copy()
    v[:k] = flat_then_climb(k, 1.25, np.random.default_rng(5))   # overfitting before the fault came
    climbed = dataclasses.replace(c, val_loss=v.astype(np.float32))
    res = check_before_onset(climbed)
    assert not res.passed and f"before the onset (step {c.onset_step})" in res.reason
    dropped, decided, made = label_run(climbed)
    assert dropped is None and decided == res
    assert [r.kind for r in made] == [HEALTHY]        # no kind was tried on it
    # the same climb after the onset is the fault's business, not the stretch's
    after = v.copy()
    after[:k] = c.val_loss[:k]
    after[k:] = after[k:] * np.linspace(1.0, 1.5, len(after) - k)
    assert check_before_onset(dataclasses.replace(c, val_loss=after.astype(np.float32))).passed


def test_check_before_onset_needs_an_onset(dev: list[Any]) -> None:
    with pytest.raises(ValueError, match="onset"):
        check_before_onset(first(dev, HEALTHY))


@pytest.mark.parametrize("suite", ["real", "real_dev", "real_heldout"])
def test_every_committed_run_is_healthy_where_its_label_says(suite: str) -> None:
    bad = [(c.name, r.reason) for c in load_suite(suite)
           if not (r := check_healthy(c) if c.kind == HEALTHY else check_before_onset(c)).passed]
    assert bad == []


# --------------------------------------------------------------------------- recheck


def test_recheck_drops_what_the_checks_reject_and_keeps_the_rest_as_it_was(tmp_path: Path) -> None:
    src = Path(__file__).resolve().parents[1] / "datasets" / "real_dev"
    folder = tmp_path / "real_dev"
    shutil.copytree(src, folder)
    assert recheck(folder) == []                     # the committed suite passes as it is
    assert (folder / "manifest.json").read_text() == (src / "manifest.json").read_text()

    curves = load_suite(folder)
    victim = long_run(curves, HEALTHY)
    n = len(victim.val_steps)
    spoiled = dataclasses.replace(victim, val_loss=flat_then_climb(n, 1.3, np.random.default_rng(6)).astype(np.float32))
    from trainsignals.curves import write_suite

    manifest = json.loads((folder / "manifest.json").read_text())
    write_suite([spoiled if c.name == victim.name else c for c in curves], folder, seed=manifest["seed"])
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")

    gone = recheck(folder)
    assert [g["name"] for g in gone] == [victim.name] and gone[0]["recheck"] is True
    after = load_suite(folder)
    assert [c.name for c in after] == [c.name for c in curves if c.name != victim.name]
    for a, b in zip(after, (c for c in curves if c.name != victim.name), strict=True):
        assert np.array_equal(a.loss, b.loss, equal_nan=True) and np.array_equal(a.val_loss, b.val_loss)
    written = json.loads((folder / "manifest.json").read_text())
    assert victim.name not in {e["name"] for e in written["curves"]}
    assert written["dropped"][-1]["name"] == victim.name and "ends 1.2" in written["dropped"][-1]["checks"][0]["reason"]
    assert written["rechecks"][-1]["dropped"] == [victim.name]
    assert {k: v for k, v in written.items() if k not in ("curves", "dropped", "rechecks")} == \
        {k: v for k, v in manifest.items() if k not in ("curves", "dropped", "rechecks")}
    assert recheck(folder) == []                     # nothing left to drop


def test_recheck_refuses_a_suite_the_builder_did_not_make(capsys: pytest.CaptureFixture[str]) -> None:
    from trainsignals.curves.real_runs import main

    src = Path(__file__).resolve().parents[1] / "datasets" / "synthetic"
    with pytest.raises(ValueError, match="folder .*synthetic"):
        recheck(src)
    assert main(["recheck", str(src)]) == 2       # the command says why, without a traceback
    assert "holds no suite built by" in capsys.readouterr().err
