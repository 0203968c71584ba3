"""The Monitor: the classroom example, bad input, status, stopping, checkpoints, batch twin."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from test_scan_equivalence import close_events

import trainsignals as ts


def gd(lr: float, steps: int = 10) -> ts.Monitor:
    """Gradient descent on (w - 3)**2 from w = 10, loss recorded after each update."""
    mon, w = ts.Monitor(), 10.0
    for step in range(steps):
        grad = 2 * (w - 3)
        w -= lr * grad
        mon.update(step=step, loss=(w - 3) ** 2, grad_norm=abs(grad), lr=lr)
    return mon


@pytest.mark.parametrize("lr", [1.1, 1.05])
def test_classroom_divergence_flagged_within_five_steps(lr):
    mon = gd(lr)
    div = [e for e in mon.events if e.kind is ts.Kind.DIVERGENCE]
    assert div and div[0].step <= 4 and div[0].onset_step == 0
    assert div[0].severity == "critical" and mon.should_stop
    assert mon.status == "diverging"


@pytest.mark.parametrize("lr", [0.1, 0.4])
def test_classroom_healthy_rates_stay_quiet(lr):
    mon = gd(lr)
    assert [e for e in mon.events if e.severity != "info"] == []
    assert not mon.should_stop


def test_classroom_losses_match_the_reference():
    def losses(lr):
        w, out = 10.0, []
        for _ in range(6):
            w -= lr * 2 * (w - 3)
            out.append(round((w - 3) ** 2, 1))
        return out

    assert losses(0.1) == [31.4, 20.1, 12.8, 8.2, 5.3, 3.4]
    assert losses(1.1) == [70.6, 101.6, 146.3, 210.7, 303.4, 436.9]


def test_type_error_names_the_signal_and_records_nothing():
    mon = ts.Monitor()
    mon.update(loss=1.0, grad_norm=1.0)
    before = json.dumps(mon.state_dict())
    with pytest.raises(TypeError, match="loss"):
        mon.update(loss="x")
    with pytest.raises(TypeError, match="grad_norm"):
        mon.update(loss=1.0, grad_norm=[1, 2])
    with pytest.raises(TypeError, match="activations"):
        mon.update(loss=1.0, activations=3)
    with pytest.raises(TypeError, match="step"):
        mon.update(loss=1.0, step="3")
    assert json.dumps(mon.state_dict()) == before


def test_value_errors():
    mon = ts.Monitor()
    with pytest.raises(ValueError, match="grad_norm"):
        mon.update(loss=1.0, grad_norm=-1.0)
    with pytest.raises(ValueError, match="lr"):
        mon.update(lr=-0.1)
    mon.update(step=10, loss=1.0)
    with pytest.raises(ValueError, match="step"):
        mon.update(step=5, loss=1.0)


def test_accepts_numpy_scalars_0d_arrays_and_objects_with_float():
    class Tensorish:
        def __float__(self):
            return 0.5

    mon = ts.Monitor()
    mon.update(loss=np.float32(1.0), grad_norm=np.array(2.0), lr=Tensorish())
    mon.update(loss=1, grad_norm=np.float64(1.5))
    assert mon.step == 1
    mon.update(step=np.array(5), loss=1.0)  # a step as 0-d array, as the signals may be (a JAX or torch counter)
    mon.update(step=np.int32(6), loss=1.0)
    assert mon.step == 6
    for bad in (np.array(7.5), np.array([7]), True):
        with pytest.raises(TypeError, match="step must be an integer"):
            mon.update(step=bad, loss=1.0)
    for shape in (np.ones((2, 2)), 3.0):  # not one value per layer: refused, not flattened
        with pytest.raises(ValueError, match=r"layer_grad_norms must be one value per layer \(1-D\)"):
            mon.update(loss=1.0, layer_grad_norms=shape)
    assert mon.step == 6


def test_nonfinite_is_a_critical_event_and_statistics_are_untouched():
    mon = ts.Monitor()
    for t in range(50):
        mon.update(loss=2.0 - t * 0.01, grad_norm=1.0)
    snap = mon.state_dict()
    evs = mon.update(loss=float("nan"), grad_norm=float("inf"))
    kinds = [(e.kind, e.signal, e.severity) for e in evs]
    assert (ts.Kind.NONFINITE, "loss", "critical") in kinds
    assert (ts.Kind.NONFINITE, "grad_norm", "critical") in kinds
    assert mon.should_stop and mon.status == "diverging"
    after = mon.state_dict()
    for name in ("loss_spike", "early_climb", "trend_divergence", "lost_progress", "stall_grad_collapse",
                 "stall_frozen_updates", "stall_abrupt", "sawtooth", "edge_of_stability", "lr_edge_of_stability",
                 "grad_explosion", "grad_decoupling", "joint_collapse"):
        a, b = dict(snap["detectors"][name]["state"]), dict(after["detectors"][name]["state"])
        a.pop("last_step"), b.pop("last_step")
        assert a == b, name
    # a second NaN in a row is the same incident, not a new event
    assert mon.update(loss=float("nan")) == []


def test_stop_on_is_configurable():
    mon = ts.Monitor(stop_on=("nonfinite",))
    w = 10.0
    for step in range(10):
        w -= 1.1 * 2 * (w - 3)
        mon.update(step=step, loss=(w - 3) ** 2)
    assert any(e.kind is ts.Kind.DIVERGENCE for e in mon.events)
    assert not mon.should_stop
    mon.update(loss=float("inf"))
    assert mon.should_stop


def test_configuration_errors():
    with pytest.raises(TypeError, match="unknown"):
        ts.Monitor(bogus=1)
    with pytest.raises(ValueError, match="threshold"):
        ts.Monitor(loss_spike={"threshold": -1})
    with pytest.raises(ValueError, match="total_steps"):
        ts.Monitor(total_steps=0)
    with pytest.raises(ValueError, match="stop_on"):
        ts.Monitor(stop_on=("explosion",))
    with pytest.raises(ValueError, match=r"stop_on must be a sequence of kinds, e.g. \['divergence'\]"):
        ts.Monitor(stop_on="divergence")  # not read as the letters d, i, v, ...
    mon = ts.Monitor(total_steps=5000, sawtooth=False)
    assert "sawtooth" not in mon.detectors
    assert {mon.detectors[n].patience for n in mon.detectors if n.startswith("stall")} == {500}


def test_status_enters_and_leaves_failed_states():
    mon = ts.Monitor()
    assert mon.status == "warming_up"
    rng = np.random.default_rng(0)
    for t in range(100):
        mon.update(loss=2.0 * np.exp(-t / 200) * np.exp(rng.normal(0, 0.01)))
    assert mon.status == "healthy"
    for t in range(100, 180):
        mon.update(loss=1.2 * np.exp(0.5 if t % 2 else -0.5))
    assert mon.status == "oscillating"
    for t in range(180, 450):
        mon.update(loss=1.0 * np.exp(-(t - 180) / 200) * np.exp(rng.normal(0, 0.01)))
    assert mon.status == "healthy"


def run_curve(n: int = 1200, seed: int = 5) -> dict:
    """Every signal, with sparse validation, layers and activations, and several failures."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    loss = 2.5 * np.exp(-t / 300) * np.exp(rng.standard_t(5, n) * 0.03)
    loss[400] *= 5
    loss[900:] *= np.exp(0.05 * np.arange(n - 900))
    loss[1150] = np.nan
    grad = np.exp(rng.normal(0, 0.1, n))
    grad[600:700] *= 10.0 ** (-np.arange(100) / 30)
    lr = np.full(n, 1e-3)
    lr[800:] = 0.5
    ratio = 3e-4 * np.exp(rng.normal(0, 0.1, n))
    val_steps = np.arange(0, n, 50)
    val = 2.6 * np.exp(-val_steps / 300) + np.where(val_steps > 500, (val_steps - 500) / 400, 0)
    layers = {f"l{j}": np.exp(rng.normal(0, 0.2, n)) * 10.0 ** -j for j in range(4)}
    layers["l0"][700:] = 1e-9
    act_steps = np.arange(0, n, 10)
    dead = np.clip(0.2 + np.where(act_steps > 300, (act_steps - 300) / 200, 0), 0, 0.99)
    acts = {"relu1": {"dead_frac": dead, "saturation": np.zeros(len(act_steps))},
            "tanh2": {"dead_frac": np.zeros(len(act_steps)), "saturation": np.full(len(act_steps), 0.1)}}
    return {"step": t, "loss": loss, "grad_norm": grad, "lr": lr, "update_ratio": ratio,
            "val_loss": (val_steps, val), "layer_grad_norms": (t, layers), "activations": (act_steps, acts)}


def stream(sig: dict, mon: ts.Monitor, start: int = 0, stop: int | None = None) -> list[ts.Event]:
    vs, vv = sig["val_loss"]
    val = dict(zip(vs.tolist(), vv.tolist()))
    _, layers = sig["layer_grad_norms"]
    a_steps, acts = sig["activations"]
    act_at = {s: i for i, s in enumerate(a_steps.tolist())}
    out = []
    for t in sig["step"][start:stop].tolist():
        a = None
        if t in act_at:
            i = act_at[t]
            a = {name: {k: float(v[i]) for k, v in stats.items()} for name, stats in acts.items()}
        out += mon.update(step=t, loss=float(sig["loss"][t]), grad_norm=float(sig["grad_norm"][t]),
                          lr=float(sig["lr"][t]), update_ratio=float(sig["update_ratio"][t]),
                          val_loss=val.get(t), layer_grad_norms={k: float(v[t]) for k, v in layers.items()},
                          activations=a)
    return out


def test_monitor_scan_equals_streaming_with_every_signal():
    sig = run_curve()
    streamed = stream(sig, ts.Monitor(total_steps=1200))
    kinds = {e.kind for e in streamed}
    for k in (ts.Kind.LOSS_SPIKE, ts.Kind.DIVERGENCE, ts.Kind.NONFINITE, ts.Kind.LR_ANOMALY,
              ts.Kind.OVERFITTING, ts.Kind.VANISHING_GRADIENT, ts.Kind.DEAD_UNITS):
        assert k in kinds, k
    mon = ts.Monitor(total_steps=1200)
    batched = mon.scan(**sig)
    assert close_events(streamed, batched)
    ref = ts.Monitor(total_steps=1200)
    stream(sig, ref)
    assert ref.status == mon.status and ref.should_stop == mon.should_stop


def test_state_dict_resume_mid_run_gives_the_uninterrupted_events():
    sig = run_curve()
    whole = stream(sig, ts.Monitor(total_steps=1200))
    first = ts.Monitor(total_steps=1200)
    part = stream(sig, first, 0, 640)
    snap = json.loads(json.dumps(first.state_dict()))
    resumed = ts.Monitor(total_steps=1200)
    resumed.load_state_dict(snap)
    rest = stream(sig, resumed, 640)
    assert close_events(part + rest, whole)
    assert close_events(resumed.events, whole)


def test_load_state_dict_refuses_foreign_or_mismatched():
    mon = ts.Monitor()
    with pytest.raises(ValueError, match="Monitor"):
        mon.load_state_dict({"detector": "EWMAZSpike"})
    snap = ts.Monitor(total_steps=1000).state_dict()
    with pytest.raises(ValueError, match="config"):
        mon.load_state_dict(snap)
    snap = mon.state_dict()
    del snap["monitor"]["n_loss"]
    with pytest.raises(ValueError, match="n_loss"):
        mon.load_state_dict(snap)


@pytest.mark.parametrize("spoil", ["detector", "policy", "event"])
def test_a_refused_snapshot_changes_nothing(spoil):
    """A snapshot refused by its last detector, its policy or an event loads none of its parts."""
    mon = ts.Monitor()
    for i in range(100):
        mon.update(step=i, loss=1.0 - i / 1000)
    other = ts.Monitor()
    for i in range(300):
        other.update(step=i, loss=0.01 * (1 + i % 2))
    snap = json.loads(json.dumps(other.state_dict()))
    if spoil == "detector":
        last = list(snap["detectors"])[-1]
        del snap["detectors"][last]["state"][next(iter(snap["detectors"][last]["state"]))]
    elif spoil == "policy":
        snap["monitor"]["policy"]["hist"] = [["not a step", 0.0, 0.0]]
    else:
        snap["monitor"]["events"] = [{"kind": "no such kind"}]
    before = json.dumps(mon.state_dict())
    with pytest.raises((ValueError, KeyError, TypeError)):
        mon.load_state_dict(snap)
    assert json.dumps(mon.state_dict()) == before


def test_reset_summary_and_scan_function():
    sig = run_curve()
    mon = ts.Monitor()
    mon.scan(**sig)
    text = mon.summary()
    assert "divergence" in text and "status" in text and "fix:" in text
    mon.reset()
    assert mon.events == [] and mon.status == "warming_up" and mon.step == -1
    assert close_events(ts.scan(**sig), ts.Monitor().scan(**sig))


def test_memory_is_bounded_by_configuration_not_run_length():
    rng = np.random.default_rng(0)
    mon = ts.Monitor()
    sizes = []
    for _ in range(3):
        n = 20000
        mon.scan(loss=np.exp(rng.normal(0, 0.01, n)), grad_norm=np.exp(rng.normal(0, 0.1, n)))
        sizes.append(len(json.dumps({k: v for k, v in mon.state_dict()["detectors"].items()})))
    assert max(sizes) - min(sizes) < 2000


def test_import_pulls_in_no_framework():
    code = ("import sys, trainsignals; heavy = [m for m in ('torch', 'jax', 'keras', 'tensorflow', "
            "'matplotlib', 'pandas', 'pyarrow', 'river', 'statsmodels', 'rich') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_event_memory_is_bounded_and_counted():
    mon = ts.Monitor(max_events=5)
    for t in range(40):
        mon.update(step=t, loss=float("nan") if t % 2 else 1.0)
    assert mon.n_events == 20 and len(mon.events) == 5
    assert [e.step for e in mon.events] == [31, 33, 35, 37, 39]
    again = ts.Monitor(max_events=5)
    again.load_state_dict(json.loads(json.dumps(mon.state_dict())))
    assert again.n_events == 20 and [e.step for e in again.events] == [31, 33, 35, 37, 39]


def test_scan_accepts_lists_numpy_and_pyarrow_columns():
    import pyarrow as pa

    sig = run_curve()
    ref = ts.Monitor().scan(step=sig["step"], loss=sig["loss"], grad_norm=sig["grad_norm"])
    as_lists = ts.Monitor().scan(step=sig["step"].tolist(), loss=sig["loss"].tolist(),
                                 grad_norm=sig["grad_norm"].tolist())
    table = pa.table({"step": sig["step"], "loss": sig["loss"], "grad_norm": sig["grad_norm"]})
    as_arrow = ts.Monitor().scan(step=table["step"], loss=table["loss"], grad_norm=table["grad_norm"])
    assert ref and close_events(ref, as_lists) and close_events(ref, as_arrow)


def test_scan_rejects_bad_arrays():
    with pytest.raises(ValueError, match="equal lengths"):
        ts.Monitor().scan(loss=[1.0, 2.0], grad_norm=[1.0])
    with pytest.raises(TypeError, match="loss"):
        ts.Monitor().scan(loss=["a", "b"])
    with pytest.raises(ValueError, match="grad_norm"):
        ts.Monitor().scan(loss=[1.0, 2.0], grad_norm=[1.0, -1.0])
    with pytest.raises(ValueError, match="step"):
        ts.Monitor().scan(step=[3, 2], loss=[1.0, 2.0])


def test_gaps_in_dense_signals_mean_not_measured():
    import pyarrow as pa

    sig = run_curve()
    n = len(sig["step"])
    rng = np.random.default_rng(9)
    gaps = rng.random(n) < 0.3
    gaps[1150] = False  # keep the measured NaN
    loss = np.ma.masked_array(sig["loss"], mask=gaps)
    grad_gaps = rng.random(n) < 0.2
    # streaming: a gap is simply not passed
    mon = ts.Monitor()
    streamed = []
    for t in range(n):
        kw = {}
        if not gaps[t]:
            kw["loss"] = float(sig["loss"][t])
        if not grad_gaps[t]:
            kw["grad_norm"] = float(sig["grad_norm"][t])
        streamed += mon.update(step=t, **kw)
    grad = pa.array(np.where(grad_gaps, np.nan, sig["grad_norm"]), mask=grad_gaps)
    batched = ts.Monitor().scan(step=sig["step"], loss=loss, grad_norm=grad)
    assert close_events(streamed, batched)
    nonfinite = [e for e in batched if e.kind is ts.Kind.NONFINITE]
    assert [e.step for e in nonfinite] == [1150]


def test_a_loss_that_jumps_and_stays_up_is_critical():
    rng = np.random.default_rng(4)
    loss = 2.0 * np.exp(-np.arange(300) / 200) * np.exp(rng.normal(0, 0.02, 300))
    loss[150:] *= 500.0  # the network died: the loss stepped up and stayed there
    events = ts.Monitor().scan(loss=loss)
    assert events[0].kind is ts.Kind.LOSS_SPIKE and events[0].step == 150
    crit = [e for e in events if e.severity == "critical"]
    assert crit and crit[0].kind is ts.Kind.DIVERGENCE and abs(crit[0].onset_step - 150) <= 5
    assert crit[0].step <= 165
    # the level-shift rule sees it too; the Monitor reports the incident once (the first rule's event)
    assert len([e for e in events if e.kind is ts.Kind.DIVERGENCE]) == 1
    stayed = ts.LevelShift().scan(loss=loss)
    assert stayed and stayed[0].onset_step == 150 and "did not come back" in stayed[0].message


def test_scan_takes_a_table_of_columns():
    import pyarrow as pa

    sig = run_curve()
    vs, vv = sig["val_loss"]
    ref = ts.scan(step=sig["step"], loss=sig["loss"], grad_norm=sig["grad_norm"], lr=sig["lr"],
                  val_loss=(vs, vv))
    val_col = np.full(len(sig["step"]), np.nan)
    val_col[vs] = vv
    frame = {"step": sig["step"], "loss": sig["loss"], "grad_norm": sig["grad_norm"], "lr": sig["lr"],
             "val_loss": val_col, "epoch": np.zeros(len(sig["step"]))}
    assert close_events(ref, ts.scan(frame))
    table = pa.table({**frame, "val_loss": pa.array(val_col, mask=np.isnan(val_col))})
    assert close_events(ref, ts.scan(table))
    with pytest.raises(TypeError, match="data"):
        ts.scan(3)


def _frozen_run(seed: int, cut: float, onset: int = 400, n: int = 900) -> dict[str, np.ndarray]:
    """A run whose learning rate is multiplied by ``cut`` at ``onset``: the loss stops where it
    is, the grad norm stays in its minibatch band, and the update ratio falls with the lr."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    progress = np.where(t < onset, t, onset)
    if cut == 1.0:
        progress = t
    loss = 2.0 * np.exp(-progress / 300) * np.exp(rng.normal(0, 0.03, n))
    grad = 0.8 * np.exp(rng.normal(0, 0.1, n))
    lr = np.where(t < onset, 1e-2, 1e-2 * cut)
    ratio = 3e-4 * (lr / 1e-2) * np.exp(rng.normal(0, 0.1, n))
    return {"loss": loss, "grad_norm": grad, "lr": lr, "update_ratio": ratio}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_stall_is_told_from_convergence_by_the_update_ratio_or_the_lr(seed):
    onset = 400  # patience: 10 % of the planned 900 steps
    sigs = _frozen_run(seed, 1e-4, onset)

    def stalls(**given):
        return [e for e in ts.Monitor(total_steps=900).scan(**given) if e.kind is ts.Kind.STALL]

    no_lr = {k: v for k, v in sigs.items() if k != "lr"}
    found = stalls(**no_lr)
    assert found and onset < found[0].step <= onset + 300 and "update ratio" in found[0].message
    # the cut learning rate names the stall at once, with its cause, ratio or not
    for given in (sigs, {k: v for k, v in sigs.items() if k != "update_ratio"}):
        found = stalls(**given)
        assert found and found[0].step <= onset + 15 and found[0].onset_step == onset and "lr fell" in found[0].message
    # the same loss and grad norm alone: a converged run looks the same
    assert not stalls(loss=sigs["loss"], grad_norm=sigs["grad_norm"])
    # a run that keeps learning at its rate stays quiet
    healthy = _frozen_run(seed, 1.0, onset)
    assert [e for e in ts.Monitor(total_steps=900).scan(**healthy) if e.severity != "info"] == []
    # streaming gives the same stall
    mon = ts.Monitor(total_steps=900)
    streamed = [e for i in range(len(sigs["loss"])) for e in mon.update(**{k: float(v[i]) for k, v in sigs.items()})]
    assert [e for e in streamed if e.kind is ts.Kind.STALL][0].step == stalls(**sigs)[0].step


def test_each_default_detector_keeps_few_instance_attributes():
    # CPython keeps an instance's attributes in its fast layout only up to 29 of them (beyond,
    # every attribute access of the per-step code is a dict lookup); trackers keep their state
    # in slots to stay under it
    for name, det in ts.Monitor(total_steps=1000).detectors.items():
        assert len(vars(det)) <= 29, (name, len(vars(det)))


def _diverging_loss() -> np.ndarray:
    return np.r_[np.linspace(2.0, 1.0, 100), 1.0 * 1.2 ** np.arange(1, 30)]


def test_a_rewind_restores_the_snapshots_status_and_keeps_the_step():
    """A run rolled back to a snapshot taken while diverging is diverging again, at the step it had reached."""
    loss = _diverging_loss()
    mon = ts.Monitor()
    for t in range(110):
        mon.update(step=t, loss=float(loss[t]))
    snap, then = json.loads(json.dumps(mon.state_dict())), mon.status
    assert then == "diverging"
    for t in range(110, 600):
        mon.update(step=t, loss=1.0)
    assert mon.status != "diverging"
    mon.load_state_dict(snap, rewind=True)
    assert (mon.status, mon.step, mon.should_stop) == (then, 599, True)
    warm = ts.Monitor()
    warm.update(step=0, loss=1.0)
    early = json.loads(json.dumps(warm.state_dict()))
    for t in range(1, 300):
        warm.update(step=t, loss=1.0)
    warm.load_state_dict(early, rewind=True)
    assert warm.status == "warming_up"  # one loss seen, as in the snapshot


def test_the_summary_says_what_it_kept_and_keeps_notes_apart():
    mon = ts.Monitor(max_events=1)
    mon.scan(loss=_diverging_loss())
    n = mon.n_events
    assert n > 1
    head = mon.summary().splitlines()[0]
    assert f"{n} event(s) (the oldest {n - 1} not kept: max_events=1)" in head
    note = ts.make_event(ts.Kind.DIVERGENCE, "info", 5, 5, "mine", "loss", 1.0, 1.0, "rolled back")
    quiet = ts.Monitor()
    quiet.update(step=5, loss=1.0, events=[note])
    text = quiet.summary()
    assert "divergence" not in text and "and 1 info event(s): notes, not alarms" in text
