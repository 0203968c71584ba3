"""``replay`` and ``plot`` of whatever the user has: traces, other tools' logs, folders mixing them,
on any ``concurrent.futures`` executor; output that reads in pipes; the one-line verdict."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from trainsignals.cli import main
from trainsignals.io._console import PIPE_WIDTH, make_console
from trainsignals.io.report import Report, expand_sources, replay_many, replay_source
from trainsignals.io.traces import write_trace

DATA = Path(__file__).parent / "data"
LOGS = DATA / "logs"
HF = DATA / "importers" / "hf-checkpoint-60" / "trainer_state.json"
LIGHTNING = DATA / "importers" / "lightning-version_0"


def diverging_trace(path: Path, n: int = 900) -> Path:
    """A loss that blows up at step 250 and comes back to normal: critical, then healthy again."""
    rng = np.random.default_rng(0)
    loss = np.exp(-np.arange(n) / 300) * (1 + 0.02 * rng.standard_normal(n))
    loss[250:262] *= np.exp(np.arange(12) * 0.8)
    write_trace(path, step=np.arange(n), loss=loss)
    return path


@pytest.fixture()
def mixed(tmp_path: Path) -> Path:
    """A folder mixing a trace, an HF run with checkpoints, a Lightning version folder and loose logs."""
    root = tmp_path / "mixed"
    (root / "hf" / "checkpoint-30").mkdir(parents=True)
    shutil.copy(HF, root / "hf" / "checkpoint-30" / "trainer_state.json")  # a prefix: skipped
    shutil.copy(HF, root / "hf" / "trainer_state.json")
    shutil.copytree(LIGHTNING, root / "lightning_logs" / "version_0")
    (root / "lightning_logs" / "version_0" / "hparams.yaml").write_text("lr: 0.1\n")
    shutil.copy(LOGS / "training.log", root / "training.log")
    shutil.copy(LOGS / "no_signals.csv", root / "no_signals.csv")
    (root / "README.txt").write_text("these are my runs\n")
    (root / "config.json").write_text('{"hidden_size": 8}')
    diverging_trace(root / "run.arrow")
    return root


def test_expand_sources_finds_each_run_once(mixed: Path) -> None:
    found = [p.relative_to(mixed).as_posix() for p in expand_sources(mixed)]
    assert found == ["hf/trainer_state.json", "lightning_logs/version_0/metrics.csv", "no_signals.csv", "run.arrow",
                     "training.log"]
    assert expand_sources(mixed / "lightning_logs" / "version_0") == [mixed / "lightning_logs" / "version_0"]
    only_ckpt = mixed / "only"
    for n in (10, 30, 20):
        (only_ckpt / f"checkpoint-{n}").mkdir(parents=True)
        shutil.copy(HF, only_ckpt / f"checkpoint-{n}" / "trainer_state.json")
    assert expand_sources(only_ckpt) == [only_ckpt / "checkpoint-30" / "trainer_state.json"]


def test_replay_trainer_state_directly(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["replay", str(HF), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == out["exit_code"] < 3
    run = out["runs"][0]
    assert run["error"] is None and run["steps"] == 7 and run["metadata"]["tool"] == "hf-trainer"


def test_replay_without_signals_says_what_to_map(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(LOGS / "no_signals.csv")]) == 3
    out = capsys.readouterr().out
    assert "train/box_loss" in out and "--map loss=train/box_loss" in out
    assert main(["convert", str(LOGS / "no_signals.csv"), "-o", "/dev/null"]) == 1
    assert "--map loss=train/box_loss" in capsys.readouterr().err
    code = main(["replay", str(LOGS / "no_signals.csv"), "--map", "loss=train/box_loss", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code < 3 and out["runs"][0]["unit"] == "epoch" and out["runs"][0]["first_step"] == 1


def test_epoch_indexed_log_names_epochs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "training.log"  # Keras CSVLogger: the epoch is the x-axis, 100 epochs from 0
    n = 100
    loss = np.r_[np.linspace(1.0, 0.5, 60), 0.5 * np.exp(np.arange(40) * 0.3)]
    log.write_text("epoch,loss,val_loss\n" + "".join(f"{i},{float(x)!r},{float(x)!r}\n" for i, x in enumerate(loss[:n])))
    rep = replay_source(log)
    assert rep.unit == "epoch" and rep.first_step == 0 and rep.last_step == n - 1
    assert any("epoch" in note for note in rep.notes)
    assert rep.failures(), "the blow-up from epoch 60 is found"
    first = rep.failures()[0][1][0]
    assert 55 <= first.step < n and f"epoch {first.step}" in rep.headline()


def test_mixed_folder_cli_and_progress(mixed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["replay", str(mixed), "--processes", "1", "--progress", "--json"])
    out = json.loads(capsys.readouterr().out)
    names = [Path(r["source"]).name for r in out["runs"]]
    assert names == ["trainer_state.json", "metrics.csv", "no_signals.csv", "run.arrow", "training.log"]
    errors = {Path(r["source"]).name: r["error"] for r in out["runs"] if r["error"]}
    assert list(errors) == ["no_signals.csv"] and "NoSignalError" in errors["no_signals.csv"]
    assert code == 3 == max(r["exit_code"] for r in out["runs"])
    verdicts = {Path(r["source"]).name: r["verdict"] for r in out["runs"]}
    assert verdicts["run.arrow"] == "critical"


def _replayed(reports: list[Report]) -> list[tuple[str, str, int]]:
    return [(Path(r.source).name, r.verdict, len(r.events)) for r in reports]


def test_replay_many_on_executors(mixed: Path) -> None:
    here = replay_many(mixed, processes=1, progress=False)
    with ProcessPoolExecutor(max_workers=2) as pool:
        assert _replayed(replay_many(mixed, executor=pool, progress=False)) == _replayed(here)
    with ThreadPoolExecutor(max_workers=2) as pool:
        assert _replayed(replay_many(mixed, executor=pool)) == _replayed(here)
        assert not pool._shutdown  # the caller's executor is left running


def test_replay_many_on_a_dask_cluster(mixed: Path) -> None:
    distributed = pytest.importorskip("distributed", reason="dask distributed is not installed")
    here = replay_many(mixed, processes=1, progress=False)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        with client.get_executor() as ex:
            got = replay_many(mixed, executor=ex, progress=False)
    assert _replayed(got) == _replayed(here)


def test_verdict_first_and_wide_output_in_pipes(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    trace = diverging_trace(tmp_path / "a_run_with_a_rather_long_name_for_the_table.arrow")
    shutil.copy(trace, tmp_path / "b_second_run_with_a_long_name_as_well.arrow")
    monkeypatch.delenv("TRAINSIGNALS_WIDTH", raising=False)
    monkeypatch.setenv("COLUMNS", "80")
    assert make_console().width == PIPE_WIDTH  # captured stdout is not a terminal
    assert main(["replay", str(trace)]) == 2
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("CRITICAL a_run_with") and "since step" in out[0] and "Fix:" in out[0]
    main(["replay", str(tmp_path), "--processes", "1"])
    out = capsys.readouterr().out
    assert "│ a_run_with_a_rather_long_name_for_the_table.arrow │" in out  # the summary table, names whole
    assert "…" not in out


def test_headline_and_plot_title_tell_the_truth(tmp_path: Path) -> None:
    rep = replay_source(diverging_trace(tmp_path / "run.arrow"))
    assert rep.should_stop and rep.final_status == "healthy"
    crit = next(e for e in rep.events if e.severity == "critical")
    line = rep.headline(fix=False)
    assert line.startswith(f"critical {crit.kind.value} at step {crit.step}")
    assert "recovered, status healthy at the end" in line and f"stop advised at step {crit.step}" in line
    pytest.importorskip("matplotlib")
    from trainsignals.io.plot import plot_run

    fig = plot_run(rep)
    title = fig.texts[0].get_text()
    assert "recovered, status healthy at the end" in title and "status healthy, stop advised" not in title


def test_plot_of_a_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "keras.png"
    assert main(["plot", str(LOGS / "training.log"), "-o", str(out)]) == 0
    assert out.stat().st_size > 10_000
    assert main(["plot", str(LOGS / "no_signals.csv"), "-o", str(out)]) == 1
    assert "--map loss=train/box_loss" in capsys.readouterr().err


def test_demo_and_bench_output_formats(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["totals"]["faulty"] == len(data["curves"]) - data["totals"]["healthy"]
    assert main(["demo", "--markdown"]) == 0
    md = capsys.readouterr().out
    assert md.startswith("| curve |") and md.count("\n|") == len(data["curves"]) + 1
