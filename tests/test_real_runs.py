"""The real-run generator (:mod:`trainsignals.curves.real_runs`) and the committed suite ``datasets/real``.

Tiny runs (a few hundred steps of a small MLP/CNN/character model on CPU) check determinism,
that the labelling check keeps a fault that took effect and drops one that did not, and that
a written suite loads with :func:`trainsignals.curves.load_suite`. The committed suite is
checked as it is: it loads, its labels pass their checks, its manifest says how it was made, and
a run of two of its families retrains to its stored values (the suite matches its command).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trainsignals.curves import load_suite
from trainsignals.curves.labels import check_label, label_run
from trainsignals.curves.real_runs import FAMILIES, _map, build, default_directory, plan_suite, train
from trainsignals.curves.training import FAULT_KINDS, RunSpec

ARRAYS = ("loss", "grad_norm", "lr", "update_ratio", "val_steps", "val_loss", "layer_grad_norms",
          "act_steps", "dead_frac", "saturation")


def spec(**kw: Any) -> RunSpec:
    base: dict[str, Any] = dict(
        name="t-mlp-0", kind="healthy", family="mlp", seed=1, steps=300, optimizer="sgd", lr=0.2,
        weight_decay=0.0, schedule="constant", warmup=0, batch_size=32,
        arch={"widths": [32, 32], "activation": "relu"}, augment=(0.5, 0.05), val_every=25,
        val_at_zero=False, per_layer="module",
    )
    base.update(kw)
    return RunSpec(**base)


def same(a: Any, b: Any) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f), equal_nan=True) for f in ARRAYS) and \
        a.layer_names == b.layer_names and a.act_layer_names == b.act_layer_names


@pytest.fixture(scope="module")
def torch() -> Any:
    pytest.importorskip("sklearn.datasets")
    return pytest.importorskip("torch")


# --------------------------------------------------------------------------- generation


@pytest.mark.parametrize("family", ["cnn", "charlm"])
def test_same_seed_gives_identical_arrays(torch: Any, family: str) -> None:
    arch = {"channels": [4, 8], "hidden": 16, "activation": "relu"} if family == "cnn" else \
        {"context": 8, "embed": 8, "widths": [32], "activation": "tanh"}
    s = spec(name=f"t-{family}-0", family=family, steps=60, arch=arch, clip=1.0, per_layer="parameter")
    a, b = train(s), train(s)
    assert same(a, b)
    c = train(dataclasses.replace(s, seed=2))
    assert not np.array_equal(a.loss, c.loss)
    # what the adapter records: every step, validation every 25, activations every 10
    assert a.total_steps == 60 and np.isfinite(a.update_ratio).all() and (a.update_ratio > 0).all()
    assert list(a.val_steps) == [25, 50] and list(a.act_steps) == list(range(0, 60, 10))
    assert a.layer_grad_norms.shape == (60, len(a.layer_names)) and len(a.layer_names) >= 4
    assert a.difficulty == family
    # the global norm is the root sum of squares of the per-parameter norms (float32)
    np.testing.assert_allclose(np.sqrt((a.layer_grad_norms ** 2).sum(axis=1)), a.grad_norm, rtol=1e-4)


def test_a_fault_that_takes_effect_is_kept_and_one_that_does_not_is_dropped(torch: Any) -> None:
    # plain SGD at lr 0.2; at step 150 the learning rate is multiplied by 100 (or by 1: no fault)
    bumped = train(spec(name="divergence-mlp-0", kind="divergence", onset=150, fault={"lr_mult": 100.0, "ramp": 0}))
    res = check_label(bumped)
    assert res.passed, res.reason
    kept, decided, _ = label_run(bumped)
    assert kept is not None and kept.kind == "divergence" and kept.onset_step == 150 and decided.passed

    flat = train(spec(name="divergence-mlp-1", kind="divergence", onset=150, fault={"lr_mult": 1.0, "ramp": 0}))
    assert not check_label(flat).passed
    dropped, decided, made = label_run(flat)
    assert dropped is None and not decided.passed
    assert [r.kind for r in made] == ["divergence", "oscillation"]   # its fallback was tried too
    # the same run passes as healthy: nothing happened at step 150
    assert check_label(flat, "healthy").passed


def test_the_twin_continues_the_run_without_its_fault_on_the_same_batches(torch: Any) -> None:
    """At the onset a copy of the run continues without the fault: with a fault that changes
    nothing (a learning rate x1) the twin's trace is the run's, value for value; with a x100
    learning rate the run departs from it at once, and the twin check sees it."""
    from trainsignals.curves.families import twin_check
    from trainsignals.curves.real_runs import train_with_info

    same_run, info = train_with_info(spec(name="divergence-mlp-1", kind="divergence", onset=150,
                                          fault={"lr_mult": 1.0, "ramp": 0}))
    twin = info["twin"]
    n = len(twin["loss"])
    assert twin["start"] == 150 and n > 50
    for key in ("loss", "grad_norm", "lr", "update_ratio"):
        np.testing.assert_array_equal(twin[key], getattr(same_run, key)[150:150 + n], err_msg=key)
    np.testing.assert_array_equal(twin["val_loss"], same_run.val_loss[(same_run.val_steps >= 150)
                                                                      & (same_run.val_steps < 150 + n)])
    assert not twin_check(same_run, "divergence", twin)["visible"]
    bumped, info = train_with_info(spec(name="divergence-mlp-0", kind="divergence", onset=150,
                                        fault={"lr_mult": 100.0, "ramp": 0}))
    np.testing.assert_array_equal(bumped.loss[:150], same_run.loss[:150])   # the same run up to the fault
    np.testing.assert_array_equal(info["twin"]["loss"], twin["loss"])       # and the same twin
    assert twin_check(bumped, "divergence", info["twin"])["visible"]


def test_dead_units_check_on_a_real_bias_injection(torch: Any) -> None:
    fault = {"layer": 0, "fraction": 1.0, "bias": -50.0}
    dead = train(spec(name="dead_units-mlp-0", kind="dead_units", onset=100, fault=fault, steps=200))
    assert check_label(dead).passed
    assert check_label(dead, "dead_units", onset=100).reason.startswith("relu1")
    weak = train(spec(name="dead_units-mlp-1", kind="dead_units", onset=100, steps=200,
                      fault={"layer": 0, "fraction": 0.3, "bias": -50.0}))
    assert not check_label(weak).passed       # 30 % of the units killed is not a dead layer


def test_build_writes_a_suite_that_load_suite_reads(torch: Any, tmp_path: Path) -> None:
    specs = [
        spec(name="healthy-mlp-0", steps=250),
        spec(name="divergence-mlp-0", kind="divergence", onset=150, steps=260, fault={"lr_mult": 100.0, "ramp": 0}),
        spec(name="divergence-mlp-1", kind="divergence", onset=150, steps=260, fault={"lr_mult": 1.0, "ramp": 0}),
    ]
    manifest = build(tmp_path, seed=7, jobs=1, specs=specs)
    curves = load_suite(tmp_path)
    # a x1 learning rate is no fault: the run is its own twin in every signal, so it is healthy
    assert [c.name for c in curves] == ["divergence-mlp-0", "healthy-mlp-0", "healthy-mlp-1-nofault-divergence"]
    assert manifest["dropped"] == []
    again = _map([specs[1]], 1, None)[0]["curve"]   # trained like build: a fresh process, pinned kernels
    assert same(curves[0], again)      # stored exactly (float32 values)
    written = json.loads((tmp_path / "manifest.json").read_text())
    assert written["versions"]["torch"] == torch.__version__
    assert written["command"] == "python -m trainsignals.curves.real_runs build --seed 7"
    entry = written["curves"][0]
    assert entry["check"]["passed"] and entry["family"] == "mlp" and entry["config"]["fault"]["lr_mult"] == 100.0
    assert entry["twin"]["visible"] and entry["twin"]["effect"] > entry["twin"]["threshold"]   # checked against its twin


def test_build_gives_the_same_values_whatever_kernels_the_cpu_would_pick(torch: Any, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # torch and MKL choose their kernels by the CPU's vector extensions; a build started where
    # they would pick AVX2 code must write the values of one where they would pick AVX-512
    # (without build's pinned kernels the two differ in the last bits, and labels can flip)
    specs = [spec(name="healthy-mlp-0", steps=250),
             spec(name="healthy-cnn-1", family="cnn", arch={"channels": [8, 16], "hidden": 32, "activation": "relu"},
                  steps=250)]
    outs = []
    for cap, cbwr in (("avx2", "AVX2"), ("avx512", "AVX512")):
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", cap)   # what build's fresh workers would inherit
        monkeypatch.setenv("MKL_CBWR", cbwr)
        build(tmp_path / cap, seed=7, jobs=1, specs=specs)
        outs.append(load_suite(tmp_path / cap))
    assert [c.name for c in outs[0]] == [c.name for c in outs[1]] == ["healthy-mlp-0", "healthy-cnn-1"]
    assert all(same(a, b) for a, b in zip(*outs))
    assert json.loads((tmp_path / "avx2" / "manifest.json").read_text())["versions"]["cpu_kernels"].startswith(
        "ATEN_CPU_CAPABILITY=default")


# --------------------------------------------------------------------------- plan and validation


def test_plan_covers_every_kind_and_family() -> None:
    specs = plan_suite(0, per_kind=4, n_healthy=8)
    assert {s.kind for s in specs} == {*FAULT_KINDS, "healthy"}
    assert {s.family for s in specs} == set(FAMILIES)
    assert len({s.name for s in specs}) == len(specs)
    assert plan_suite(0, 4, 8) == specs          # seeded
    assert plan_suite(1, 4, 8) != specs
    for s in specs:
        if s.kind != "healthy":
            assert 0 < s.onset < s.steps


@pytest.mark.parametrize(("kw", "param"), [({"seed": -1}, "seed"), ({"per_kind": 1.5}, "per_kind"),
                                           ({"n_healthy": -2}, "n_healthy")])
def test_plan_rejects_bad_arguments(kw: dict[str, Any], param: str) -> None:
    with pytest.raises(ValueError, match=param):
        plan_suite(**kw)


def test_import_does_not_pull_in_torch() -> None:
    code = "import sys, trainsignals, trainsignals.curves.real_runs; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------- the committed suite


@pytest.fixture(scope="module")
def committed() -> list[Any]:
    if not (default_directory() / "manifest.json").is_file():
        pytest.skip("datasets/real is not in this checkout")
    return load_suite("real")


def test_committed_suite_loads_and_is_balanced(committed: list[Any]) -> None:
    kinds = [c.kind for c in committed]
    assert set(FAULT_KINDS) <= set(kinds)
    assert kinds.count("healthy") >= 0.4 * len(kinds)
    assert {c.difficulty for c in committed} == set(FAMILIES)
    assert len({c.name for c in committed}) == len(committed)
    size = sum(p.stat().st_size for p in default_directory().iterdir() if p.is_file())
    assert size <= 50e6
    manifest = json.loads((default_directory() / "manifest.json").read_text())
    assert manifest["versions"]["torch"] and manifest["command"].startswith("python -m trainsignals.curves.real_runs build")


def test_every_committed_label_passes_its_check(committed: list[Any]) -> None:
    failed = [(c.name, r.reason) for c in committed if not (r := check_label(c)).passed]
    assert failed == []


def test_check_label_rejects_unknown_kinds(committed: list[Any]) -> None:
    with pytest.raises(ValueError, match="kind"):
        check_label(committed[0], "exploding")
    with pytest.raises(ValueError, match="onset"):
        check_label(committed[0], "stall", onset=-1)


def test_stalls_of_fresh_real_runs_are_named_within_the_target_window(torch: Any) -> None:
    """Learning-rate cuts in MLP runs drawn with seeds no threshold was chosen on (7000 on): the
    default Monitor names each kept stall within max(50, 10 % of the run) of its onset, and the
    same runs without the cut (the healthy draw of each seed) draw no stall."""
    import trainsignals as ts
    from trainsignals.curves.real_runs import _draw_spec, run
    from trainsignals.eval.bench import target_window

    kept = 0
    for seed in range(7000, 7004):
        curve = run(_draw_spec("stall", "mlp", seed, 0))["curve"]   # labelled as the builder labels: twin included
        if curve is None or curve.kind != "stall":
            continue
        kept += 1
        stalls = [e for e in ts.Monitor(total_steps=curve.total_steps).scan(**curve.withheld("update_ratio").signals())
                  if e.kind is ts.Kind.STALL]
        assert stalls and curve.onset_step <= stalls[0].step <= curve.onset_step + target_window(curve.total_steps)
        healthy = train(_draw_spec("healthy", "mlp", seed, 0))
        assert not [e for e in ts.Monitor(total_steps=healthy.total_steps).scan(**healthy.signals())
                    if e.kind is ts.Kind.STALL]
    assert kept >= 3


@pytest.mark.parametrize("family", ["mlp", "charlm"])
def test_a_committed_run_retrains_to_its_stored_values(committed: list[Any], torch: Any, family: str) -> None:
    """The suite matches its command: the family's shortest faulty run, trained again in a fresh
    worker with the pinned kernels as the build trains, gives its stored values bit for bit (the
    classifier's answers included) and its label."""
    manifest = json.loads((default_directory() / "manifest.json").read_text())
    entry = min((e for e in manifest["curves"] if e["family"] == family and e["intended_kind"] != "healthy"),
                key=lambda e: e["config"]["steps"])
    cfg = dict(entry["config"], augment=tuple(entry["config"]["augment"]))
    again = _map([RunSpec(**cfg)], 1, None)[0]
    stored = next(c for c in committed if c.name == entry["name"])
    got = again["curve"]
    assert got is not None and got.name == stored.name and got.kind == stored.kind and same(got, stored)
    for f in ("val_metric", "pred_steps", "pred_top_share"):
        assert np.array_equal(getattr(got, f), getattr(stored, f), equal_nan=True), f
