"""Traces carry the per-layer update ratios (``layer_update_ratios``) with nothing lost.

A live Monitor recording into a TraceWriter and the replay of its trace see the same events
(the frozen layer's ``update_ratio_low`` included); ``update``, ``scan`` and ``write_trace`` round
trip the ratios exactly; traces written before the column existed still read and replay; ratios
over other layers than the trace's are refused with a ``ValueError`` naming the column.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import trainsignals as ts
from trainsignals.cli.traces import TraceTail
from trainsignals.io.traces import (
    TraceFormatError,
    TraceWriter,
    read_trace,
    trace_events,
    trace_metadata,
    trace_schema,
    trace_signals,
    write_trace,
)

LAYERS = ("embed", "block1", "block2", "head")
RATIO_KINDS = (ts.Kind.UPDATE_RATIO_LOW, ts.Kind.UPDATE_RATIO_HIGH)


def run(n: int = 600, *, frozen: str | None = None, freeze_at: int = 0, seed: int = 0) -> dict[str, Any]:
    """A run whose layers learn at 1e-3..3e-4 a step; from ``freeze_at`` the layer ``frozen`` gets
    no update at all (its ratio is exactly 0, as with a parameter group left at lr=0) while its
    gradients keep flowing. Grad norms every 4 steps, update ratios every step."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    loss = 2.0 * np.exp(-t / 400) + 0.3 + 0.02 * rng.standard_normal(n)
    levels = np.array([1e-3, 6e-4, 4e-4, 3e-4])
    ratios = levels * np.exp(0.15 * rng.standard_normal((n, len(LAYERS))))
    if frozen is not None:
        ratios[freeze_at:, LAYERS.index(frozen)] = 0.0
    gsteps = t[::4]
    grads = np.array([0.5, 0.3, 0.2, 0.1]) * np.exp(0.1 * rng.standard_normal((len(gsteps), len(LAYERS))))
    return {"step": t, "loss": loss, "grad_norm": 1.0 + 0.05 * rng.random(n), "lr": np.full(n, 1e-3),
            "update_ratio": np.median(ratios, axis=1) + 1e-4,
            "layer_grad_norms": (gsteps, {k: grads[:, j] for j, k in enumerate(LAYERS)}),
            "layer_update_ratios": (t, {k: ratios[:, j] for j, k in enumerate(LAYERS)})}


def feed_live(mon: ts.Monitor, sig: dict[str, Any]) -> list[ts.Event]:
    """The run fed step by step, as an adapter does (without update ratios if ``sig`` has none)."""
    gsteps, grads = sig["layer_grad_norms"]
    g_at = {int(s): {k: float(v[i]) for k, v in grads.items()} for i, s in enumerate(gsteps)}
    ratios = sig["layer_update_ratios"][1] if "layer_update_ratios" in sig else None
    out: list[ts.Event] = []
    for i, s in enumerate(sig["step"].tolist()):
        kw: dict[str, Any] = {k: float(sig[k][i]) for k in ("loss", "grad_norm", "lr", "update_ratio")}
        if s in g_at:
            kw["layer_grad_norms"] = g_at[s]
        if ratios is not None:
            kw["layer_update_ratios"] = {k: float(v[i]) for k, v in ratios.items()}
        out += mon.update(step=s, **kw)
    return out


def dicts(events: list[ts.Event]) -> list[dict[str, Any]]:
    return [e.to_dict() for e in events]


def ratio_matrix(sig: dict[str, Any]) -> np.ndarray:
    return np.column_stack([sig["layer_update_ratios"][1][k] for k in LAYERS])


def write_old_trace(src: Any, dst: Any) -> None:
    """``dst``: the trace ``src`` as a writer that predates ``layer_update_ratios`` wrote it (the same
    schema and metadata without that column)."""
    t = read_trace(src)
    i = t.schema.get_field_index("layer_update_ratios")
    old = t.remove_column(i)
    assert old.schema.metadata == t.schema.metadata
    with pa.ipc.new_stream(str(dst), old.schema) as w:
        for batch in old.to_batches(max_chunksize=97):
            w.write_batch(batch)


# ------------------------------------------------------------------------------ live run -> replay
@pytest.mark.parametrize("frozen,freeze_at", [("block1", 300), ("head", 120), (None, 0)])
def test_live_run_recorded_and_replayed_gives_the_same_events(tmp_path, frozen, freeze_at):
    sig = run(frozen=frozen, freeze_at=freeze_at, seed=freeze_at)
    p = tmp_path / "live.arrow"
    with TraceWriter(p, metadata={"model": "toy"}, flush_every=64) as w:
        mon = ts.Monitor(recorder=w)
        live = feed_live(mon, sig)
    t = read_trace(p)
    assert "layer_update_ratios" in t.column_names
    assert trace_metadata(t)["layer_names"] == list(LAYERS)
    # the ratios as fed, bit for bit, one row per step
    got = np.array(t.column("layer_update_ratios").to_pylist())
    np.testing.assert_array_equal(got, ratio_matrix(sig))
    assert dicts(trace_events(t)) == dicts(live)
    replayed = ts.Monitor().scan(**trace_signals(t))
    assert dicts(replayed) == dicts(live)
    low = [e for e in live if e.kind == ts.Kind.UPDATE_RATIO_LOW]
    if frozen is None:  # a healthy run: no layer flagged
        assert [e for e in live if e.kind in RATIO_KINDS] == []
    else:  # the frozen layer, caught within 5 steps, its onset before the freeze
        assert len(low) == 1
        assert low[0].layer == frozen and low[0].signal == f"layer_update_ratios[{frozen}]"
        assert freeze_at <= low[0].step <= freeze_at + 5
        assert low[0].onset_step < freeze_at
        assert [e for e in live if e.kind == ts.Kind.UPDATE_RATIO_HIGH] == []


# ------------------------------------------------------------------------------ round trips
def test_write_round_trip_every_input_form(tmp_path):
    p = tmp_path / "w.arrow"
    with TraceWriter(p, flush_every=3) as w:
        w.write(0, loss=1.0, layer_grad_norms={"a": 1.0, "b": 2.0}, layer_update_ratios={"a": 1e-3, "b": 2e-3})
        w.write(1, layer_update_ratios=[math.nan, 0.0])  # a sequence, in the trace's order
        w.write(2, loss=0.9)  # not measured at this step
        w.write(3, layer_update_ratios=np.array([math.inf, 5e-4]))  # the fast path: a vector
        w.write(4, layer_grad_norms=[3.0, 4.0], layer_update_ratios=(1e-9, 2e-9))
    t = read_trace(p)
    assert t.schema.names == trace_schema().names
    assert t.schema.field("layer_update_ratios").type == pa.list_(pa.float64())
    rows = t.column("layer_update_ratios").to_pylist()
    assert rows[2] is None and rows[0] == [1e-3, 2e-3] and rows[3:] == [[math.inf, 5e-4], [1e-9, 2e-9]]
    assert math.isnan(rows[1][0]) and rows[1][1] == 0.0
    assert t.column("layer_grad_norms").to_pylist() == [[1.0, 2.0], None, None, None, [3.0, 4.0]]
    steps, ratios = trace_signals(t)["layer_update_ratios"]
    np.testing.assert_array_equal(steps, [0, 1, 3, 4])
    assert list(ratios) == ["a", "b"]
    np.testing.assert_array_equal(ratios["a"], [1e-3, math.nan, math.inf, 1e-9])
    np.testing.assert_array_equal(ratios["b"], [2e-3, 0.0, 5e-4, 2e-9])


def test_ratios_alone_name_the_layers_even_after_the_first_flush(tmp_path):
    p = tmp_path / "late.arrow"
    with TraceWriter(p, flush_every=2) as w:
        for s in range(5):
            w.write(s, loss=1.0)  # two batches on disk before any layer is seen
        w.write(5, layer_update_ratios={"x": 1e-3, "y": 1e-4})
        w.write(6, layer_update_ratios=[2e-3, 2e-4])
    t = read_trace(p)
    assert trace_metadata(t)["layer_names"] == ["x", "y"]
    assert t.column("layer_update_ratios").to_pylist() == [None] * 5 + [[1e-3, 1e-4], [2e-3, 2e-4]]
    steps, ratios = trace_signals(t)["layer_update_ratios"]
    np.testing.assert_array_equal(steps, [5, 6])
    np.testing.assert_array_equal(ratios["y"], [1e-4, 2e-4])


def part(sig: dict[str, Any], form: str, lo: int, hi: int) -> dict[str, Any]:
    """The keywords of ``Monitor.scan`` for steps ``lo..hi-1`` of ``run``, per-layer signals in ``form``."""
    kw = {k: sig[k][lo:hi] for k in ("step", "loss", "grad_norm", "lr", "update_ratio")}
    gsteps, grads = sig["layer_grad_norms"]
    g = (gsteps >= lo) & (gsteps < hi)
    rat = {k: v[lo:hi] for k, v in sig["layer_update_ratios"][1].items()}
    if form == "aligned matrix":  # unnamed columns
        kw["layer_grad_norms"] = (gsteps[g], np.column_stack([grads[k][g] for k in LAYERS]))
        kw["layer_update_ratios"] = np.column_stack([rat[k] for k in LAYERS])
    else:
        kw["layer_grad_norms"] = (gsteps[g], {k: v[g] for k, v in grads.items()})
        kw["layer_update_ratios"] = rat if form == "aligned mapping" else (sig["step"][lo:hi], rat)
    return kw


@pytest.mark.parametrize("form", ["sparse mapping", "aligned mapping", "aligned matrix"])
def test_scan_records_the_ratios_and_replays(tmp_path, form):
    sig = run(400, frozen="block2", freeze_at=250, seed=1)
    p = tmp_path / "scan.arrow"
    with TraceWriter(p, flush_every=150) as w:
        mon = ts.Monitor(recorder=w)
        live = mon.scan(**part(sig, form, 0, 220)) + mon.scan(**part(sig, form, 220, 400))
    t = read_trace(p)
    names = list(LAYERS) if form != "aligned matrix" else [f"layer{j}" for j in range(len(LAYERS))]
    assert trace_metadata(t)["layer_names"] == names
    out = trace_signals(t)
    steps, ratios = out["layer_update_ratios"]
    np.testing.assert_array_equal(steps, sig["step"])
    assert list(ratios) == names
    np.testing.assert_array_equal(np.column_stack([ratios[k] for k in names]), ratio_matrix(sig))
    assert dicts(trace_events(t)) == dicts(live)
    replayed = ts.Monitor().scan(**out)
    assert dicts(replayed) == dicts(live)
    low = [e for e in replayed if e.kind in RATIO_KINDS]
    assert [(e.kind, e.layer) for e in low] == [(ts.Kind.UPDATE_RATIO_LOW, names[LAYERS.index("block2")])]
    assert 250 <= low[0].step <= 255
    if form != "aligned matrix":  # the run fed step by step sees the same per-layer events
        assert dicts([e for e in feed_live(ts.Monitor(), sig) if e.kind in RATIO_KINDS]) == dicts(low)


def test_unnamed_ratios_take_the_names_of_the_grad_norms_beside_them(tmp_path):
    sig = run(100, seed=4)
    p = tmp_path / "named.arrow"
    with TraceWriter(p) as w:  # the Monitor hands the unnamed ratios over without names
        ts.Monitor(recorder=w).scan(step=sig["step"], loss=sig["loss"], layer_grad_norms=sig["layer_grad_norms"],
                                    layer_update_ratios=ratio_matrix(sig))
    t = read_trace(p)
    assert trace_metadata(t)["layer_names"] == list(LAYERS)
    np.testing.assert_array_equal(np.array(t.column("layer_update_ratios").to_pylist()), ratio_matrix(sig))


def test_write_trace_round_trip_and_copy(tmp_path):
    sig = run(300, frozen="embed", freeze_at=200, seed=2)
    p = tmp_path / "imported.arrow"
    rsteps = sig["step"][::2]  # its own cadence
    rat = {k: v[::2] for k, v in sig["layer_update_ratios"][1].items()}
    assert write_trace(p, step=sig["step"], loss=sig["loss"], layer_update_ratios=(rsteps, rat)) == 300
    t = read_trace(p)
    assert trace_metadata(t)["layer_names"] == list(LAYERS)
    steps, ratios = trace_signals(t)["layer_update_ratios"]
    np.testing.assert_array_equal(steps, rsteps)
    for k in LAYERS:
        np.testing.assert_array_equal(ratios[k], rat[k])
    # the output of trace_signals writes the same trace back
    p2 = tmp_path / "copy.arrow"
    write_trace(p2, **trace_signals(t))
    t2 = read_trace(p2)
    for name in ("step", "loss", "layer_update_ratios"):
        assert t2.column(name).to_pylist() == t.column(name).to_pylist(), name
    # aligned with step, unnamed, under given layer names
    p3 = tmp_path / "matrix.arrow"
    write_trace(p3, step=sig["step"], layer_update_ratios=ratio_matrix(sig), layer_names=LAYERS)
    np.testing.assert_array_equal(np.array(read_trace(p3).column("layer_update_ratios").to_pylist()),
                                  ratio_matrix(sig))


# ------------------------------------------------------------------------------ older traces
def test_trace_without_the_column_reads_and_replays(tmp_path):
    sig = run(500, frozen="block1", freeze_at=300, seed=3)
    sig.pop("layer_update_ratios")  # a run recorded before the ratios existed
    new = tmp_path / "new.arrow"
    with TraceWriter(new, flush_every=100) as w:
        live = feed_live(ts.Monitor(recorder=w), sig)
    old = tmp_path / "old.arrow"
    write_old_trace(new, old)
    with pa.OSFile(str(old)) as f:
        assert "layer_update_ratios" not in pa.ipc.open_stream(f).schema.names
    t = read_trace(old)
    assert t.schema.names == trace_schema().names  # the missing column is added in its place
    assert t.column("layer_update_ratios").null_count == t.num_rows == 500
    assert trace_metadata(old)["layer_names"] == list(LAYERS)
    out = trace_signals(t)
    assert "layer_update_ratios" not in out and "layer_grad_norms" in out
    assert dicts(ts.Monitor().scan(**out)) == dicts(live) == dicts(trace_events(t))
    # a trace being followed (trainsignals watch) decodes the file's own batches, without the column
    batches = TraceTail(old).poll()
    assert "layer_update_ratios" not in batches[0].schema.names
    assert dicts(ts.Monitor().scan(**trace_signals(pa.Table.from_batches(batches)))) == dicts(live)
    # only that column may be missing
    broken = tmp_path / "broken.arrow"
    t0 = read_trace(new)
    no_grads = t0.remove_column(t0.schema.get_field_index("layer_grad_norms"))
    with pa.ipc.new_stream(str(broken), no_grads.schema) as w2:
        w2.write_table(no_grads)
    with pytest.raises(TraceFormatError, match="layer_grad_norms"):
        read_trace(broken)


# ------------------------------------------------------------------------------ other layers
def test_ratios_over_other_layers_raise_and_record_nothing(tmp_path):
    p = tmp_path / "bad.arrow"
    with TraceWriter(p, layer_names=["a", "b"]) as w:
        w.write(0, layer_grad_norms=[1.0, 2.0], layer_update_ratios=[1e-3, 1e-3])
        for bad in ({"a": 1e-3, "c": 1e-3}, {"b": 1e-3, "a": 1e-3}, [1e-3, 1e-3, 1e-3], np.array([1e-3])):
            with pytest.raises(ValueError, match="layer_update_ratios"):
                w.write(1, loss=1.0, layer_update_ratios=bad)
        assert w.buffered == 1 and w.layer_names == ("a", "b")
    assert read_trace(p).column("step").to_pylist() == [0]
    # a row whose grad norms and ratios disagree, before any name is known: refused, nothing learned
    with TraceWriter(tmp_path / "fresh.arrow") as w:
        with pytest.raises(ValueError, match="layer_update_ratios"):
            w.write(0, layer_grad_norms={"a": 1.0, "b": 1.0}, layer_update_ratios={"b": 1e-3, "a": 1e-3})
        assert w.layer_names is None and w.buffered == 0
        w.write(0, layer_update_ratios={"b": 1e-3, "a": 1e-3})
        assert w.layer_names == ("b", "a")


def test_monitor_fed_ratios_over_other_layers_is_refused_by_its_writer(tmp_path):
    with TraceWriter(tmp_path / "u.arrow") as w:
        mon = ts.Monitor(recorder=w)
        mon.update(step=0, layer_grad_norms={"a": 1.0, "b": 1.0}, layer_update_ratios={"a": 1e-3, "b": 1e-3})
        with pytest.raises(ValueError, match="layer_update_ratios"):
            ts.Monitor(recorder=w).update(step=1, layer_update_ratios={"a": 1e-3, "z": 1e-3})
        assert w.buffered == 1
    with TraceWriter(tmp_path / "s.arrow") as w:
        n = 60
        with pytest.raises(ValueError, match="layer_update_ratios"):
            ts.Monitor(recorder=w).scan(step=np.arange(n), loss=np.ones(n),
                                        layer_grad_norms={"a": np.ones(n), "b": np.ones(n)},
                                        layer_update_ratios={"a": np.ones(n), "c": np.ones(n)})
        assert w.rows_written == 0 and w.layer_names is None
    p = tmp_path / "wt.arrow"
    with pytest.raises(ValueError, match="layer_update_ratios"):
        write_trace(p, step=[0, 1], layer_update_ratios=[[1e-3, 1e-3, 1e-3]] * 2, layer_names=["a", "b"])
    assert not os.path.exists(p)
