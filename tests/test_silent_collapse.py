"""Silent collapse seen by its own signals: predictions concentrating (``pred_top_share``) and a
validation metric back at chance (``val_metric``), the ``collapsed`` status, and their plumbing.

Curves are generated fresh with seeds >= 5000 (the rules' thresholds were set on healthy runs of
seeds 7000-7199, benchmarks/probe_collapse_thresholds.py; the committed synthetic suite carries
the signals since 7 December 2026).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import trainsignals as ts
from trainsignals.curves import DIFFICULTIES, generate

SEEDS = range(5000, 5020)


def _window(c) -> int:  # type: ignore[no-untyped-def]
    """The issue's detection window: max(50 steps, 10 % of the run) after the onset."""
    return max(50, int(0.1 * c.total_steps))


def _first_after(events, onset):  # type: ignore[no-untyped-def]
    return next((e.step for e in events if e.step >= onset), None)


@pytest.fixture(scope="module")
def collapses():  # type: ignore[no-untyped-def]
    return [generate("silent_collapse", s, d) for s in SEEDS for d in DIFFICULTIES]


@pytest.fixture(scope="module")
def healthy():  # type: ignore[no-untyped-def]
    return [generate("healthy", s, d) for s in SEEDS for d in DIFFICULTIES]


def test_generated_curves_carry_the_new_signals_and_the_old_ones_unchanged():
    c = generate("silent_collapse", 5001, "medium")
    sig = c.signals()
    steps, share = sig["pred_top_share"]
    assert len(steps) == len(share) > 50 and np.all((share >= 0) & (share <= 1))
    assert sig["val_metric"][0] is c.val_steps and len(c.val_metric) == len(c.val_steps)
    late = share[steps > c.onset_step + 100]
    assert late.mean() > share[(steps > 50) & (steps < c.onset_step)].mean() + 0.3  # predictions concentrate
    assert "pred_top_share" not in generate("divergence", 5001).signals()
    committed = {x.name: x for x in ts.curves.load_suite()}
    old = generate("silent_collapse", 0, "easy")
    assert np.array_equal(committed[old.name].loss, old.loss)  # the committed suite is its command's output,
    assert len(old.pred_top_share) and np.array_equal(committed[old.name].pred_top_share, old.pred_top_share)  # answers too


def test_top_share_rule_catches_collapse_within_the_window(collapses):
    caught = []
    for c in collapses:
        evs = ts.TopShareCollapse().scan(pred_top_share=c.signals()["pred_top_share"], loss=c.loss, steps=c.steps)
        assert not [e for e in evs if e.step < c.onset_step], c.name  # nothing before the onset
        first = _first_after(evs, c.onset_step)
        caught.append(first is not None and first - c.onset_step <= _window(c))
    assert np.mean(caught) >= 0.95, f"{sum(caught)} of {len(caught)} caught within max(50, 10 %)"


def test_val_metric_rule_catches_collapse_within_the_window_and_one_validation(collapses):
    caught = []
    for c in collapses:
        evs = ts.ValMetricChance().scan(val_metric=c.signals()["val_metric"], loss=c.loss, steps=c.steps)
        assert not [e for e in evs if e.step < c.onset_step], c.name
        first = _first_after(evs, c.onset_step)
        every = int(np.diff(c.val_steps).max())  # a sparse signal is seen one validation later at worst
        caught.append(first is not None and first - c.onset_step <= _window(c) + every)
    assert np.mean(caught) >= 0.8, f"{sum(caught)} of {len(caught)} caught"


def test_both_rules_stay_quiet_on_healthy_runs(healthy):
    for c in healthy:
        sig = c.signals()
        assert ts.TopShareCollapse().scan(pred_top_share=sig["pred_top_share"], loss=c.loss, steps=c.steps) == []
        assert ts.ValMetricChance().scan(val_metric=sig["val_metric"], loss=c.loss, steps=c.steps) == []


def test_the_default_monitor_reports_it_and_stays_quiet_on_healthy_runs(collapses, healthy):
    mine = {"TopShareCollapse", "ValMetricChance"}
    hits = 0
    for c in collapses[:15]:
        evs = ts.Monitor(total_steps=c.total_steps).scan(**c.signals())
        first = _first_after([e for e in evs if e.detector in mine], c.onset_step)
        hits += first is not None and first - c.onset_step <= _window(c)
    assert hits >= 14
    for c in healthy[:15]:
        assert not [e for e in ts.Monitor(total_steps=c.total_steps).scan(**c.signals()) if e.detector in mine]


def _untrained_start(seed: int, n: int = 900, collapse_at: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Shares of a batch of 32 predictions the way real networks answer while they learn: for the
    first 5..30 steps as the random weights make them (one class, or spread evenly), then bunched
    on the prior's class for 10..80 steps, spreading out by step 150 to a learned level of
    0.15..0.4; a collapse drives them to one class over 20 steps from ``collapse_at``. The loss
    falls throughout."""
    rng = np.random.default_rng(seed + 40_000)
    t = np.arange(n)
    first, prior = int(rng.integers(5, 31)), int(rng.integers(10, 81))
    learned = rng.uniform(0.15, 0.4)
    share = np.full(n, learned)
    share[:first] = 1.0 if rng.random() < 0.5 else rng.uniform(0.05, 0.2)
    share[first:first + prior] = rng.uniform(0.7, 1.0)
    fade = slice(first + prior, 150)
    share[fade] = np.linspace(share[first + prior - 1], learned, len(share[fade]))
    if collapse_at is not None:
        share = share + (1.0 - share) * np.clip((t - collapse_at) / 20, 0, 1)
    counts = rng.binomial(32, np.clip(share, 0, 1)) / 32
    loss = 2.3 * np.exp(-t / 200) + 0.1
    return np.maximum(counts, 1 / 32), loss * np.exp(rng.normal(0, 0.03, n))


def test_an_untrained_network_answering_one_class_is_no_collapse_and_a_later_one_is() -> None:
    """An untrained network's answers (one class, or an even spread, then the prior's class) set
    no baseline; the level the run holds once it has learned does, and a collapse from it is named."""
    for seed in SEEDS:
        share, loss = _untrained_start(seed)
        assert ts.TopShareCollapse().scan(pred_top_share=share, loss=loss) == [], seed
        share, loss = _untrained_start(seed, collapse_at=500)
        got = [e.step for e in ts.TopShareCollapse().scan(pred_top_share=share, loss=loss)]
        assert got and 500 <= got[0] <= 550, (seed, got)


def test_answers_held_at_one_answer_have_no_diversity_to_lose() -> None:
    """A character model that answers one character for 150 steps, then holds 95 % of its answers
    there and comes back to all of them: its baseline is already ONE_ANSWER or more, where the
    rule's rise (half the room left to 1) is smaller than a batch's scatter. No collapse; the same
    moves from a held 60 % are one."""
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        loss = 3.0 * np.exp(-np.arange(400) / 2000) * np.exp(rng.normal(0, 0.03, 400))
        for held, fires in ((0.95, False), (0.6, True)):
            share = np.concatenate((np.ones(150), np.full(100, held), np.ones(150)))
            share[150:250] = np.clip(share[150:250] + rng.normal(0, 0.015, 100), 0, 1)
            got = [e.step for e in ts.TopShareCollapse().scan(pred_top_share=share, loss=loss)]
            assert bool(got) is fires, (seed, held, got)
            assert not got or 250 <= got[0] <= 260


def test_a_lucky_validation_is_no_gain_to_lose_and_a_held_one_is() -> None:
    """A slow learner's accuracy sits near its start with one lucky draw above it, then climbs:
    the draw the next validation does not confirm is no gain, so its return is no collapse; a
    fall from a level two validations held is one."""
    for seed in SEEDS:
        rng = np.random.default_rng(seed + 50_000)
        steps = np.arange(25, 1500, 25)
        start = rng.uniform(0.2, 0.4)
        acc = start + np.clip((steps - 600) / 900, 0, 1) * rng.uniform(0.1, 0.2) + rng.normal(0, 0.004, len(steps))
        k = int(rng.integers(4, 12))
        acc[k] += rng.uniform(0.03, 0.05)             # one lucky validation while still near the start
        loss = 2.0 * np.exp(-steps / 2000)
        det = ts.ValMetricChance(chance=start)        # the level of answering one class, known
        assert [e for s, a, lo in zip(steps, acc, loss) for e in det.update(step=int(s), val_metric=float(a), loss=float(lo))] == [], seed
        acc[k + 1] = acc[k]                           # the next validation holds it: a gain the model had
        det = ts.ValMetricChance(chance=start)
        got = [e.step for s, a, lo in zip(steps, acc, loss) for e in det.update(step=int(s), val_metric=float(a), loss=float(lo))]
        assert got and steps[k + 2] <= got[0] <= steps[k + 2] + 150, (seed, got)  # within 6 validations


def test_a_loss_that_rises_with_the_share_is_not_a_silent_collapse():
    t = np.arange(600)
    share = np.where(t < 300, 0.1, 0.95)
    loss = np.where(t < 300, np.exp(-t / 300), 5.0 * 1.01 ** (t - 300))  # blows up
    assert ts.TopShareCollapse().scan(pred_top_share=share, loss=loss) == []
    acc = (t[::50], np.where(t[::50] < 300, 0.9, 0.1))
    assert ts.ValMetricChance().scan(val_metric=acc, loss=loss) == []


def test_a_metric_back_at_chance_is_a_collapse_only_if_the_measured_answers_concentrated():
    """A model that memorised a short text loses its validation accuracy while its answers spread
    out: no collapse to one answer. The same fall with the answers piling onto one class is one;
    a run that does not measure its answers is judged by the metric and the loss, as before."""
    for seed in SEEDS:
        rng = np.random.default_rng(seed + 60_000)
        t = np.arange(1500)
        vs = np.arange(50, 1500, 50)
        acc = np.where(vs < 800, 0.2 + 0.5 * (1 - np.exp(-vs / 200)), 0.22) + rng.normal(0, 0.005, len(vs))
        loss = 2.0 * np.exp(-t / 500) * np.exp(rng.normal(0, 0.05, len(t)))
        before = rng.uniform(0.3, 0.6)
        for after, named in ((before - rng.uniform(0.05, 0.2), False), (rng.uniform(0.9, 1.0), True)):
            share = np.clip(np.where(t < 780, before, after) + rng.normal(0, 0.02, len(t)), 0, 1)
            share[rng.random(len(t)) < 0.3] = np.nan                      # not measured at every step
            got = ts.ValMetricChance().scan(val_metric=(vs, acc), loss=loss, pred_top_share=share, steps=t)
            assert bool(got) is named, (seed, after, [e.step for e in got])
            if named:
                assert 800 <= got[0].step <= 900
        assert ts.ValMetricChance().scan(val_metric=(vs, acc), loss=loss, steps=t)   # no answers measured


@pytest.mark.parametrize("rule", [ts.SharpTurnOverfitting, ts.BreakoutOverfitting, ts.LevelStepOverfitting,
                                  ts.MemorisationClimbOverfitting], ids=lambda r: r.__name__)
def test_a_validation_climb_while_the_model_gives_one_answer_is_left_to_the_collapse_rules(rule):
    """Labels collapsed to one class: the training loss collapses, the validation loss climbs (as
    in overfitting) and nine answers in ten or more are that class. The overfitting rules stay
    quiet while the measured answers say so; the same run with its answers spread is overfitting."""
    t = np.arange(1200)
    loss = np.where(t < 600, np.exp(-t / 400), np.exp(-1.5) * 10.0 ** (-(t - 600) / 100))
    vs = np.arange(50, 1200, 50)
    val = np.where(vs <= 600, 0.5 + np.exp(-vs / 150), (0.5 + np.exp(-4)) * (1.0 + 0.1 * (vs - 600) / 50))
    for share, fires in ((np.where(t < 620, 0.3, 0.97), False), (np.full(len(t), 0.3), True)):
        evs = rule().scan(loss=loss, val_loss=(vs, val), pred_top_share=share, steps=t)
        assert bool(evs) is fires, (rule.__name__, [e.step for e in evs])
    assert rule().scan(loss=loss, val_loss=(vs, val), steps=t)     # no answers measured: the rule as before


def test_a_blow_up_logged_apart_from_the_validations_is_not_a_silent_collapse():
    """Logs often write the training loss and the validation at different steps (a window mean
    every 10 steps, a validation every 50 at step 49, 99, ...): the latest loss still says the run
    blew up, so the fall of the metric is a divergence, not a collapse."""
    t = np.arange(0, 600, 10)
    loss = np.where(t < 300, np.exp(-t / 300), 5.0 * 1.05 ** ((t - 300) / 10))
    vs = np.arange(49, 600, 50)
    acc = np.where(vs < 300, np.minimum(0.9, 0.3 + vs / 300), 0.1)
    det = ts.ValMetricChance()
    rows = sorted([(int(s), "loss", float(v)) for s, v in zip(t, loss)] +
                  [(int(s), "val_metric", float(a)) for s, a in zip(vs, acc)])
    assert [e for s, k, v in rows for e in det.update(step=s, **{k: v})] == []
    assert ts.ValMetricChance().scan(val_metric=(vs, acc), loss=(t, loss)) == []
    healthy = np.exp(-t / 300)  # the same fall of the metric while the loss keeps falling: a collapse
    assert ts.ValMetricChance().scan(val_metric=(vs, acc), loss=(t, healthy))


def test_status_is_collapsed_while_the_collapse_lasts():
    c = generate("silent_collapse", 5003, "easy")
    sig = c.signals()
    ps, share = sig["pred_top_share"]
    at = dict(zip(ps.tolist(), share.tolist()))
    vs = dict(zip(c.val_steps.tolist(), c.val_metric.tolist()))
    mon = ts.Monitor(total_steps=c.total_steps)
    seen: list[str] = []
    first = None
    for t in range(c.total_steps):
        evs = mon.update(step=t, loss=float(c.loss[t]), pred_top_share=at.get(t), val_metric=vs.get(t))
        if first is None and any(e.kind is ts.Kind.SILENT_COLLAPSE for e in evs):
            first = t
        seen.append(mon.status)
    assert first is not None and c.onset_step <= first <= c.onset_step + _window(c)
    assert set(seen[first:]) == {"collapsed"}, "the status went back while the model still answers one class"
    assert "collapsed" not in seen[:c.onset_step]
    assert "collapsed" in ts.STATUSES and ts.STATUSES.index("collapsed") < ts.STATUSES.index("diverging")


def test_val_metric_mode_min_reads_an_error_rising_to_chance():
    steps = np.arange(0, 2000, 50)
    err = np.where(steps < 1000, 0.9 - 0.8 * (1 - np.exp(-steps / 200)), 0.9)
    loss = np.exp(-np.arange(2000) / 500)
    got = ts.Monitor(val_metric_mode="min").scan(loss=loss, val_metric=(steps, err))
    assert [e.step for e in got if e.detector == "ValMetricChance"][:1] == [1000]
    assert ts.default_suite(val_metric_mode="min")["val_metric_chance"].mode == "min"
    assert not [e for e in ts.Monitor().scan(loss=loss, val_metric=(steps, err)) if e.detector == "ValMetricChance"]


@pytest.mark.parametrize(("kw", "err", "name"), [
    ({"pred_top_share": 1.5}, ValueError, "pred_top_share"),
    ({"pred_top_share": -0.1}, ValueError, "pred_top_share"),
    ({"pred_top_share": math.inf}, ValueError, "pred_top_share"),
    ({"pred_top_share": "a lot"}, TypeError, "pred_top_share"),
    ({"val_metric": "0.9"}, TypeError, "val_metric"),
    ({"val_metric": None, "pred_top_share": [0.5, 0.6]}, TypeError, "pred_top_share"),
])
def test_bad_input_is_refused_naming_the_signal_and_changes_nothing(kw, err, name):
    mon = ts.Monitor()
    for t in range(30):
        mon.update(step=t, loss=1.0 / (t + 1), pred_top_share=0.2, val_metric=0.5 if t % 10 == 0 else None)
    before = json.dumps(mon.state_dict())
    with pytest.raises(err, match=name):
        mon.update(step=30, loss=0.01, **kw)
    assert json.dumps(mon.state_dict()) == before


def test_bad_batches_and_settings_are_refused():
    with pytest.raises(ValueError, match="pred_top_share"):
        ts.Monitor().scan(loss=np.ones(3), pred_top_share=np.array([0.2, 1.2, 0.3]))
    with pytest.raises(TypeError, match="val_metric"):
        ts.Monitor().scan(loss=np.ones(3), val_metric=np.ones(3))  # validation has its own cadence
    with pytest.raises(ValueError, match="val_metric_mode"):
        ts.Monitor(val_metric_mode="up")
    with pytest.raises(ValueError, match="val_metric_mode"):
        ts.default_suite(val_metric_mode="higher")
    with pytest.raises(ValueError, match="pred_top_share"):
        ts.TopShareCollapse().update(pred_top_share=2.0, loss=1.0)


def test_scan_equals_streaming_and_the_state_round_trips():
    c = generate("silent_collapse", 5007, "medium")
    sig = c.signals()
    whole = ts.Monitor(total_steps=c.total_steps).scan(**sig)
    assert any(e.detector == "TopShareCollapse" for e in whole)
    ps, share = sig["pred_top_share"]
    at = dict(zip(ps.tolist(), share.tolist()))
    vs = dict(zip(c.val_steps.tolist(), c.val_metric.tolist()))
    mine = {"TopShareCollapse", "ValMetricChance"}

    def feed(mon, lo, hi):  # type: ignore[no-untyped-def]
        out = []
        for t in range(lo, hi):
            out += mon.update(step=t, loss=float(c.loss[t]), pred_top_share=at.get(t), val_metric=vs.get(t))
        return out

    cut = c.onset_step + 10
    first = ts.Monitor(total_steps=c.total_steps)
    head = feed(first, 0, cut)
    resumed = ts.Monitor(total_steps=c.total_steps)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    streamed = head + feed(resumed, cut, c.total_steps)
    pick = lambda evs: [(e.step, e.onset_step, e.detector) for e in evs if e.detector in mine]  # noqa: E731
    assert pick(streamed) == pick(whole)
    assert resumed.status == "collapsed"


def test_traces_record_and_replay_the_new_signals(tmp_path):
    pytest.importorskip("pyarrow")
    c = generate("silent_collapse", 5011, "easy")
    sig = c.signals()
    path = tmp_path / "run.arrow"
    with ts.TraceWriter(path) as w:
        live = ts.Monitor(total_steps=c.total_steps, recorder=w).scan(**sig)
    back = ts.trace_signals(path)
    vst, vv = back["val_metric"]
    assert np.array_equal(vst, c.val_steps) and np.array_equal(vv, c.val_metric)
    share = np.asarray(back["pred_top_share"].to_numpy(zero_copy_only=False))
    assert np.allclose(share[sig["pred_top_share"][0]], sig["pred_top_share"][1])
    replayed = ts.Monitor(total_steps=c.total_steps).scan(**back)
    assert [e.to_dict() for e in replayed] == [e.to_dict() for e in live]
    assert any(e.detector == "TopShareCollapse" for e in ts.trace_events(path))
    # one row at a time (the streaming recorder) and by hand
    p2 = tmp_path / "rows.arrow"
    with ts.TraceWriter(p2) as w:
        mon = ts.Monitor(recorder=w)
        mon.update(step=0, loss=1.0, pred_top_share=0.25)
        mon.update(step=1, loss=0.9, val_metric=0.5)
        w.write(2, loss=0.8, pred_top_share=0.5, val_metric=0.6)
    t = ts.read_trace(p2)
    assert t.column("pred_top_share").to_pylist() == [0.25, None, 0.5]
    assert t.column("val_metric").to_pylist() == [None, 0.5, 0.6]


def test_a_trace_written_before_the_new_columns_still_reads(tmp_path):
    pa = pytest.importorskip("pyarrow")
    path = tmp_path / "new.arrow"
    ts.write_trace(path, step=[0, 1, 2], loss=[1.0, 0.9, 0.8])
    table = ts.read_trace(path)
    old = table.drop_columns(["val_metric", "pred_top_share"])
    p_old = tmp_path / "old.arrow"
    with pa.OSFile(str(p_old), "wb") as f, pa.ipc.new_stream(f, old.schema) as writer:
        writer.write_table(old)
    back = ts.read_trace(p_old)
    assert back.column("pred_top_share").null_count == 3
    assert sorted(ts.trace_signals(back)) == ["loss", "step"]


def test_the_torch_adapter_measures_the_top_share():
    torch = pytest.importorskip("torch")
    from trainsignals.adapters.torch import pred_top_share

    logits = torch.tensor([[2.0, 0.1, 0.3], [1.5, 0.2, 0.1], [0.1, 3.0, 0.2], [0.9, 0.1, 0.0]], requires_grad=True)
    got = pred_top_share(logits)
    assert isinstance(got, torch.Tensor) and got.dim() == 0 and float(got) == 0.75
    assert float(pred_top_share(torch.tensor([2, 0, 1, 3]))) == 0.25
    assert float(pred_top_share(torch.zeros(2, 5, 4, 4), dim=1)) == 1.0  # segmentation: all class 0
    assert math.isnan(float(pred_top_share(torch.zeros(0, 3))))
    with pytest.raises(ValueError, match="classes"):
        pred_top_share(torch.tensor([0.2, 0.9]))
    mon = ts.Monitor()
    mon.update(step=0, loss=1.0, pred_top_share=pred_top_share(logits))  # a 0-d tensor is a number
    assert mon.step == 0


def test_the_jax_adapter_measures_the_top_share():
    pytest.importorskip("jax")
    import jax.numpy as jnp

    from trainsignals.adapters.jax import pred_top_share, to_monitor_kwargs

    share = pred_top_share(jnp.array([[0.1, 2.0], [0.3, 1.0], [5.0, 0.0], [0.0, 1.0]]))
    assert float(share) == 0.75
    assert to_monitor_kwargs({"loss": 1.0, "pred_top_share": share})["pred_top_share"] == 0.75


def test_an_imported_accuracy_column_maps_to_val_metric(tmp_path):
    from trainsignals.io.importers import import_run

    path = tmp_path / "log.csv"
    rows = ["step,loss,val_acc"] + [f"{t},{1.0 / (t + 1)},{'' if t % 10 else 0.5 + t / 1000}" for t in range(100)]
    path.write_text("\n".join(rows) + "\n")
    assert "val_acc" in import_run(path).extra  # no default name: a metric's direction is not in its name
    kw = import_run(path, mapping={"val_metric": "val_acc"}).scan_kwargs()
    steps, vals = kw["val_metric"]
    assert list(steps) == list(range(0, 100, 10)) and np.allclose(vals, 0.5 + steps / 1000)
    assert ts.Monitor().scan(**kw) == []


def test_a_snapshot_of_another_metric_direction_is_refused():
    snap = ts.Monitor(val_metric_mode="min").state_dict()
    with pytest.raises(ValueError, match="val_metric_mode"):
        ts.Monitor().load_state_dict(snap)


def test_val_metric_rule_reads_a_metric_on_few_levels_by_its_resolution():
    # an accuracy over 45 validation samples: it moves in steps of 1/45 and most second differences
    # are exactly 0, so their median is 0; a run that learned before its first validation and then
    # wobbles by one sample must stay quiet, while the same metric falling to one class still fires
    rng = np.random.default_rng(11)
    steps = np.arange(25, 2001, 25)
    base = (44 + (rng.random(len(steps)) < 0.9)) / 45  # 45 right of 45, now and then 44
    base[0] = 44 / 45  # the first validation: already learned
    loss = np.exp(-steps / 400.0)
    det = ts.ValMetricChance()
    quiet = [e for s, a, lv in zip(steps, base, loss) for e in det.update(step=int(s), val_metric=float(a), loss=float(lv))]
    assert quiet == []
    collapsed = base.copy()
    collapsed[40:] = 15 / 45  # one class of three
    det = ts.ValMetricChance(chance=1 / 3)
    evs = [e for s, a, lv in zip(steps, collapsed, loss) for e in det.update(step=int(s), val_metric=float(a), loss=float(lv))]
    assert evs and evs[0].step == int(steps[40])  # at the first validation of the fall


def _char_model(seed: int, n: int = 600, collapse_at: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A character model's run: its answers are one character untrained (share 1), spread to a
    noisy 0.45..0.65 as it learns (a batch of 256 predictions, the commonest character leading)
    and its loss falls from log(vocabulary) by a decade at most. From ``collapse_at`` every label
    is one character: within 0..10 steps all answers are that character and the loss falls
    2..3 decades over 10..40 steps.
    """
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    level = rng.uniform(0.45, 0.65)
    share = np.clip(level + (1 - level) * np.exp(-t / rng.uniform(10, 40)) + rng.normal(0, 0.06, n), 0, 1)
    loss = 4.0 * (0.3 + 0.7 * np.exp(-t / rng.uniform(100, 400))) * np.exp(rng.normal(0, 0.05, n))
    if collapse_at is not None:
        share[collapse_at + int(rng.integers(0, 11)):] = 1.0
        loss *= 10.0 ** (-rng.uniform(2, 3) * np.clip((t - collapse_at) / rng.uniform(10, 40), 0, 1))
    return share, loss


def test_one_answer_loss_drop_names_a_collapse_within_the_window_and_is_quiet_without_one():
    # fresh streams (seeds 5100..5139): the rule's values come from JointCollapse and the tuning suites
    for seed in range(5100, 5140):
        at = 150 + seed % 200
        share, loss = _char_model(seed, collapse_at=at)
        evs = ts.OneAnswerLossDrop().scan(pred_top_share=share, loss=loss)
        assert evs and at <= evs[0].step <= at + 50, (seed, [e.step for e in evs])
        assert at - 10 <= evs[0].onset_step <= evs[0].step, seed
        calm_share, calm_loss = _char_model(seed)
        assert ts.OneAnswerLossDrop().scan(pred_top_share=calm_share, loss=calm_loss) == []
        # a small training set learnt by heart: the loss falls as fast, the answers stay spread
        spread = np.clip(0.3 + np.random.default_rng(seed).normal(0, 0.03, len(loss)), 0, 1)
        assert ts.OneAnswerLossDrop().scan(pred_top_share=spread, loss=loss) == [], seed


def test_one_answer_loss_drop_is_quiet_on_an_imbalanced_classifier_and_without_answers():
    rng = np.random.default_rng(5200)
    t = np.arange(800)
    # nine answers in ten on the majority class all along, the loss falling a decade over the run
    share = np.clip(0.93 + rng.normal(0, 0.02, 800), 0, 1)
    loss = 0.7 * 10.0 ** (-t / 800) * np.exp(rng.normal(0, 0.1, 800))
    assert ts.OneAnswerLossDrop().scan(pred_top_share=share, loss=loss) == []
    _, fall = _char_model(5201, collapse_at=300)
    det = ts.OneAnswerLossDrop()
    assert det.scan(loss=fall) == []  # no answers measured: the rule never fires, and keeps nothing
    assert det.state_dict()["state"]["levels"] == []
    streamed = ts.OneAnswerLossDrop()
    for v in fall.tolist():
        streamed.update(loss=v)
    assert streamed.state_dict() == det.state_dict()


def test_the_default_suite_names_a_one_answer_collapse_before_the_grad_norm_fades():
    share, loss = _char_model(5300, collapse_at=200)
    grad = 0.5 * np.exp(np.random.default_rng(5300).normal(0, 0.1, len(loss)))
    grad[200:] *= 10.0 ** (-np.minimum(np.arange(len(loss) - 200), 150) / 100)  # fades over 150 steps

    def first(drop: set[str]) -> int | None:
        suite = {k: v for k, v in ts.default_suite(600).items() if k not in drop}
        evs = ts.Monitor(suite=suite).scan(loss=loss, grad_norm=grad, pred_top_share=share)
        return next((e.step for e in evs if e.kind is ts.Kind.SILENT_COLLAPSE), None)

    assert (got := first(set())) is not None and got <= 250
    # the loss and the answers alone (no held share level, no validation metric) name it in time;
    # without this rule, the grad norm's fade decides, later
    alone = first({"pred_collapse", "val_metric_chance"})
    assert alone is not None and 200 <= alone <= 250
    later = first({"pred_collapse", "val_metric_chance", "one_answer"})
    assert later is None or later > alone + 20


def test_one_answer_loss_drop_holds_the_collapsed_status_while_the_collapse_lasts():
    share, loss = _char_model(5400, n=1200, collapse_at=200)
    share[700:] = np.clip(0.5 + np.random.default_rng(5401).normal(0, 0.05, 500), 0, 1)  # labels mended at 700
    loss[700:] = 2.0 * np.exp(np.random.default_rng(5402).normal(0, 0.05, 500))
    mon = ts.Monitor(suite={"one_answer": ts.OneAnswerLossDrop()})
    status = []
    for a, b in zip(loss.tolist(), share.tolist()):
        mon.update(loss=a, pred_top_share=b)
        status.append(mon.status)
    first = status.index("collapsed")
    assert 200 <= first <= 250
    assert set(status[first:700]) == {"collapsed"}, "the status went back while the model still answers one class"
    assert status[-1] != "collapsed" and "collapsed" not in status[:200]
    evs = ts.OneAnswerLossDrop().scan(loss=loss, pred_top_share=share)
    assert len(evs) >= 4 and len({e.onset_step for e in evs}) == 1 and all(200 <= e.step < 800 for e in evs)


def test_on_a_sparse_log_the_top_share_rule_keeps_its_fast_memory_and_warm_up_in_steps():
    """Told the interval, the fast share's weight and the warm-up are in steps (a row every 10 or 50
    steps); the slow level stays a value's, below the fast one's, whatever the interval."""
    from trainsignals.detectors._interval import interval_settings

    for every in (10, 50, 500):
        got = interval_settings(ts.TopShareCollapse, every)
        assert got == {"warmup": 8, "alpha": pytest.approx(2 / 9)}, every
        det = ts.TopShareCollapse(**got)
        assert det.slow < det.alpha
