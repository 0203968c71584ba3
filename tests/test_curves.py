"""The labeled curve generator: determinism, format, the committed suite, and each failure's signature."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from trainsignals import DISTRIBUTED_KINDS, Kind
from trainsignals.curves import (
    DIFFICULTIES,
    HEALTHY,
    KINDS,
    Curve,
    default_directory,
    generate,
    load_suite,
    main,
    standard_suite,
    write_suite,
)

ARRAYS = (
    "steps", "loss", "grad_norm", "lr", "update_ratio", "val_steps", "val_loss",
    "layer_grad_norms", "act_steps", "dead_frac", "saturation",
)
LABELS = ("name", "kind", "onset_step", "difficulty", "seed", "total_steps", "first_nonfinite_step")
SIZE_BUDGET = 25_000_000


@pytest.fixture(scope="module")
def suite() -> list[Curve]:
    return standard_suite(0)


def of_kind(suite: list[Curve], kind: str) -> list[Curve]:
    out = [c for c in suite if c.kind == kind]
    assert out
    return out


def same(a: Curve, b: Curve, answers: bool = True) -> bool:
    """Labels and every series, the classifier's answers (``val_metric``, ``pred_top_share``) too unless not ``answers``."""
    return all(getattr(a, k) == getattr(b, k) for k in LABELS + ("layer_names", "act_layer_names")) and all(
        getattr(a, k).dtype == getattr(b, k).dtype and np.array_equal(getattr(a, k), getattr(b, k), equal_nan=True)
        for k in (*ARRAYS, *(("val_metric", "pred_steps", "pred_top_share") if answers else ()))
    )


def med(x: np.ndarray) -> float:
    return float(np.median(x))


def llog(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(x)


# ------------------------------------------------------------------------------------ the API


def test_kinds_are_the_event_kinds() -> None:
    assert KINDS == tuple(k.value for k in Kind if k not in DISTRIBUTED_KINDS)
    assert len(KINDS) == 14


@pytest.mark.parametrize("kind", KINDS + (HEALTHY,))
def test_generate_is_deterministic_per_curve(kind: str) -> None:
    a = generate(kind, 5, "hard")
    b = generate(kind, 5, "hard")
    assert same(a, b)
    assert not same(a, generate(kind, 6, "hard"))
    assert not np.array_equal(a.loss, generate(kind, 5, "easy").loss, equal_nan=True)


def test_generate_accepts_a_kind_enum_and_a_length() -> None:
    c = generate(Kind.STALL, 1, n_steps=777)  # type: ignore[arg-type]
    assert c.kind == "stall" and c.total_steps == 777 and len(c.loss) == 777


@pytest.mark.parametrize(
    "kwargs",
    [
        {"kind": "nope", "seed": 0},
        {"kind": "stall", "seed": -1},
        {"kind": "stall", "seed": 0, "difficulty": "brutal"},
        {"kind": "stall", "seed": 0, "n_steps": 50},
    ],
)
def test_generate_rejects_bad_arguments(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        generate(**kwargs)


def test_shapes_dtypes_and_invariants(suite: list[Curve]) -> None:
    names = [c.name for c in suite]
    assert len(set(names)) == len(names)
    for c in suite:
        n = c.total_steps
        assert 400 <= n <= 2000
        assert c.steps.dtype == np.int64 and np.array_equal(c.steps, np.arange(n))
        for k in ("loss", "grad_norm", "lr", "update_ratio"):
            a = getattr(c, k)
            assert a.dtype == np.float64 and a.shape == (n,), (c.name, k)
        assert c.val_steps.dtype == np.int64 and c.val_loss.dtype == np.float64
        assert len(c.val_steps) == len(c.val_loss) >= 4
        assert np.all(np.diff(c.val_steps) > 0) and c.val_steps[0] >= 0 and c.val_steps[-1] < n
        every = np.diff(c.val_steps[c.val_steps > 0])
        assert np.all(every == every[0]) and 25 <= every[0] <= 100
        assert 4 <= len(c.layer_names) <= 10 and c.layer_grad_norms.shape == (n, len(c.layer_names))
        assert np.array_equal(c.act_steps, np.arange(0, n, 10))
        assert c.dead_frac.shape == c.saturation.shape == (len(c.act_steps), len(c.act_layer_names))
        assert set(c.act_layer_names) <= set(c.layer_names)
        for k in ARRAYS:
            assert not getattr(c, k).flags.writeable
        # the global norm is the root sum of squares of the layer norms (float32 rounding)
        ok = np.isfinite(c.grad_norm) & np.all(np.isfinite(c.layer_grad_norms), axis=1)
        rss = np.sqrt(np.sum(c.layer_grad_norms[ok] ** 2, axis=1))
        assert np.allclose(c.grad_norm[ok], rss, rtol=1e-4)
        # derived label
        bad = ~(np.isfinite(c.loss) & np.isfinite(c.grad_norm))
        assert c.first_nonfinite_step == (int(np.argmax(bad)) if bad.any() else -1)
        if c.kind == HEALTHY:
            assert c.onset_step == -1
        else:
            assert 0 <= c.onset_step < n


def test_values_are_float32_numbers(suite: list[Curve]) -> None:
    for c in suite[::7]:
        for k in ("loss", "grad_norm", "lr", "update_ratio", "val_loss", "layer_grad_norms", "dead_frac", "saturation"):
            a = getattr(c, k)
            assert np.array_equal(a.astype(np.float32).astype(np.float64), a, equal_nan=True)


def test_signals_are_monitor_keywords() -> None:
    c = generate("dead_units", 2)
    s = c.signals()
    assert set(s) == {"step", "loss", "grad_norm", "lr", "update_ratio", "val_loss", "layer_grad_norms", "activations"}
    assert s["loss"] is c.loss and s["step"] is c.steps
    vs, vl = s["val_loss"]
    assert vs is c.val_steps and vl is c.val_loss
    assert list(s["layer_grad_norms"]) == list(c.layer_names)
    np.testing.assert_array_equal(s["layer_grad_norms"][c.layer_names[1]], c.layer_grad_norms[:, 1])
    act_steps, acts = s["activations"]
    assert act_steps is c.act_steps and list(acts) == list(c.act_layer_names)
    np.testing.assert_array_equal(acts[c.act_layer_names[0]]["dead_frac"], c.dead_frac[:, 0])
    np.testing.assert_array_equal(acts[c.act_layer_names[-1]]["saturation"], c.saturation[:, -1])


# ------------------------------------------------------------------------------------ the suite


def test_suite_composition(suite: list[Curve]) -> None:
    counts = Counter(c.kind for c in suite)
    assert set(counts) == set(KINDS) | {HEALTHY}
    assert all(counts[k] >= 30 for k in KINDS)
    assert counts[HEALTHY] >= 150
    for kind in counts:
        diff = Counter(c.difficulty for c in suite if c.kind == kind)
        assert set(diff) == set(DIFFICULTIES)
        assert max(diff.values()) - min(diff.values()) <= 1


def test_suite_is_deterministic(suite: list[Curve]) -> None:
    again = standard_suite(0)
    assert len(again) == len(suite) and all(same(a, b) for a, b in zip(suite, again))
    other = standard_suite(1)
    assert not np.array_equal(other[0].loss, suite[0].loss)


def test_curves_regenerate_from_their_labels(suite: list[Curve]) -> None:
    for c in suite[::25]:
        assert same(c, generate(c.kind, c.seed, c.difficulty))


def test_write_and_load_round_trip_exactly(tmp_path: Path) -> None:
    curves = [generate("divergence", 0, "easy"), generate("nonfinite", 1, "easy"), generate("healthy", 2, "hard")]
    assert any(not np.isfinite(c.loss).all() for c in curves)
    write_suite(curves, tmp_path, seed=3)
    back = load_suite(tmp_path)
    assert [c.name for c in back] == [c.name for c in curves]
    assert all(same(a, b) for a, b in zip(curves, back))
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["seed"] == 3 and len(manifest["curves"]) == 3
    assert sorted(p.name for p in tmp_path.glob("*.arrow")) == ["divergence.arrow", "healthy.arrow", "nonfinite.arrow"]


def test_a_classifier_s_answers_round_trip_and_old_files_load_them_empty(tmp_path: Path) -> None:
    """``val_metric``, ``pred_steps`` and ``pred_top_share`` are stored exactly; a suite file
    written before those columns existed loads its curves with them empty."""
    import pyarrow.ipc as ipc

    curves = [generate("silent_collapse", 7, "medium"), generate("healthy", 8, "hard"), generate("divergence", 9, "easy")]
    assert len(curves[0].pred_top_share) > 0 and len(curves[2].pred_top_share) == 0
    write_suite(curves, tmp_path / "new")
    for a, b in zip(curves, load_suite(tmp_path / "new"), strict=True):
        for k in ("val_metric", "pred_steps", "pred_top_share"):
            got, want = getattr(b, k), getattr(a, k)
            assert got.dtype == want.dtype and np.array_equal(got, want), (a.name, k)
    old = tmp_path / "old"
    write_suite(curves[:1], old)
    path = old / "silent_collapse.arrow"
    with ipc.open_file(path) as reader:
        table = reader.read_all()
    table = table.drop_columns(["val_metric", "pred_steps", "pred_top_share"])
    with ipc.new_file(path, table.schema) as writer:
        writer.write_table(table)
    back = load_suite(old)[0]
    assert len(back.val_metric) == len(back.pred_steps) == len(back.pred_top_share) == 0
    assert same(back, curves[0], answers=False) and "pred_top_share" not in back.signals()


def test_steps_not_measured_round_trip_as_nulls_and_reach_scan_as_gaps(tmp_path: Path) -> None:
    import dataclasses

    import trainsignals as ts

    base = generate("healthy", 4, "easy")
    gaps = np.zeros(base.total_steps, dtype=bool)
    gaps[200:] = True                                   # the update ratio stops being recorded
    ratio = np.where(gaps, np.nan, np.float32(1e-3)).astype(np.float64)
    unmeasured = dataclasses.replace(base, name="unmeasured", update_ratio=ratio, gaps={"update_ratio": gaps})
    measured_nan = dataclasses.replace(base, name="measured-nan", update_ratio=ratio)
    write_suite([unmeasured, measured_nan], tmp_path)
    back = {c.name: c for c in load_suite(tmp_path)}
    assert np.array_equal(back["unmeasured"].gaps["update_ratio"], gaps) and back["measured-nan"].gaps == {}
    assert np.array_equal(back["unmeasured"].update_ratio, ratio, equal_nan=True)   # NaN for array readers
    fed = back["unmeasured"].signals()["update_ratio"]
    assert isinstance(fed, np.ma.MaskedArray) and np.array_equal(np.ma.getmaskarray(fed), gaps)

    def nonfinite(c: Curve) -> list[int]:
        evs = ts.Monitor(total_steps=c.total_steps).scan(**c.signals())
        return [e.step for e in evs if e.kind == Kind.NONFINITE and e.signal == "update_ratio"]

    assert nonfinite(back["unmeasured"]) == []          # not measured is not a non-finite value
    assert nonfinite(back["measured-nan"])[:1] == [200]  # a measured NaN is
    with pytest.raises(ValueError, match="gaps"):
        dataclasses.replace(base, gaps={"val_loss": gaps})


def test_sampled_is_a_log_of_block_means_and_last_values() -> None:
    c = generate("divergence", 2, "medium")
    s = c.sampled(25)
    ends = np.arange(24, c.total_steps, 25)
    assert np.array_equal(np.flatnonzero(~s.gaps["loss"]), ends) and np.array_equal(np.flatnonzero(~s.gaps["lr"]), ends)
    block = np.asarray(c.loss[:25], dtype=np.float64)
    assert s.loss[24] == pytest.approx(block.mean(), rel=1e-6)      # the logged loss: the block's mean
    assert s.grad_norm[49] == c.grad_norm[49] and s.lr[49] == c.lr[49]   # the others: the block's last value
    assert s.layer_names == () and s.act_layer_names == () and np.array_equal(s.val_steps, c.val_steps)
    sig = s.signals()
    assert "layer_grad_norms" not in sig and "activations" not in sig
    assert int(np.ma.count(sig["loss"])) == len(ends)
    assert s.kind == c.kind and s.onset_step == c.onset_step      # the label is the run's
    assert c.sampled(1).loss.tolist() == c.loss.tolist()
    with pytest.raises(ValueError, match="every"):
        c.sampled(0)


def test_write_refuses_duplicate_names(tmp_path: Path) -> None:
    c = generate("stall", 0)
    with pytest.raises(ValueError, match="unique"):
        write_suite([c, c], tmp_path)


def test_load_missing_suite_says_so(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="build"):
        load_suite(tmp_path / "nothing")


def test_committed_suite_equals_a_regeneration(suite: list[Curve]) -> None:
    committed = load_suite()
    assert len(committed) == len(suite)
    for a, b in zip(committed, suite):
        assert same(a, b), a.name
    assert [c.name for c in load_suite("synthetic")][:3] == [c.name for c in committed][:3]


def test_committed_manifest_is_consistent() -> None:
    directory = default_directory()
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["format"] == "trainsignals-curves/1" and manifest["seed"] == 0
    entries = manifest["curves"]
    assert len({e["name"] for e in entries}) == len(entries)
    files = {e["file"] for e in entries}
    assert files == {p.name for p in directory.glob("*.arrow")}
    for e in entries:
        assert e["file"] == f"{e['kind']}.arrow"
        assert set(e) == {"name", "kind", "onset_step", "difficulty", "seed", "total_steps", "first_nonfinite_step", "file"}
    assert (directory.parent / "README.md").is_file()


def test_committed_suite_fits_the_size_budget() -> None:
    total = sum(p.stat().st_size for p in default_directory().iterdir() if p.is_file())
    assert total < SIZE_BUDGET


def test_build_command_reproduces_the_committed_manifest(tmp_path: Path) -> None:
    assert main(["build", "--out", str(tmp_path), "--seed", "0"]) == 0
    assert (tmp_path / "manifest.json").read_text() == (default_directory() / "manifest.json").read_text()
    for p in default_directory().glob("*.arrow"):
        assert (tmp_path / p.name).is_file()


# ------------------------------------------------------------------------------------ healthy runs


def test_healthy_runs_are_finite_and_in_band(suite: list[Curve]) -> None:
    for c in of_kind(suite, HEALTHY):
        for k in ("loss", "grad_norm", "lr", "update_ratio", "val_loss", "layer_grad_norms", "dead_frac", "saturation"):
            assert np.all(np.isfinite(getattr(c, k))), (c.name, k)
        assert np.all(c.loss > 0) and np.all(c.grad_norm > 0) and np.all(c.lr > 0)
        # the update ratio at full learning rate sits in the healthy band
        full = c.lr >= 0.9 * c.lr.max()
        assert 5e-5 <= med(c.update_ratio[full]) <= 2e-3, c.name
        assert np.all((c.dead_frac >= 0) & (c.dead_frac <= 0.7)) and np.all(c.saturation <= 0.4)
        # the loss goes down overall and ends in a band above its floor, no spike above 1.3x its trend
        assert med(c.loss[-20:]) < med(c.loss[:10])
        ll = llog(c.loss)
        assert np.max(ll[4:-4] - np.convolve(ll, np.ones(9) / 9, "valid")) < 0.6


def test_healthy_runs_vary(suite: list[Curve]) -> None:
    hs = of_kind(suite, HEALTHY)
    l0 = np.array([c.loss[0] for c in hs])
    assert l0.min() < 0.2 and l0.max() > 5  # scale-free: initial losses over orders of magnitude
    noise = np.array([np.std(np.diff(llog(c.loss))) for c in hs])
    assert noise.min() < 0.015 and noise.max() > 0.08
    lr_jumps = [np.max(c.lr[1:] / c.lr[:-1]) for c in hs]
    assert sum(j > 5 for j in lr_jumps) >= 10  # warm restarts
    lr_drops = [np.min(c.lr[1:] / c.lr[:-1]) for c in hs]
    assert sum(d < 0.2 for d in lr_drops) >= 10  # step decays
    flat = [
        c for c in hs
        if abs(med(llog(c.loss[-c.total_steps // 3:])) - med(llog(c.loss[-c.total_steps // 2: -c.total_steps // 3]))) < 0.02
    ]
    assert len(flat) >= 15  # converged plateaus


def test_healthy_learning_rates_never_jump_like_an_anomaly(suite: list[Curve]) -> None:
    for c in of_kind(suite, HEALTHY):
        ratio = c.lr[1:] / c.lr[:-1]
        assert ratio.min() >= 0.09, c.name  # decays are at most 10x at a time
        peak = np.maximum.accumulate(c.lr)
        assert np.all(c.lr[1:] <= peak[:-1] * 1.0001) or np.argmax(c.lr) < c.total_steps // 5  # warmup only


def test_failures_are_healthy_before_onset(suite: list[Curve]) -> None:
    for c in suite:
        if c.kind == HEALTHY or c.onset_step == 0:
            continue
        o = c.onset_step
        for k in ("loss", "grad_norm", "update_ratio", "layer_grad_norms"):
            assert np.all(np.isfinite(getattr(c, k)[:o])), (c.name, k)
            assert np.all(getattr(c, k)[:o] > 0), (c.name, k)
        assert np.all(c.lr[:o] > 0)
        assert np.all(c.dead_frac[c.act_steps < o] <= 0.7) and np.all(c.saturation[c.act_steps < o] <= 0.4)
        full = c.lr[:o] >= 0.9 * c.lr[:o].max()
        assert 5e-5 <= med(c.update_ratio[:o][full]) <= 2e-3, c.name


# ------------------------------------------------------------------------------------ failure signatures


def pre(x: np.ndarray, o: int, width: int = 50) -> float:
    return med(x[max(0, o - width):o])


def test_nonfinite(suite: list[Curve]) -> None:
    for c in of_kind(suite, "nonfinite"):
        o = c.onset_step
        assert c.first_nonfinite_step == o
        # no climb before it
        ll = llog(c.loss)
        assert pre(ll, o, 20) < med(ll[o - 120:o - 60]) + 0.1, c.name


def test_divergence(suite: list[Curve]) -> None:
    cs = of_kind(suite, "divergence")
    assert sum(c.onset_step == 0 for c in cs) >= 5
    blown = [c for c in cs if c.first_nonfinite_step >= 0]
    assert 0.3 * len(cs) <= len(blown) <= 0.8 * len(cs)
    for c in cs:
        o = c.onset_step
        end = c.first_nonfinite_step if c.first_nonfinite_step >= 0 else c.total_steps
        assert end > o + 5
        ll, lg, lu = llog(c.loss), llog(c.grad_norm), llog(c.update_ratio)
        start = ll[o] if o == 0 else pre(ll, o, 20)
        assert med(ll[end - 5:end]) - start > 1.0, c.name  # the loss grows (more than e-fold)
        g0 = lg[o] if o == 0 else pre(lg, o, 20)
        assert med(lg[end - 5:end]) > g0 + 0.5, c.name
        u0 = lu[min(o + 5, end - 1)] if o == 0 else pre(lu, o, 20)
        assert med(lu[end - 5:end]) > u0, c.name


def test_grad_explosion(suite: list[Curve]) -> None:
    need = {"easy": 100.0, "medium": 20.0, "hard": 5.0}
    for c in of_kind(suite, "grad_explosion"):
        o = c.onset_step
        jump = np.max(c.grad_norm[o:o + 3]) / pre(c.grad_norm, o)
        assert jump >= need[c.difficulty], (c.name, jump)
        assert np.all(np.isfinite(c.loss))
        # the loss reacts modestly
        assert np.max(llog(c.loss[o:o + 30])) - pre(llog(c.loss), o) < 1.0, c.name


def test_loss_spike(suite: list[Curve]) -> None:
    for c in of_kind(suite, "loss_spike"):
        o = c.onset_step
        base = pre(c.loss, o, 30)
        assert c.loss[o] / base >= 1.45, c.name
        assert med(c.loss[o + 8:o + 40]) / base < 1.15, c.name  # recovered
        assert c.grad_norm[o] > pre(c.grad_norm, o, 30), c.name


def test_stall(suite: list[Curve]) -> None:
    for c in of_kind(suite, "stall"):
        o, n = c.onset_step, c.total_steps
        assert n - o >= 0.25 * n
        ll = llog(c.loss)
        # still clearly falling before the onset
        assert med(ll[o - n // 10:o]) < med(ll[o - n // 5:o - n // 10]) - 0.02, c.name
        # flat after it
        after = ll[o + 10:]
        half = len(after) // 2
        assert abs(med(after[half:]) - med(after[:half])) < 0.03 + 0.5 * np.std(after), c.name
        assert med(c.grad_norm[o + 25:]) < pre(c.grad_norm, o) / 2.5, c.name
        assert med(c.update_ratio[o + 25:]) < pre(c.update_ratio, o) / 8, c.name


def resid_std(x: np.ndarray, width: int = 31) -> float:
    """Spread around a moving average: the fast part of a series."""
    m = np.convolve(x, np.ones(width) / width, "valid")
    h = width // 2
    return float(np.std(x[h:-h] - m))


def test_oscillation(suite: list[Curve]) -> None:
    for c in of_kind(suite, "oscillation"):
        o = c.onset_step
        ll, lg = llog(c.loss), llog(c.grad_norm)
        before, after = slice(max(0, o - 130), o), slice(o + 20, o + 150)
        assert resid_std(ll[after]) > 1.4 * resid_std(ll[before]), c.name
        assert resid_std(lg[after]) > 1.4 * resid_std(lg[before]), c.name
        # no net progress
        tail = ll[o + 30:]
        half = len(tail) // 2
        assert abs(np.mean(tail[half:]) - np.mean(tail[:half])) < 0.5 * np.std(tail) + 0.05, c.name


def test_vanishing_gradient(suite: list[Curve]) -> None:
    for c in of_kind(suite, "vanishing_gradient"):
        o = c.onset_step
        end = c.layer_grad_norms[-30:]
        before = np.median(c.layer_grad_norms[max(0, o - 50):o], axis=0)
        ratio = np.median(end, axis=0) / before
        assert ratio.min() < 1.5e-3, c.name  # some layers fell off the cliff (3 to 6 orders of magnitude)
        assert ratio[0] < 1.5e-3  # the earliest one among them
        assert ratio.max() > 0.2, c.name  # others stay healthy
        assert med(c.grad_norm[-30:]) < pre(c.grad_norm, o), c.name


def test_silent_collapse(suite: list[Curve]) -> None:
    cs = of_kind(suite, "silent_collapse")
    down = 0
    for c in cs:
        o = c.onset_step
        ll = llog(c.loss)
        assert med(ll[-20:]) < med(ll[o - 10:o + 10]) - 0.03, c.name  # the loss keeps falling
        g = med(c.grad_norm[-20:]) / pre(c.grad_norm, o)
        assert g <= 1e-2 or g >= 1e2, (c.name, g)
        down += g <= 1e-2
    assert down > len(cs) / 2


def test_update_ratio_high_and_low(suite: list[Curve]) -> None:
    for c in of_kind(suite, "update_ratio_high"):
        o = c.onset_step
        assert 0.07 <= med(c.update_ratio[-20:]) <= 1.3, c.name
        assert np.std(np.diff(llog(c.loss[o + 10:o + 110]))) > np.std(np.diff(llog(c.loss[max(0, o - 100):o])))
    for c in of_kind(suite, "update_ratio_low"):
        o = c.onset_step
        assert 5e-9 <= med(c.update_ratio[-20:]) <= 1.5e-6, c.name
        assert np.array_equal(c.lr, generate(c.kind, c.seed, c.difficulty).lr)
        assert np.all(c.lr[o:] > 0)


def test_overfitting(suite: list[Curve]) -> None:
    for c in of_kind(suite, "overfitting"):
        o = c.onset_step
        assert o in set(c.val_steps.tolist())
        assert c.val_steps[np.argmin(c.val_loss)] == o
        i = int(np.searchsorted(c.val_steps, o))
        assert len(c.val_steps) - i - 1 >= 5
        assert np.log(c.val_loss[-1] / c.val_loss[i]) > 0.05, c.name  # validation rises
        assert np.mean(np.diff(c.val_loss[i:]) > 0) > 0.5, c.name  # steadily
        ll = llog(c.loss)
        assert med(ll[-30:]) < med(ll[o - 15:o + 15]) - 0.03, c.name  # training keeps falling


@pytest.mark.parametrize("kind, field, level, before", [("dead_units", "dead_frac", 0.9, 0.65), ("saturation", "saturation", 0.55, 0.35)])
def test_activation_failures(suite: list[Curve], kind: str, field: str, level: float, before: float) -> None:
    for c in of_kind(suite, kind):
        a = getattr(c, field)
        o = c.onset_step
        assert np.max(np.median(a[-5:], axis=0)) >= level, c.name
        assert np.all(a[c.act_steps < o] <= before), c.name
        # the other statistic stays normal
        other = c.saturation if field == "dead_frac" else c.dead_frac
        assert np.all(other <= 0.7)


def test_lr_anomaly(suite: list[Curve]) -> None:
    kinds = Counter()
    for c in of_kind(suite, "lr_anomaly"):
        o = c.onset_step
        r = c.lr[o] / c.lr[o - 1]
        if c.lr[o] == 0:
            kinds["zero"] += 1
            assert np.all(c.lr[o:] == 0) and np.all(c.update_ratio[o:] == 0)
            flat = c.lr[o // 2:o]
            assert np.all(flat == flat[-1]), c.name  # from a flat schedule
        elif r > 1:
            kinds["up"] += 1
            assert r >= 19 and c.lr[o] > 1.5 * c.lr[:o].max(), c.name
            assert med(llog(c.loss[o + 5:o + 30])) > pre(llog(c.loss), o), c.name  # the loss reacts
        else:
            kinds["down"] += 1
            assert r <= 1 / 19 and c.lr[o] > 0, c.name
    assert set(kinds) == {"up", "down", "zero"}


# ------------------------------------------------------------------------------------ writing into a folder


def _tiny() -> list[Curve]:
    return [generate("stall", 0, "easy", n_steps=400), generate("healthy", 0, "easy", n_steps=400)]


def test_write_refuses_a_folder_with_arrow_files_that_are_no_suite_s(tmp_path: Path) -> None:
    (tmp_path / "run1.arrow").write_text("x\n")
    (tmp_path / "run2.arrow").write_text("y\n")
    with pytest.raises(FileExistsError, match=r"holds \.arrow files .*\(run1\.arrow, run2\.arrow\)"):
        write_suite(_tiny(), tmp_path)
    assert (tmp_path / "run1.arrow").read_text() == "x\n" and sorted(p.name for p in tmp_path.iterdir()) == [
        "run1.arrow", "run2.arrow"]                      # nothing written, nothing lost


def test_write_refuses_another_tool_s_manifest(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text('{"format": "someone-else"}')
    with pytest.raises(FileExistsError, match="not a curve suite's manifest"):
        write_suite(_tiny(), tmp_path)
    assert (tmp_path / "manifest.json").read_text() == '{"format": "someone-else"}'
    with pytest.raises(NotADirectoryError, match="is a file"):
        write_suite(_tiny(), tmp_path / "manifest.json")


def test_write_replaces_the_previous_suite_and_only_it(tmp_path: Path) -> None:
    folder = tmp_path / "suite"
    write_suite([generate("divergence", 0, "easy", n_steps=400), *_tiny()], folder)
    (folder / "notes.txt").write_text("mine\n")
    (tmp_path / "victim.arrow").write_text("outside\n")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["curves"][0]["file"] = "../victim.arrow"   # a manifest naming a file outside: never removed
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(FileExistsError, match=r"\(divergence\.arrow\)"):  # now listed by no entry: not ours to drop
        write_suite(_tiny(), folder)
    manifest["curves"][0]["file"] = "divergence.arrow"
    (folder / "manifest.json").write_text(json.dumps(manifest))
    write_suite(_tiny(), folder)
    assert sorted(p.name for p in folder.iterdir()) == ["healthy.arrow", "manifest.json", "notes.txt", "stall.arrow"]
    assert [c.name for c in load_suite(folder)] == [c.name for c in _tiny()]
    assert (tmp_path / "victim.arrow").read_text() == "outside\n" and (folder / "notes.txt").read_text() == "mine\n"


def test_build_refuses_a_folder_it_would_spoil_before_generating(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    import trainsignals.curves as curves_mod
    from trainsignals.cli import main as cli

    (tmp_path / "run1.arrow").write_text("x\n")
    monkeypatch.setattr(curves_mod, "standard_suite", lambda seed=0: pytest.fail("generated"))
    with pytest.raises(FileExistsError, match="run1.arrow"):
        main(["build", "--out", str(tmp_path)])
    assert cli(["datasets", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"trainsignals datasets: error: {tmp_path} holds .arrow files") and err.count("\n") == 1
    assert (tmp_path / "run1.arrow").read_text() == "x\n"


@pytest.mark.parametrize(("argv", "message"), [
    (["build", "--seed", "-1"], "python -m trainsignals.curves build: error: argument --seed: must be >= 0, got -1"),
    (["build", "--out", "{file}"], "python -m trainsignals.curves: error: --out {file} is a file; give the folder "
                                   "to write the suite into"),
    (["build", "--out", "{dir}"], "python -m trainsignals.curves: error: {dir} holds .arrow files"),
])
def test_the_build_command_reports_bad_input_in_one_line(argv: list[str], message: str, tmp_path: Path) -> None:
    import subprocess
    import sys

    afile, adir = tmp_path / "a_file", tmp_path / "runs"
    afile.write_text("keep\n")
    adir.mkdir()
    (adir / "run1.arrow").write_text("x\n")
    argv = [a.format(file=afile, dir=adir) for a in argv]
    proc = subprocess.run([sys.executable, "-m", "trainsignals.curves", *argv], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(message.format(file=afile, dir=adir)), proc.stderr
    assert afile.read_text() == "keep\n" and (adir / "run1.arrow").read_text() == "x\n"


# ------------------------------------------------------------------------------------ reading a suite


def _broken(folder: Path, how: str) -> str:
    """Spoil a small suite in ``folder``; what the error must name."""
    write_suite(_tiny(), folder)
    mpath = folder / "manifest.json"
    manifest = json.loads(mpath.read_text())
    if how == "no curves":
        del manifest["curves"]
        mpath.write_text(json.dumps(manifest))
        return f"{mpath}: no 'curves' list"
    if how == "missing key":
        del manifest["curves"][1]["first_nonfinite_step"]
        mpath.write_text(json.dumps(manifest))
        return f"{mpath}: curve entry 1 ('healthy-easy-0') lacks 'first_nonfinite_step'"
    if how == "not json":
        mpath.write_text("{not json")
        return f"{mpath}: not a JSON manifest"
    if how == "outside":
        manifest["curves"][0]["file"] = "../stall.arrow"
        mpath.write_text(json.dumps(manifest))
        return "file '../stall.arrow' is not a .arrow file name in the suite's folder"
    path = folder / "healthy.arrow"
    path.write_bytes(path.read_bytes()[:8])              # truncated
    return f"{path}: not a readable curve file"


@pytest.mark.parametrize("how", ["no curves", "missing key", "not json", "outside", "truncated"])
def test_a_malformed_suite_is_a_value_error_naming_the_file(how: str, tmp_path: Path) -> None:
    want = _broken(tmp_path / "suite", how)
    with pytest.raises(ValueError) as info:
        load_suite(tmp_path / "suite")
    assert want in str(info.value)


def test_suite_names_are_the_repository_s_folders_and_other_names_paths(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from trainsignals.curves import SUITE_FOLDERS, suite_directory

    datasets = default_directory().parent
    assert {n: suite_directory(n) for n in SUITE_FOLDERS} == {
        "synthetic": datasets / "synthetic", "real": datasets / "real", "real_dev": datasets / "real_dev",
        "dev": datasets / "real_dev", "real_heldout": datasets / "real_heldout", "heldout": datasets / "real_heldout"}
    write_suite(_tiny(), tmp_path / "synthetic")             # a folder of mine named like a committed suite
    monkeypatch.chdir(tmp_path)
    assert suite_directory("./synthetic") == Path("synthetic") and suite_directory(Path("synthetic")) == Path("synthetic")
    assert [c.name for c in load_suite("./synthetic")] == [c.name for c in _tiny()]
    assert [c.name for c in load_suite(Path("synthetic"))] == [c.name for c in _tiny()]
    assert suite_directory("synthetic") == datasets / "synthetic"
    assert suite_directory("mine") == Path("mine")
    with pytest.raises(ValueError, match="empty string"):
        load_suite("")


@pytest.mark.parametrize(("name", "builder"), [
    ("synthetic", "`python -m trainsignals.curves build`"),
    ("real", "`python -m trainsignals.curves.real_runs build`"),
    ("dev", "`python -m trainsignals.curves.real_runs build --dev`"),
    ("heldout", "`python -m trainsignals.curves.real_runs build --heldout`"),
])
def test_a_missing_committed_suite_names_its_own_builder(name: str, builder: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import trainsignals.curves as curves_mod

    monkeypatch.setattr(curves_mod, "default_directory", lambda: tmp_path / "datasets" / "synthetic")
    with pytest.raises(FileNotFoundError) as info:
        load_suite(name)
    assert str(info.value).endswith(builder)
    with pytest.raises(FileNotFoundError, match=r"build --out .*elsewhere`$"):
        load_suite(tmp_path / "elsewhere")
