"""The Hugging Face Trainer callback (:class:`trainsignals.adapters.transformers.TrainSignalsCallback`) on CPU.

Real ``transformers.Trainer`` runs, no download: a tiny GPT-2-like causal LM and a tiny BERT-like
classifier built from configs with random weights, on made-up token ids. The LM learns arithmetic
sequences ``(a + b·t) mod V`` (its loss falls steadily); the classifier learns whether the first
token is in the lower half of the vocabulary. Faults are injected at known optimizer steps:
the learning rate raised 100x by the LR schedule, or a NaN put into the model's loss by a forward
hook. Every run is a few dozen steps on one thread.

The 2-process DDP test runs this file as a script under ``torch.distributed.run`` (gloo, CPU).
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib.util
import json
import math
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from transformers import (  # noqa: E402
    BertConfig,
    BertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

import trainsignals as ts  # noqa: E402
from trainsignals.adapters.transformers import TrainingFailure, TrainSignalsCallback  # noqa: E402

V, T = 64, 16            # vocabulary and sequence length of the made-up data
LR = 3e-3                # AdamW's learning rate (constant schedule)
FAULT = 40               # the optimizer step (0-based) from which the learning rate is 100x
WITHIN = 15              # a stop must come within this many steps of the fault
STEPS = 80
LOUD = ("warning", "critical")


def _datasets_shadowed() -> bool:
    """Whether ``import datasets`` finds a namespace package: this repository's ``datasets/`` folder
    (on ``sys.path`` as the working directory under ``python -m pytest``) instead of Hugging Face's."""
    spec = importlib.util.find_spec("datasets")
    return spec is not None and spec.origin is None


@pytest.fixture(autouse=True)
def _not_hf_datasets(monkeypatch: pytest.MonkeyPatch) -> None:
    # transformers takes any importable "datasets" for the Hugging Face library and then fails on
    # ``datasets.Dataset``; the data here are torch datasets, so tell it there is none
    if _datasets_shadowed():
        monkeypatch.setattr(transformers.trainer, "is_datasets_available", lambda: False)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)          # tiny matrices: threads only add overhead on a shared CPU
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        yield
    transformers.logging.set_verbosity(level)
    torch.set_num_threads(threads)


# ----------------------------------------------------------------------------------------
# Models, data, helpers
# ----------------------------------------------------------------------------------------
class SeqData(torch.utils.data.Dataset):
    """Arithmetic token sequences for the causal LM (labels = inputs: the model shifts them)."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, V, (n, 1), generator=g)
        stride = torch.randint(1, 5, (n, 1), generator=g)
        self.x = (start + stride * torch.arange(T)) % V

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


class ClassData(torch.utils.data.Dataset):
    """Random token ids; the label says whether the first token is in the lower half."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randint(0, V, (n, T), generator=g)
        self.y = (self.x[:, 0] < V // 2).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.x[i], "labels": self.y[i]}


def tiny_lm(seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(vocab_size=V, n_positions=T, n_layer=2, n_head=2, n_embd=32,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def tiny_bert(seed: int = 0) -> BertForSequenceClassification:
    torch.manual_seed(seed)
    return BertForSequenceClassification(BertConfig(
        vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=T, num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))


def targs(out: Path, **kw: Any) -> TrainingArguments:
    base: dict[str, Any] = dict(output_dir=str(out), max_steps=STEPS, per_device_train_batch_size=8,
                                learning_rate=LR, lr_scheduler_type="constant", logging_steps=10,
                                report_to=[], save_strategy="no", use_cpu=True, dataloader_num_workers=0,
                                disable_tqdm=True, seed=0)
    base.update(kw)
    return TrainingArguments(**base)


def lr_fault_optimizers(model: torch.nn.Module, fault: int | None) -> tuple[Any, Any]:
    """AdamW whose LR schedule multiplies the rate by 100 from optimizer step ``fault`` on."""
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 100.0 if fault is not None and s >= fault else 1.0)
    return opt, sched


class Recorder:
    """What the Monitor was fed, per step (a trainsignals Recorder)."""

    def __init__(self) -> None:
        self.signals: dict[int, dict[str, float]] = {}
        self.layers: dict[int, tuple[Any, tuple[str, ...]]] = {}

    def record(self, *, step: int, signals: Any, layer_grad_norms: Any, activations: Any, events: Any) -> None:
        self.signals.setdefault(step, {}).update(signals)
        if layer_grad_norms is not None:
            self.layers[step] = layer_grad_norms

    def record_batch(self, **kwargs: Any) -> None:   # scan(): not used here
        raise AssertionError("the callback feeds the Monitor step by step")


class NaNLossAt(TrainerCallback):
    """Makes the model's loss NaN at optimizer step ``step`` (a forward hook on the model).

    ``grad_free=True`` adds a NaN constant (the gradients stay finite); otherwise the loss is
    multiplied by NaN (so are the gradients). ``rank`` limits it to one process.
    """

    def __init__(self, model: torch.nn.Module, step: int, *, grad_free: bool = False, rank: int | None = None) -> None:
        self.step, self.grad_free, self.rank, self.now = step, grad_free, rank, False
        model.register_forward_hook(self._hook)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.now = state.global_step == self.step and (self.rank is None or args.process_index == self.rank)

    def _hook(self, module: torch.nn.Module, inputs: Any, output: Any) -> None:
        if self.now and module.training and getattr(output, "loss", None) is not None:
            loss = output.loss
            output.loss = loss + loss.detach() * math.nan if self.grad_free else loss * math.nan


class StopAt(TrainerCallback):
    """Interrupts training after ``steps`` optimizer steps (a crash stand-in)."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step >= self.steps:
            control.should_training_stop = True


def loud(cb: TrainSignalsCallback) -> list[tuple[str, str, int]]:
    return [(e.kind.value, e.severity, e.step) for e in cb.events if e.severity in LOUD]


def fingerprint(cb: TrainSignalsCallback) -> list[tuple[str, str, int, int]]:
    return [(e.kind.value, e.severity, e.step, e.onset_step) for e in cb.events]


def train_rows(trainer: Trainer) -> list[dict[str, Any]]:
    return [r for r in trainer.state.log_history if "loss" in r]


def lm_trainer(out: Path, *, fault: int | None = None, seed: int = 0, callbacks: tuple[Any, ...] = (),
               monitor: ts.Monitor | None = None, cb_kwargs: dict[str, Any] | None = None,
               model: torch.nn.Module | None = None, **kw: Any) -> tuple[Trainer, TrainSignalsCallback]:
    """A Trainer of the tiny LM with the callback (and ``callbacks`` before it), not trained yet."""
    model = model if model is not None else tiny_lm(seed)
    cb = TrainSignalsCallback(monitor, verbose=0, **(cb_kwargs or {}))
    trainer = Trainer(model=model, args=targs(out, seed=seed, **kw), train_dataset=SeqData(640, seed),
                      callbacks=[*callbacks, cb], optimizers=lr_fault_optimizers(model, fault))
    return trainer, cb


def lm_run(out: Path, *, resume: str | None = None, **kw: Any) -> tuple[Trainer, TrainSignalsCallback]:
    trainer, cb = lm_trainer(out, **kw)
    trainer.train(resume_from_checkpoint=resume)
    return trainer, cb


def unwrapped(trainer: Trainer) -> bool:
    """Whether the callback's wrappers are off the Trainer and its Accelerator."""
    return ("training_step" not in vars(trainer) and "log" not in vars(trainer)
            and "clip_grad_norm_" not in vars(trainer.accelerator))


# ----------------------------------------------------------------------------------------
# Options
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "name"), [
    ({"on_critical": "halt"}, "on_critical"),
    ({"also_stop_on": ("overfit",)}, "also_stop_on"),
    ({"also_stop_on": "overfitting"}, "also_stop_on"),
    ({"verbose": 3}, "verbose"),
    ({"total_steps": 0}, "total_steps"),
    ({"val_metric": ""}, "val_metric"),
    ({"score_metric": 3}, "score_metric"),
    ({"save_on_stop": "yes"}, "save_on_stop"),
    ({"monitor": "monitor"}, "monitor"),
    ({"update_ratio_every": -1}, "update_ratio_every"),
    ({"scaler": None}, "scaler"),
    ({"no_such_option": 1}, "no_such_option"),
])
def test_bad_options_raise_value_error_naming_the_parameter(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        TrainSignalsCallback(**kwargs)


def test_attach_refuses_what_is_not_a_trainer() -> None:
    with pytest.raises(ValueError, match="trainer"):
        TrainSignalsCallback().attach(object())


# ----------------------------------------------------------------------------------------
# Healthy runs: quiet, and the signals are the step's own
# ----------------------------------------------------------------------------------------
def test_healthy_lm_run_is_quiet_and_feeds_each_steps_own_signals(tmp_path: Path) -> None:
    rec = Recorder()
    trainer, cb = lm_run(tmp_path, monitor=ts.Monitor(total_steps=STEPS, recorder=rec), logging_steps=1)
    assert loud(cb) == []
    assert cb.stopped_step is None and trainer.state.global_step == STEPS
    assert sorted(rec.signals) == list(range(STEPS))          # one update per optimizer step, 0-based
    rows = train_rows(trainer)
    assert len(rows) == STEPS
    for row in rows:
        fed = rec.signals[row["step"] - 1]
        # logging every step, the Trainer's window mean is that step's loss: the same value
        assert fed["loss"] == pytest.approx(row["loss"], rel=1e-5)
        assert row["trainsignals/loss"] == pytest.approx(fed["loss"], rel=1e-6)
        assert fed["grad_norm"] == pytest.approx(row["grad_norm"], rel=1e-5)   # the Trainer's own (pre-clip) norm
        assert fed["lr"] == pytest.approx(row["learning_rate"], rel=1e-9)
    ratios = sorted(s for s, sig in rec.signals.items() if "update_ratio" in sig)
    assert ratios == list(range(0, STEPS, 10))                # the watcher's default cadence
    names, norms = rec.layers[STEPS - 1][1], rec.layers[STEPS - 1][0]
    # per module by default: the parameters' owners
    assert set(names) == {n.rsplit(".", 1)[0] for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert math.sqrt(sum(float(v) ** 2 for v in norms)) == pytest.approx(rec.signals[STEPS - 1]["grad_norm"],
                                                                         rel=1e-4)
    assert cb.watcher is None and unwrapped(trainer)          # hooks and wrappers removed at the end


@pytest.mark.parametrize("max_grad_norm", [0.05, 0.0])
def test_grad_norm_is_read_before_clipping(tmp_path: Path, max_grad_norm: float) -> None:
    class Applied(TrainerCallback):   # the norm of the gradients the optimizer gets (after any clipping)
        norms: list[float] = []

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
            self.norms.append(float(torch.linalg.vector_norm(
                torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]))))

    rec = Recorder()
    trainer, cb = lm_run(tmp_path, monitor=ts.Monitor(recorder=rec), max_steps=30, logging_steps=1,
                         max_grad_norm=max_grad_norm, callbacks=(Applied(),))
    rows = train_rows(trainer)
    fed = [rec.signals[r["step"] - 1]["grad_norm"] for r in rows]
    assert fed == pytest.approx([r["grad_norm"] for r in rows], rel=1e-5)
    if max_grad_norm:
        assert min(fed) > 2 * max_grad_norm                   # clipped every step: the fed norm is not
        applied = [r["trainsignals/grad_norm_applied"] for r in rows]
        assert applied == pytest.approx(Applied.norms, rel=1e-4)
        assert max(Applied.norms) <= max_grad_norm * (1 + 1e-4)
    else:
        assert not any("trainsignals/grad_norm_applied" in r for r in rows)


def test_healthy_classifier_is_quiet_and_gets_eval_loss_and_accuracy(tmp_path: Path) -> None:
    def accuracy(p: Any) -> dict[str, float]:
        return {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean())}

    class Spy(TrainerCallback):   # what evaluate() hands on (and returns): the Trainer's metrics only
        keys: list[set[str]] = []

        def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
            self.keys.append(set(metrics))

    rec = Recorder()
    cb = TrainSignalsCallback(ts.Monitor(total_steps=STEPS, recorder=rec), verbose=0)
    model = tiny_bert()
    trainer = Trainer(model=model, args=targs(tmp_path, eval_strategy="steps", eval_steps=20,
                                              per_device_eval_batch_size=64),
                      train_dataset=ClassData(640, 0), eval_dataset=ClassData(128, 1),
                      compute_metrics=accuracy, callbacks=[cb, Spy()])
    trainer.train()
    assert len(Spy.keys) == STEPS // 20
    assert all("epoch" in k and "eval_accuracy" in k and not any(n.startswith("trainsignals/") for n in k)
               for k in Spy.keys)
    assert loud(cb) == [] and trainer.state.global_step == STEPS
    evals = [r for r in trainer.state.log_history if "eval_loss" in r]
    assert [h["step"] for h in cb.val_history] == [r["step"] - 1 for r in evals]
    assert [h["val_loss"] for h in cb.val_history] == pytest.approx([r["eval_loss"] for r in evals])
    assert [h["eval_accuracy"] for h in cb.val_history] == pytest.approx([r["eval_accuracy"] for r in evals])
    assert [rec.signals[r["step"] - 1]["val_loss"] for r in evals] == pytest.approx([r["eval_loss"] for r in evals])
    # the accuracy is the Monitor's val_metric too (a real healthy run: ValMetricChance stays quiet above)
    assert [rec.signals[r["step"] - 1]["val_metric"] for r in evals] == pytest.approx([r["eval_accuracy"] for r in evals])
    assert cb.val_history[-1]["eval_accuracy"] > 0.6              # it learned the rule
    last = train_rows(trainer)[-1]                                # rows after an evaluation carry it
    assert last["trainsignals/eval_accuracy"] == pytest.approx(evals[-2]["eval_accuracy"])


# ----------------------------------------------------------------------------------------
# Faults: stop, raise, warn
# ----------------------------------------------------------------------------------------
def test_lr_blow_up_stops_within_the_window_and_points_to_the_last_good_checkpoint(tmp_path: Path) -> None:
    trainer, cb = lm_run(tmp_path, fault=FAULT, save_strategy="steps", save_steps=10)
    assert [e for e in loud(cb) if e[2] < FAULT] == []
    assert cb.stopped_step is not None and FAULT <= cb.stopped_step <= FAULT + WITHIN
    assert trainer.state.global_step == cb.stopped_step + 1
    assert cb.failure_events and all(e.severity == "critical" for e in cb.failure_events)
    onset = min(e.onset_step for e in cb.failure_events)
    saved = sorted(int(p.name.split("-")[1]) for p in tmp_path.glob("checkpoint-*"))
    good = max(n for n in saved if n <= onset)
    assert cb.last_good_checkpoint == str(tmp_path / f"checkpoint-{good}")
    assert max(saved) <= cb.stopped_step                      # nothing saved with the failed weights
    row = train_rows(trainer)[-1]                             # the stop step got its own log row
    assert row["step"] == cb.stopped_step + 1
    assert row["trainsignals/events/critical"] >= 1 and row["trainsignals/events/total"] >= 1


def test_raise_and_warn(tmp_path: Path) -> None:
    trainer, cb = lm_trainer(tmp_path / "raise", fault=FAULT, cb_kwargs={"on_critical": "raise"},
                             max_steps=FAULT + WITHIN + 5)
    with pytest.raises(TrainingFailure) as info:
        trainer.train()
    assert info.value.events and all(FAULT <= e.step <= FAULT + WITHIN for e in info.value.events)
    assert trainer.state.global_step == cb.stopped_step == info.value.events[0].step   # raised at the step
    assert cb.watcher is None and unwrapped(trainer)          # cleaned up: no on_train_end after a raise
    with pytest.warns(RuntimeWarning):
        trainer, cb = lm_run(tmp_path / "warn", fault=FAULT, cb_kwargs={"on_critical": "warn"},
                             max_steps=FAULT + WITHIN + 5)
    assert cb.stopped_step is None and trainer.state.global_step == FAULT + WITHIN + 5
    assert any(e.severity == "critical" and e.step >= FAULT for e in cb.events)


def test_nan_loss_is_seen_at_its_step_despite_the_trainers_nan_filter(tmp_path: Path) -> None:
    k = 25
    model = tiny_lm()
    trainer, cb = lm_run(tmp_path, model=model, callbacks=(NaNLossAt(model, k),), logging_nan_inf_filter=True,
                         save_strategy="steps", save_steps=1, save_only_model=True)
    first = next(e for e in cb.events if e.kind.value == "nonfinite")
    assert (first.step, first.severity) == (k, "critical")
    assert loud(cb)[0][2] == k and cb.stopped_step == k and trainer.state.global_step == k + 1
    row = train_rows(trainer)[-1]
    assert row["step"] == k + 1
    assert math.isfinite(row["loss"])                        # the Trainer's filtered mean hides it
    assert math.isnan(row["trainsignals/loss"])
    assert cb.last_good_checkpoint == str(tmp_path / f"checkpoint-{k}")   # the weights before step k
    assert not (tmp_path / f"checkpoint-{k + 1}").exists()               # the failed step's save: cancelled


def test_skip_nonfinite_steps_guard_trains_on(tmp_path: Path) -> None:
    k = 25
    model = tiny_lm()
    trainer, cb = lm_run(tmp_path, model=model, callbacks=(NaNLossAt(model, k),), max_steps=40,
                         cb_kwargs={"skip_nonfinite_steps": True})
    assert cb.stopped_step is None and trainer.state.global_step == 40
    assert [(e.kind.value, e.severity, e.step) for e in cb.events] == [("nonfinite", "info", k)]
    assert all(torch.isfinite(p).all() for p in model.parameters())


# ----------------------------------------------------------------------------------------
# Same events: gradient accumulation, resume from a checkpoint
# ----------------------------------------------------------------------------------------
def test_gradient_accumulation_gives_one_update_per_optimizer_step_and_the_same_events(tmp_path: Path) -> None:
    rec1, rec2 = Recorder(), Recorder()
    t1, cb1 = lm_run(tmp_path / "whole", fault=FAULT, monitor=ts.Monitor(total_steps=STEPS, recorder=rec1))
    t2, cb2 = lm_run(tmp_path / "accum", fault=FAULT, monitor=ts.Monitor(total_steps=STEPS, recorder=rec2),
                     per_device_train_batch_size=4, gradient_accumulation_steps=2)
    assert cb1.stopped_step is not None
    assert fingerprint(cb2) == fingerprint(cb1)
    assert t2.state.global_step == t1.state.global_step
    assert sorted(rec2.signals) == sorted(rec1.signals) == list(range(t1.state.global_step))
    for s in range(FAULT):                                     # the same batches, split in two
        assert rec2.signals[s]["loss"] == pytest.approx(rec1.signals[s]["loss"], rel=1e-4)
        assert rec2.signals[s]["grad_norm"] == pytest.approx(rec1.signals[s]["grad_norm"], rel=1e-3)


def test_resume_from_checkpoint_gives_the_same_events_as_an_uninterrupted_run(tmp_path: Path) -> None:
    whole, cb_whole = lm_run(tmp_path / "whole", fault=FAULT)
    assert cb_whole.stopped_step is not None
    _, cb_crash = lm_run(tmp_path / "crash", fault=FAULT, callbacks=(StopAt(25),), save_strategy="steps",
                         save_steps=20)
    assert cb_crash.monitor.step == 24
    ckpt = tmp_path / "crash" / "checkpoint-20"
    saved = json.loads((ckpt / "trainer_state.json").read_text())["stateful_callbacks"]["TrainSignalsCallback"]
    assert saved["trainsignals"]["monitor"]["monitor"]["step"] == 19
    resumed, cb = lm_run(tmp_path / "crash", fault=FAULT, resume=str(ckpt))
    assert cb.monitor.step == cb_whole.monitor.step                   # continued from step 20, not from 0
    assert fingerprint(cb) == fingerprint(cb_whole)
    assert cb.stopped_step == cb_whole.stopped_step and resumed.state.global_step == whole.state.global_step
    assert cb.event_counts == cb_whole.event_counts
    # the Trainer's own restore builds a new callback from state()["args"]: it carries on the same way
    again, old = lm_trainer(tmp_path / "crash", fault=FAULT, restore_callback_states_from_checkpoint=True)
    again.train(resume_from_checkpoint=str(ckpt))
    (new,) = [c for c in again.callback_handler.callbacks if isinstance(c, TrainSignalsCallback)]
    assert new is not old and new.watcher_kwargs == old.watcher_kwargs
    assert fingerprint(new) == fingerprint(cb_whole)


# ----------------------------------------------------------------------------------------
# Mixed precision, torch.compile
# ----------------------------------------------------------------------------------------
def test_bf16_on_cpu(tmp_path: Path) -> None:
    rec = Recorder()
    trainer, cb = lm_run(tmp_path, monitor=ts.Monitor(recorder=rec), bf16=True, max_steps=30, logging_steps=1)
    rows = train_rows(trainer)
    assert sorted(rec.signals) == list(range(30)) and loud(cb) == []
    assert [rec.signals[r["step"] - 1]["grad_norm"] for r in rows] == pytest.approx([r["grad_norm"] for r in rows],
                                                                                   rel=1e-5)
    assert all(math.isfinite(rec.signals[s]["loss"]) for s in rec.signals)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 mixed precision (GradScaler) needs CUDA")
def test_fp16_on_cuda_reads_unscaled_norms(tmp_path: Path) -> None:
    rec = Recorder()
    model = tiny_lm()
    cb = TrainSignalsCallback(ts.Monitor(recorder=rec), verbose=0)
    args = targs(tmp_path, use_cpu=False, fp16=True, max_steps=40, logging_steps=1)
    trainer = Trainer(model=model, args=args, train_dataset=SeqData(640, 0), callbacks=[cb])
    trainer.train()
    assert not [e for e in cb.events if e.severity == "critical"]
    rows = {r["step"] - 1: r for r in train_rows(trainer)}
    stepped = [s for s in rec.signals if "grad_norm" in rec.signals[s]]   # the scaler may skip the first steps
    assert len(stepped) >= 30
    for s in stepped:   # divided by the loss scale: the Trainer's (unscaled) norm
        assert rec.signals[s]["grad_norm"] == pytest.approx(rows[s]["grad_norm"], rel=1e-3)


def test_torch_compile(tmp_path: Path) -> None:
    rec_eager, rec = Recorder(), Recorder()
    lm_run(tmp_path / "eager", monitor=ts.Monitor(recorder=rec_eager), max_steps=5)
    trainer, cb = lm_run(tmp_path / "compiled", monitor=ts.Monitor(recorder=rec), max_steps=5, torch_compile=True,
                         torch_compile_backend="aot_eager")
    assert trainer.model_wrapped is not trainer.model                  # the Trainer did compile it
    assert sorted(rec.signals) == list(range(5)) and loud(cb) == []
    for s in range(5):
        for key in ("loss", "grad_norm", "lr"):
            assert rec.signals[s][key] == pytest.approx(rec_eager.signals[s][key], rel=1e-4)
    assert set(rec.layers[4][1]) == set(rec_eager.layers[4][1])          # layers named as the original's


# ----------------------------------------------------------------------------------------
# DDP: 2 processes, gloo, CPU
# ----------------------------------------------------------------------------------------
DDP_FAULT = 15
DDP_HANG_S = 420   # a rank's whole job takes 15-30 s here, on a loaded 2-core machine


def ddp_job(out: Path) -> None:
    """One rank of the DDP test: rank 1's loss (only its reported value) is NaN at ``DDP_FAULT``."""
    # a rank still running after DDP_HANG_S prints where each of its threads is and exits: a hang shows
    # in the test's failure, not as the test's timeout
    faulthandler.dump_traceback_later(DDP_HANG_S, exit=True)
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    model = tiny_lm()
    cb = TrainSignalsCallback(verbose=0)
    args = targs(out, max_steps=40, ddp_backend="gloo", per_device_train_batch_size=4)
    trainer = Trainer(model=model, args=args, train_dataset=SeqData(640, 0),
                      callbacks=[NaNLossAt(model, DDP_FAULT, grad_free=True, rank=1), cb])
    trainer.train()
    rank = args.process_index
    (out / f"rank{rank}.json").write_text(json.dumps({
        "global_step": trainer.state.global_step, "stopped_step": cb.stopped_step,
        "critical": [[e.kind.value, e.step] for e in cb.events if e.severity == "critical"],
        "world": args.world_size}))
    if torch.distributed.is_initialized():  # leave no communication thread running at exit
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()
    # the rank's result is written: leave before this function's locals are freed. Freeing the Trainer's
    # DDP reducer joins gloo's worker thread while holding the GIL that thread may still need to free a
    # finished collective's tensors (a deadlock py-spy showed at this function's return, and, before, at
    # the interpreter's teardown: the test timed out)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def test_one_ranks_critical_event_stops_every_rank_at_the_same_step(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           __file__, "--ddp-job", str(tmp_path)]
    # the ranks arm their own limit after importing torch and transformers, which a loaded machine can
    # stretch to minutes: the launcher's limit leaves them room to fail with their stacks first
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=DDP_HANG_S + 480)
    assert done.returncode == 0, done.stderr[-12000:]   # a hung rank's threads, if one hung
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["world"] == r1["world"] == 2
    assert r1["critical"][0] == ["nonfinite", DDP_FAULT]       # rank 1 saw its NaN loss
    assert r0["critical"] == []                                 # rank 0's run was healthy
    assert r0["stopped_step"] == r1["stopped_step"] == DDP_FAULT   # and stopped with it
    assert r0["global_step"] == r1["global_step"] == DDP_FAULT + 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--ddp-job", type=Path, required=True)
    ddp_job(parser.parse_args().ddp_job)  # leaves the process itself (os._exit), see its end
