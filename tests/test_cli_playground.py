"""``trainsignals playground``: the live demo shows no false alarm on healthy descent, and the
sweep never counts a run the Monitor has not judged as healthy."""

from __future__ import annotations

import argparse

import pytest

from trainsignals.cli import main
from trainsignals.cli.options import UsageError
from trainsignals.cli.playground import (
    DEFAULT_LR,
    NOT_JUDGED,
    add_playground_arguments,
    converged,
    descend,
    run_playground,
    sweep,
)


def status_of(argv: list[str]) -> int:
    """The exit status of ``trainsignals ARGV``, whether argparse or the command refused it."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


@pytest.mark.parametrize("lr", [DEFAULT_LR, 0.03, 0.27, 0.5, 0.81, 0.95])
def test_a_stable_run_stops_converged_without_an_alarm(lr: float) -> None:
    ticks = list(descend(lr, steps=2000))
    assert [e for t in ticks for e in t.events if e.severity != "info"] == []  # was silent_collapse at 100
    assert ticks[-1].converged and converged(ticks[-1].loss) and not any(t.converged for t in ticks[:-1])
    assert ticks[-1].status in ("healthy", "warming_up") and len(ticks) < 2000


def test_the_default_demo_says_it_converged(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["playground", "--steps", "200"]) == 0
    out = capsys.readouterr().out
    assert "WARNING" not in out and "collapsed" not in out  # was: silent_collapse at step 100
    lines = out.splitlines()
    assert lines[-1].startswith("converged at step 83: the loss ") and "stopping" in lines[-1]
    assert lines[-2].startswith("step  83 ") and lines[-2].endswith("healthy")


def test_an_unstable_run_still_diverges_and_stops_at_overflow(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["playground", "--lr", "1.1", "--steps", "10"]) == 0
    out = capsys.readouterr().out
    assert "step 4 CRITICAL divergence (since step 0)" in out and "converged" not in out
    ticks = list(descend(2.43, steps=5000))  # was an OverflowError
    assert ticks[-1].status == "diverging" and ticks[-1].loss == float("inf") and len(ticks) < 5000


def test_a_sweep_too_short_to_judge_counts_no_rate_healthy(capsys: pytest.CaptureFixture[str]) -> None:
    rows, edge = sweep(steps=3)
    assert [r.verdict for r in rows] == [NOT_JUDGED] * 6  # lr 2.43: loss 49 -> 1.6e5, was "healthy"
    assert "healthy" not in edge and "sweep higher" not in edge and "--steps 20 or more" in edge
    rows, edge = sweep(steps=10)
    assert [(r.lr, r.verdict) for r in rows][-1] == (2.43, "diverging")
    assert edge.startswith("lr 2.43 failed; lr 0.01, 0.03, 0.09, 0.27, 0.81 not judged: ")
    assert main(["playground", "--sweep", "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert NOT_JUDGED in out and "every rate stayed healthy" not in out


def test_a_long_sweep_finds_the_edge_and_says_which_runs_converged() -> None:
    rows, edge = sweep(steps=300)
    assert [r.verdict for r in rows] == ["healthy"] * 5 + ["diverging"]
    assert [r.converged_at for r in rows] == [None, None, 93, 23, 38, None]  # was: collapsed, from lr 0.09
    assert edge.startswith("edge of stability between lr 0.81 (last healthy) and lr 2.43 (first failing)")


def test_lr_with_sweep_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert status_of(["playground", "--sweep", "--lr", "2"]) == 2  # was: --lr silently ignored
    out, err = capsys.readouterr()
    assert out == "" and "--lr" in err and "--sweep" in err
    with pytest.raises(UsageError, match="--lr 2 with --sweep"):
        run_playground(2.0, 10, True)


def test_the_playground_parser_refuses_lr_with_sweep_as_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="trainsignals playground")
    add_playground_arguments(parser)
    assert parser.parse_args([]).lr is None and parser.parse_args(["--sweep"]).sweep
    for argv in (["--sweep", "--lr", "0.1"], ["--lr", "2", "--sweep"]):
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("usage: trainsignals playground") and "not allowed with argument" in err
    assert "converged" in parser.format_help() and "not judged" in parser.format_help()
