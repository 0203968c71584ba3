"""The development real-run families (:data:`trainsignals.curves.families.DEV_FAMILIES`) and
``datasets/real_dev``: tuning data beside ``datasets/real``, none of it a held-out family.

Short runs of each family check what the adapter records and the label each fault gets; the
plan is checked for determinism and coverage; the committed suite is checked as it is (loads,
its manifest matches its files and its plan, every label passes its check and its twin) and as
tuning data (:func:`trainsignals.eval.calibrate.tuning_curves` takes it, the held-out suite
stays refused).
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trainsignals.curves import load_suite
from trainsignals.curves.families import (
    DEV_FAMILIES,
    DEV_FAULT_FAMILIES,
    DEV_OPTIMIZERS,
    HELDOUT_FAMILIES,
    draw_dev_spec,
    plan_dev,
    plan_heldout,
)
from trainsignals.curves.labels import check_label
from trainsignals.curves.real_runs import FAMILIES, build, default_directory, run, train_with_info
from trainsignals.curves.training import FAULT_KINDS


@pytest.fixture(scope="module")
def torch() -> Any:
    pytest.importorskip("sklearn.datasets")
    return pytest.importorskip("torch")


def short(kind: str, family: str, steps: int, onset: int, **kw: Any) -> Any:
    s = draw_dev_spec(kind, family, 2000, 0)
    return dataclasses.replace(s, steps=steps, onset=onset if kind != "healthy" else -1, clip=0.0,
                               schedule="constant", warmup=0, **kw)


def test_a_residual_net_records_its_norm_layers_and_a_dead_relu(torch: Any) -> None:
    arch = {"channels": 8, "norm": "batch", "blocks": 2}
    s = short("dead_units", "resnet", 120, 60, arch=arch, optimizer="adam", lr=2e-3, batch_size=16,
              per_layer="module", fault={"layer": 1, "fraction": 1.0, "bias": -50.0})
    r = run(s)
    c = r["curve"]
    assert c is not None and c.kind == "dead_units" and c.difficulty == "resnet" and c.total_steps == 120
    assert {"stem", "stem_norm", "blocks.0.conv1", "blocks.1.norm2", "head"} <= set(c.layer_names)
    assert c.act_layer_names[:3] == ("stem_relu", "blocks.0.relu1", "blocks.0.relu2")
    j = c.act_layer_names.index("blocks.0.relu1")              # the ReLU after the shifted norm
    assert (c.dead_frac[c.act_steps < 60, j] < 0.5).all() and (c.dead_frac[c.act_steps >= 70, j] == 1.0).all()
    assert np.isfinite(c.loss).all() and np.isfinite(c.layer_grad_norms).all()
    assert r["entry"]["twin"]["visible"] is True and r["entry"]["twin"]["twin_steps"] == 60


def test_a_residual_branch_scaled_down_is_a_vanishing_gradient(torch: Any) -> None:
    arch = {"channels": 8, "norm": "group", "groups": 2, "blocks": 3}
    s = short("vanishing_gradient", "resnet", 140, 70, arch=arch, optimizer="adam", lr=1e-3, batch_size=16,
              per_layer="module", fault={"mode": "gain", "blocks": [0, 1], "scale": 1e-4})
    r = run(s)
    c = r["curve"]
    assert c is not None and c.kind == "vanishing_gradient", r["entry"]["checks"]
    g = c.layer_grad_norms
    conv = c.layer_names.index("blocks.0.conv1")
    head = c.layer_names.index("head")
    assert np.median(g[90:130, conv]) < 1e-2 * np.median(g[20:70, conv])       # the scaled branch
    assert np.median(g[90:130, head]) > 0.1 * np.median(g[20:70, head])        # the rest keeps its gradients


def test_a_patch_transformer_records_its_blocks_and_a_gradient_explosion(torch: Any) -> None:
    arch = {"patch": 4, "d_model": 32, "heads": 2, "blocks": 1, "pool": "cls", "ffn_act": "gelu"}
    s = short("grad_explosion", "vit", 100, 60, arch=arch, optimizer="adamax", lr=3e-3, batch_size=32,
              per_layer="parameter", fault={"mode": "weights", "target": "head", "scale": 100.0})
    r = run(s)
    c = r["curve"]
    assert c is not None and c.kind == "grad_explosion" and c.difficulty == "vit"
    assert {"embed.weight", "cls.weight", "pos.weight", "blocks.0.qkv.weight", "ln_f.weight", "head.bias"} \
        <= set(c.layer_names)
    assert c.act_layer_names == ("blocks.0.act",)
    assert c.grad_norm[60:63].max() > 10 * np.median(c.grad_norm[10:60])
    assert r["entry"]["twin"]["visible"] is True


@pytest.mark.parametrize(("dataset", "widths", "optimizer", "lr", "smoothing"),
                         [("iris", [], "adagrad", 0.1, 0.0), ("digits", [256], "nadam", 3e-3, 0.1)])
def test_softmax_regression_and_a_wide_mlp_train_healthy(torch: Any, dataset: str, widths: list[int],
                                                         optimizer: str, lr: float, smoothing: float) -> None:
    arch = {"dataset": dataset, "widths": widths, "activation": "relu", "label_smoothing": smoothing}
    s = short("healthy", "linear", 200, -1, arch=arch, optimizer=optimizer, lr=lr, batch_size=32, val_every=25,
              per_layer="module")
    r = run(s)
    c = r["curve"]
    assert c is not None and c.kind == "healthy" and c.onset_step == -1, r["entry"]["check"]
    assert c.layer_names == (("fc1", "out") if widths else ("out",))
    assert c.act_layer_names == (("relu1",) if widths else ())
    assert np.isfinite(c.update_ratio).all() and (np.diff(c.val_steps) == 25).all()
    assert c.loss[-20:].mean() < 0.7 * c.loss[:20].mean()
    again = run(s)["curve"]
    assert np.array_equal(again.loss, c.loss) and np.array_equal(again.grad_norm, c.grad_norm)


def test_a_softmax_regression_has_no_activation_layer_and_its_twin_records_none(torch: Any) -> None:
    arch = {"dataset": "iris", "widths": [], "activation": "relu", "label_smoothing": 0.0}
    s = short("stall", "linear", 120, 60, arch=arch, optimizer="sgdm", lr=0.05, batch_size=16,
              fault={"lr_mult": 1e-5, "ramp": 0})
    c, info = train_with_info(s)
    assert c.act_layer_names == () and c.dead_frac.shape == (0, 0)
    assert info["twin"]["dead_frac"].shape == (0, 0) and len(info["twin"]["loss"]) == 60
    assert np.isfinite(c.loss).all()


def test_dev_plan_is_deterministic_and_covers_every_kind_with_its_families() -> None:
    specs = plan_dev(2000)
    assert plan_dev(2000) == specs and plan_dev(2001) != specs
    assert len({s.name for s in specs}) == len(specs)
    assert {s.family for s in specs} == set(DEV_FAMILIES)
    assert not set(DEV_FAMILIES) & (set(FAMILIES) | set(HELDOUT_FAMILIES))
    for kind in FAULT_KINDS:
        assert {s.family for s in specs if s.kind == kind} == set(DEV_FAULT_FAMILIES[kind]), kind
    assert Counter(s.kind for s in specs)["healthy"] == 36
    assert {s.optimizer for s in specs} == set(DEV_OPTIMIZERS)
    for s in specs:
        assert 300 <= s.steps <= 3000 and 8 <= s.batch_size <= 128
        if s.kind != "healthy":
            assert 0 < s.onset < s.steps
    with pytest.raises(ValueError, match="family"):
        draw_dev_spec("healthy", "tflm", 2000, 0)
    with pytest.raises(ValueError, match="per_kind"):
        plan_dev(2000, per_kind=-1)
    with pytest.raises(ValueError, match="heldout and dev"):
        build(heldout=True, dev=True)


def test_heldout_plan_is_the_one_the_committed_heldout_suite_was_built_from() -> None:
    folder = default_directory(heldout=True)
    if not (folder / "manifest.json").is_file():
        pytest.skip("datasets/real_heldout is not in this checkout")
    manifest = json.loads((folder / "manifest.json").read_text())
    built = {e["config"]["name"]: e["config"] for e in (*manifest["curves"], *manifest["dropped"])}
    plan = {s.name: json.loads(json.dumps(asdict(s))) for s in plan_heldout(1000)}
    assert built == plan


def test_tuning_curves_take_the_dev_suite_and_refuse_the_heldout_one() -> None:
    from trainsignals.eval import calibrate as cal

    assert "real_dev" in cal.TUNING_SUITES and "real_heldout" not in cal.TUNING_SUITES
    for name in ("heldout", "real_heldout", str(Path("datasets") / "real_heldout")):
        with pytest.raises(ValueError, match="held-out"):
            cal.tuning_curves([name])
    if not (default_directory(dev=True) / "manifest.json").is_file():
        pytest.skip("datasets/real_dev is not in this checkout")
    got = cal.tuning_curves(["dev"])
    assert got and {c.kind for c in got} == {"healthy"} and {c.difficulty for c in got} == set(DEV_FAMILIES)
    assert [c.name for c in cal.tuning_curves(["real_dev"])] == [c.name for c in got]


# --------------------------------------------------------------------------- the committed dev suite


@pytest.fixture(scope="module")
def committed() -> list[Any]:
    if not (default_directory(dev=True) / "manifest.json").is_file():
        pytest.skip("datasets/real_dev is not in this checkout")
    return load_suite("real_dev")


def test_committed_dev_suite_matches_its_manifest_and_its_plan(committed: list[Any]) -> None:
    folder = default_directory(dev=True)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert [e["name"] for e in manifest["curves"]] == [c.name for c in committed]
    assert {e["file"] for e in manifest["curves"]} == {p.name for p in folder.glob("*.arrow")}
    for e, c in zip(manifest["curves"], committed, strict=True):
        assert e["file"] == f"{c.kind}.arrow" and e["kind"] == c.kind and e["family"] == c.difficulty
    assert manifest["dev"] is True and "--dev" in manifest["command"]
    plan = {s.name: json.loads(json.dumps(asdict(s))) for s in plan_dev(manifest["seed"], manifest["plan"]["per_kind"],
                                                                          manifest["plan"]["n_healthy"])}
    built = {e["config"]["name"]: e["config"] for e in (*manifest["curves"], *manifest["dropped"])}
    assert built == plan                      # the same seed gives the same runs
    kinds = [c.kind for c in committed]
    assert kinds.count("healthy") >= 0.4 * len(kinds)
    assert {c.difficulty for c in committed} == set(DEV_FAMILIES)
    bare = [c for c in committed if not c.act_layer_names]         # softmax regressions load too
    assert bare and all(c.dead_frac.shape == (len(c.act_steps), 0) for c in bare)
    assert len({c.name for c in committed}) == len(committed)
    assert sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) < 15e6
    assert "--dev" in (folder / "README.md").read_text()
    for entry in manifest["curves"]:
        if entry["intended_kind"] != "healthy":      # every faulty run was compared with its twin
            assert entry["twin"]["visible"] == (entry["kind"] != "healthy"), entry["name"]


def test_every_committed_dev_label_passes_its_check(committed: list[Any]) -> None:
    failed = [(c.name, r.reason) for c in committed if not (r := check_label(c)).passed]
    assert failed == []


def test_bench_resolves_the_dev_suite(committed: list[Any]) -> None:
    from trainsignals.eval.bench import _load_suite, targets_for

    assert [c.name for c in _load_suite("dev")] == [c.name for c in committed]
    assert targets_for("dev") == targets_for("real") == targets_for(str(Path("datasets") / "real_dev"))
