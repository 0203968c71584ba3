"""Real training logs from public repositories (``../shared/wild-logs`` beside the repository):
each imports (or says clearly how to map it), and replays without an exception.

The logs are not committed here; the tests skip when the folder is absent. Each quirk they show
is also tested on a small committed file in ``tests/test_importers.py``.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from trainsignals.io.importers import NoSignalError, import_run
from trainsignals.io.report import expand_sources, replay_source

WILD = Path(__file__).resolve().parents[2] / "shared" / "wild-logs"
RUNS = WILD / "runs"
pytestmark = pytest.mark.skipif(not (WILD / "SOURCES.md").is_file(),
                                reason=f"the wild logs are not at {WILD} (a copy sits beside the clone in CI)")


def sources_table() -> dict[str, tuple[int, str]]:
    """short_name -> (points, primary loss name), read from SOURCES.md."""
    out: dict[str, tuple[int, str]] = {}
    for line in (WILD / "SOURCES.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 7 or not (RUNS / cells[0]).is_dir():
            continue
        m = re.match(r"(\d+) \(`(.+)`\)", cells[5])
        if m:
            out[cells[0]] = (int(m.group(1)), m.group(2))
    return out


def one_source(name: str) -> Path:
    found = expand_sources(RUNS / name)
    assert len(found) == 1, (name, found)
    return found[0]


def test_sources_table_lists_every_run():
    table = sources_table()
    assert len(table) == len([d for d in RUNS.iterdir() if d.is_dir()]) == 39


def test_every_wild_log_imports_and_replays():
    table = sources_table()
    tally: dict[str, list[str]] = {"healthy": [], "warnings": [], "critical": []}
    kinds: dict[str, int] = {}
    mapped = []
    for name, (points, primary) in sorted(table.items()):
        src = one_source(name)
        run = import_run(src)
        mapping = None
        if not run.measured_signals():
            with pytest.raises(NoSignalError) as info:
                run.require_signals()
            assert primary in str(info.value), name  # the message names the column to map
            mapping = {"loss": primary}
            mapped.append(name)
            run = import_run(src, mapping=mapping)
        run.require_signals()
        primary_sig = next((s for s, c in run.metadata["mapping"].items() if c == primary), None)
        series = run.signals[primary_sig] if primary_sig is not None else run.extra[primary]
        count = series.count()
        merged = "conflicts" in run.metadata or "steps_went_back" in run.metadata or run.tool == "lightning-csv"
        assert count == points or (merged and 0 < count <= points), (name, count, points)
        assert np.all(np.diff(run.steps) > 0)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            rep = replay_source(src, mapping=mapping)
        assert rep.error is None and rep.steps == len(run.steps)
        tally[rep.verdict].append(name)
        for kind, _evs in rep.failures():
            kinds[kind.value] = kinds.get(kind.value, 0) + 1
    assert sum(map(len, tally.values())) == 39
    print(f"\nwild logs: 39 imported ({len(mapped)} after mapping the loss the error named: {', '.join(mapped)}); "
          f"healthy {len(tally['healthy'])}, warnings {len(tally['warnings'])}, critical {len(tally['critical'])}; "
          f"runs per failure kind: {kinds}")
    for v in ("warnings", "critical"):
        print(f"  {v}: {', '.join(tally[v])}")


def test_keras_training_log_is_read_as_csv_by_epoch():
    run = import_run(one_source("csv_keras_brats_unet"))
    assert run.tool == "csv" and run.metadata["step_unit"] == "epoch"
    assert run.steps[0] == 0 and len(run.steps) == 24 and set(run.signals) == {"loss", "lr", "val_loss"}
    lr = run.signals["lr"].compressed()
    assert lr.max() == pytest.approx(1e-3) and 1.6000001e-06 in lr.tolist()  # float32 reprs, read exactly


def test_ultralytics_results_csv_needs_a_mapping_and_says_which():
    src = one_source("csv_yolo_court")
    with pytest.raises(NoSignalError, match=r"--map loss=train/box_loss val_loss=val/box_loss"):
        import_run(src).require_signals()
    run = import_run(src, mapping={"loss": "train/box_loss", "val_loss": "val/box_loss"})
    assert run.steps[0] == 1 and run.metadata["step_column"] == "epoch"
    assert run.signals["val_loss"].count() == 225 and np.isnan(run.signals["val_loss"].compressed()).all()


def test_llamafactory_two_writers_and_resume():
    run = import_run(one_source("jsonl_sft_resumed"))
    assert run.metadata["step_column"] == "current_steps"
    assert run.metadata["steps_went_back"] > 100 and "runs_in_file" not in run.metadata
    assert len(run.steps) == len(np.unique(run.steps)) == 657
    nulls = import_run(one_source("jsonl_luojiu_7b_nulls"))
    assert nulls.signals["val_loss"].count() == 0 and nulls.signals["loss"].count() == 1742


def test_hf_files_with_other_keys():
    star = import_run(one_source("hf_star_pretrain"))
    assert star.metadata["mapping"]["lr"] == "lr" and "remaining_time" in star.metadata["skipped_columns"]
    grpo = import_run(one_source("hf_dllm_grpo"))
    zeros = grpo.signals["loss"].compressed()
    assert np.sum((zeros == 0) & np.signbit(zeros)) > 100  # "loss": -0.0 kept as measured values


def test_a_sparse_log_hears_of_one_climb_once_per_window():
    # csv_ddpg_a logs a critic loss every 2,000 steps that grows for tens of rows (by design of the
    # algorithm); the window rules' cooldown (100 steps) is under one row, so before their quiet lasted
    # until their window had passed they reported the climb from step 2000 at every row, 25 times
    tab = sources_table()
    for name in ("csv_ddpg_a", "csv_oedometer_mlp", "pl_pinn_em_b", "tb_naf_dqn_rl"):
        src = one_source(name)
        mapping = None if import_run(src).measured_signals() else {"loss": tab[name][1]}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rep = replay_source(src, mapping=mapping)
        windowed = [(e.detector, e.onset_step) for e in rep.events
                    if e.detector in ("TrendDivergence", "EarlyClimbDivergence", "LjungBoxSawtooth",
                                      "SwingRatioEdgeOfStability")]
        assert windowed and len(windowed) == len(set(windowed)), (name, windowed)
