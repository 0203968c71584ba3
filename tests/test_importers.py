"""Importers of other tools' logs: values, masks (not measured vs NaN), merging, detection, errors."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import trainsignals as ts
from trainsignals.io import importers
from trainsignals.io.importers import (
    DEFAULT_MAPPINGS,
    ImportedRun,
    import_csv,
    import_hf_trainer_state,
    import_jsonl,
    import_lightning_csv,
    import_run,
    import_tensorboard,
)

DATA = Path(__file__).parent / "data" / "importers"
HF = DATA / "hf-checkpoint-60" / "trainer_state.json"
LIGHTNING = DATA / "lightning-version_0" / "metrics.csv"
CUSTOM = DATA / "custom_names.csv"
JSONL = DATA / "metrics.jsonl"
CUSTOM_MAPPING = {"loss": "my_loss", "grad_norm": "gnorm", "lr": "learning_rate_now", "val_loss": "valid_score"}


def values(a: np.ma.MaskedArray) -> list[float | None]:
    """Measured entries as floats (NaN/inf kept), not-measured ones as None."""
    return [None if m else float(x) for x, m in zip(np.ma.getdata(a), np.ma.getmaskarray(a))]


def same(got: list[float | None], want: list[float | None]) -> bool:
    if len(got) != len(want):
        return False
    for g, w in zip(got, want):
        if (g is None) != (w is None):
            return False
        if g is None or w is None:
            continue
        if math.isnan(w):
            if not math.isnan(g):
                return False
        elif g != pytest.approx(w, rel=1e-6):
            return False
    return True


def check_aligned(run: ImportedRun) -> None:
    assert run.steps.dtype == np.int64
    assert np.all(np.diff(run.steps) > 0)
    for arr in [*run.signals.values(), *run.extra.values()]:
        assert isinstance(arr, np.ma.MaskedArray)
        assert arr.dtype == np.float64
        assert arr.shape == run.steps.shape
        assert np.ma.getmaskarray(arr).shape == run.steps.shape


# --------------------------------------------------------------------------------------------
# Hugging Face Trainer


def test_hf_trainer_state_merges_train_and_eval_entries_by_step():
    run = import_hf_trainer_state(HF)
    check_aligned(run)
    assert run.tool == "hf-trainer" and run.source == str(HF)
    assert run.steps.tolist() == [10, 20, 25, 30, 40, 50, 60]
    assert list(run.signals) == ["loss", "grad_norm", "lr", "val_loss"]
    nan, inf = float("nan"), float("inf")
    # step 25 is an eval-only entry: no training loss was measured there; step 50 logged NaN
    assert same(values(run.signals["loss"]), [0.6931, 0.6412, None, 0.6027, 0.5802, nan, 0.5519])
    assert same(values(run.signals["grad_norm"]), [4.182, 3.507, None, 2.911, 2.448, inf, 2.102])
    assert same(values(run.signals["lr"]), [4.25e-05, 3.4166666666666666e-05, None, 2.5833333333333336e-05,
                                            1.75e-05, 9.166666666666667e-06, 8.333333333333334e-07])
    assert same(values(run.signals["val_loss"]), [None, None, 0.6213, None, None, 0.5731, 0.5796])


def test_hf_trainer_state_keeps_extras_and_metadata():
    run = import_hf_trainer_state(HF)
    assert set(run.extra) == {"epoch", "eval_accuracy", "eval_runtime", "eval_samples_per_second",
                              "eval_steps_per_second"}
    assert same(values(run.extra["eval_accuracy"]), [None, None, 0.64, None, None, 0.705, 0.7])
    assert run.extra["epoch"].count() == 7
    # the end-of-training summary is a run aggregate, not a step's values
    assert "train_loss" not in run.extra and "train_runtime" not in run.extra
    assert run.metadata["train_summary"]["train_loss"] == 0.6138
    assert run.metadata["best_model_checkpoint"] == "out/checkpoint-50"
    assert run.metadata["global_step"] == 60 and run.metadata["num_train_epochs"] == 2
    assert run.metadata["mapping"] == {"loss": "loss", "grad_norm": "grad_norm", "lr": "learning_rate",
                                       "val_loss": "eval_loss"}
    assert "log_history" not in run.metadata
    assert "conflicts" not in run.metadata  # epoch is logged twice at steps 50 and 60, with equal values


def test_hf_trainer_state_from_checkpoint_dir_and_mapping_override():
    assert import_hf_trainer_state(HF.parent).steps.tolist() == import_hf_trainer_state(HF).steps.tolist()
    run = import_hf_trainer_state(HF, mapping={"val_loss": "eval_accuracy", "lr": None})
    assert "lr" not in run.signals and "learning_rate" in run.extra
    assert same(values(run.signals["val_loss"]), [None, None, 0.64, None, None, 0.705, 0.7])
    assert "eval_loss" in run.extra


def test_hf_trainer_state_empty_log_history(tmp_path):
    p = tmp_path / "trainer_state.json"
    p.write_text(json.dumps({"global_step": 0, "log_history": []}))
    run = import_run(p)
    assert run.tool == "hf-trainer" and len(run.steps) == 0 and run.signals == {} and run.scan_kwargs() == {}


# --------------------------------------------------------------------------------------------
# Lightning CSVLogger


def test_lightning_csv_merges_rows_sharing_a_step():
    run = import_lightning_csv(LIGHTNING)
    check_aligned(run)
    assert run.tool == "lightning-csv"
    assert run.steps.tolist() == [4, 9, 14, 19]
    assert run.metadata["mapping"] == {"loss": "train_loss_step", "grad_norm": "grad_2.0_norm_total",
                                       "lr": "lr-SGD", "val_loss": "val_loss"}
    nan = float("nan")
    assert same(values(run.signals["loss"]), [2.2874, 2.0113, 1.8790, 1.7925])
    assert same(values(run.signals["grad_norm"]), [1.8821, 1.5642, nan, 1.2340])  # "nan" cell: measured
    assert same(values(run.signals["lr"]), [0.1, 0.1, 0.01, 0.01])
    assert same(values(run.signals["val_loss"]), [None, 1.9688, None, 1.8214])  # empty cells: not measured
    assert set(run.extra) == {"epoch", "grad_2.0_norm/layer.bias", "grad_2.0_norm/layer.weight",
                              "train_loss_epoch", "val_acc"}
    assert same(values(run.extra["train_loss_epoch"]), [None, 2.1502, None, 1.8361])
    assert same(values(run.extra["epoch"]), [0, 0, 1, 1])
    assert "conflicts" not in run.metadata


def test_lightning_csv_from_version_dir_and_overrides():
    assert import_lightning_csv(LIGHTNING.parent).steps.tolist() == [4, 9, 14, 19]
    run = import_lightning_csv(LIGHTNING, mapping={"loss": "train_loss_epoch", "lr": None})
    assert same(values(run.signals["loss"]), [None, 2.1502, None, 1.8361])
    assert "train_loss_step" in run.extra and "lr-SGD" in run.extra and "lr" not in run.signals


def test_lightning_lr_monitor_columns_skip_momentum(tmp_path):
    p = tmp_path / "metrics.csv"
    p.write_text("epoch,lr-Adam-momentum,lr-Adam/pg1,lr-Adam/pg2,step,train_loss\n"
                 ",0.9,0.001,0.0001,0,\n0,,,,0,2.5\n")
    run = import_run(p)
    assert run.tool == "lightning-csv"
    assert run.metadata["mapping"]["lr"] == "lr-Adam/pg1"
    assert run.metadata["mapping"]["loss"] == "train_loss"
    assert {"lr-Adam-momentum", "lr-Adam/pg2", "epoch"} <= set(run.extra)


# --------------------------------------------------------------------------------------------
# generic CSV


def test_csv_with_custom_column_names():
    run = import_csv(CUSTOM, mapping=CUSTOM_MAPPING, step_column="iteration")
    check_aligned(run)
    assert run.tool == "csv"
    assert run.steps.tolist() == [0, 10, 20, 30, 40]
    nan, inf = float("nan"), float("inf")
    assert same(values(run.signals["loss"]), [2.4512, 2.1034, 1.8877, nan, 1.7023])
    assert same(values(run.signals["grad_norm"]), [5.103, 4.221, None, 3.118, inf])
    assert same(values(run.signals["lr"]), [0.0005, 0.001, 0.001, 0.001, 0.0009])
    assert same(values(run.signals["val_loss"]), [None, None, 1.9402, None, 1.8127])
    # wall_time is measured by both rows of steps 20 and 40: the later row wins, and it is reported
    assert same(values(run.extra["wall_time"]), [12.0, 24.1, 39.8, 52.0, 67.9])
    assert run.metadata["conflicts"] == {"wall_time": 2}
    # a text column is skipped, not a crash
    assert set(run.extra) == {"wall_time"} and "note" in run.metadata["skipped_columns"]
    assert run.metadata["step_column"] == "iteration"


def test_csv_defaults_find_step_alias_and_keep_unknown_columns_as_extras():
    run = import_csv(CUSTOM)  # "iteration" is a known step alias; no column has a known signal name
    assert run.metadata["step_column"] == "iteration"
    assert run.signals == {}
    assert set(run.extra) == {"my_loss", "gnorm", "learning_rate_now", "valid_score", "wall_time"}
    assert run.scan_kwargs() == {}


def test_csv_without_step_column_uses_row_order(tmp_path):
    p = tmp_path / "log.csv"
    p.write_text("train_loss,learning_rate,eval_loss\n2.0,0.1,\n1.5,0.1,\nnan,0.1,1.7\n")
    run = import_csv(p)
    assert run.metadata["step_column"] is None
    assert run.steps.tolist() == [0, 1, 2]
    assert run.metadata["mapping"] == {"loss": "train_loss", "lr": "learning_rate", "val_loss": "eval_loss"}
    assert same(values(run.signals["loss"]), [2.0, 1.5, float("nan")])
    assert same(values(run.signals["val_loss"]), [None, None, 1.7])
    assert import_csv(CUSTOM, step_column=None).steps.tolist() == list(range(7))


def test_csv_missing_tokens_and_rows_out_of_order(tmp_path):
    p = tmp_path / "log.csv"
    p.write_text("step,loss,grad_norm\n20,NA,-inf\n0,1.0,null\n10,  ,NaN\n10.0,0.5,\n")
    run = import_csv(p)
    assert run.steps.tolist() == [0, 10, 20]
    assert same(values(run.signals["loss"]), [1.0, 0.5, None])
    assert same(values(run.signals["grad_norm"]), [None, float("nan"), float("-inf")])
    assert "conflicts" not in run.metadata


# --------------------------------------------------------------------------------------------
# JSONL


def test_jsonl_aliases_nan_null_nested_and_text():
    run = import_jsonl(JSONL)
    check_aligned(run)
    assert run.tool == "jsonl"
    assert run.steps.tolist() == [0, 100, 200, 300]
    assert run.metadata["mapping"] == {"loss": "train/loss", "grad_norm": "train/grad_norm", "lr": "lr",
                                       "val_loss": "eval/loss"}
    assert same(values(run.signals["loss"]), [3.2188, 2.7405, float("nan"), 2.4931])  # NaN literal
    assert same(values(run.signals["grad_norm"]), [7.91, 2.85, None, 1.97])  # null
    assert same(values(run.signals["val_loss"]), [None, None, 2.6517, None])
    assert same(values(run.extra["throughput/tokens_per_s"]), [51234.5, 60122.0, None, 59876.2])  # nested
    assert same(values(run.extra["eval/ppl"]), [None, None, 14.178, None])
    assert set(run.metadata["skipped_columns"]) == {"phase"}


def test_jsonl_mapping_and_json_array(tmp_path):
    p = tmp_path / "history.json"
    p.write_text(json.dumps([{"_step": 0, "nll": 3.0}, {"_step": 1, "nll": 2.5, "dev_nll": 2.9}]))
    run = import_run(p, mapping={"loss": "nll", "val_loss": "dev_nll"})
    assert run.tool == "jsonl" and run.metadata["step_column"] == "_step"
    assert same(values(run.signals["loss"]), [3.0, 2.5])
    assert same(values(run.signals["val_loss"]), [None, 2.9])


# --------------------------------------------------------------------------------------------
# scan_kwargs, to_arrow, Monitor end to end


def test_scan_kwargs_shape():
    run = import_hf_trainer_state(HF)
    kw = run.scan_kwargs()
    assert list(kw) == ["step", "loss", "grad_norm", "lr", "val_loss"]
    assert kw["step"].tolist() == run.steps.tolist()
    for name in ("loss", "grad_norm", "lr"):
        assert isinstance(kw[name], np.ma.MaskedArray)
        assert np.ma.getmaskarray(kw[name]).tolist() == [False, False, True, False, False, False, False]
    vs, vv = kw["val_loss"]
    assert vs.tolist() == [25, 50, 60] and vv.tolist() == [0.6213, 0.5731, 0.5796]
    kw["loss"][0] = 99.0  # copies: the run is untouched
    assert run.signals["loss"][0] == pytest.approx(0.6931)


def test_scan_kwargs_skips_signals_never_measured(tmp_path):
    p = tmp_path / "log.csv"
    p.write_text("step,loss,lr,val_loss\n0,1.0,,\n1,0.9,,\n")
    kw = import_csv(p).scan_kwargs()
    assert list(kw) == ["step", "loss"]


def test_end_to_end_monitor_scan_on_imported_runs():
    # HF: NaN loss and Inf grad norm at step 50; step 25 (eval only) has no training values
    run = import_run(HF.parent)
    events = ts.Monitor().scan(**run.scan_kwargs())
    nonfinite = [(e.step, e.signal) for e in events if e.kind.value == "nonfinite"]
    assert sorted(nonfinite) == [(50, "grad_norm"), (50, "loss")]
    # Lightning: a measured NaN grad norm at step 14; the gaps of the val rows are not alarms
    events = ts.Monitor().scan(**import_run(LIGHTNING).scan_kwargs())
    assert [(e.step, e.kind.value, e.signal) for e in events] == [(14, "nonfinite", "grad_norm")]
    # the measured loss steps alone, as plain arrays, give the same loss alarm
    m = ~np.ma.getmaskarray(run.signals["loss"])
    plain = ts.Monitor().scan(step=run.steps[m], loss=np.ma.getdata(run.signals["loss"])[m])
    assert [(e.step, e.signal) for e in plain if e.kind.value == "nonfinite"] == [(50, "loss")]


def test_to_arrow_nulls_are_not_measured_and_nan_stays():
    pa = pytest.importorskip("pyarrow")
    table = import_csv(CUSTOM, mapping=CUSTOM_MAPPING).to_arrow()
    assert table.column_names == ["step", "loss", "grad_norm", "lr", "val_loss", "wall_time"]
    assert table.schema.field("step").type == pa.int64()
    assert table.column("grad_norm").to_pylist() == [5.103, 4.221, None, 3.118, float("inf")]
    loss = table.column("loss").to_pylist()
    assert loss[3] is not None and math.isnan(loss[3]) and table.column("loss").null_count == 0


def test_to_arrow_renames_colliding_extras(tmp_path):
    pytest.importorskip("pyarrow")
    p = tmp_path / "log.csv"
    p.write_text("iteration,step,loss,my_loss\n0,100,9.0,1.0\n1,101,9.0,0.5\n")
    run = import_csv(p, mapping={"loss": "my_loss"}, step_column="iteration")
    assert set(run.extra) == {"step", "loss"}
    table = run.to_arrow()
    assert table.column_names == ["step", "loss", "extra/step", "extra/loss"]
    assert table.column("step").to_pylist() == [0, 1] and table.column("loss").to_pylist() == [1.0, 0.5]


def test_large_integer_steps_are_exact(tmp_path):
    big = 2**60 + 1
    p = tmp_path / "log.jsonl"
    p.write_text(f'{{"step": {big}, "loss": 1.0}}\n{{"step": {big + 2}, "loss": 0.5}}\n')
    assert import_jsonl(p).steps.tolist() == [big, big + 2]
    q = tmp_path / "log.csv"
    q.write_text(f"step,loss\n{big},1.0\n")
    assert import_csv(q).steps.tolist() == [big]


def test_repr_is_short():
    r = repr(import_run(LIGHTNING))
    assert r.startswith("ImportedRun(tool='lightning-csv'") and "steps=4 [4..19]" in r and "loss: 4" in r


# --------------------------------------------------------------------------------------------
# auto-detection


@pytest.mark.parametrize(("path", "tool"), [
    (HF, "hf-trainer"),
    (HF.parent, "hf-trainer"),
    (LIGHTNING, "lightning-csv"),
    (LIGHTNING.parent, "lightning-csv"),
    (CUSTOM, "csv"),
    (JSONL, "jsonl"),
])
def test_import_run_detects_the_tool(path, tool):
    assert import_run(path).tool == tool


def test_detection_by_content(tmp_path):
    p = tmp_path / "state-copy.json"  # not named trainer_state.json, but it is one
    p.write_text(HF.read_text())
    assert import_run(p).tool == "hf-trainer"
    q = tmp_path / "metrics.csv"  # a metrics.csv that is not Lightning's
    q.write_text("step,loss\n0,1.0\n")
    assert import_run(q).tool == "csv"
    r = tmp_path / "run.csv"  # Lightning columns under another name
    r.write_text("loss_epoch,loss_step,step\n,1.0,0\n")
    assert import_run(r).tool == "lightning-csv"
    assert import_run(r, tool="csv").tool == "csv"


# --------------------------------------------------------------------------------------------
# errors


def test_wrong_files_raise_value_error_naming_the_file(tmp_path):
    cases = [
        (import_hf_trainer_state, JSONL, "trainer_state"),
        (import_hf_trainer_state, LIGHTNING, "trainer_state"),
        (import_csv, HF, "CSV"),
        (import_lightning_csv, JSONL, "metrics.csv"),
        (import_jsonl, LIGHTNING, "JSON"),
        (import_jsonl, CUSTOM, "JSON"),
        (import_jsonl, HF, "use import_hf_trainer_state"),
    ]
    for fn, path, expected in cases:
        with pytest.raises(ValueError, match=expected) as info:
            fn(path)
        assert str(path) in str(info.value), (fn.__name__, str(info.value))
    obj = tmp_path / "trainer_state.json"
    obj.write_text('{"global_step": 3}')
    with pytest.raises(ValueError, match="log_history"):
        import_run(obj)
    binary = tmp_path / "weights.csv"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x00")
    with pytest.raises(ValueError, match="not a (text|readable)"):
        import_csv(binary)
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(ValueError, match="empty"):
        import_csv(empty)
    header_only = tmp_path / "header.csv"
    header_only.write_text("step,loss\n")
    with pytest.raises(ValueError, match="no data rows"):
        import_csv(header_only)
    words = tmp_path / "words.csv"
    words.write_text("name,comment\nalice,hello\n")
    with pytest.raises(ValueError, match="no numeric columns"):
        import_csv(words)


def test_bad_steps(tmp_path):
    p = tmp_path / "log.csv"
    p.write_text("step,loss\n0,1.0\n,0.9\n")
    with pytest.raises(ValueError, match=r"data row 2 has no step in 'step'"):
        import_csv(p)
    p.write_text("step,loss\n0,1.0\n1.5,0.9\n")
    with pytest.raises(ValueError, match="not an integer"):
        import_csv(p)
    # a step a float holds but 64 bits do not (found by fuzzing the importers): an error naming it, not an OverflowError
    s = tmp_path / "trainer_state.json"
    s.write_text(json.dumps({"log_history": [{"step": 0, "loss": 1.0}, {"step": 1e308, "loss": 0.9}]}))
    with pytest.raises(ValueError, match=r"step 1e\+308 in 'step' beyond the 64-bit range"):
        importers.import_run(s)
    p.write_text(f"step,loss\n0,1.0\n{2 ** 64},0.9\n")
    with pytest.raises(ValueError, match="beyond the 64-bit range"):
        import_csv(p)
    q = tmp_path / "log.jsonl"
    q.write_text('{"step": 0, "loss": 1}\n{"loss": 0.5}\n')
    with pytest.raises(ValueError, match="record 2 has no step"):
        import_jsonl(q)
    with pytest.raises(ValueError, match="'iter_no' not found"):
        import_csv(CUSTOM, step_column="iter_no")


def test_bad_mappings():
    with pytest.raises(ValueError, match="unknown mapping target.*'losss'.*'val'"):
        import_csv(CUSTOM, mapping={"losss": "my_loss", "val": "valid_score"})
    with pytest.raises(ValueError, match="'no_such_col' not found"):
        import_csv(CUSTOM, mapping={"loss": "no_such_col"})
    with pytest.raises(ValueError, match="'note'.*not numeric"):
        import_csv(CUSTOM, mapping={"loss": "note"})
    with pytest.raises(ValueError, match="'iteration' is the step"):
        import_csv(CUSTOM, mapping={"loss": "iteration"})
    with pytest.raises(ValueError, match="both"):
        import_csv(CUSTOM, mapping={"loss": "my_loss", "val_loss": "my_loss"})
    with pytest.raises(ValueError, match="unknown mapping target"):
        import_hf_trainer_state(HF, mapping={"accuracy": "eval_accuracy"})
    with pytest.raises(ValueError, match="unknown tool"):
        import_run(HF, tool="wandb")


def test_unrecognised_and_missing_paths(tmp_path):
    txt = tmp_path / "notes.txt"
    txt.write_text("loss went down\n")
    with pytest.raises(ValueError, match="cannot tell the format"):
        import_run(txt)
    with pytest.raises(ValueError, match="cannot tell what"):
        import_run(tmp_path)
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        import_run(tmp_path / "nope.csv")


def test_tensorboard_missing_package_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard.backend.event_processing.event_accumulator", None)
    with pytest.raises(ImportError, match=r"pip install trainsignals\[tensorboard\]"):
        import_tensorboard(DATA)


def test_docstring_table_lists_every_default_name():
    doc = importers.__doc__ or ""
    for tool, table in DEFAULT_MAPPINGS.items():
        assert f"``{tool}``" in doc
        for sig, names in table.items():
            for name in names:
                assert f"``{name}``" in doc, (tool, sig, name)


# --------------------------------------------------------------------------------------------
# TensorBoard (needs the tensorboard package)


def _write_events(logdir: Path, scalars: list[tuple[int, str, float]], tensor_scalars=()) -> None:
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.plugins.scalar.summary_v2 import scalar_pb
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    w = EventFileWriter(str(logdir))
    for step, tag, value in scalars:
        summ = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
        w.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summ))
    for step, tag, value in tensor_scalars:  # TF2 / Keras style: a scalar tensor with the scalars plugin
        w.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=scalar_pb(tag, np.float32(value))))
    w.close()


def test_tensorboard_hf_style_tags(tmp_path):
    pytest.importorskip("tensorboard")
    logdir = tmp_path / "runs" / "Nov30_12-00-00_host"
    _write_events(logdir, [
        (10, "train/loss", 0.75), (10, "train/grad_norm", 4.0), (20, "train/loss", 0.5),
        (20, "train/grad_norm", float("inf")), (30, "train/loss", float("nan")), (30, "train/grad_norm", 2.0),
        (25, "eval/loss", 0.625), (25, "eval/accuracy", 0.5), (10, "train/epoch", 0.25),
    ], tensor_scalars=[(10, "train/learning_rate", 0.5), (20, "train/learning_rate", 0.25),
                       (30, "train/learning_rate", 0.125)])
    for path in (tmp_path / "runs", logdir, next(logdir.iterdir())):
        run = import_run(path)
        check_aligned(run)
        assert run.tool == "tensorboard"
        assert run.steps.tolist() == [10, 20, 25, 30]
        assert run.metadata["mapping"] == {"loss": "train/loss", "grad_norm": "train/grad_norm",
                                           "lr": "train/learning_rate", "val_loss": "eval/loss"}
        nan, inf = float("nan"), float("inf")
        assert same(values(run.signals["loss"]), [0.75, 0.5, None, nan])
        assert same(values(run.signals["grad_norm"]), [4.0, inf, None, 2.0])
        assert same(values(run.signals["lr"]), [0.5, 0.25, None, 0.125])
        assert same(values(run.signals["val_loss"]), [None, None, 0.625, None])
        assert set(run.extra) == {"eval/accuracy", "train/epoch"}
        assert run.metadata["runs"] == [""]
    events = ts.Monitor().scan(**run.scan_kwargs())
    assert sorted((e.step, e.signal) for e in events if e.kind.value == "nonfinite") == [
        (20, "grad_norm"), (30, "loss")]


def test_tensorboard_keras_layout_and_mapping(tmp_path):
    pytest.importorskip("tensorboard")
    _write_events(tmp_path / "logs" / "train", [], tensor_scalars=[(0, "epoch_loss", 2.0), (1, "epoch_loss", 1.5)])
    _write_events(tmp_path / "logs" / "validation", [], tensor_scalars=[(0, "epoch_loss", 2.25), (1, "epoch_loss", 2.5)])
    run = import_tensorboard(tmp_path / "logs")
    assert run.metadata["runs"] == ["train", "validation"]
    assert run.metadata["mapping"] == {"loss": "train/epoch_loss", "val_loss": "validation/epoch_loss"}
    assert same(values(run.signals["val_loss"]), [2.25, 2.5])
    swapped = import_tensorboard(tmp_path / "logs", mapping={"loss": "validation/epoch_loss", "val_loss": None})
    assert same(values(swapped.signals["loss"]), [2.25, 2.5]) and "train/epoch_loss" in swapped.extra
    with pytest.raises(ValueError, match="'Loss/dev' not found"):
        import_tensorboard(tmp_path / "logs", mapping={"val_loss": "Loss/dev"})


def test_tensorboard_bad_inputs(tmp_path):
    pytest.importorskip("tensorboard")
    junk = tmp_path / "events.out.tfevents.123.host"
    junk.write_bytes(b"this is not a tfrecord file at all" * 4)
    with pytest.raises(ValueError, match="not a TensorBoard event file"):
        import_tensorboard(junk)
    with pytest.raises(ValueError, match="not named like"):
        import_tensorboard(CUSTOM)
    with pytest.raises(ValueError, match="holds no TensorBoard event files"):
        import_tensorboard(DATA)


# --------------------------------------------------------------------------------------------
# quirks of logs found in the wild (small files under tests/data/logs/)

LOGS = Path(__file__).parent / "data" / "logs"


def test_keras_csvlogger_training_log_is_csv_indexed_by_epoch():
    run = import_run(LOGS / "training.log")
    assert run.tool == "csv"
    assert run.metadata["step_column"] == "epoch" and run.metadata["step_unit"] == "epoch"
    assert run.steps.tolist() == [0, 1, 2, 3, 4, 5]  # 0-based, as Keras writes them
    assert same(values(run.signals["lr"]), [0.001, 0.001, 0.001, 0.00020000001, 0.00020000001, 4.0000003e-05])
    assert set(run.signals) == {"loss", "lr", "val_loss"} and "val_accuracy" in run.extra
    assert any("epoch" in n for n in run.notes)


def test_ultralytics_padded_header_epoch_axis_and_no_signal_message():
    run = import_run(LOGS / "results.csv")
    assert run.steps.tolist() == [1, 2, 3, 4] and run.metadata["step_column"] == "epoch"
    assert run.signals == {} and "train/box_loss" in run.extra
    assert np.all(np.isnan(np.ma.getdata(run.extra["val/box_loss"])))  # measured NaN, not "missing"
    assert run.extra["val/box_loss"].count() == 4
    with pytest.raises(importers.NoSignalError) as info:
        run.require_signals()
    msg = str(info.value)
    assert "train/box_loss" in msg and "metrics/mAP50(B)" in msg and "--map loss=train/box_loss" in msg
    mapped = import_run(LOGS / "results.csv", mapping={"loss": "train/box_loss", "val_loss": "val/box_loss"})
    mapped.require_signals()
    assert same(values(mapped.signals["loss"]), [3.6966, 2.968, 2.712, 2.501])


def test_suggest_mapping_prefers_training_losses():
    assert importers.suggest_mapping(["epoch", "val_mse", "train_mse"]) == {"loss": "train_mse", "val_loss": "val_mse"}
    assert importers.suggest_mapping(["a_loss", "mean_loss"])["loss"] == "mean_loss"
    assert importers.suggest_mapping(["reward"]) == {"loss": "reward"}
    assert importers.suggest_mapping([]) == {}


def test_epoch_is_the_x_axis_only_when_one_row_per_epoch():
    run = import_csv(LOGS / "epochs.csv")
    assert run.steps.tolist() == [1, 2, 3] and run.metadata["step_unit"] == "epoch"
    rep = import_csv(LOGS / "epochs_repeat.csv")  # two rows per epoch: the row order, and a note saying why
    assert rep.metadata["step_column"] is None and rep.steps.tolist() == [0, 1, 2, 3]
    assert "step_unit" not in rep.metadata
    assert any("repeats in consecutive rows" in n for n in rep.notes)
    assert import_csv(LOGS / "epochs.csv", step_column=None).steps.tolist() == [0, 1, 2]


def test_resume_from_a_checkpoint_later_rows_win():
    run = import_run(LOGS / "resumed.jsonl")
    assert run.metadata["step_column"] == "current_steps"  # LLaMA-Factory's step key
    assert run.steps.tolist() == [10, 20, 30, 40, 50]
    assert same(values(run.signals["loss"]), [2.0, 1.8, 1.65, 1.6, 1.5])  # 9.9 at step 40 was abandoned
    assert run.metadata["steps_went_back"] == 1 and "runs_in_file" not in run.metadata
    assert run.metadata["conflicts"]["loss"] == 2
    assert "elapsed_time" in run.metadata["skipped_columns"]
    assert any("goes back 1 time" in n and "40 -> 30" in n for n in run.notes)


def test_concatenated_runs_keep_the_last_unless_asked():
    run = import_csv(LOGS / "two_runs.csv")
    assert run.steps.tolist() == [0, 1, 2, 3] and same(values(run.signals["loss"]), [2.5, 2.0, 1.8, 1.7])
    assert run.metadata["runs_in_file"] == [{"rows": [1, 3], "steps": [0, 2]}, {"rows": [4, 7], "steps": [0, 3]}]
    assert run.metadata["run_index"] == 1 and any("holds 2 runs" in n for n in run.notes)
    first = import_run(LOGS / "two_runs.csv", run_index=0)
    assert first.steps.tolist() == [0, 1, 2] and same(values(first.signals["loss"]), [5.0, 4.0, 3.0])
    assert "conflicts" not in first.metadata
    with pytest.raises(ValueError, match="run_index 2 out of range: the file holds 2 run"):
        import_csv(LOGS / "two_runs.csv", run_index=2)


def test_numbers_written_as_strings():
    run = import_run(LOGS / "strings.jsonl")
    assert run.steps.tolist() == [1, 2, 3]
    assert same(values(run.signals["loss"]), [2.5, 2.25, 2.0])
    assert same(values(run.extra["throughput"]), [0.0, 12.5, 13.0])
    assert run.metadata["skipped_columns"] == {"elapsed_time": "'1 day, 0:08:23'"}


@pytest.mark.parametrize("name", ["nonfinite.jsonl", "nonfinite.csv"])
def test_nonfinite_and_missing_spellings(name):
    run = import_run(LOGS / name)
    nan, inf = float("nan"), float("inf")
    if name.endswith(".jsonl"):
        assert same(values(run.signals["loss"]), [1.0, inf, nan, nan, None])
        assert same(values(run.signals["grad_norm"]), [nan, -inf, inf, -inf, nan])
        assert run.signals["val_loss"].count() == 0
    else:
        assert same(values(run.signals["loss"]), [1.0, inf, nan, None, None])
        assert same(values(run.signals["grad_norm"]), [nan, -inf, inf, None, inf])


def test_hf_none_values_null_step_summary_lr_key_and_grouped_evals():
    run = import_run(LOGS / "hf_quirks")
    assert run.tool == "hf-trainer" and run.steps.tolist() == [0, 10, 20, 30]
    assert same(values(run.signals["loss"]), [None, 0.8, -0.0, 0.6])
    assert math.copysign(1.0, float(run.signals["loss"][2])) == -1.0  # a signed zero stays a measured value
    assert same(values(run.signals["grad_norm"]), [None, None, 1.5, float("nan")])
    assert run.metadata["mapping"]["lr"] == "lr"  # custom trainers log "lr", not "learning_rate"
    assert "val_loss" not in run.signals and same(values(run.extra["eval_g1_loss"]), [1.1, None, None, 0.75])
    assert run.metadata["train_summary"]["train_loss"] == 0.61 and "train_loss" not in run.extra
    assert "remaining_time" in run.metadata["skipped_columns"]
    assert any('"step": null skipped (entry 4)' in n for n in run.notes)


def test_sniffing_text_files(tmp_path):
    j = tmp_path / "train.txt"
    j.write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "loss": 0.9}\n')
    assert import_run(j).tool == "jsonl"
    prose = tmp_path / "notes.log"
    prose.write_text("epoch 1 done\nepoch 2 done, loss 0.9\n")
    with pytest.raises(ValueError, match="cannot tell the format"):
        import_run(prose)


# --------------------------------------------------------------------------------------------
# CSV headers as pandas and hand-rolled writers leave them; the step column in any case


def test_pandas_index_column_is_ignored(tmp_path):
    """``DataFrame.to_csv()`` writes the row index as an unnamed first column: not a signal, not an error."""
    p = tmp_path / "df.csv"
    p.write_text(",step,loss,val_loss\n0,0,2.0,\n1,10,1.5,1.75\n2,20,1.0,\n")
    run = import_run(p)
    assert run.tool == "csv" and run.steps.tolist() == [0, 10, 20]
    assert same(values(run.signals["loss"]), [2.0, 1.5, 1.0])
    assert same(values(run.signals["val_loss"]), [None, 1.75, None])
    assert run.extra == {} and run.metadata["columns"] == ["step", "loss", "val_loss"]
    assert run.metadata["ignored_columns"] == {"column 1": "no name and the row numbers 0, 1, 2, ... (pandas' index)"}
    # the same file under a name that is sniffed (Keras' training.log style)
    txt = tmp_path / "log.txt"
    txt.write_text(p.read_text())
    assert import_run(txt).steps.tolist() == [0, 10, 20]


def test_trailing_comma_is_ignored(tmp_path):
    every_line = tmp_path / "a.csv"
    every_line.write_text("step,loss,\n0,2.0,\n1,1.5,\n")
    data_only = tmp_path / "b.csv"
    data_only.write_text("step,loss\n0,2.0,\n1,1.5,\n")
    for p in (every_line, data_only):
        run = import_run(p)
        assert run.steps.tolist() == [0, 1] and same(values(run.signals["loss"]), [2.0, 1.5]), p
        assert run.metadata["columns"] == ["step", "loss"]
    assert "column 3" in import_run(every_line).metadata["ignored_columns"]


def test_other_unnamed_columns_are_still_refused(tmp_path):
    middle = tmp_path / "m.csv"
    middle.write_text("step,,loss\n0,5,2.0\n1,6,1.5\n")
    with pytest.raises(ValueError, match="header row has no name for column 2; name it"):
        import_csv(middle)
    not_an_index = tmp_path / "i.csv"  # an unnamed first column that is not 0, 1, 2, ...: data, not pandas' index
    not_an_index.write_text(",loss\n5,2.0\n7,1.5\n")
    with pytest.raises(ValueError, match="header row has no name for column 1"):
        import_csv(not_an_index)
    trailing_values = tmp_path / "t.csv"  # an unnamed last column that holds values
    trailing_values.write_text("step,loss,\n0,2.0,3\n1,1.5,4\n")
    with pytest.raises(ValueError, match="no name for column 3"):
        import_csv(trailing_values)
    extra_values = tmp_path / "x.csv"  # cells past the header that hold values
    extra_values.write_text("step,loss\n0,2.0,9\n")
    with pytest.raises(ValueError, match="row 1 has 3 cells but the header has 2"):
        import_csv(extra_values)


@pytest.mark.parametrize("name", ["Step", "STEP", "Global_Step", "GLOBAL_STEP", "Iteration"])
def test_step_column_matches_in_any_case(tmp_path, name):
    p = tmp_path / "log.csv"
    p.write_text(f"{name},Loss\n0,2.0\n10,1.5\n20,1.0\n")
    run = import_run(p)
    assert run.steps.tolist() == [0, 10, 20]
    assert run.metadata["step_column"] == name and "notes" not in run.metadata
    assert same(values(run.signals["loss"]), [2.0, 1.5, 1.0])
    j = tmp_path / "log.jsonl"
    j.write_text("".join(json.dumps({name: s, "loss": 1.0}) + "\n" for s in (5, 6)))
    assert import_run(j).steps.tolist() == [5, 6]


def test_step_column_exact_name_wins_and_explicit_names_match_in_any_case(tmp_path):
    p = tmp_path / "log.csv"
    p.write_text("Step,step,loss\n100,0,2.0\n200,1,1.5\n")
    assert import_csv(p).steps.tolist() == [0, 1]
    assert import_csv(p, step_column="STEP").steps.tolist() == [100, 200]  # no exact 'STEP': the first in any case


def test_missing_step_message_fits_the_importer(tmp_path):
    p = tmp_path / "log.csv"
    p.write_text("step,loss\n0,2.0\n,1.5\n")
    with pytest.raises(ValueError, match=r"data row 2 has no step in 'step': every data row needs one \(fill it in "
                                         r"or drop the data row; in Python, import_csv\(\.\.\., step_column=None\)"):
        import_run(p)
    metrics = tmp_path / "metrics.csv"  # Lightning's importer has no step_column: it is not suggested
    metrics.write_text("epoch,step,train_loss_step,lr-SGD\n0,0,2.0,0.1\n0,,1.5,0.1\n")
    with pytest.raises(ValueError, match=r"needs one \(fill it in or drop the data row\)$"):
        import_run(metrics)


# --------------------------------------------------------------------------------------------
# run_index for every format that can hold several runs; folders read by the file at their top


def test_hf_trainer_state_takes_run_index(tmp_path):
    p = tmp_path / "trainer_state.json"
    first = [{"step": s, "loss": 3.0 - 0.01 * s, "epoch": 0.1} for s in (10, 20, 30)]
    second = [{"step": s, "loss": 2.0 - 0.01 * s, "epoch": 0.1} for s in (10, 20, 30, 40)]
    p.write_text(json.dumps({"global_step": 40, "log_history": first + second}))
    last = import_run(p)
    assert last.steps.tolist() == [10, 20, 30, 40] and len(last.metadata["runs_in_file"]) == 2
    assert any("--run-index" in n for n in last.notes)
    run0 = import_run(p, run_index=0)
    assert run0.steps.tolist() == [10, 20, 30] and same(values(run0.signals["loss"]), [2.9, 2.8, 2.7])
    assert import_hf_trainer_state(p, run_index=0).steps.tolist() == [10, 20, 30]
    with pytest.raises(ValueError, match="run_index 2 out of range: the file holds 2 run"):
        import_run(p, run_index=2)


def test_hf_output_folder_is_read_by_its_trainer_state_not_its_tensorboard_runs(tmp_path):
    pytest.importorskip("tensorboard")
    out = tmp_path / "output"
    _write_events(out / "runs" / "Nov30_12-00-00_host", [(1, "train/loss", 9.0)])
    _write_events(out / "runs" / "Dec01_08-00-00_host", [(1, "train/loss", 8.0)])
    state = {"log_history": [{"step": s, "loss": 1.0 / s} for s in range(1, 6)]}
    (out / "trainer_state.json").write_text(json.dumps(state))
    run = import_run(out)
    assert run.tool == "hf-trainer" and run.source == str(out / "trainer_state.json")
    assert run.steps.tolist() == [1, 2, 3, 4, 5]
    lf = tmp_path / "llama_factory"  # LLaMA-Factory's output folder: trainer_log.jsonl at the top
    _write_events(lf / "runs" / "x", [(1, "train/loss", 9.0)])
    (lf / "trainer_log.jsonl").write_text("".join(json.dumps({"current_steps": s, "loss": 1.0}) + "\n"
                                                  for s in (1, 2)))
    run = import_run(lf)
    assert run.tool == "jsonl" and run.source == str(lf / "trainer_log.jsonl") and run.steps.tolist() == [1, 2]


def test_tensorboard_folder_with_several_runs_is_refused_naming_them(tmp_path):
    pytest.importorskip("tensorboard")
    runs = tmp_path / "runs"
    _write_events(runs / "a", [(0, "loss", 1.0), (1, "loss", 0.5)])
    _write_events(runs / "b", [(0, "loss", 9.0), (1, "loss", 8.0)])
    with pytest.raises(ValueError, match=r"holds 2 TensorBoard runs, which are not merged: .*runs/a, .*runs/b; "
                                         r"point at one of them"):
        import_run(runs)
    assert import_run(runs / "a").steps.tolist() == [0, 1]
    # one run's own subfolders are not runs: Keras' train/validation, add_scalars' <tag>_<name>
    one = tmp_path / "one"
    _write_events(one, [(0, "loss", 1.0)])
    _write_events(one / "Loss_val", [(0, "Loss", 2.0)])
    assert import_run(one).metadata["runs"] == ["", "Loss_val"]


def test_tensorboard_run_index_other_than_the_one_run_is_refused(tmp_path):
    pytest.importorskip("tensorboard")
    _write_events(tmp_path / "tb", [(0, "loss", 1.0), (1, "loss", 0.5)])
    for k in (0, -1):
        assert import_run(tmp_path / "tb", run_index=k).steps.tolist() == [0, 1]
    with pytest.raises(ValueError, match="run_index 1: a TensorBoard log is read as one run"):
        import_run(tmp_path / "tb", run_index=1)


def test_truncated_tensorboard_file_is_read_up_to_the_damage_with_a_warning(tmp_path):
    pytest.importorskip("tensorboard")
    _write_events(tmp_path / "tb", [(s, "train/loss", 1.0 / (s + 1)) for s in range(400)])
    (f,) = (tmp_path / "tb").iterdir()
    whole = import_tensorboard(f)
    assert "damaged_files" not in whole.metadata and whole.notes == []
    data = f.read_bytes()
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / f.name).write_bytes(data[: len(data) // 2 + 7])  # a copy cut short mid-record
    with pytest.warns(importers.LogDamagedWarning, match=r"damaged event file .*: its records end at byte"):
        run = import_run(cut)
    assert 100 < len(run.steps) < 400  # what is complete was read
    assert list(run.metadata["damaged_files"]) == [str(cut / f.name)]
    assert any(n.startswith(f"damaged event file {cut / f.name}: its records end at byte") for n in run.notes)
