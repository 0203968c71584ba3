"""The trace commands, run in-process through argparse: replay, plot, watch, convert."""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import trainsignals as ts
from trainsignals.cli import traces as trace_cli
from trainsignals.cli.traces import add_trace_commands
from trainsignals.io.importers import import_run
from trainsignals.io.traces import TraceWriter, read_trace, write_trace


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="trainsignals")
    add_trace_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    return int(args.func(args))


def healthy(n: int = 400) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    t = np.arange(n)
    return {"step": t, "loss": (2.0 * np.exp(-t / 150) + 0.5) * np.exp(rng.normal(0, 0.01, n)),
            "grad_norm": np.exp(rng.normal(0, 0.05, n))}


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    d = tmp_path / "runs"
    d.mkdir()
    sig = healthy()
    write_trace(d / "a_ok.arrow", **sig)
    spike = dict(sig, loss=sig["loss"].copy())
    spike["loss"][300] *= 8.0
    write_trace(d / "b_warn.arrow", **spike)
    nan = dict(sig, loss=sig["loss"].copy())
    nan["loss"][300:] = np.nan
    write_trace(d / "c_crit.arrow", **nan)
    return d


def test_replay_exit_codes(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("replay", str(runs / "a_ok.arrow")) == 0
    assert run("replay", str(runs / "b_warn.arrow")) == 1
    assert run("replay", str(runs / "c_crit.arrow")) == 2
    assert run("replay", str(runs / "a_ok.arrow"), str(runs / "b_warn.arrow")) == 1  # the worst run
    assert run("replay", str(runs), "--processes", "2") == 2
    out = capsys.readouterr().out
    assert "loss_spike" in out and "nonfinite" in out and "healthy, no events" in out
    assert run("replay", str(runs / "missing.arrow")) == 3
    (runs / "junk.arrow").write_bytes(b"not arrow at all")
    assert run("replay", str(runs / "junk.arrow")) == 3
    assert "could not be read" in capsys.readouterr().out


def test_replay_is_told_the_logging_interval_and_run_length(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sig = healthy(4000)
    sparse = {k: v[::50] for k, v in sig.items()}
    write_trace(runs / "d_sparse.arrow", **sparse)
    assert run("replay", str(runs / "d_sparse.arrow"), "--json") == 0
    guessed = json.loads(capsys.readouterr().out)["runs"][0]
    assert any("log_every=50" in n for n in guessed["notes"])
    assert run("replay", str(runs / "d_sparse.arrow"), "--json", "--log-every", "25", "--total-steps", "8000") == 0
    told = json.loads(capsys.readouterr().out)["runs"][0]
    assert any("log_every=25) as asked" in n for n in told["notes"])
    for flag in ("--log-every", "--total-steps"):
        with pytest.raises(SystemExit) as exc:  # refused while parsing: argparse's usage error
            run("replay", str(runs / "d_sparse.arrow"), flag, "0")
        assert exc.value.code == 2
        assert f"argument {flag}: must be >= 1, got 0" in capsys.readouterr().err


def test_replay_json_and_markdown(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("replay", str(runs), "--json", "--processes", "1") == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_code"] == 2
    assert [(Path(r["source"]).name, r["exit_code"]) for r in doc["runs"]] == [
        ("a_ok.arrow", 0), ("b_warn.arrow", 1), ("c_crit.arrow", 2)]
    crit = doc["runs"][2]
    assert crit["events"][0]["kind"] == "nonfinite" and crit["events"][0]["value"] == "nan"
    assert crit["should_stop"] and crit["status_timeline"][-1] == [300, "diverging"]
    assert run("replay", str(runs), "--markdown", "--processes", "1") == 2
    md = capsys.readouterr().out
    assert md.startswith("# trainsignals replay: 3 run(s)")
    assert "| `c_crit.arrow` | critical | diverging (stop) | 400 | nonfinite 300 -> 300 |" in md
    assert "## `" in md and "| failure | severity |" in md


def test_convert_round_trip_from_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sig = healthy(300)
    csv = tmp_path / "log.csv"
    lines = ["step,my_loss,grad_norm,learning_rate,val_loss"]
    for i in range(300):
        gn = "" if i % 7 == 3 else repr(float(sig["grad_norm"][i]))  # gaps: not measured
        val = repr(1.0 + 0.001 * i) if i % 50 == 49 else ""
        loss = "nan" if i == 250 else repr(float(sig["loss"][i]))
        lines.append(f"{i},{loss},{gn},0.001,{val}")
    csv.write_text("\n".join(lines) + "\n")
    out = tmp_path / "log.arrow"
    assert run("convert", str(csv), "-o", str(out), "--tool", "csv", "--map", "loss=my_loss") == 0
    assert "wrote" in capsys.readouterr().out
    t = read_trace(out)
    assert t.column("step").to_pylist() == list(range(300))
    got_loss = np.asarray(t.column("loss").to_numpy(zero_copy_only=False))
    assert np.isnan(got_loss[250]) and np.allclose(np.delete(got_loss, 250), np.delete(sig["loss"], 250))
    assert t.column("grad_norm").null_count == len(range(3, 300, 7))
    assert t.column("val_loss").drop_null().to_pylist() == pytest.approx([1.0 + 0.001 * i for i in range(49, 300, 50)])
    assert t.column("lr").to_pylist() == [0.001] * 300
    # replaying the converted trace = scanning the import directly
    kw = import_run(csv, tool="csv", mapping={"loss": "my_loss"}).scan_kwargs()
    direct = ts.Monitor(total_steps=300).scan(**kw)
    assert run("replay", str(out), "--json") == 2  # the NaN loss
    got = json.loads(capsys.readouterr().out)["runs"][0]["events"]
    assert got == [e.to_dict() for e in direct]
    with pytest.raises(SystemExit) as exc:
        run("convert", str(csv), "-o", str(tmp_path / "x.arrow"), "--map", "loss")
    assert exc.value.code == 2 and "OURS=THEIRS" in capsys.readouterr().err
    assert not (tmp_path / "x.arrow").exists()


def test_watch_follows_a_writer_until_it_closes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "live.arrow"
    sig = healthy(300)

    def writer() -> None:
        time.sleep(0.1)  # watch starts before the file exists
        with TraceWriter(path, flush_every=25, metadata={"total_steps": 300}) as w:
            for i in range(300):
                w.write(i, loss=float(sig["loss"][i]), grad_norm=float(sig["grad_norm"][i]))
                if i % 60 == 0:
                    time.sleep(0.05)

    th = threading.Thread(target=writer)
    th.start()
    t0 = time.monotonic()
    code = run("watch", str(path), "--interval", "0.02", "--timeout", "20")
    th.join()
    assert code == 0 and time.monotonic() - t0 < 15
    out = capsys.readouterr().out
    assert "the writer closed the trace" in out and "300 steps (0..299)" in out


def test_watch_reports_events_times_out_and_stops_on_ctrl_c(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    sig = healthy(300)
    sig["loss"][200:] = np.nan
    path = tmp_path / "stuck.arrow"
    w = TraceWriter(path, flush_every=100)  # a writer that stays open: no end-of-stream marker
    for i in range(300):
        w.write(i, loss=float(sig["loss"][i]), grad_norm=float(sig["grad_norm"][i]))
    w.flush()
    assert run("watch", str(path), "--interval", "0.02", "--timeout", "0.2") == 2
    out = capsys.readouterr().out
    assert "CRITICAL nonfinite" in out and "no growth for 0.2 s" in out

    def ctrl_c(_: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(trace_cli.time, "sleep", ctrl_c)
    assert run("watch", str(path), "--interval", "0.02") == 130
    assert "interrupted" in capsys.readouterr().err
    w.close()
    monkeypatch.undo()
    (tmp_path / "junk.arrow").write_bytes(b"PAR1 not a trace")
    assert run("watch", str(tmp_path / "junk.arrow"), "--timeout", "1") == 3


def test_plot_command(runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    assert run("plot", str(runs / "c_crit.arrow"), "-o", str(tmp_path / "c.png")) == 0
    assert (tmp_path / "c.png").stat().st_size > 10_000
    assert run("plot", str(tmp_path / "nope.arrow"), "-o", str(tmp_path / "n.png")) == 1
    assert "error" in capsys.readouterr().err


def test_help_documents_exit_codes() -> None:
    parser = argparse.ArgumentParser(prog="trainsignals")
    sub = parser.add_subparsers(dest="command", required=True)
    add_trace_commands(sub)
    text = sub.choices["replay"].format_help()
    assert "0 every run healthy" in text and "1 warnings only" in text and "2 a critical event" in text
    assert "130 interrupted" in sub.choices["watch"].format_help()


# -- logs with only a validation loss; traces beside logs; strict JSON ------------------------
def test_replay_and_plot_a_log_with_only_a_validation_loss(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    csv = tmp_path / "v.csv"
    csv.write_text("step,val_loss\n0,1.0\n100,0.9\n200,0.8\n")
    state = tmp_path / "eval_only" / "trainer_state.json"
    state.parent.mkdir()
    state.write_text(json.dumps({"log_history": [{"step": s, "epoch": s / 100, "eval_loss": 1.0 / s}
                                                 for s in (100, 200, 300)]}))
    for src, steps in ((csv, 3), (state, 3)):
        assert run("replay", str(src), "--json") == 0
        rep = json.loads(capsys.readouterr().out)["runs"][0]
        assert rep["error"] is None and rep["steps"] == steps
        assert any(n.startswith("no training loss in the trace") for n in rep["notes"])
    pytest.importorskip("matplotlib")
    assert run("plot", str(csv), "-o", str(tmp_path / "v.png")) == 0
    assert (tmp_path / "v.png").stat().st_size > 5_000


def test_a_mapping_for_the_logs_leaves_the_traces_of_a_folder_alone(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    sig = healthy(200)
    write_trace(tmp_path / "run.arrow", **sig)
    (tmp_path / "a.csv").write_text("step,myloss\n" + "".join(f"{i},{float(v)!r}\n" for i, v in enumerate(sig["loss"])))
    assert run("replay", str(tmp_path), "--map", "loss=myloss", "--json", "--processes", "1") == 0
    runs = {Path(r["source"]).name: r for r in json.loads(capsys.readouterr().out)["runs"]}
    assert runs["a.csv"]["error"] is None and runs["run.arrow"]["error"] is None
    assert runs["run.arrow"]["steps"] == runs["a.csv"]["steps"] == 200
    assert run("replay", str(tmp_path / "run.arrow"), "--tool", "csv", "--json") == 0
    rep = json.loads(capsys.readouterr().out)["runs"][0]
    assert rep["error"] is None and any("read as a trace; tool 'csv' not used" in n for n in rep["notes"])


def test_replay_json_is_strict_with_a_nan_in_the_metadata(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "trainer_state.json"
    hist = [{"step": s, "loss": 2.0 / s, "learning_rate": 1e-4} for s in range(1, 60)]
    hist.append({"step": 59, "train_runtime": 10.0, "train_loss": float("nan")})
    state.write_text(json.dumps({"log_history": hist, "best_metric": float("inf")}))
    assert "NaN" in state.read_text()
    run("replay", str(state), "--json")
    text = capsys.readouterr().out

    def refuse(token: str) -> None:
        raise AssertionError(f"bare {token} in --json output")

    doc = json.loads(text, parse_constant=refuse)
    meta = doc["runs"][0]["metadata"]
    assert meta["train_summary"]["train_loss"] == "nan" and meta["best_metric"] == "inf"


# -- plot -o, convert onto its source, watch of a missing file --------------------------------
def test_plot_says_where_it_wrote(runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    assert run("plot", str(runs / "a_ok.arrow"), "-o", str(tmp_path / "out")) == 0
    assert capsys.readouterr().out == f"wrote {tmp_path / 'out.png'}\n"
    assert (tmp_path / "out.png").is_file() and not (tmp_path / "out").exists()
    folder = tmp_path / "figures"
    folder.mkdir()
    assert run("plot", str(runs / "a_ok.arrow"), "-o", str(folder)) == 1
    assert f"output {str(folder)!r} is a folder; give the image's file name" in capsys.readouterr().err
    assert list(folder.iterdir()) == [] and not (tmp_path / "figures.png").exists()


def test_convert_refuses_to_write_over_its_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "x.csv"
    text = "step,loss\n" + "".join(f"{i},{1.0 / (i + 1)}\n" for i in range(20))
    src.write_text(text)
    link = tmp_path / "link.csv"
    link.symlink_to(src)
    for out in (src, link, Path(str(tmp_path) + "/./x.csv")):
        assert run("convert", str(src), "-o", str(out)) == 1
        assert "is the log being converted" in capsys.readouterr().err
    assert src.read_text() == text
    assert run("convert", str(src), "-o", str(tmp_path / "x.arrow")) == 0


def test_watch_says_what_happened_when_nothing_arrived(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.arrow"
    assert run("watch", str(missing), "--timeout", "0.2", "--interval", "0.02") == 3
    out, err = capsys.readouterr()
    assert "healthy" not in out
    assert err == f"error: {missing}: no such file (it did not appear within 0.2 s)\n"
    empty = tmp_path / "empty.arrow"
    TraceWriter(empty).close()  # a writer closed without a step
    assert run("watch", str(empty), "--timeout", "5", "--interval", "0.02") == 3
    out, err = capsys.readouterr()
    assert "healthy" not in out and err == f"error: {empty}: the writer closed the trace without writing a step\n"


# -- watch judges as replay does; rich tables show data as it is -----------------------------
def sparse_jump(n: int = 6000, every: int = 50, at: int = 114) -> dict[str, Any]:
    """A run logged every 50 steps whose loss triples at its 114th row: 6 rows before the end."""
    sig = {k: v[::every].copy() for k, v in healthy(n).items()}
    sig["loss"][at:] *= 3.0
    return sig


def watched_events(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("step ") and (" WARNING " in line
                                                                              or " CRITICAL " in line)]


def test_watch_of_a_closed_trace_gives_the_events_and_status_of_replay(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "sparse.arrow"
    write_trace(path, **sparse_jump())
    assert run("replay", str(path), "--json") == 2  # the jump is a divergence 2 rows later at log_every=50
    rep = json.loads(capsys.readouterr().out)["runs"][0]
    assert [(e["step"], e["kind"]) for e in rep["events"]] == [(5700, "loss_spike"), (5800, "divergence")]
    assert run("watch", str(path), "--timeout", "5", "--interval", "0.02") == 2  # was 1: Monitor(log_every=1)
    out = capsys.readouterr().out
    assert [line.split(" [")[0] for line in watched_events(out)] == [
        f"step {e['step']} {e['severity'].upper()} {e['kind']}" + (f" (since step {e['onset_step']})"
                                                                   if e["onset_step"] != e["step"] else "")
        + f": {e['message']}" for e in rep["events"]]
    assert "watched with Monitor(log_every=50)" in out
    # told otherwise, watch uses what it is told, and says so
    assert run("watch", str(path), "--timeout", "5", "--interval", "0.02", "--log-every", "1") == 1
    out = capsys.readouterr().out
    assert "divergence" not in out and "watched with Monitor(log_every=1) as asked" in out
    with pytest.raises(SystemExit) as exc:
        run("watch", str(path), "--log-every", "0")
    assert exc.value.code == 2 and "argument --log-every: must be >= 1, got 0" in capsys.readouterr().err


def test_watch_infers_the_interval_from_the_first_rows_of_a_live_trace(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "live_sparse.arrow"
    sig = sparse_jump()
    started = threading.Event()

    def writer() -> None:
        with TraceWriter(path, flush_every=4, metadata={"total_steps": 6000}) as w:  # 4 losses a batch
            for i, step in enumerate(sig["step"]):
                w.write(int(step), loss=float(sig["loss"][i]), grad_norm=float(sig["grad_norm"][i]))
                if i % 4 == 3:
                    started.set()
                    time.sleep(0.01)

    th = threading.Thread(target=writer)
    th.start()
    started.wait(5)
    code = run("watch", str(path), "--interval", "0.005", "--timeout", "20")
    th.join()
    out = capsys.readouterr().out
    write_trace(tmp_path / "whole.arrow", **sig, metadata={"total_steps": 6000})
    assert run("replay", str(tmp_path / "whole.arrow"), "--json") == code == 2
    rep = json.loads(capsys.readouterr().out)["runs"][0]
    assert [" ".join(line.split()[:4]).rstrip(":") for line in watched_events(out)] == [
        f"step {e['step']} {e['severity'].upper()} {e['kind']}" for e in rep["events"]]
    assert "watched with Monitor(log_every=50)" in out and "120 steps (0..5950)" in out


def test_watch_holds_the_first_rows_until_it_can_tell_the_interval(tmp_path: Path) -> None:
    write_trace(tmp_path / "s.arrow", **sparse_jump())
    table = read_trace(tmp_path / "s.arrow")
    w = trace_cli._Watch("s.arrow", None)
    assert w.status == "waiting" and w.feed(table.slice(0, 6)) == []
    assert w.monitor is None and w.status == "warming_up" and w.rows == 6
    assert "reading the logging interval (6/10 losses; --log-every skips this)" in w.line("writer running")
    w.feed(table.slice(6, 6))  # 12 losses: the Monitor is built from them, and judges them
    assert w.monitor is not None and w.monitor.log_every == 50 and w.monitor.total_steps is None
    rest = w.feed(table.slice(12))
    assert [(e.step, e.kind.value) for e in rest] == [(5700, "loss_spike"), (5800, "divergence")]
    told = trace_cli._Watch("s.arrow", None, log_every=25)
    told.feed(table.slice(0, 1))  # told the interval: judged from the first row
    assert told.monitor is not None and told.monitor.log_every == 25
    short = trace_cli._Watch("s.arrow", None)
    short.feed(table.slice(0, 3))
    assert short.finish(complete=True) == [] and short.monitor is not None  # the end: judged with what is there
    assert short.monitor.total_steps == 150  # a closed trace's span, as replay


def layer_report(name: str) -> ts.io.report.Report:
    from trainsignals.io.report import Report

    ev = ts.Event(ts.Kind.VANISHING_GRADIENT, "warning", 276, 274, "OwnDropGradCliff", "layer_grad_norms[fc1]",
                  2.1, 2.0, "grad norm of layer fc1 is 0.0272 [tiny]", "c", "fix [a] then [b]", layer="fc1")
    return Report(source=name, events=[ev], final_status="healthy", steps=465, first_step=0, last_step=464)


def test_rich_tables_show_names_and_layers_in_brackets_as_they_are() -> None:
    import io

    from rich.console import Console

    from trainsignals.io.report import summary_table

    def render(table: Any) -> str:
        buf = io.StringIO()
        Console(file=buf, width=250, force_terminal=True, color_system=None).print(table)
        return buf.getvalue()

    text = render(trace_cli._failure_table(layer_report("exp[lr].arrow")))
    assert "vanishing_gradient [fc1]" in text  # was "vanishing_gradient": [fc1] read as markup
    assert "0.0272 [tiny]" in text and "fix [a] then [b]" in text
    summary = render(summary_table([layer_report("runs/exp[lr].arrow"), layer_report("runs/b.arrow")]))
    assert "exp[lr].arrow" in summary and "fix [a] then [b]" in summary


def test_replay_of_a_folder_lists_a_run_named_with_brackets(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (runs / "a_ok.arrow").rename(runs / "exp[lr=0.1].arrow")
    assert run("replay", str(runs), "--processes", "1") == 2
    out = capsys.readouterr().out  # through a pipe: the plain report, then the summary table
    table = out[out.index("3 run(s) replayed"):]
    assert "exp[lr=0.1].arrow" in table  # was "exp.arrow"
