"""Bad input to the ``trainsignals`` command: a one-line ``error:`` naming the option or the path and
status 2 (argparse's), never a traceback, never an impossible value taken silently."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trainsignals.cli import main
from trainsignals.cli.options import UsageError, nonnegative_float, positive_int, run_command
from trainsignals.eval import bench
from trainsignals.io.traces import write_trace


def outcome(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``main(argv)``'s exit status (argparse's ``SystemExit`` included) and its stderr."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse refused the command line
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def last_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert lines, "nothing on stderr"
    return lines[-1]


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    t = np.arange(300)
    path = tmp_path / "ok.arrow"
    write_trace(path, step=t, loss=np.exp(-t / 100) + 0.5)
    return path


@pytest.fixture
def small_suite(tmp_path: Path) -> Path:
    from trainsignals.curves import generate, write_suite

    folder = tmp_path / "suite"
    write_suite([generate("stall", 0, "easy"), generate("healthy", 0, "easy")], folder)
    return folder


# -- values refused while the command line is parsed ---------------------------------------
@pytest.mark.parametrize(("argv", "message"), [
    (["bench", "--log-every", "0"], "argument --log-every: must be >= 1, got 0"),
    (["bench", "--log-every", "-3"], "argument --log-every: must be >= 1, got -3"),
    (["bench", "--log-every", "x"], "argument --log-every: expected an integer, got 'x'"),
    (["bench", "--json", "--markdown"], "argument --markdown: not allowed with argument --json"),
    (["datasets", "--jobs", "0"], "argument --jobs: must be >= 1, got 0"),
    (["datasets", "--suite", "real", "--jobs", "-1"], "argument --jobs: must be >= 1, got -1"),
    (["datasets", "--seed", "-1"], "argument --seed: must be >= 0, got -1"),
    (["demo", "--per-kind", "0"], "argument --per-kind: must be >= 1, got 0"),
    (["demo", "--per-kind", "-2"], "argument --per-kind: must be >= 1, got -2"),
    (["demo", "--seed", "-1"], "argument --seed: must be >= 0, got -1"),
    (["playground", "--steps", "0"], "argument --steps: must be >= 1, got 0"),
    (["playground", "--lr", "0"], "argument --lr: must be a finite number > 0, got 0"),
    (["playground", "--lr", "-0.1"], "argument --lr: must be a finite number > 0, got -0.1"),
    (["playground", "--lr", "nan"], "argument --lr: must be a finite number > 0, got nan"),
    (["playground", "--lr", "inf"], "argument --lr: must be a finite number > 0, got inf"),
    (["plot", "run.arrow", "-o", "run.png", "--dpi", "0"], "argument --dpi: must be >= 1, got 0"),
    (["watch", "run.arrow", "--interval", "0"], "argument --interval: must be a finite number > 0, got 0"),
    (["watch", "run.arrow", "--interval", "nan"], "argument --interval: must be a finite number > 0, got nan"),
    (["watch", "run.arrow", "--timeout", "-1"], "argument --timeout: must be a finite number >= 0, got -1"),
    (["watch", "run.arrow", "--timeout", "nan"], "argument --timeout: must be a finite number >= 0, got nan"),
    (["watch", "run.arrow", "--total-steps", "0"], "argument --total-steps: must be >= 1, got 0"),
])
def test_impossible_values_are_refused_by_the_parser(argv: list[str], message: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, err = outcome(argv, capsys)
    assert code == 2
    assert last_line(err) == f"trainsignals {argv[0]}: error: {message}"


def test_the_types_take_the_values_that_make_sense() -> None:
    assert positive_int("1") == 1 and positive_int(" 12 ") == 12
    assert nonnegative_float("0") == 0.0 and nonnegative_float("1e3") == 1000.0
    parser = argparse.ArgumentParser(prog="t")
    parser.add_argument("--n", type=positive_int, default=1)
    assert parser.parse_args([]).n == 1 and parser.parse_args(["--n", "7"]).n == 7


# -- bench: what only running it finds ------------------------------------------------------
def test_bench_missing_suite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nonexistent"
    code, err = outcome(["bench", "--suite", str(missing)], capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith(f"trainsignals bench: error: no curve suite at {missing} ")
    # the same through the bench module's own entry point, and in a pool of suites
    assert bench.main(["--suite", str(missing)]) == 2
    assert capsys.readouterr().err.startswith(f"trainsignals bench: error: no curve suite at {missing} ")
    code, err = outcome(["bench", "--suite", "synthetic", "--suite", str(missing)], capsys)
    assert code == 2 and f"no curve suite at {missing}" in last_line(err)
    code, err = outcome(["bench", "--leave-one-family-out", "--suite", str(missing)], capsys)
    assert code == 2 and f"no curve suite at {missing}" in last_line(err)
    assert not missing.exists()


def test_bench_suite_folder_that_is_not_a_suite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "manifest.json").write_text(json.dumps({"format": "someone-else", "curves": []}))
    code, err = outcome(["bench", "--suite", str(foreign)], capsys)
    assert code == 2
    assert last_line(err).startswith("trainsignals bench: error: --suite: ")
    assert f"{foreign / 'manifest.json'}: unknown format 'someone-else'" in err


def test_bench_leave_one_family_out_takes_one_suite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = outcome(["bench", "--leave-one-family-out", "--suite", "real", "--suite", "dev"], capsys)
    assert code == 2
    assert err == "trainsignals bench: error: --leave-one-family-out scores one suite: give --suite once\n"


def test_bench_bad_calibration_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.json"
    code, err = outcome(["bench", "--calibration", str(missing)], capsys)
    assert (code, err) == (2, f"trainsignals bench: error: --calibration: cannot read {missing}: "
                              "No such file or directory\n")
    code, err = outcome(["bench", "--calibration", str(tmp_path)], capsys)
    assert code == 2 and err == f"trainsignals bench: error: --calibration: cannot read {tmp_path}: Is a directory\n"
    junk = tmp_path / "junk.txt"
    junk.write_text("not json\n")
    code, err = outcome(["bench", "--calibration", str(junk)], capsys)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"trainsignals bench: error: --calibration: {junk} is not a calibration file")
    assert "JSONDecodeError" in err
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"x": 1}))
    code, err = outcome(["bench", "--calibration", str(other)], capsys)
    assert code == 2 and f"--calibration: {other} is not a calibration file" in err and "KeyError" in err


def test_bench_withhold_names_a_signal(small_suite: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = outcome(["bench", "--suite", str(small_suite), "--no-baselines", "--withhold", "bogus"], capsys)
    assert code == 2  # refused while parsing, before any suite is read; the choices are listed
    assert last_line(err).startswith("trainsignals bench: error: argument --withhold: invalid choice: 'bogus' "
                                     "(choose from 'grad_norm', ")
    code, err = outcome(["bench", "--suite", str(small_suite), "--no-baselines", "--withhold", "loss"], capsys)
    assert code == 2 and "invalid choice: 'loss'" in last_line(err)
    # a signal a run can go without is still scored
    code, err = outcome(["bench", "--suite", str(small_suite), "--no-baselines", "--json", "--withhold", "lr"], capsys)
    assert code == 0 and "scored without lr" in err


def test_bench_log_every_set_by_hand_is_refused_not_taken_as_1(small_suite: Path) -> None:
    parser = argparse.ArgumentParser(prog="trainsignals bench")
    bench.add_arguments(parser)
    args = parser.parse_args(["--suite", str(small_suite), "--no-baselines", "--json"])
    args.log_every = 0  # a Namespace a caller built: the parser never saw it
    with pytest.raises(UsageError, match="--log-every must be >= 1, got 0"):
        bench.run_from_args(args)


# -- datasets -------------------------------------------------------------------------------
def test_datasets_out_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "a_file"
    target.write_text("keep me\n")
    code, err = outcome(["datasets", "--out", str(target)], capsys)
    assert code == 2
    assert err == f"trainsignals datasets: error: --out {target} is a file; give the folder to write the suite into\n"
    assert target.read_text() == "keep me\n"


# -- the trace commands: their own exit codes, still one line --------------------------------
def test_watch_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = outcome(["watch", str(tmp_path), "--timeout", "0.1", "--interval", "0.01"], capsys)
    assert code == 3  # watch's "the file is not a trace"
    assert err == f"error: {tmp_path} is a folder; watch follows one trace file (e.g. {tmp_path / 'run.arrow'})\n"


def test_watch_a_file_that_cannot_be_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trainsignals.cli import traces

    path = tmp_path / "run.arrow"
    path.write_bytes(b"\xff\xff\xff\xff")

    def unreadable(self: traces.TraceTail) -> list:
        raise PermissionError(13, "Permission denied", str(self.path))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(traces.TraceTail, "poll", unreadable)
        code, err = outcome(["watch", str(path), "--timeout", "0.1", "--interval", "0.01"], capsys)
    assert code == 3 and last_line(err) == f"error: {path}: Permission denied"


def test_replay_keeps_its_messages(tmp_path: Path, trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = outcome(["replay", str(tmp_path / "nonexistent")], capsys)
    assert code == 3 and last_line(err) == f"error: no such trace, log or folder: {tmp_path / 'nonexistent'}"
    empty = tmp_path / "empty"
    empty.mkdir()
    code, err = outcome(["replay", str(empty)], capsys)
    assert code == 3 and last_line(err) == f"error: no traces or logs in {empty}"


_MAP_SYNTAX = "expected OURS=THEIRS (e.g. loss=train/loss; lr= skips lr)"
_BAD_TRACE_OPTIONS = [
    (["--map", "loss"], f"argument --map: {_MAP_SYNTAX}, got 'loss'", ("replay", "plot", "convert")),
    (["--map", "=a"], f"argument --map: {_MAP_SYNTAX}, got '=a'", ("replay", "plot", "convert")),
    (["--map", "los=a"], "argument --map: 'los' in 'los=a' is not one of our signals (loss, grad_norm, lr, "
                         "update_ratio, val_loss, val_metric, pred_top_share, pred_spread)", ("replay", "convert")),
    (["--processes", "0"], "argument --processes: must be >= 1, got 0", ("replay",)),
    (["--log-every", "0"], "argument --log-every: must be >= 1, got 0", ("replay", "plot")),
    (["--total-steps", "-5"], "argument --total-steps: must be >= 1, got -5", ("replay", "plot")),
]


@pytest.mark.parametrize(("command", "argv", "message"),
                         [(c, argv, msg) for argv, msg, commands in _BAD_TRACE_OPTIONS for c in commands])
def test_trace_commands_refuse_bad_option_values_while_parsing(command: str, argv: list[str], message: str,
                                                               trace: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A usage error is argparse's status 2 for every command: replay and watch (where 2 is also a
    critical event) too, never replay's 3 ("unreadable") or convert's 1 ("failed")."""
    out = {"plot": ["-o", str(tmp_path / "out.png")], "convert": ["-o", str(tmp_path / "out.arrow")]}
    code, err = outcome([command, str(trace), *out.get(command, []), *argv], capsys)
    assert code == 2
    assert last_line(err) == f"trainsignals {command}: error: {message}"
    assert err.startswith(f"usage: trainsignals {command}")
    assert not (tmp_path / "out.png").exists() and not (tmp_path / "out.arrow").exists()


def test_a_signal_mapped_twice_is_a_usage_error(trace: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["replay", str(trace)], ["convert", str(trace), "-o", str(tmp_path / "x.arrow")]):
        code, err = outcome([*argv, "--map", "loss=a", "loss=b"], capsys)
        assert code == 2
        assert err == f"trainsignals {argv[0]}: error: --map names 'loss' twice (loss=a and loss=b); give it once\n"


def test_plot_and_convert_name_the_missing_folder(tmp_path: Path, trace: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, err = outcome(["convert", str(tmp_path / "nonexistent.csv"), "-o", str(tmp_path / "x.arrow")], capsys)
    assert code == 1 and last_line(err) == f"error: no such file or directory: {tmp_path / 'nonexistent.csv'}"
    csv = tmp_path / "log.csv"
    csv.write_text("step,a\n" + "".join(f"{i},{1.0 / (i + 1)}\n" for i in range(50)))
    out = tmp_path / "nodir" / "x.arrow"
    code, err = outcome(["convert", str(csv), "-o", str(out), "--map", "loss=a"], capsys)
    assert code == 1 and f"the folder {str(out.parent)!r} does not exist" in last_line(err)
    pytest.importorskip("matplotlib")
    code, err = outcome(["plot", str(trace), "-o", str(tmp_path / "nodir" / "x.png")], capsys)
    assert code == 1 and str(tmp_path / "nodir" / "x.png") in last_line(err)


# -- what is not the user's fault keeps its traceback -----------------------------------------
def test_a_programming_error_is_not_swallowed(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(args: argparse.Namespace) -> int:
        raise KeyError("a bug")

    monkeypatch.setattr(bench, "run_from_args", broken)
    with pytest.raises(KeyError, match="a bug"):
        main(["bench"])
    with pytest.raises(RuntimeError):
        run_command("t", lambda args: (_ for _ in ()).throw(RuntimeError("bug")), argparse.Namespace())
    assert run_command("t", lambda args: 5, argparse.Namespace()) == 5


# -- the installed command, as a user runs it -------------------------------------------------
COMMAND = [sys.executable, "-c", "import sys; from trainsignals.cli import main; sys.exit(main())"]  # the script


@pytest.mark.parametrize("command", [[*COMMAND, "bench"], [sys.executable, "-m", "trainsignals.eval.bench"]])
def test_the_command_prints_one_line_and_no_traceback(command: list[str], tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent"
    proc = subprocess.run([*command, "--suite", str(missing)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(f"trainsignals bench: error: no curve suite at {missing} (missing manifest.json)")
    proc = subprocess.run([*command, "--log-every", "0"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[-1] == "trainsignals bench: error: argument --log-every: must be >= 1, got 0"


def test_a_run_index_for_a_trace_is_refused_not_ignored(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A trace holds one run: ``run_index`` 0 or -1 replays it, any other is an error that says why."""
    from trainsignals.io.report import replay_source

    path = tmp_path / "run.arrow"
    write_trace(path, step=np.arange(50), loss=np.linspace(2.0, 1.0, 50))
    assert replay_source(path, run_index=0).steps == replay_source(path, run_index=-1).steps == 50
    with pytest.raises(ValueError, match="run_index 5: .* is a trace, which holds one run"):
        replay_source(path, run_index=5)
    assert main(["replay", str(path), "--run-index", "5"]) == 3  # replay's status for a source it cannot read
    assert "is a trace, which holds one run" in capsys.readouterr().out


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX pipes")
@pytest.mark.parametrize("extra", [[], ["--json"], ["--markdown"], ["COPY"]])
def test_a_reader_that_goes_away_stops_replay_quietly(trace: Path, extra: list[str]) -> None:
    """``trainsignals replay ... | head -1``: no BrokenPipeError traceback; status 141 (128 + SIGPIPE),
    as a shell reports a Unix tool stopped by SIGPIPE; through print() and through rich alike."""
    from trainsignals.cli.options import EXIT_BROKEN_PIPE

    paths = [str(trace), str(trace)] if extra == ["COPY"] else [str(trace)]  # two runs: rich's summary table
    opts = [] if extra == ["COPY"] else extra
    proc = subprocess.Popen([*COMMAND, "replay", *paths, *opts, "--processes", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before anything is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == EXIT_BROKEN_PIPE == 141
    assert err == ""
