"""Traces: round trips, Monitor recording, crash safety, damage, bad input, bounded memory."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import trainsignals as ts
from trainsignals._events import make_event
from trainsignals.io.traces import (
    TRACE_SCHEMA_VERSION,
    TraceDamagedWarning,
    TraceFormatError,
    TraceWriter,
    read_trace,
    trace_events,
    trace_metadata,
    trace_schema,
    trace_signals,
    write_trace,
)
from trainsignals.testing import close_events  # noqa: F401 - other tests import them from here

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- helpers
def same(a: Any, b: Any) -> bool:
    """Equality where None is None, NaN matches NaN and lists compare element-wise."""
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b)
                and all(same(x, y) for x, y in zip(a, b)))
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


def dicts(events: list[ts.Event]) -> list[dict]:
    return [e.to_dict() for e in events]


def run_signals(n: int = 800, seed: int = 3) -> dict:
    """Every signal, failures included: a spike, a NaN, a vanishing layer, dying units, gaps."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    loss = 2.5 * np.exp(-t / 300) * np.exp(rng.standard_t(5, n) * 0.03)
    loss[300] *= 5
    loss[600] = np.nan
    loss_gap = rng.random(n) < 0.1
    loss_gap[600] = False
    grad = np.exp(rng.normal(0, 0.1, n))
    grad[500] = np.inf
    lr = np.full(n, 1e-3)
    ratio = 3e-4 * np.exp(rng.normal(0, 0.1, n))
    val_steps = np.arange(0, n, 40)
    val = 2.6 * np.exp(-val_steps / 300) + np.where(val_steps > 400, (val_steps - 400) / 300, 0)
    layer_steps = np.arange(0, n, 4)
    layers = {f"l{j}": np.exp(rng.normal(0, 0.2, len(layer_steps))) * 10.0 ** -j for j in range(3)}
    layers["l0"][layer_steps > 450] = 1e-9
    act_steps = np.arange(0, n, 10)
    dead = np.clip(0.2 + np.where(act_steps > 200, (act_steps - 200) / 150, 0), 0, 0.99)
    acts = {"relu1": {"dead_frac": dead, "saturation": np.zeros(len(act_steps))},
            "tanh2": {"dead_frac": np.zeros(len(act_steps)), "saturation": np.full(len(act_steps), 0.1)}}
    return {"step": t, "loss": loss, "loss_gap": loss_gap, "grad_norm": grad, "lr": lr, "update_ratio": ratio,
            "val_loss": (val_steps, val), "layer_grad_norms": (layer_steps, layers),
            "activations": (act_steps, acts)}


def feed_updates(mon: ts.Monitor, sig: dict) -> None:
    """Feed ``run_signals`` step by step, each sparse signal at its own steps."""
    val_at = dict(zip(sig["val_loss"][0].tolist(), sig["val_loss"][1].tolist()))
    lsteps, layers = sig["layer_grad_norms"]
    layer_at = {int(s): {k: float(v[i]) for k, v in layers.items()} for i, s in enumerate(lsteps)}
    asteps, acts = sig["activations"]
    act_at = {int(s): {k: {st: float(a[i]) for st, a in v.items()} for k, v in acts.items()}
              for i, s in enumerate(asteps)}
    for t in sig["step"].tolist():
        kw: dict[str, Any] = {"grad_norm": float(sig["grad_norm"][t]), "lr": float(sig["lr"][t]),
                              "update_ratio": float(sig["update_ratio"][t])}
        if not sig["loss_gap"][t]:
            kw["loss"] = float(sig["loss"][t])
        if t in val_at:
            kw["val_loss"] = val_at[t]
        if t in layer_at:
            kw["layer_grad_norms"] = layer_at[t]
        if t in act_at:
            kw["activations"] = act_at[t]
        mon.update(step=t, **kw)


def scan_kwargs(sig: dict) -> dict:
    kw = {k: sig[k] for k in ("step", "grad_norm", "lr", "update_ratio", "val_loss", "layer_grad_norms",
                              "activations")}
    kw["loss"] = np.ma.masked_array(sig["loss"], mask=sig["loss_gap"])
    return kw


def event(step: int, kind: ts.Kind = ts.Kind.LOSS_SPIKE, value: float = 2.0, layer: str | None = None) -> ts.Event:
    return make_event(kind, "warning", step, step - 1, "EWMAZSpike", "loss", value, 1.5, f"at {step}", layer=layer)


# --------------------------------------------------------------------------- round trips
def test_round_trip_every_column(tmp_path):
    p = tmp_path / "run.arrow"
    ev_nan = make_event(ts.Kind.NONFINITE, "critical", 2, 2, "NonFinite", "loss", math.nan, math.inf, "nan")
    ev_layer = make_event(ts.Kind.VANISHING_GRADIENT, "warning", 2, 1, "MedianGapGradCliff",
                          "layer_grad_norms[fc1]", -6.5, 3.0, "cliff", layer="fc1")
    meta = {"framework": "numpy", "model": "mlp", "config": {"lr": 0.1, "layers": [2, 3]}, "np": np.float32(0.5)}
    with TraceWriter(p, metadata=meta, flush_every=2) as w:
        assert isinstance(w, ts.Recorder)
        w.write(0, loss=2.0, grad_norm=1.0, lr=0.1, update_ratio=1e-3, val_loss=2.5,
                layer_grad_norms={"fc1": 0.5, "fc2": 0.25},
                activations={"relu1": {"dead_frac": 0.1, "saturation": 0.0}, "tanh2": {"dead_frac": 0.0,
                                                                                       "saturation": 0.3}},
                wall_time=1000.5)
        w.write(1, loss=math.inf, grad_norm=-math.inf, wall_time=1001.0)
        w.write(2, loss=math.nan, layer_grad_norms=[math.nan, 1e-12], events=[ev_nan, ev_layer.to_dict()])
        w.write(3, val_loss=1.5, activations={"relu1": {"dead_frac": 0.9}, "tanh2": {"dead_frac": 1.0}},
                events=[event(3, value=math.inf)])
        w.write(5)  # a row with nothing measured
    t = read_trace(p)
    assert t.schema.names == trace_schema().names
    assert t.schema.field("step").nullable is False and t.schema.field("events").nullable is False
    cols = {name: t.column(name).to_pylist() for name in t.schema.names}
    assert cols["step"] == [0, 1, 2, 3, 5]
    assert cols["wall_time"][:2] == [1000.5, 1001.0] and abs(cols["wall_time"][2] - time.time()) < 60
    assert same(cols["loss"], [2.0, math.inf, math.nan, None, None])
    assert same(cols["grad_norm"], [1.0, -math.inf, None, None, None])
    assert same(cols["lr"], [0.1, None, None, None, None])
    assert same(cols["update_ratio"], [1e-3, None, None, None, None])
    assert same(cols["val_loss"], [2.5, None, None, 1.5, None])
    assert same(cols["layer_grad_norms"], [[0.5, 0.25], None, [math.nan, 1e-12], None, None])
    assert same(cols["act_dead_frac"], [[0.1, 0.0], None, None, [0.9, 1.0], None])
    assert same(cols["act_saturation"], [[0.0, 0.3], None, None, None, None])  # not given at step 3: null
    assert [len(e) for e in cols["events"]] == [0, 0, 2, 1, 0]
    assert dicts(trace_events(t)) == dicts([ev_nan, ev_layer, event(3, value=math.inf)])
    info = trace_metadata(p)
    assert info == trace_metadata(t)
    assert info["format"] == "trace" and info["format_version"] == TRACE_SCHEMA_VERSION
    assert info["trainsignals_version"] == ts.__version__
    assert info["metadata"] == {"framework": "numpy", "model": "mlp", "config": {"lr": 0.1, "layers": [2, 3]},
                                "np": 0.5}
    assert info["layer_names"] == ["fc1", "fc2"] and info["act_layer_names"] == ["relu1", "tanh2"]
    raw = t.schema.metadata
    assert raw[b"trainsignals.format"] == b"trace" and raw[b"trainsignals.format_version"] == str(TRACE_SCHEMA_VERSION).encode()
    assert json.loads(raw[b"trainsignals.layer_names"]) == ["fc1", "fc2"]


def test_trace_signals_and_write_trace_round_trip(tmp_path):
    sig = run_signals(700)
    p = tmp_path / "a.arrow"
    kw = scan_kwargs(sig)
    n = write_trace(p, **kw, metadata={"source": "test"})
    assert n == 700
    t = read_trace(p)
    out = trace_signals(t)
    assert sorted(out) == ["activations", "grad_norm", "layer_grad_norms", "loss", "lr", "step", "update_ratio",
                           "val_loss"]
    assert isinstance(out["loss"], pa.Array) and out["loss"].null_count == sig["loss_gap"].sum()
    loss = out["loss"].to_numpy(zero_copy_only=False)
    keep = ~sig["loss_gap"]
    np.testing.assert_array_equal(loss[keep], sig["loss"][keep])  # NaN at 600 stays NaN (equal_nan)
    assert np.isnan(loss[600]) and out["loss"].is_valid()[600].as_py()
    np.testing.assert_array_equal(out["grad_norm"].to_numpy(), sig["grad_norm"])
    np.testing.assert_array_equal(out["val_loss"][0], sig["val_loss"][0])
    np.testing.assert_array_equal(out["val_loss"][1], sig["val_loss"][1])
    lsteps, layers = out["layer_grad_norms"]
    np.testing.assert_array_equal(lsteps, sig["layer_grad_norms"][0])
    assert list(layers) == ["l0", "l1", "l2"]
    for k in layers:
        np.testing.assert_array_equal(layers[k], sig["layer_grad_norms"][1][k])
    asteps, acts = out["activations"]
    np.testing.assert_array_equal(asteps, sig["activations"][0])
    for layer, stats in sig["activations"][1].items():
        for stat, arr in stats.items():
            np.testing.assert_array_equal(acts[layer][stat], arr)
    # the output of trace_signals writes the same trace back
    p2 = tmp_path / "b.arrow"
    write_trace(p2, **out, metadata=trace_metadata(t)["metadata"])
    t2 = read_trace(p2)
    for name in t.schema.names:
        if name != "wall_time":
            assert same(t.column(name).to_pylist(), t2.column(name).to_pylist()), name
    assert trace_metadata(t2)["metadata"] == {"source": "test"}


def test_write_trace_input_forms(tmp_path):
    p = tmp_path / "forms.arrow"
    steps = [0, 1, 2, 3]
    write_trace(
        p, step=np.array(steps, dtype=np.float64),
        loss=[1.0, None, math.nan, 0.5],
        grad_norm=np.ma.masked_array([1.0, 2.0, 3.0, math.inf], mask=[False, True, False, False]),
        lr=pa.array([0.1, None, 0.1, None], pa.float64()),
        update_ratio=pa.chunked_array([[1e-3, 2e-3], [None, 4e-3]]),
        val_loss=[None, None, 2.0, None],
        layer_grad_norms=[[1.0, 2.0], None, None, [3.0, 4.0]],
        activations={"r": {"dead_frac": [0.1, None, None, 0.2]}},
        events=[event(3), event(7)],  # an event at a step no signal has gets its own row
        wall_time=[10.0, 11.0, None, 13.0],
        layer_names=["a", "b"],
    )
    t = read_trace(p)
    c = {name: t.column(name).to_pylist() for name in t.schema.names}
    assert c["step"] == [0, 1, 2, 3, 7]
    assert same(c["loss"], [1.0, None, math.nan, 0.5, None])
    assert same(c["grad_norm"], [1.0, None, 3.0, math.inf, None])
    assert same(c["lr"], [0.1, None, 0.1, None, None])
    assert same(c["update_ratio"], [1e-3, 2e-3, None, 4e-3, None])
    assert same(c["val_loss"], [None, None, 2.0, None, None])
    assert same(c["layer_grad_norms"], [[1.0, 2.0], None, None, [3.0, 4.0], None])
    assert same(c["act_dead_frac"], [[0.1], None, None, [0.2], None])
    assert same(c["act_saturation"], [None] * 5)
    assert same(c["wall_time"], [10.0, 11.0, None, 13.0, None])
    assert [len(e) for e in c["events"]] == [0, 0, 0, 1, 1]
    assert trace_metadata(t)["layer_names"] == ["a", "b"] and trace_metadata(t)["act_layer_names"] == ["r"]
    # aligned mapping with a gap, 2-D arrays, duplicate steps matched in order
    p2 = tmp_path / "forms2.arrow"
    write_trace(p2, step=[0, 1, 1, 2], loss=[1.0, 2.0, 3.0, 4.0],
                layer_grad_norms={"x": np.ma.masked_array([1.0, 0, 2.0, 3.0], mask=[0, 1, 0, 0]),
                                  "y": [1.0, None, None, 3.0]},
                val_loss=(np.array([1, 1, 5]), np.array([9.0, 8.0, 7.0])))
    t2 = read_trace(p2)
    assert t2.column("step").to_pylist() == [0, 1, 1, 2, 5]
    assert same(t2.column("val_loss").to_pylist(), [None, 9.0, 8.0, None, 7.0])
    # a row partly measured stores NaN for the missing layers
    assert same(t2.column("layer_grad_norms").to_pylist(), [[1.0, 1.0], None, [2.0, math.nan], [3.0, 3.0], None])
    with pytest.raises(TypeError, match="loss"):
        write_trace(p, step=[0, 1], loss=["a", "b"])
    with pytest.raises(ValueError, match="grad_norm has 3 values for 2 steps"):
        write_trace(p, step=[0, 1], grad_norm=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="path"):
        write_trace(tmp_path / "no" / "x.arrow", step=[0])
    assert read_trace(p).num_rows == 5  # a failed write leaves the existing trace as it was
    assert not list(tmp_path.glob("*.tmp"))
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"step": [0, 1, 2], "loss": [1.0, math.nan, None]})
    write_trace(tmp_path / "pd.arrow", step=df["step"], loss=df["loss"])
    assert same(read_trace(tmp_path / "pd.arrow").column("loss").to_pylist(), [1.0, math.nan, math.nan])


def test_empty_trace(tmp_path):
    p = tmp_path / "empty.arrow"
    TraceWriter(p, layer_names=["a"]).close()
    t = read_trace(p)
    assert t.num_rows == 0 and t.schema.names == trace_schema().names
    assert trace_metadata(p)["layer_names"] == ["a"]
    out = trace_signals(t)
    assert out == {}  # no signal, so no step to align one with
    assert ts.Monitor().scan(**out) == [] and trace_events(t) == []
    assert write_trace(tmp_path / "copy.arrow", **out) == 0


# --------------------------------------------------------------------------- Monitor recording
def test_monitor_update_records_rows_and_events(tmp_path):
    sig = run_signals()
    p = tmp_path / "update.arrow"
    with TraceWriter(p, metadata={"how": "update"}, flush_every=64) as w:
        mon = ts.Monitor(recorder=w)
        feed_updates(mon, sig)
        assert w.buffered <= 64
    t = read_trace(p)
    assert t.num_rows == len(sig["step"])
    np.testing.assert_array_equal(t.column("step").to_numpy(), sig["step"])
    assert t.column("loss").null_count == sig["loss_gap"].sum()
    kinds = {e.kind for e in mon.events}
    assert {ts.Kind.NONFINITE, ts.Kind.VANISHING_GRADIENT, ts.Kind.DEAD_UNITS} <= kinds
    assert dicts(trace_events(t)) == dicts(mon.events)
    per_row = t.column("events").to_pylist()
    for s, evs in zip(t.column("step").to_pylist(), per_row):
        assert all(e["step"] == s for e in evs)
    assert trace_metadata(t)["layer_names"] == ["l0", "l1", "l2"]
    assert trace_metadata(t)["act_layer_names"] == ["relu1", "tanh2"]
    # replaying the trace with the batch path finds the same events
    assert close_events(ts.Monitor().scan(**trace_signals(t)), mon.events)


def test_monitor_scan_records_rows_and_events(tmp_path):
    sig = run_signals()
    kw = scan_kwargs(sig)
    # a validation step between the dense steps gets its own row
    kw["step"] = sig["step"] * 2
    kw["val_loss"] = (sig["val_loss"][0] * 2 + 1, sig["val_loss"][1])
    kw["layer_grad_norms"] = (sig["layer_grad_norms"][0] * 2, sig["layer_grad_norms"][1])
    kw["activations"] = (sig["activations"][0] * 2, sig["activations"][1])
    p = tmp_path / "scan.arrow"
    with TraceWriter(p, flush_every=100) as w:
        mon = ts.Monitor(recorder=w)
        events = mon.scan(**kw)
        assert w.buffered == 0 and w.batches_written >= 8
    t = read_trace(p)
    assert max(b.num_rows for b in t.to_batches()) <= 100
    steps = t.column("step").to_numpy()
    assert t.num_rows == len(sig["step"]) + len(sig["val_loss"][0])
    assert np.all(np.diff(steps) > 0)
    val = t.column("val_loss")
    np.testing.assert_array_equal(steps[val.is_valid().to_numpy(zero_copy_only=False)], kw["val_loss"][0])
    assert events and dicts(trace_events(t)) == dicts(mon.events) == dicts(events)
    assert t.column("loss").null_count == sig["loss_gap"].sum() + len(sig["val_loss"][0])
    assert close_events(ts.Monitor().scan(**trace_signals(t)), events)


def test_unnamed_layers_and_names_learned_after_first_flush(tmp_path):
    p = tmp_path / "late.arrow"
    with TraceWriter(p, flush_every=5) as w:
        mon = ts.Monitor(recorder=w)
        for s in range(12):
            mon.update(step=s, loss=1.0)
        assert w.batches_written == 2 and trace_metadata(p)["layer_names"] == []
        for s in range(12, 20):
            mon.update(step=s, loss=1.0, layer_grad_norms={"enc": 1.0, "dec": 2.0},
                       activations={"relu": {"dead_frac": 0.1, "saturation": 0.2}})
    t = read_trace(p)
    assert t.column("step").to_pylist() == list(range(20))
    assert trace_metadata(t)["layer_names"] == ["enc", "dec"]
    assert trace_metadata(t)["act_layer_names"] == ["relu"]
    assert t.column("layer_grad_norms").null_count == 12
    assert not list(tmp_path.glob("*.tmp"))
    # unnamed vectors take the writer's names
    q = tmp_path / "named.arrow"
    with TraceWriter(q, layer_names=["a", "b", "c"]) as w:
        mon = ts.Monitor(recorder=w)
        mon.update(step=0, loss=1.0, layer_grad_norms=np.array([1.0, 2.0, 3.0]))
        w.write(1, layer_grad_norms=[4.0, 5.0, 6.0])
    assert trace_signals(q)["layer_grad_norms"][1]["c"].tolist() == [3.0, 6.0]


def test_layer_change_raises_and_records_nothing(tmp_path):
    with TraceWriter(tmp_path / "x.arrow", flush_every=10) as w:
        w.write(0, layer_grad_norms={"fc1": 1.0, "fc2": 2.0})
        with pytest.raises(ValueError, match=r"layers changed.*'fc1', 'fc2'.*'fc1', 'fc3'"):
            w.write(1, loss=1.0, layer_grad_norms={"fc1": 1.0, "fc3": 2.0})
        with pytest.raises(ValueError, match="layers changed"):
            w.write(1, layer_grad_norms=[1.0, 2.0, 3.0])
        w.write(1, activations={"relu": {"dead_frac": 0.5}})
        with pytest.raises(ValueError, match=r"activations layers changed.*'relu'.*'gelu'"):
            w.write(2, activations={"gelu": {"dead_frac": 0.5}})
        with pytest.raises(ValueError, match="layers changed"):
            w.record_batch(steps=np.arange(2, 4), signals={}, val_loss=None,
                           layer_grad_norms=(np.arange(2, 4), np.ones((2, 2)), ("a", "b")),
                           activations=None, events=[])
        assert w.buffered == 2
    assert read_trace(tmp_path / "x.arrow").column("step").to_pylist() == [0, 1]
    with TraceWriter(tmp_path / "y.arrow", layer_names=["a", "b"]) as w:
        with pytest.raises(ValueError, match="'a', 'b'"):
            w.write(0, layer_grad_norms={"b": 1.0, "a": 1.0})


# --------------------------------------------------------------------------- crash safety
CHILD = r"""
import sys
from trainsignals.io.traces import TraceWriter
w = TraceWriter(sys.argv[1], flush_every=10, metadata={"run": "crash"})
seen = i = 0
while True:
    w.write(i, loss=1.0 / (i + 1), grad_norm=float(i), layer_grad_norms=[float(i), 2.0 * i])
    i += 1
    if w.batches_written != seen:
        seen = w.batches_written
        print(f"flushed {seen}", flush=True)
"""


def test_sigkill_mid_run_leaves_flushed_records(tmp_path):
    p = tmp_path / "crash.arrow"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(p)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    flushed = 0
    try:
        deadline = time.monotonic() + 60
        assert proc.stdout is not None
        while flushed < 20 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            flushed = int(line.split()[1])
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert flushed >= 20, proc.stderr.read() if proc.stderr else ""
    assert proc.returncode == -signal.SIGKILL
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceDamagedWarning)  # killed mid-flush: allowed
        t = read_trace(p)
    n = t.num_rows
    assert n >= 10 * flushed and n % 10 == 0
    steps = np.arange(n)
    np.testing.assert_array_equal(t.column("step").to_numpy(), steps)
    np.testing.assert_array_equal(t.column("loss").to_numpy(), 1.0 / (steps + 1))
    np.testing.assert_array_equal(t.column("grad_norm").to_numpy(), steps.astype(float))
    assert t.column("layer_grad_norms").to_pylist()[-1] == [n - 1.0, 2.0 * (n - 1)]
    assert trace_metadata(p)["metadata"] == {"run": "crash"}


def batch_ends(path: Path, rows: int, flush_every: int) -> tuple[int, list[tuple[int, int]]]:
    """Write a trace row by row; returns the schema's end and (file size, rows) after each batch."""
    ends = []
    with TraceWriter(path, flush_every=flush_every, layer_names=["a", "b"]) as w:
        w.flush()
        schema_end = path.stat().st_size
        for s in range(rows):
            w.write(s, loss=float(s), layer_grad_norms=[1.0, float(s)],
                    events=[event(s)] if s % 7 == 0 else ())
            if w.buffered == 0:
                ends.append((path.stat().st_size, w.rows_written))
    return schema_end, ends


def test_truncated_file_reads_up_to_the_damage(tmp_path):
    p = tmp_path / "full.arrow"
    schema_end, ends = batch_ends(p, 50, 10)
    data = p.read_bytes()
    assert len(data) == ends[-1][0] + 8  # the end-of-stream marker
    q = tmp_path / "cut.arrow"
    starts = [(schema_end, 0)] + ends
    for (lo, rows), (hi, _) in zip(starts, starts[1:]):
        for cut in (lo + 1, lo + 5, (lo + hi) // 2, hi - 1):
            q.write_bytes(data[:cut])
            with pytest.warns(TraceDamagedWarning, match=f"recovered {rows} records") as rec:
                t = read_trace(q)
            w = rec[0].message
            assert isinstance(w, TraceDamagedWarning) and w.rows == rows and w.offset == lo
            assert t.num_rows == rows and t.column("step").to_pylist() == list(range(rows))
        q.write_bytes(data[:lo])  # cut exactly after a batch: a run killed between flushes
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert read_trace(q).num_rows == rows
    q.write_bytes(data[:-3])  # inside the end-of-stream marker
    with pytest.warns(TraceDamagedWarning, match="recovered 50 records"):
        assert read_trace(q).num_rows == 50
    for cut in (1, 4, 9, 100, 300):  # inside the schema: nothing to recover
        q.write_bytes(data[:cut])
        with pytest.raises(TraceFormatError, match="cut.arrow"):
            read_trace(q)


def test_corrupted_bytes_never_crash(tmp_path):
    p = tmp_path / "full.arrow"
    batch_ends(p, 60, 10)
    data = p.read_bytes()
    rng = np.random.default_rng(0)
    q = tmp_path / "bad.arrow"
    outcomes = set()
    for _ in range(150):
        buf = bytearray(data)
        for i in rng.integers(0, len(buf), 3):
            buf[int(i)] = int(rng.integers(0, 256))
        q.write_bytes(bytes(buf))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                t = read_trace(q)
            except TraceFormatError as exc:
                assert "bad.arrow" in str(exc)
                outcomes.add("format")
                continue
        trace_signals(t)
        trace_events(t)
        assert t.num_rows <= 60 and t.num_rows % 10 == 0
        if caught:
            assert all(issubclass(w.category, TraceDamagedWarning) for w in caught)
            outcomes.add("damaged")
    assert "damaged" in outcomes


def test_not_a_trace_raises_format_error(tmp_path):
    rng = np.random.default_rng(1)
    garbage = tmp_path / "garbage.arrow"
    garbage.write_bytes(rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())
    csv = tmp_path / "metrics.csv"
    csv.write_text("step,loss,grad_norm\n0,2.3,1.0\n1,2.1,0.9\n")
    other = tmp_path / "other.arrow"
    tbl = pa.table({"step": [0, 1], "loss": [1.0, 2.0]})
    with pa.ipc.new_stream(str(other), tbl.schema) as sw:
        sw.write_table(tbl)
    arrow_file = tmp_path / "file_format.arrow"
    with pa.ipc.new_file(str(arrow_file), tbl.schema) as fw:
        fw.write_table(tbl)
    empty = tmp_path / "empty.arrow"
    empty.write_bytes(b"")
    ffff = tmp_path / "ffff.arrow"
    ffff.write_bytes(b"\xff" * 64)
    for path, hint in ((garbage, "not an Arrow IPC stream"), (csv, "not an Arrow IPC stream"),
                       (other, "not a trainsignals trace"), (arrow_file, "Arrow IPC \\*file\\*"),
                       (empty, "empty"), (ffff, "not an Arrow IPC stream")):
        with pytest.raises(TraceFormatError, match=hint) as info:
            read_trace(path)
        assert str(path) in str(info.value)
        assert "Traceback" not in str(info.value)
        with pytest.raises(TraceFormatError):
            trace_metadata(path)
    newer = tmp_path / "newer.arrow"
    schema = trace_schema().with_metadata({**trace_schema().metadata, b"trainsignals.format_version": b"99"})
    pa.ipc.new_stream(str(newer), schema).close()
    with pytest.raises(TraceFormatError, match="format version 99"):
        read_trace(newer)
    with pytest.raises(FileNotFoundError):
        read_trace(tmp_path / "missing.arrow")


# --------------------------------------------------------------------------- memory and config
def test_memory_bounded(tmp_path):
    p = tmp_path / "long.arrow"
    vec = np.linspace(0.1, 1.0, 50)
    with TraceWriter(p, flush_every=50) as w:
        peak = 0
        for s in range(1000):
            w.write(s, loss=1.0, grad_norm=1.0, lr=1e-3, layer_grad_norms=vec)
            peak = max(peak, w.buffered)
        base = pa.total_allocated_bytes()
        for s in range(1000, 6000):
            w.record(step=s, signals={"loss": 1.0}, layer_grad_norms=(vec, w.layer_names), activations=None,
                     events=())
            peak = max(peak, w.buffered)
        grown = pa.total_allocated_bytes() - base
        with pytest.warns(UserWarning, match="its plan"):  # attached after 6000 rows: no plan in the trace
            mon = ts.Monitor(recorder=w)
        mon.scan(step=np.arange(6000, 9000), loss=np.ones(3000), grad_norm=np.ones(3000))
        assert w.buffered == 0
    assert peak <= 50 and grown < 1 << 20
    t = read_trace(p)
    assert t.num_rows == 9000 and max(b.num_rows for b in t.to_batches()) == 50


def test_bad_configuration_names_the_parameter(tmp_path):
    for bad, match in (((), "path"), ((123,), "path"), ((tmp_path,), "path .* is a folder"),
                       ((tmp_path / "no" / "such" / "x.arrow",), "path .* does not exist"),
                       (("",), "path")):
        with pytest.raises(ValueError, match=match):
            TraceWriter(*bad) if bad else TraceWriter(None)  # type: ignore[arg-type]
    for fe in (0, -5, 1.5, True, "10"):
        with pytest.raises(ValueError, match="flush_every"):
            TraceWriter(tmp_path / "x.arrow", flush_every=fe)
    with pytest.raises(ValueError, match="metadata"):
        TraceWriter(tmp_path / "x.arrow", metadata=["not", "a", "mapping"])  # type: ignore[arg-type]
    loop: dict = {}
    loop["self"] = loop
    with pytest.raises(ValueError, match="metadata must be JSON-serialisable"):
        TraceWriter(tmp_path / "x.arrow", metadata=loop)
    with pytest.raises(ValueError, match="layer_names"):
        TraceWriter(tmp_path / "x.arrow", layer_names="fc1")
    with pytest.raises(ValueError, match="act_layer_names"):
        TraceWriter(tmp_path / "x.arrow", act_layer_names=["a", "a"])
    w = TraceWriter(tmp_path / "x.arrow")
    with pytest.raises(TypeError, match="grad_norm"):
        w.write(0, grad_norm="big")
    with pytest.raises(TypeError, match="step"):
        w.write(1.5)
    with pytest.raises(TypeError, match="update_ratio"):
        w.record(step=0, signals={"loss": 1, "update_ratio": "x"}, layer_grad_norms=None, activations=None,
                 events=())
    assert w.buffered == 0
    w.record(step=0, signals={"loss": np.float32(2.0), "lr": 1}, layer_grad_norms=None, activations=None, events=())
    w.close()
    assert read_trace(tmp_path / "x.arrow").column("lr").to_pylist() == [1.0]
    w.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        w.write(0, loss=1.0)
    with pytest.raises(ValueError, match="closed"):
        w.record(step=0, signals={"loss": 1.0}, layer_grad_norms=None, activations=None, events=())
    with pytest.raises(ValueError, match="closed"):
        ts.Monitor(recorder=w).update(loss=1.0)


def test_rows_survive_an_exception_in_the_with_block(tmp_path):
    p = tmp_path / "exc.arrow"
    with pytest.raises(RuntimeError):
        with TraceWriter(p, flush_every=1000, fsync=True) as w:
            for s in range(5):
                w.write(s, loss=float(s))
            raise RuntimeError("training crashed")
    assert read_trace(p).column("loss").to_pylist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_import_trainsignals_does_not_import_pyarrow():
    code = "import sys, trainsignals; assert 'pyarrow' not in sys.modules, 'pyarrow imported'"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)


def test_public_names_are_served_lazily_from_the_package():
    import trainsignals as ts
    from trainsignals.io import report as report_module
    from trainsignals.io import traces as traces_module

    assert ts.TraceWriter is traces_module.TraceWriter
    assert ts.read_trace is traces_module.read_trace
    assert ts.replay is report_module.replay and ts.Report is report_module.Report
    with pytest.raises(AttributeError):
        ts.no_such_name  # noqa: B018


@pytest.mark.parametrize(("version", "missing"), [(1, ("healthy_rate", "heldout_rate")), (2, ("heldout_rate",))])
def test_older_traces_without_the_event_rates_are_read(tmp_path, version, missing):
    """A trace written before events carried ``healthy_rate`` (format 1) or ``heldout_rate`` (format 2)
    still reads, those rates None."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    from trainsignals.io import traces

    p = tmp_path / "new.arrow"
    ev = ts.Event(ts.Kind.STALL, "warning", 1, 0, "d", "loss", 1.0, 0.5, "m", "c", "f", healthy_rate=0.2,
                  heldout_rate=0.5)
    write_trace(p, step=[0, 1], loss=[1.0, 1.0], events=[ev])
    t = read_trace(p)
    assert trace_events(t) == [ev]
    # rebuild the same table as that format wrote it: the event struct without the missing fields
    old_struct = pa.struct([f for f in traces.EVENT_TYPE if f.name not in missing])
    ev_col = t.column("events").combine_chunks()
    flat = ev_col.flatten()
    child = pa.StructArray.from_arrays([flat.field(f.name) for f in old_struct], fields=list(old_struct))
    old_events = pa.ListArray.from_arrays(ev_col.offsets, child, type=pa.list_(old_struct))
    meta = dict(t.schema.metadata)
    meta[b"trainsignals.format_version"] = str(version).encode()
    i = t.schema.get_field_index("events")
    old = t.set_column(i, pa.field("events", old_events.type, nullable=False), old_events).replace_schema_metadata(meta)
    q = tmp_path / "old.arrow"
    with ipc.new_stream(str(q), old.schema) as w:
        w.write_table(old)
    got = trace_events(read_trace(q))
    assert [tuple(getattr(e, m) for m in missing) for e in got] == [(None,) * len(missing)]
    assert got[0].to_dict() | {m: getattr(ev, m) for m in missing} == ev.to_dict()


@pytest.mark.parametrize("damage", [b"null", b"[]", b"7", b'{"a": 1}', b"[1, 2]", b"{"])
def test_damaged_metadata_fields_read_as_empty(tmp_path, damage):
    """Another writer's trace whose metadata fields hold JSON of the wrong type (found by fuzzing the
    reader: ``layer_names`` null raised ``TypeError`` from ``trace_metadata`` and ``replay``) reads them
    as empty, as it already read fields that are not JSON."""
    import pyarrow.ipc as ipc

    from trainsignals.io.report import replay_source

    path = tmp_path / "run.arrow"
    write_trace(path, step=np.arange(30), loss=np.exp(-np.arange(30) / 10.0), grad_norm=np.ones(30))
    table = ipc.open_stream(pa.OSFile(str(path)).read_buffer()).read_all()
    meta = dict(table.schema.metadata)
    for key in (b"trainsignals.metadata", b"trainsignals.layer_names", b"trainsignals.act_layer_names"):
        meta[key] = damage
    with ipc.new_stream(str(path), table.schema.with_metadata(meta)) as w:
        w.write_table(table.replace_schema_metadata(meta))
    got = trace_metadata(path)
    assert got["layer_names"] == [] and got["act_layer_names"] == []
    assert got["metadata"] == ({"a": 1} if damage == b'{"a": 1}' else {})
    rep = replay_source(path)
    assert rep.error is None and rep.steps == 30


# ------------------------------------------------------------------ a trace without a dense signal
def test_a_trace_with_only_a_validation_loss_replays_and_copies(tmp_path):
    """``step`` goes with the signals aligned with it: a trace holding only ``val_loss`` (its own
    (steps, values) pair) must not hand ``scan`` a ``step`` with no signal beside it."""
    p = tmp_path / "val.arrow"
    steps = np.arange(0, 6000, 100)
    val = np.r_[np.linspace(1.0, 0.6, 50), [np.nan] * 10]
    assert write_trace(p, step=steps, val_loss=(steps, val)) == 60
    out = trace_signals(p)
    assert sorted(out) == ["val_loss"]
    np.testing.assert_array_equal(out["val_loss"][0], steps)
    events = ts.Monitor().scan(**out)
    assert [(e.kind.value, e.step, e.signal) for e in events if e.kind.value == "nonfinite"] == [
        ("nonfinite", 5000, "val_loss")]
    copy = tmp_path / "copy.arrow"  # write_trace(p, **trace_signals(t)) copies it without a step=
    assert write_trace(copy, **out) == 60
    assert read_trace(copy).column("val_loss").to_pylist()[:2] == [1.0, pytest.approx(val[1])]
    with pytest.raises(ValueError, match="loss is aligned with step, which is missing: give step="):
        write_trace(tmp_path / "bad.arrow", loss=[1.0, 2.0])


# ----------------------------------------------------------------------------- file permissions
@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_written_traces_get_the_permissions_open_gives(tmp_path):
    """Written beside the target and renamed: the file gets 0o666 less the umask (not mkstemp's
    0o600), and a file it replaces keeps its permissions."""
    import stat

    def mode(p: Path) -> int:
        return stat.S_IMODE(p.stat().st_mode)

    old = os.umask(0o027)
    try:
        new = tmp_path / "new.arrow"
        write_trace(new, step=[0, 1], loss=[1.0, 0.5])
        assert mode(new) == 0o640
        new.chmod(0o604)
        write_trace(new, step=[0, 1, 2], loss=[1.0, 0.5, 0.2])
        assert mode(new) == 0o604 and read_trace(new).num_rows == 3
        # TraceWriter rewrites its file when it learns layer names after the first flush
        live = tmp_path / "live.arrow"
        with TraceWriter(live, flush_every=1) as w:
            w.write(0, loss=1.0)
            w.flush()
            w.write(1, loss=0.9, layer_grad_norms={"fc": 1.0})
        assert trace_metadata(live)["layer_names"] == ["fc"] and mode(live) == 0o640
        assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []
    finally:
        os.umask(old)
