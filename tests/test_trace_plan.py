"""A trace a Monitor recorded replays with that Monitor's plan (``TraceWriter.plan``, ``monitor_plan``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import trainsignals as ts
from trainsignals.curves import generate
from trainsignals.io.report import default_monitor, replay
from trainsignals.io.traces import TraceWriter, read_trace, trace_metadata


def stalling(n: int, seed: int, flat_from: int) -> np.ndarray:
    """A loss that falls, then sits on a plateau from ``flat_from`` (noise only): a converged run."""
    rng = np.random.default_rng(seed)
    t = np.minimum(np.arange(n), flat_from)
    return (2.0 * np.exp(-t / 150) + 0.1) * np.exp(rng.normal(0, 0.01, n))


def dicts(events: list[ts.Event]) -> list[dict]:
    return [e.to_dict() for e in events]


@pytest.mark.parametrize("seed", [1, 2])
def test_a_run_stopped_early_replays_with_its_plan(tmp_path: Path, seed: int) -> None:
    path = tmp_path / "run.arrow"
    sig = generate("stall", seed=seed, difficulty="medium").signals()  # a stall, the run stopped at its end
    with TraceWriter(path) as w:
        live = ts.Monitor(total_steps=8000, recorder=w)  # planned 8000 steps: a stall patience of 800
        for x, g, lr in zip(sig["loss"], sig["grad_norm"], sig["lr"], strict=True):
            live.update(loss=float(x), grad_norm=float(g), lr=float(lr))
    plan = trace_metadata(read_trace(path))["metadata"]["monitor_plan"]
    assert (plan["total_steps"], plan["log_every"], plan["suite"], plan["settings"]) == (8000, 1, "default", {})
    rep = replay(path)
    assert dicts(rep.events) == dicts(live.events) and rep.final_status == live.status
    # planned by the trace's span instead (as before the plan was recorded), the stall rules judge another run
    span = replay(path, total_steps=len(sig["loss"]))
    assert [e.step for e in span.events if e.kind == ts.Kind.STALL] != [e.step for e in live.events
                                                                         if e.kind == ts.Kind.STALL]


def test_a_loss_fed_at_some_steps_replays_at_the_monitor_s_interval(tmp_path: Path) -> None:
    path = tmp_path / "sparse.arrow"
    loss = stalling(3000, 3, 900)
    with TraceWriter(path) as w:
        live = ts.Monitor(recorder=w)  # no plan: patience 200; the loss comes every 5th step
        for i, x in enumerate(loss):
            live.update(step=i, loss=float(x)) if i % 5 == 0 else live.update(step=i, grad_norm=1.0)
    mon, notes = default_monitor(read_trace(path))
    assert (mon.total_steps, mon.log_every, notes) == (None, 1, [])
    assert dicts(replay(path).events) == dicts(live.events)
    asked, notes = default_monitor(read_trace(path), log_every=5)
    assert asked.log_every == 5 and "as asked" in notes[0]


def test_a_writer_that_already_wrote_rows_keeps_no_plan(tmp_path: Path) -> None:
    path = tmp_path / "late.arrow"
    with TraceWriter(path, flush_every=1) as w:
        w.write(0, loss=1.0)
        with pytest.warns(UserWarning, match="its plan"):
            ts.Monitor(total_steps=100, recorder=w)
    assert "monitor_plan" not in trace_metadata(read_trace(path))["metadata"]


@pytest.mark.parametrize("plan", [{"total_steps": 0, "log_every": 1}, {"total_steps": 10, "log_every": "2"},
                                  {"total_steps": 1.5, "log_every": 1}, [100, 1]])
def test_a_malformed_plan_is_ignored(tmp_path: Path, plan: object) -> None:
    path = tmp_path / "odd.arrow"
    with TraceWriter(path, metadata={"monitor_plan": plan}) as w:
        for i in range(50):
            w.write(i, loss=1.0 / (i + 1))
    mon, _ = default_monitor(read_trace(path))
    assert (mon.total_steps, mon.log_every) == (50, 1)  # the span, as for any trace


def test_the_recording_monitor_s_settings_come_back(tmp_path: Path) -> None:
    path = tmp_path / "settings.arrow"
    with TraceWriter(path) as w:
        live = ts.Monitor(total_steps=900, val_metric_mode="min", warmup=5, recovery=50, stop_on=("divergence",),
                          loss_spike={"threshold": 9.0}, policy=ts.EventPolicy(escalate_after=2), recorder=w)
        for i in range(300):
            live.update(loss=1.0 + 0.01 * (i % 7), grad_norm=1.0)
    mon, notes = default_monitor(read_trace(path))
    assert mon.config() == live.config() and notes == []


def test_what_a_plan_cannot_rebuild_is_named(tmp_path: Path) -> None:
    path = tmp_path / "custom.arrow"
    with TraceWriter(path) as w:
        ts.Monitor(suite=ts.default_suite(), recorder=w).update(loss=1.0)
    _, notes = default_monitor(read_trace(path))
    assert "suite of its own" in notes[0]
    path = tmp_path / "numpy.arrow"  # NumPy numbers in the settings are kept as numbers
    with TraceWriter(path) as w:
        ts.Monitor(total_steps=100, loss_spike={"hold": np.int64(12)}, recorder=w).update(loss=1.0)
    mon, notes = default_monitor(read_trace(path))
    assert mon.detectors["loss_spike"].hold == 12 and notes == []


def test_replay_gives_back_the_findings_not_the_rules_events(tmp_path: Path) -> None:
    path = tmp_path / "found.arrow"
    sig = generate("divergence", seed=3, difficulty="easy").signals()
    note = ts.make_event(ts.Kind.NONFINITE, "info", 40, 40, "MyWatcher", "loss", 1.0, 0.0, "a step skipped")
    with TraceWriter(path) as w:
        live = ts.Monitor(total_steps=len(sig["loss"]), recorder=w)
        for i, (x, g) in enumerate(zip(sig["loss"], sig["grad_norm"], strict=True)):
            live.update(step=i, loss=float(x), grad_norm=float(g), events=[note] if i == 40 else None)
    assert {e.detector for e in live.events} - {"MyWatcher"}  # the default rules fired too
    one = ts.Monitor(suite={"trend": ts.TrendDivergence()})  # one rule replayed: the others' events stay out
    rep = replay(path, one)
    assert {e.detector for e in rep.events} <= {"TrendDivergence", "MyWatcher"}
    assert [e.to_dict() for e in rep.events if e.detector == "MyWatcher"] == [note.to_dict()]
