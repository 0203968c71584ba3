"""The held-out real-run families (:mod:`trainsignals.curves.families`) and ``datasets/real_heldout``.

Tiny runs check that the new families train deterministically and that the counterfactual
twin relabels a fault that did nothing; the committed held-out suite is checked as it is
(loads, balanced, every family, labels pass their checks and their twins). No detection
figure is asserted on the held-out suite: it is reported, never tuned on.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trainsignals.curves import load_suite
from trainsignals.curves.families import (
    HELDOUT_FAMILIES,
    HELDOUT_FAULT_FAMILIES,
    draw_spec,
    label_with_twin,
    plan_heldout,
    twin_check,
    untouched,
)
from trainsignals.curves.labels import check_label
from trainsignals.curves.real_runs import default_directory, run, train_with_info
from trainsignals.curves.training import FAULT_KINDS

ARRAYS = ("loss", "grad_norm", "lr", "update_ratio", "val_steps", "val_loss", "layer_grad_norms",
          "act_steps", "dead_frac", "saturation", "val_metric", "pred_steps", "pred_top_share")


@pytest.fixture(scope="module")
def torch() -> Any:
    pytest.importorskip("sklearn.datasets")
    return pytest.importorskip("torch")


def tiny(kind: str, family: str, index: int, steps: int, onset: int = -1, **kw: Any) -> Any:
    s = draw_spec(kind, family, 1000, index)
    return dataclasses.replace(s, steps=steps, onset=onset if kind != "healthy" else -1, **kw)


def same(a: Any, b: Any) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f), equal_nan=True) for f in ARRAYS) and \
        a.layer_names == b.layer_names and a.act_layer_names == b.act_layer_names


@pytest.mark.parametrize(("kind", "family", "fault"), [
    ("dead_units", "tflm", {"layer": 0, "fraction": 1.0, "bias": -50.0}),
    ("grad_explosion", "rnnlm", {"mode": "weights", "target": "head", "scale": 30.0}),
    ("silent_collapse", "tabular", {"ramp": 20}),
])
def test_heldout_families_train_deterministically(torch: Any, kind: str, family: str, fault: dict[str, Any]) -> None:
    s = tiny(kind, family, 0, steps=120, onset=60, fault=fault, batch_size=8)
    (a, ia), (b, ib) = train_with_info(s), train_with_info(s)
    assert same(a, b)
    assert a.difficulty == family and a.total_steps == 120 and np.isfinite(a.loss[:60]).all()
    for key in ("loss", "grad_norm", "layer_grad_norms", "val_loss", "dead_frac"):   # the twin too
        np.testing.assert_array_equal(ia["twin"][key], ib["twin"][key])
    assert len(ia["twin"]["loss"]) == 60          # to the end of the run (its window is longer)
    other = train_with_info(dataclasses.replace(s, seed=s.seed + 1))[0]
    assert not np.array_equal(a.loss, other.loss)


def test_a_frozen_optimizer_leaves_its_update_ratio_unmeasured_not_nan(torch: Any) -> None:
    s = tiny("stall", "tabular", 0, steps=80, onset=40, fault={"freeze": True}, batch_size=16)
    c, _ = train_with_info(s)
    gaps = c.gaps["update_ratio"]
    assert not gaps[:40].any() and gaps[40:].all()      # the optimizer never steps again
    assert np.isfinite(c.update_ratio[:40]).all() and np.isnan(c.update_ratio[40:]).all()
    assert np.isfinite(c.loss).all()


def test_twin_relabels_a_fault_without_effect_and_keeps_one_with_effect(torch: Any) -> None:
    base = tiny("grad_explosion", "tabular", 0, steps=300, onset=150, clip=0.0,
                arch={"dataset": "synthetic", "widths": [64, 64], "activation": "relu"},
                optimizer="adam", lr=2e-3, schedule="constant", warmup=0, batch_size=32)
    none = run(dataclasses.replace(base, fault={"mode": "weights", "target": 0, "scale": 1.0}))
    assert none["curve"] is not None and none["curve"].kind == "healthy"
    assert none["curve"].name.endswith("-nofault-grad_explosion")
    tw = none["entry"]["twin"]
    assert tw["visible"] is False and tw["effect"] == pytest.approx(0.0, abs=1e-6)

    real = run(dataclasses.replace(base, fault={"mode": "weights", "target": 0, "scale": 100.0}))
    assert real["curve"] is not None and real["curve"].kind == "grad_explosion"
    assert real["entry"]["twin"]["visible"] is True and real["entry"]["twin"]["effect"] > real["entry"]["twin"]["threshold"]


def test_twin_check_on_a_trace_equal_to_its_twin_sees_nothing(torch: Any) -> None:
    s = tiny("stall", "mse", 1, steps=200, onset=100, fault={"lr_mult": 1.0, "ramp": 0})
    curve, info = train_with_info(s)
    tc = twin_check(curve, "stall", info["twin"])
    assert not tc["visible"] and tc["effect"] == 0.0
    frozen, finfo = train_with_info(dataclasses.replace(s, fault={"freeze": True}))
    assert not np.isfinite(frozen.update_ratio[101:]).any()    # the optimizer never steps again: no update
    assert twin_check(frozen, "stall", finfo["twin"])["effect"] > 0.0


def test_a_fault_that_shows_only_outside_its_kind_is_dropped_not_relabelled_healthy(torch: Any) -> None:
    s = tiny("stall", "mse", 1, steps=200, onset=100, fault={"lr_mult": 1.0, "ramp": 0})
    curve, info = train_with_info(s)
    twin = info["twin"]
    assert set(twin) >= {"lr", "update_ratio"} and np.isfinite(twin["lr"]).all()
    assert untouched(curve, twin) is None                          # the fault did nothing: no signal differs
    assert label_with_twin(curve, twin)[0].kind == "healthy"
    after = np.arange(len(curve.lr)) >= 100
    halved = dataclasses.replace(curve, lr=np.where(after, curve.lr * 0.5, curve.lr))   # only the rate moved
    assert not twin_check(halved, "stall", twin)["visible"]
    assert untouched(halved, twin) == "lr"
    dropped, why, _, figures = label_with_twin(halved, twin)
    assert dropped is None and not why.passed and "lr" in why.reason and figures["shows"] == "lr"
    unstepped = dataclasses.replace(curve, update_ratio=np.where(after, np.nan, curve.update_ratio))
    assert untouched(unstepped, twin) == "update_ratio"           # a frozen optimizer: no update measured
    nudged = dataclasses.replace(curve, lr=np.where(after, curve.lr * 1.01, curve.lr))
    assert untouched(nudged, twin) is None                        # within the level check's 10 %


def test_heldout_plan_covers_every_family_and_kind() -> None:
    specs = plan_heldout(1000)
    assert {s.family for s in specs} == set(HELDOUT_FAMILIES)
    assert {s.kind for s in specs} == {*FAULT_KINDS, "healthy"}
    assert plan_heldout(1000) == specs and plan_heldout(1001) != specs
    assert len({s.name for s in specs}) == len(specs)
    for s in specs:
        assert s.family in HELDOUT_FAULT_FAMILIES.get(s.kind, HELDOUT_FAMILIES)
        assert 300 <= s.steps <= 3000 and 8 <= s.batch_size <= 128
        if s.kind != "healthy":
            assert 0 < s.onset < s.steps


# --------------------------------------------------------------------------- the committed held-out suite


@pytest.fixture(scope="module")
def committed() -> list[Any]:
    if not (default_directory(heldout=True) / "manifest.json").is_file():
        pytest.skip("datasets/real_heldout is not in this checkout")
    return load_suite("real_heldout")


def test_committed_heldout_suite_is_balanced_and_frozen(committed: list[Any]) -> None:
    folder = default_directory(heldout=True)
    kinds = [c.kind for c in committed]
    assert kinds.count("healthy") >= 0.4 * len(kinds)
    assert {c.difficulty for c in committed} == set(HELDOUT_FAMILIES)
    assert len({c.name for c in committed}) == len(committed)
    assert sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) < 15e6
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["heldout"] is True and "--heldout" in manifest["command"]
    assert "no threshold" in (folder / "README.md").read_text()
    for entry in manifest["curves"]:
        if entry["intended_kind"] != "healthy":      # every faulty run was compared with its twin
            assert "twin" in entry, entry["name"]
            assert entry["twin"]["visible"] == (entry["kind"] != "healthy"), entry["name"]


@pytest.mark.parametrize("suite", ["real_heldout", "real_dev"])
def test_committed_classifiers_record_their_answers(suite: str) -> None:
    """Every classifier run holds each step's top share and each validation's accuracy, which
    the silent-collapse rules read; an MSE run has no classes, so it holds neither."""
    classifiers = 0
    for c in load_suite(suite):
        if c.difficulty == "mse":
            assert len(c.pred_top_share) == len(c.val_metric) == 0, c.name
            continue
        classifiers += 1
        assert np.array_equal(c.pred_steps, c.steps) and len(c.val_metric) == len(c.val_steps), c.name
        share = c.pred_top_share[np.isfinite(c.loss)]   # a step with a finite loss has finite outputs
        assert ((share > 0) & (share <= 1)).all() and ((c.val_metric >= 0) & (c.val_metric <= 1)).all(), c.name
        sig = c.signals()
        assert sig["pred_top_share"][0] is c.pred_steps and sig["val_metric"][1] is c.val_metric
    assert classifiers > 0


def test_every_committed_heldout_label_passes_its_check(committed: list[Any]) -> None:
    failed = [(c.name, r.reason) for c in committed if not (r := check_label(c)).passed]
    assert failed == []


def test_bench_resolves_the_heldout_suite_and_tables_it_by_family(committed: list[Any]) -> None:
    from trainsignals.eval.bench import _load_suite, run_bench, targets_for

    assert [c.name for c in _load_suite("heldout")] == [c.name for c in committed]
    assert targets_for("heldout") == targets_for("real") == targets_for(str(Path("datasets") / "real_heldout"))
    pick = [next(c for c in committed if c.difficulty == f) for f in ("tabular", "mse")]
    result = run_bench("heldout", baselines=False, curves=pick)
    header, rows = result.family_rows()
    fams = [label for label, _ in rows if not label.startswith(" ")]
    assert fams == ["mse", "tabular"] and header[0] == "curves"
    assert all(cells[0] == "1" for label, cells in rows if label in fams)
    assert "| mse |" in result.family_markdown()


def test_a_committed_heldout_run_retrains_to_its_stored_values(committed: list[Any], torch: Any) -> None:
    from trainsignals.curves.real_runs import _map
    from trainsignals.curves.training import RunSpec

    manifest = json.loads((default_directory(heldout=True) / "manifest.json").read_text())
    entry = min((e for e in manifest["curves"] if e["family"] == "tabular" and e["intended_kind"] != "healthy"),
                key=lambda e: e["config"]["steps"])
    cfg = dict(entry["config"], augment=tuple(entry["config"]["augment"]))
    again = _map([RunSpec(**cfg)], 1, None)[0]     # a fresh worker with the pinned kernels, as the build trains
    stored = next(c for c in committed if c.name == entry["name"])
    assert again["curve"] is not None and again["curve"].name == stored.name and same(again["curve"], stored)
    assert again["entry"]["twin"] == entry["twin"]
