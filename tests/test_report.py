"""Replaying traces: the events of streaming, the status rule, verdicts and renderings."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from rich.console import Console

import trainsignals as ts
from trainsignals.curves import generate
from trainsignals.io.report import Report, replay, replay_many, status_timeline, summary_table
from trainsignals.io.traces import TraceWriter, read_trace, write_trace

# -- helpers --------------------------------------------------------------------------------


def _names(table: pa.Table, key: str) -> list[str] | None:
    raw = (table.schema.metadata or {}).get(key.encode())
    return json.loads(raw) if raw else None


def stream(table: pa.Table, mon: ts.Monitor) -> tuple[list[ts.Event], list[tuple[int, str]]]:
    """Feed a trace to ``mon.update`` row by row; the events and the status read after each row."""
    rows = table.to_pylist()
    layer_names = _names(table, "trainsignals.layer_names")
    act_names = _names(table, "trainsignals.act_layer_names")
    events: list[ts.Event] = []
    timeline: list[tuple[int, str]] = []
    for row in rows:
        kw: dict[str, Any] = {"step": row["step"]}
        for name in ("loss", "grad_norm", "lr", "update_ratio", "val_loss"):
            if row.get(name) is not None:
                kw[name] = row[name]
        if row.get("layer_grad_norms") is not None:
            vals = row["layer_grad_norms"]
            kw["layer_grad_norms"] = dict(zip(layer_names, vals)) if layer_names else vals
        acts: dict[str, dict[str, float]] = {}
        for col, stat in (("act_dead_frac", "dead_frac"), ("act_saturation", "saturation")):
            if row.get(col) is not None:
                for layer, v in zip(act_names or [], row[col]):
                    if v is not None and not math.isnan(v):
                        acts.setdefault(layer, {})[stat] = v
        if acts:
            kw["activations"] = acts
        events += mon.update(**kw)
        if not timeline or timeline[-1][1] != mon.status:
            timeline.append((row["step"], mon.status))
    return events, timeline


def dicts(events: list[ts.Event]) -> list[dict[str, Any]]:
    return [e.to_dict() for e in events]  # NaN values compare equal as strings


def curve_trace(path: Path, kind: str, seed: int, layers: bool = False, acts: bool = False) -> Path:
    sig = generate(kind, seed=seed, difficulty="medium").signals()
    kw = {k: sig[k] for k in ("step", "loss", "grad_norm", "lr", "update_ratio", "val_loss")}
    if layers:
        kw["layer_grad_norms"] = sig["layer_grad_norms"]
    if acts:
        kw["activations"] = sig["activations"]
    write_trace(path, metadata={"kind": kind, "seed": seed}, **kw)
    return path


def healthy_signals(n: int = 400, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    return {"step": t, "loss": (2.0 * np.exp(-t / 150) + 0.5) * np.exp(rng.normal(0, 0.01, n)),
            "grad_norm": np.exp(rng.normal(0, 0.05, n)), "lr": np.full(n, 1e-3)}


def ev(kind: str, step: int, severity: str = "warning", onset: int | None = None) -> ts.Event:
    return ts.Event(ts.Kind(kind), severity, step, step if onset is None else onset, "D", "loss",
                    1.0, 0.5, f"{kind} seen", "a cause", f"fix {kind}")


# -- replay == streaming ------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "seed", "layers", "acts"), [
    ("divergence", 1, False, False),
    ("nonfinite", 1, False, False),
    ("stall", 1, False, False),
    ("overfitting", 2, False, False),
    ("vanishing_gradient", 2, True, False),
    ("dead_units", 3, False, True),
    ("healthy", 1, True, True),
])
def test_replay_gives_the_events_of_streaming(tmp_path: Path, kind: str, seed: int, layers: bool,
                                              acts: bool) -> None:
    path = curve_trace(tmp_path / f"{kind}.arrow", kind, seed, layers, acts)
    rep = replay(path)
    table = read_trace(path)
    events, timeline = stream(table, ts.Monitor(total_steps=table.num_rows))
    assert dicts(rep.events) == dicts(events)
    assert rep.status_timeline == timeline
    assert rep.final_status == timeline[-1][1]
    assert rep.steps == table.num_rows and rep.first_step == 0 and rep.last_step == table.num_rows - 1
    assert rep.metadata == {"kind": kind, "seed": seed}
    if kind != "healthy":
        assert kind in {e.kind.value for e in rep.events}


def test_replay_with_gaps_and_nonfinite_stretches_matches_streaming(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    n = 900
    loss = (2.0 * np.exp(-np.arange(n) / 300) + 0.3) * np.exp(rng.normal(0, 0.02, n))
    loss[400:430] = np.nan  # non-finite stretch: diverging until finite values return
    loss[600:] *= 1.03 ** np.arange(n - 600)  # then a climb
    with TraceWriter(tmp_path / "gaps.arrow", flush_every=37) as w:
        for i in range(n):
            kw: dict[str, Any] = {"grad_norm": float(np.exp(rng.normal(0, 0.1)))}
            if i % 5 != 2:  # the loss is not measured on every row
                kw["loss"] = float(loss[i])
            if i % 100 == 99:
                kw["val_loss"] = float(loss[i] * 1.1)
            if i % 3 == 0:
                kw["lr"] = 1e-3
            w.write(2 * i, **kw)  # steps with holes
    rep = replay(tmp_path / "gaps.arrow")
    table = read_trace(tmp_path / "gaps.arrow")
    events, timeline = stream(table, ts.Monitor(total_steps=2 * n, log_every=2))  # as replay plans it: a loss every 2 steps
    assert dicts(rep.events) == dicts(events)
    assert rep.status_timeline == timeline
    assert ("diverging" in {s for _, s in timeline}) and rep.last_step == 2 * (n - 1)


def test_replay_without_a_loss_stays_warming_up_like_the_monitor(tmp_path: Path) -> None:
    grad = np.exp(np.random.default_rng(3).normal(0, 0.1, 400))
    grad[150] = np.inf
    write_trace(tmp_path / "g.arrow", step=np.arange(400), grad_norm=grad)
    rep = replay(tmp_path / "g.arrow")
    events, timeline = stream(read_trace(tmp_path / "g.arrow"), ts.Monitor(total_steps=400))
    assert dicts(rep.events) == dicts(events) and rep.status_timeline == timeline
    recovery = ts.Monitor().recovery
    assert timeline == [(0, "warming_up"), (150, "diverging"), (150 + recovery, "warming_up")]


def test_replay_of_a_recorded_live_run_gives_its_events(tmp_path: Path) -> None:
    sig = generate("divergence", seed=4).signals()
    n = len(sig["step"])
    live = ts.Monitor(total_steps=n, recorder=TraceWriter(tmp_path / "live.arrow", flush_every=64))
    for i in range(n):
        live.update(step=int(sig["step"][i]), loss=float(sig["loss"][i]), grad_norm=float(sig["grad_norm"][i]))
    live.recorder.close()  # type: ignore[union-attr]
    rep = replay(tmp_path / "live.arrow")
    assert dicts(rep.events) == dicts(live.events)
    assert (rep.final_status, rep.should_stop) == (live.status, live.should_stop)


def test_replay_accepts_a_table_and_a_monitor(tmp_path: Path) -> None:
    path = curve_trace(tmp_path / "d.arrow", "divergence", 1)
    table = read_trace(path)
    mon = ts.Monitor(early_climb=False, trend_divergence=False, lost_progress=False)
    rep = replay(table, monitor=mon, name="run-7")
    assert rep.source == "run-7" and rep.table is table
    assert "divergence" not in {e.kind.value for e in rep.events}
    assert dicts(rep.events) == dicts(mon.events) and rep.events


def test_replay_says_how_often_the_log_was_written(tmp_path: Path) -> None:
    c = generate("healthy", 2, "easy")
    every = np.arange(0, c.total_steps, 25)
    write_trace(tmp_path / "s.arrow", step=every, loss=c.loss[every])
    sparse = replay(tmp_path / "s.arrow")
    assert any("one loss every 25 steps" in note and "log_every=25" in note for note in sparse.notes)
    write_trace(tmp_path / "d.arrow", step=c.steps, loss=c.loss)
    dense = replay(tmp_path / "d.arrow")
    assert not any("one loss every" in note for note in dense.notes)
    # a Monitor given by the caller is used as it is; the note says its spans count values
    mine = replay(tmp_path / "s.arrow", monitor=ts.Monitor())
    assert any("log_every=1" in note and "25x as many steps" in note for note in mine.notes)


def test_replay_of_a_sparse_log_builds_the_monitor_for_its_interval(tmp_path: Path) -> None:
    c = generate("stall", 1, "easy")
    every = np.arange(0, c.total_steps, 10)
    write_trace(tmp_path / "s.arrow", step=every, loss=c.loss[every], grad_norm=c.grad_norm[every])
    rep = replay(tmp_path / "s.arrow")
    told = ts.Monitor(total_steps=int(every[-1] - every[0]) + 10, log_every=10)
    assert dicts(rep.events) == dicts(told.scan(step=every, loss=c.loss[every], grad_norm=c.grad_norm[every]))


def test_replay_takes_the_interval_and_length_it_is_told(tmp_path: Path) -> None:
    c = generate("stall", 1, "easy")
    every = np.arange(0, c.total_steps, 10)
    uneven = np.sort(np.concatenate([every, every[1::2] + 3]))   # steps 0, 10, 13, 20, 30, 33...: median gap 3 or 7
    sig = dict(step=uneven, loss=c.loss[uneven], grad_norm=c.grad_norm[uneven])
    write_trace(tmp_path / "u.arrow", **sig)
    rep = replay(tmp_path / "u.arrow", log_every=10, total_steps=5000)
    told = ts.Monitor(total_steps=5000, log_every=10)
    assert dicts(rep.events) == dicts(told.scan(**sig))
    assert any("log_every=10) as asked" in note for note in rep.notes)
    guessed = replay(tmp_path / "u.arrow")
    assert not any("as asked" in note for note in guessed.notes)
    with pytest.raises(ValueError, match="log_every"):
        replay(tmp_path / "u.arrow", ts.Monitor(), log_every=10)
    with pytest.raises(ValueError, match="total_steps"):
        replay(tmp_path / "u.arrow", total_steps=0)


def test_default_monitor_is_the_monitor_replay_builds(tmp_path: Path) -> None:
    from trainsignals.io.report import default_monitor, logging_interval

    c = generate("stall", 1, "easy")
    every = np.arange(0, c.total_steps, 10)
    write_trace(tmp_path / "s.arrow", step=every, loss=c.loss[every], grad_norm=c.grad_norm[every])
    table = read_trace(tmp_path / "s.arrow")
    assert logging_interval(table) == 10 and logging_interval(table.slice(0, 2)) == 1
    mon, notes = default_monitor(table)
    assert (mon.log_every, mon.total_steps) == (10, int(every[-1]) + 10)
    assert notes == [n for n in replay(table).notes if "one loss every" in n] and len(notes) == 1
    assert dicts(mon.scan(step=every, loss=c.loss[every], grad_norm=c.grad_norm[every])) == dicts(replay(table).events)
    # the first rows of a trace still being written: the interval, but no length to take from the span
    first, _ = default_monitor(table.slice(0, 12), complete=False)
    assert (first.log_every, first.total_steps) == (10, None)
    told, notes = default_monitor(table.slice(0, 12), log_every=25, total_steps=900, complete=False)
    assert (told.log_every, told.total_steps) == (25, 900) and "log_every=25) as asked" in notes[0]
    with pytest.raises(ValueError, match="log_every"):
        default_monitor(table, log_every=0)


def test_summary_table_shows_names_and_errors_in_brackets_as_they_are() -> None:
    reports = [Report(source="runs/exp[lr].arrow", error="cannot read [damaged] at byte 8"),
               Report(source="runs/b[0].arrow", final_status="healthy", steps=10, notes=["[bold]not markup[/]"])]
    console = Console(width=250, record=True, force_terminal=True, color_system=None)
    console.print(summary_table(reports))
    text = console.export_text()
    assert "exp[lr].arrow" in text and "cannot read [damaged] at byte 8" in text  # was "exp.arrow", "cannot read  at"
    assert "b[0].arrow" in text and "([bold]not markup[/])" in text


# -- verdicts -----------------------------------------------------------------------------------


def test_exit_codes(tmp_path: Path) -> None:
    healthy = healthy_signals()
    write_trace(tmp_path / "ok.arrow", **healthy)
    spiky = dict(healthy, loss=healthy["loss"].copy())
    spiky["loss"][300] *= 8.0  # one spike: a warning
    write_trace(tmp_path / "warn.arrow", **spiky)
    broken = dict(healthy, loss=healthy["loss"].copy())
    broken["loss"][300] = np.nan  # a non-finite loss: critical
    write_trace(tmp_path / "crit.arrow", **broken)
    ok, warn, crit = (replay(tmp_path / f"{n}.arrow") for n in ("ok", "warn", "crit"))
    assert (ok.exit_code, ok.verdict, ok.events) == (0, "healthy", [])
    assert (warn.exit_code, [e.kind.value for e in warn.events]) == (1, ["loss_spike"])
    assert crit.exit_code == 2 and crit.should_stop and crit.events[0].kind == ts.Kind.NONFINITE
    info = Report("x", events=[ts.Event(ts.Kind.LR_ANOMALY, "info", 5, 5, "D", "lr", 1, 1, "m", "c", "f")])
    assert info.exit_code == 0
    assert Report("x", error="not a trace").exit_code == 3


# -- status timeline ------------------------------------------------------------------------------


def test_status_timeline_rule_on_constructed_events() -> None:
    steps = np.arange(0, 1000)
    events = [
        ev("loss_spike", 30),  # no state
        ev("grad_explosion", 40),  # a warning explosion: no state
        ev("stall", 100),
        ev("oscillation", 150),  # worse than stalled while live
        ev("stall", 180),
        ev("grad_explosion", 400, "critical"),  # -> diverging
        ev("divergence", 450, "critical"),
    ]
    tl = status_timeline(events, steps, np.ones(1000), warmup=20, recovery=100)
    assert tl == [(0, "warming_up"), (19, "healthy"), (100, "stalled"), (150, "oscillating"),
                  (250, "stalled"), (280, "healthy"), (400, "diverging"), (550, "healthy")]


def test_status_timeline_nonfinite_hold_and_warmup() -> None:
    loss = np.ones(400)
    loss[100:300] = np.nan  # diverging until a finite loss returns, however long
    events = [ev("nonfinite", 100, "critical")]
    tl = status_timeline(events, np.arange(400), loss, warmup=20, recovery=50)
    assert tl == [(0, "warming_up"), (19, "healthy"), (100, "diverging"), (300, "healthy")]
    # sparse loss: (steps, values) of the measured rows; warm-up counts finite values only
    tl = status_timeline([], np.arange(100), (np.arange(0, 100, 10), np.r_[np.nan, np.ones(9)]), warmup=3)
    assert tl == [(0, "warming_up"), (30, "healthy")]


def test_status_timeline_from_events_alone() -> None:
    events = [ev("stall", 100), ev("divergence", 120, "critical"), ev("loss_spike", 500)]
    assert status_timeline(events, recovery=100) == [(100, "stalled"), (120, "diverging"), (220, "healthy")]
    assert status_timeline([]) == []
    with pytest.raises(ValueError, match="must not decrease"):
        status_timeline([], [3, 2, 1])


# -- renderings -----------------------------------------------------------------------------------


@pytest.fixture
def failed_report() -> Report:
    events = [ev("loss_spike", 50), ev("divergence", 120, "critical", onset=110), ev("loss_spike", 130)]
    return Report("runs/a.arrow", events=events,
                  status_timeline=[(0, "warming_up"), (19, "healthy"), (120, "diverging")],
                  final_status="diverging", should_stop=True, steps=200, first_step=0, last_step=199,
                  metadata={"model": "mlp"}, notes=["damaged trace: truncated"])


def test_summary_and_text(failed_report: Report) -> None:
    s = failed_report.summary()
    assert s.splitlines()[0].startswith("runs/a.arrow: 200 steps (0..199), status diverging, STOP advised")
    assert "WARNING loss_spike (x2): began step 50, noticed step 50" in s
    assert "CRITICAL divergence: began step 110, noticed step 120: divergence seen" in s
    assert "fix: fix divergence" in s and "note: damaged trace" in s
    t = failed_report.to_text()
    assert "status timeline: 0: warming_up, 19: healthy, 120: diverging" in t
    assert t.count("\n  step ") == 3 and '"model": "mlp"' in t
    assert Report("r", steps=10, first_step=0, last_step=9, final_status="healthy").summary() == (
        "r: 10 steps (0..9), status healthy; healthy, no events")


def test_json(failed_report: Report) -> None:
    d = json.loads(failed_report.to_json())
    assert (d["exit_code"], d["verdict"], d["should_stop"], d["steps"]) == (2, "critical", True, 200)
    assert d["status_timeline"][-1] == [120, "diverging"]
    assert [ts.Event.from_dict(e) for e in d["events"]] == failed_report.events
    assert d["metadata"] == {"model": "mlp"} and d["error"] is None
    nan_ev = ts.Event(ts.Kind.NONFINITE, "critical", 3, 3, "D", "loss", float("nan"), 0, "m", "c", "f")
    assert json.loads(Report("r", events=[nan_ev]).to_json())["events"][0]["value"] == "nan"


def test_markdown(failed_report: Report) -> None:
    md = failed_report.to_markdown()
    assert md.startswith("## `runs/a.arrow`")
    assert "**critical** — status `diverging` after 200 steps (0..199); **stop advised**" in md
    assert "| failure | severity | began | noticed | events | signal | what | first fix |" in md
    assert "| divergence | critical | 110 | 120 | 1 | loss | divergence seen | fix divergence |" in md
    assert "| loss_spike | warning | 50 | 50 | 2 |" in md
    assert "unreadable" in Report("b.arrow", error="TraceFormatError: nope").to_markdown()


# -- many runs ---------------------------------------------------------------------------------


def test_replay_many_in_processes_with_a_damaged_and_a_foreign_file(tmp_path: Path) -> None:
    curve_trace(tmp_path / "a_div.arrow", "divergence", 1)
    write_trace(tmp_path / "b_ok.arrow", **healthy_signals())
    with TraceWriter(tmp_path / "full.arrow", flush_every=50) as w:
        for i, (x, g) in enumerate(zip(healthy_signals()["loss"], healthy_signals()["grad_norm"])):
            w.write(i, loss=float(x), grad_norm=float(g))
    data = (tmp_path / "full.arrow").read_bytes()
    (tmp_path / "full.arrow").unlink()
    (tmp_path / "c_damaged.arrow").write_bytes(data[: int(len(data) * 0.6)])  # cut mid-batch
    (tmp_path / "d_foreign.arrow").write_bytes(b"PAR1 this is not an Arrow stream")
    (tmp_path / "notes.txt").write_text("not a trace, not *.arrow: ignored")

    reports = replay_many(tmp_path, processes=2, progress=False)
    assert [Path(r.source).name for r in reports] == ["a_div.arrow", "b_ok.arrow", "c_damaged.arrow",
                                                       "d_foreign.arrow"]
    div, ok, damaged, foreign = reports
    assert div.exit_code == 2 and ok.exit_code == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert dicts(div.events) == dicts(replay(tmp_path / "a_div.arrow").events)
    assert damaged.error is None and 0 < damaged.steps < 400 and damaged.steps % 50 == 0
    assert damaged.notes and "damaged" in damaged.notes[0]
    assert foreign.error and foreign.exit_code == 3 and all(r.table is None for r in reports)

    console = Console(record=True, width=200)
    console.print(summary_table(reports))
    text = console.export_text()
    assert "4 run(s) replayed" in text and "unreadable" in text and "critical" in text
    divs = [e for e in div.events if e.kind.value == "divergence"]   # the first, and how many
    times = f" x{len(divs)}" if len(divs) > 1 else ""
    assert f"divergence{times}: {divs[0].onset_step} -> {divs[0].step}" in text


def test_replay_many_refuses_missing_paths(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        replay_many(tmp_path / "nope", progress=False)
    assert replay_many(tmp_path, progress=False) == []


def test_a_sparse_log_leaves_warming_up_after_eight_rows_in_replay_as_in_streaming(tmp_path: Path) -> None:
    # 20 loss values at one a step; a log written every 50 steps is warm after 8 rows (350 steps span the
    # warm-up's 20), as the detectors judge it; replay's timeline is the Monitor's, row by row
    c = generate("divergence", seed=4)
    every = np.arange(0, c.total_steps, 50)
    write_trace(tmp_path / "s.arrow", step=every, loss=c.loss[every], grad_norm=c.grad_norm[every])
    rep = replay(tmp_path / "s.arrow")
    told = ts.Monitor(total_steps=int(every[-1] - every[0]) + 50, log_every=50)
    events, timeline = stream(read_trace(tmp_path / "s.arrow"), told)
    assert dicts(rep.events) == dicts(events) and rep.status_timeline == timeline
    assert timeline[0] == (0, "warming_up") and timeline[1][0] == 350
    dense = ts.Monitor()
    shown = [(dense.update(step=s, loss=1.0), dense.status)[1] for s in range(25)]
    assert shown.index("healthy") == 19  # at one value a step: the 20th value, as before
    # a snapshot from before the Monitor kept its first loss's step still loads, under the rule it ran
    # with (warm after `warmup` values)
    snap = told.state_dict()
    del snap["monitor"]["first_loss"]
    n_loss = snap["monitor"]["n_loss"]
    again = ts.Monitor(total_steps=int(every[-1] - every[0]) + 50, log_every=50)
    again.load_state_dict(snap)
    assert n_loss < 20 and told.status == "healthy" and again.status == "warming_up"


# -- strict JSON, a trace's own total_steps, traces given a tool or a mapping -------------------
def _strict(text: str) -> Any:
    def refuse(token: str) -> None:
        raise AssertionError(f"bare {token} in JSON")

    return json.loads(text, parse_constant=refuse)


def test_to_json_writes_non_finite_metadata_as_strings(tmp_path: Path) -> None:
    """A diverged HF run's summary holds ``"train_loss": NaN``: the report's JSON stays strict."""
    p = tmp_path / "nan_meta.arrow"
    write_trace(p, step=np.arange(50), loss=np.linspace(2.0, 1.0, 50),
                metadata={"train_summary": {"train_loss": math.nan, "grad": [math.inf, 1.0]}, "best": -math.inf})
    rep = replay(p)
    doc = _strict(rep.to_json())
    assert doc["metadata"]["train_summary"] == {"train_loss": "nan", "grad": ["inf", 1.0]}
    assert doc["metadata"]["best"] == "-inf"
    assert math.isnan(rep.metadata["train_summary"]["train_loss"])  # the report itself keeps the numbers
    assert '"train_loss": "nan"' in rep.to_text()


def test_replay_takes_total_steps_from_the_trace_metadata(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As ``trainsignals watch`` does: a trace that says how long its run is gets that run length."""
    from trainsignals.io import report as report_module

    made: list[dict[str, Any]] = []

    class Spy(ts.Monitor):
        def __init__(self, **kw: Any) -> None:
            made.append(kw)
            super().__init__(**kw)

    monkeypatch.setattr(report_module, "Monitor", Spy)
    p = tmp_path / "planned.arrow"
    write_trace(p, step=np.arange(300), loss=np.linspace(2.0, 1.0, 300), metadata={"total_steps": 10_000})
    replay(p)
    replay(p, total_steps=500)  # told: that wins
    q = tmp_path / "unplanned.arrow"
    write_trace(q, step=np.arange(300), loss=np.linspace(2.0, 1.0, 300), metadata={"total_steps": "soon"})
    replay(q)
    assert [m["total_steps"] for m in made] == [10_000, 500, 300]


def test_a_trace_is_replayed_as_a_trace_whatever_tool_and_mapping_say(tmp_path: Path) -> None:
    from trainsignals.io.report import replay_source

    p = tmp_path / "run.arrow"
    write_trace(p, step=np.arange(100), loss=np.linspace(2.0, 1.0, 100))
    plain = replay_source(p)
    for kw in ({"tool": "csv"}, {"mapping": {"loss": "myloss"}}, {"tool": "jsonl", "mapping": {"lr": None}}):
        rep = replay_source(p, **kw)
        assert rep.error is None and rep.steps == plain.steps == 100 and rep.events == plain.events
        assert rep.notes[-1].startswith("read as a trace; ") and "not used (given for other tools' logs" in rep.notes[-1]
    csv = tmp_path / "a.csv"
    csv.write_text("step,myloss\n" + "".join(f"{i},{2 - i / 100}\n" for i in range(100)))
    reports = replay_many(tmp_path, processes=1, progress=False, mapping={"loss": "myloss"})
    assert [(Path(r.source).name, r.error, r.steps) for r in reports] == [("a.csv", None, 100), ("run.arrow", None, 100)]


def test_a_trace_without_a_loss_says_what_was_judged(tmp_path: Path) -> None:
    p = tmp_path / "val_only.arrow"
    write_trace(p, step=[0, 100, 200], val_loss=([0, 100, 200], [1.0, 0.9, 0.8]))
    rep = replay(p)
    assert rep.error is None and rep.steps == 3 and rep.final_status == "warming_up"
    assert any(n.startswith("no training loss in the trace") and "(val_loss) are checked" in n for n in rep.notes)
