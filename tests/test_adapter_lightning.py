"""The Lightning callback (:class:`trainsignals.adapters.lightning.TrainSignalsCallback`) on CPU.

Data: scikit-learn's bundled 8x8 digits; model: a ReLU MLP trained with plain SGD (lr 0.2,
batch 128), which stays quiet for 300 steps on every seed tried. The learning rate is raised
100x at a known optimizer step by a helper callback; the callback must report a critical event
within a window after it, nothing loud before, and stop the trainer there.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning")
sklearn_datasets = pytest.importorskip("sklearn.datasets")

# Lightning 2.6's own use of torch's pytree API, and its note on a test module without a val loader
pytestmark = [
    pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)` is deprecated"),
    pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no `val_dataloader`"),
]

from lightning.pytorch.loggers import CSVLogger  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import trainsignals as ts  # noqa: E402
from trainsignals.adapters.lightning import TrainingFailure, TrainSignalsCallback  # noqa: E402
from trainsignals.detectors import LostProgress  # noqa: E402

FAULT = 150          # the optimizer step whose learning rate is raised
# a critical event must come within this many steps after the fault: a learning-rate blow-up
# that leaves the loss on a plateau is judged "lost progress" once a window of values after the
# burst is in, and the burst has left the window's noise estimate
WINDOW = 2 * LostProgress().window + 5
STEPS = 300
LR = 0.2             # the models' SGD learning rate (the loss has fallen well below chance by the fault)
CRITICAL_KINDS = {"divergence", "grad_explosion", "nonfinite"}

_DATA: dict[str, Any] = {}


@pytest.fixture(autouse=True)
def _quiet_lightning() -> Any:
    level = logging.getLogger("lightning.pytorch").level
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)         # small matrices: threads only add overhead on a shared CPU
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="lightning")
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        yield
    torch.set_num_threads(threads)
    logging.getLogger("lightning.pytorch").setLevel(level)


def digits() -> tuple[Any, Any]:
    if not _DATA:
        X, y = sklearn_datasets.load_digits(return_X_y=True)
        _DATA["X"] = torch.tensor(X / 16.0, dtype=torch.float32)
        _DATA["y"] = torch.tensor(y)
    return _DATA["X"], _DATA["y"]


def loaders(seed: int, batch_size: int = 128, shuffle: bool = True) -> tuple[Any, Any]:
    X, y = digits()
    train = torch.utils.data.TensorDataset(X[:1500], y[:1500])
    val = torch.utils.data.TensorDataset(X[1500:], y[1500:])
    gen = torch.Generator().manual_seed(seed)
    return (torch.utils.data.DataLoader(train, batch_size=batch_size, shuffle=shuffle, generator=gen),
            torch.utils.data.DataLoader(val, batch_size=len(val)))


class DigitsMLP(L.LightningModule):
    """A 64-64-64-10 ReLU MLP; records every micro-batch loss it returns."""

    def __init__(self, seed: int = 0, lr: float = LR) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
        self.losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.losses.append(float(loss.detach()))
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.net(x), y))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class LRFault(L.Callback):
    """Multiplies every param group's learning rate by ``factor`` from optimizer step ``at`` on."""

    def __init__(self, at: int, factor: float) -> None:
        self.at, self.factor, self.done = at, factor, False

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self.at and not self.done:
            self.done = True
            for g in trainer.optimizers[0].param_groups:
                g["lr"] *= self.factor


class GradSpy(L.Callback):
    """Computes the global grad norm directly, in the same hook (before Lightning clips)."""

    def __init__(self) -> None:
        self.norms: list[float] = []

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        sq = sum(float(p.grad.double().square().sum()) for p in pl_module.parameters() if p.grad is not None)
        self.norms.append(math.sqrt(sq))


class Spy:
    """A Monitor recorder: what was fed at each step."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, dict[str, float]]] = []

    def record(self, *, step: int, signals: Mapping[str, float], layer_grad_norms: Any, activations: Any,
               events: Sequence[ts.Event]) -> None:
        self.rows.append((step, dict(signals)))

    def record_batch(self, **kwargs: Any) -> None:
        raise AssertionError("the callback never scans")

    def train_rows(self) -> list[tuple[int, dict[str, float]]]:
        return [(s, r) for s, r in self.rows if "val_loss" not in r]


def fit(model: Any, callbacks: list[Any], *, seed: int = 0, steps: int = STEPS, tmp_path: Path | None = None,
        val: bool = False, **trainer_kw: Any) -> Any:
    train, val_loader = loaders(seed)
    trainer = L.Trainer(accelerator="cpu", max_steps=steps, enable_progress_bar=False, enable_checkpointing=False,
                        enable_model_summary=False, num_sanity_val_steps=0,
                        logger=CSVLogger(tmp_path) if tmp_path is not None else False,
                        callbacks=callbacks, **({"check_val_every_n_epoch": None} if val else {}), **trainer_kw)
    trainer.fit(model, train, val_loader if val else None)
    return trainer


def loud(events: list[ts.Event]) -> list[ts.Event]:
    return [e for e in events if e.severity in ("warning", "critical")]


def metrics_csv(trainer: Any) -> list[dict[str, str]]:
    path = Path(trainer.logger.log_dir) / "metrics.csv"
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# ------------------------------------------------------------------------------------------
# Detection and the stop
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1])
def test_healthy_run_is_quiet_and_completes(seed: int, tmp_path: Path) -> None:
    spy = Spy()
    cb = TrainSignalsCallback(ts.Monitor(total_steps=STEPS, recorder=spy))
    model = DigitsMLP(seed)
    trainer = fit(model, [cb], seed=seed, tmp_path=tmp_path, val=True, val_check_interval=50)
    assert loud(cb.events) == []
    assert cb.stopped_step is None and not trainer.should_stop
    assert trainer.global_step == STEPS
    assert sum(model.losses[-20:]) < 0.5 * sum(model.losses[:20])      # it did learn
    assert [s for s, _ in spy.train_rows()] == list(range(STEPS))
    # validation every 50 batches: val_loss fed at the step just taken, after the training row
    val_steps = [s for s, r in spy.rows if "val_loss" in r]
    assert val_steps == list(range(49, STEPS, 50))
    assert cb.monitor.status == "healthy"


@pytest.mark.parametrize("seed", [0, 1])
def test_lr_x100_is_critical_within_a_window_and_stops_the_trainer(seed: int, tmp_path: Path) -> None:
    cb = TrainSignalsCallback(verbose=0)
    trainer = fit(DigitsMLP(seed), [LRFault(FAULT, 100.0), cb], seed=seed, tmp_path=tmp_path)
    assert all(e.step >= FAULT for e in loud(cb.events))
    crit = [e for e in cb.events if e.severity == "critical" and e.kind.value in CRITICAL_KINDS]
    assert crit and FAULT <= crit[0].step <= FAULT + WINDOW
    assert cb.stopped_step == crit[0].step
    assert cb.failure_events and cb.failure_events[0] == crit[0]
    assert trainer.global_step == crit[0].step + 1 < STEPS        # stopped right there
    assert any(e.kind.value == "lr_anomaly" and e.step == FAULT for e in cb.events)


def test_sync_every_feeds_every_step_and_validation_in_order_and_still_stops() -> None:
    spy = Spy()
    cb = TrainSignalsCallback(ts.Monitor(total_steps=STEPS, recorder=spy), verbose=0, sync_every=7)
    fit(DigitsMLP(0), [cb], val=True, val_check_interval=50)
    # validations (every 50 batches, not on a block boundary) first feed the held steps
    assert [s for s, _ in spy.train_rows()] == list(range(STEPS))
    assert [s for s, r in spy.rows if "val_loss" in r] == list(range(49, STEPS, 50))
    assert loud(cb.events) == []
    cb2 = TrainSignalsCallback(verbose=0, sync_every=7)
    trainer = fit(DigitsMLP(0), [LRFault(FAULT, 100.0), cb2])
    crit = [e for e in cb2.events if e.severity == "critical" and e.kind.value in CRITICAL_KINDS]
    assert crit and FAULT <= crit[0].step <= FAULT + WINDOW
    assert cb2.stopped_step is not None and crit[0].step <= cb2.stopped_step < crit[0].step + 7
    assert trainer.global_step == cb2.stopped_step + 1


def test_a_critical_event_the_watchers_rollback_handles_does_not_stop() -> None:
    cb = TrainSignalsCallback(verbose=0, rollback=True, rollback_every=20, rollback_lr_factor=0.01)
    trainer = fit(DigitsMLP(0), [LRFault(FAULT, 100.0), cb])
    crit = [e for e in cb.events if e.severity == "critical"]
    assert crit and FAULT <= crit[0].step <= FAULT + WINDOW
    assert any(e.detector == "rollback" and e.step == crit[0].step for e in cb.events)
    assert cb.stopped_step is None and trainer.global_step == STEPS
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(LR * 0.01)   # restored, then lowered


def test_on_critical_raise_raises_out_of_fit_and_removes_the_hooks() -> None:
    cb = TrainSignalsCallback(on_critical="raise", verbose=0)
    model = DigitsMLP(0)
    with pytest.raises(TrainingFailure) as info:
        fit(model, [LRFault(FAULT, 100.0), cb])
    assert info.value.events and info.value.events[0].severity == "critical"
    assert FAULT <= info.value.events[0].step <= FAULT + WINDOW
    opt = model.trainer.optimizers[0]
    assert cb.watcher is None
    assert len(opt._optimizer_step_pre_hooks) == 0 and len(opt._optimizer_step_post_hooks) == 0


def test_on_critical_warn_warns_and_trains_on() -> None:
    cb = TrainSignalsCallback(on_critical="warn", verbose=0)
    with pytest.warns(RuntimeWarning) as record:
        trainer = fit(DigitsMLP(0), [LRFault(FAULT, 100.0), cb])
    ours = [str(w.message) for w in record if "CRITICAL" in str(w.message)]
    assert ours
    assert trainer.global_step == STEPS and cb.stopped_step is None and not trainer.should_stop
    crit = [e for e in cb.events if e.severity == "critical"]
    assert crit and FAULT <= crit[0].step <= FAULT + WINDOW and str(crit[0]) == ours[0]


def test_events_are_reported_through_logging(caplog: pytest.LogCaptureFixture) -> None:
    cb = TrainSignalsCallback(verbose=1)
    logger = logging.getLogger("trainsignals.adapters.lightning")
    own = not logger.propagate             # without a root handler at import it does not propagate
    if own:
        logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="trainsignals.adapters.lightning"):
            fit(DigitsMLP(0), [LRFault(FAULT, 100.0), cb])
    finally:
        if own:
            logger.removeHandler(caplog.handler)
    ours = [r for r in caplog.records if r.name == "trainsignals.adapters.lightning"]
    assert len(ours) == len(loud(cb.events)) > 0           # verbose=1: warnings and criticals only
    assert ours[-1].levelno == logging.ERROR and str(cb.failure_events[0]) in ours[-1].getMessage()


# ------------------------------------------------------------------------------------------
# What reaches the loggers
# ------------------------------------------------------------------------------------------
def test_signals_and_event_counts_are_in_the_csv_metrics(tmp_path: Path) -> None:
    spy = Spy()
    cb = TrainSignalsCallback(ts.Monitor(total_steps=STEPS, recorder=spy), verbose=0)
    trainer = fit(DigitsMLP(0), [LRFault(FAULT, 100.0), cb], tmp_path=tmp_path, log_every_n_steps=10)
    rows = [r for r in metrics_csv(trainer) if r.get("trainsignals/grad_norm")]
    fed = dict(spy.train_rows())
    logged_steps = [int(r["step"]) for r in rows]
    event_steps = {e.step for e in cb.events}
    # every 10th step, and every step with an event
    assert set(logged_steps) == {s for s in fed if (s + 1) % 10 == 0} | event_steps
    for r in rows:
        s = int(r["step"])
        for key in ("loss", "grad_norm", "lr"):
            assert float(r[f"trainsignals/{key}"]) == pytest.approx(fed[s][key], rel=1e-6)
        if "update_ratio" in fed[s]:
            assert float(r["trainsignals/update_ratio"]) == pytest.approx(fed[s]["update_ratio"], rel=1e-6)
    assert any(r.get("trainsignals/update_ratio") for r in rows)
    assert not any(r.get("trainsignals/grad_norm_applied") for r in rows)   # no clipping: not measured
    last = rows[-1]
    assert int(last["step"]) == cb.stopped_step
    for kind, n in cb.event_counts.items():
        assert float(last[f"trainsignals/events/{kind}"]) == n
    assert float(last["trainsignals/events/total"]) == len(cb.events)
    assert float(last["trainsignals/events/critical"]) == sum(e.severity == "critical" for e in cb.events) >= 1
    assert float(last["trainsignals/lr"]) == pytest.approx(LR * 100)


@pytest.mark.parametrize("sync_every", [1, 7])
def test_every_row_carries_the_latest_update_ratio(tmp_path: Path, sync_every: int) -> None:
    """The update ratio is measured every 10th step (0, 10, ...) and rows are written every 10th
    (9, 19, ...): each row carries the latest measured ratio (none ever did). With ``sync_every=7`` the
    rows off a block boundary are written too (they were not), with the values fed up to then."""
    spy = Spy()
    cb = TrainSignalsCallback(ts.Monitor(total_steps=60, recorder=spy), verbose=0, sync_every=sync_every)
    trainer = fit(DigitsMLP(0), [cb], steps=60, tmp_path=tmp_path, log_every_n_steps=10)
    fed = spy.train_rows()
    rows = {int(r["step"]): r for r in metrics_csv(trainer) if r.get("trainsignals/loss")}
    assert sorted(rows) == list(range(9, 60, 10))
    for s, r in rows.items():
        # what the Monitor had been fed when row s was written: every step up to s, or up to the
        # end of the latest full block of 7
        known = [f for t, f in fed if t <= (s if sync_every == 1 else (s + 1) // 7 * 7 - 1)]
        assert float(r["trainsignals/loss"]) == pytest.approx(known[-1]["loss"], rel=1e-6)
        ratio = [f["update_ratio"] for f in known if "update_ratio" in f][-1]
        assert float(r["trainsignals/update_ratio"]) == pytest.approx(ratio, rel=1e-6)


def test_grad_norm_is_the_one_before_lightning_clips(tmp_path: Path) -> None:
    spy, direct = Spy(), GradSpy()
    cb = TrainSignalsCallback(ts.Monitor(recorder=spy), verbose=0)
    trainer = fit(DigitsMLP(0), [direct, cb], steps=20, gradient_clip_val=0.01, tmp_path=tmp_path,
                  log_every_n_steps=1)
    fed = [r["grad_norm"] for _, r in spy.train_rows()]
    assert fed == pytest.approx(direct.norms, rel=1e-5)
    assert min(fed) > 0.01                                  # the unclipped norm, not the clip value
    # the norm after Lightning clipped it is logged beside it
    applied = [float(r["trainsignals/grad_norm_applied"]) for r in metrics_csv(trainer)
               if r.get("trainsignals/grad_norm_applied")]
    assert len(applied) == 20 and applied == pytest.approx([0.01] * 20, rel=1e-3)


# ------------------------------------------------------------------------------------------
# Accumulation, manual optimization, several optimizers
# ------------------------------------------------------------------------------------------
def test_gradient_accumulation_measures_once_per_optimizer_step() -> None:
    spy, direct = Spy(), GradSpy()
    cb = TrainSignalsCallback(ts.Monitor(recorder=spy), verbose=0)
    model = DigitsMLP(0)
    pre: list[int] = []

    class CountSteps(L.Callback):
        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            trainer.optimizers[0].register_step_pre_hook(lambda *a: pre.append(1))

    trainer = fit(model, [direct, cb, CountSteps()], steps=30, accumulate_grad_batches=4)
    rows = spy.train_rows()
    assert trainer.global_step == 30 == len(rows) == len(pre) == len(direct.norms)
    assert [s for s, _ in rows] == list(range(30))
    assert cb.monitor.step == 29
    # 12 batches an epoch: accumulation windows of 4, 4, 4 micro-batches
    for i, (_, r) in enumerate(rows):
        window = model.losses[4 * i:4 * i + 4]
        assert r["loss"] == pytest.approx(sum(window) / len(window), rel=1e-5)
        assert r["grad_norm"] == pytest.approx(direct.norms[i], rel=1e-5)


class ManualMLP(DigitsMLP):
    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        opt = self.optimizers()
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.losses.append(float(loss.detach()))
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        return loss


def test_manual_optimization_one_optimizer() -> None:
    spy, direct = Spy(), GradSpy()
    cb = TrainSignalsCallback(ts.Monitor(recorder=spy), verbose=0)
    model = ManualMLP(0)
    trainer = fit(model, [direct, cb], steps=25)
    rows = spy.train_rows()
    assert trainer.global_step == 25 == len(rows)
    assert [r["loss"] for _, r in rows] == pytest.approx(model.losses, rel=1e-6)
    assert [r["grad_norm"] for _, r in rows] == pytest.approx(direct.norms, rel=1e-5)


class TwoNets(L.LightningModule):
    """Manual optimization, two optimizers: one per sub-network, each with its own loss."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.automatic_optimization = False
        self.a = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
        self.b = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
        self.norms: dict[str, list[float]] = {"a": [], "b": []}

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        opt_a, opt_b = self.optimizers()
        x, y = batch
        out = {}
        for name, net, opt in (("a", self.a, opt_a), ("b", self.b, opt_b)):
            loss = F.cross_entropy(net(x), y)
            opt.zero_grad()
            self.manual_backward(loss)
            self.norms[name].append(math.sqrt(sum(float(p.grad.double().square().sum()) for p in net.parameters())))
            opt.step()
            out[f"loss_{name}"] = loss.detach()
        return out

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.a.parameters(), lr=0.05), torch.optim.Adam(self.b.parameters(), lr=1e-3)


def test_several_optimizers_need_one_callback_each() -> None:
    with pytest.raises(ValueError, match="optimizer_index"):
        fit(TwoNets(), [TrainSignalsCallback(verbose=0)], steps=4)
    spies = [Spy(), Spy()]
    cbs = [TrainSignalsCallback(ts.Monitor(recorder=spies[i]), optimizer_index=i, loss_key=f"loss_{k}", verbose=0)
           for i, k in enumerate("ab")]
    model = TwoNets()
    trainer = fit(model, cbs, steps=20)        # global_step counts both optimizers' steps
    assert trainer.global_step == 20
    for i, k in enumerate("ab"):
        rows = spies[i].train_rows()
        assert [s for s, _ in rows] == list(range(1, 20, 2))          # one update per batch
        assert [r["grad_norm"] for _, r in rows] == pytest.approx(model.norms[k], rel=1e-5)
        assert cbs[i].watcher is None
    assert [r["lr"] for _, r in spies[1].train_rows()] == pytest.approx([1e-3] * 10)
    with pytest.raises(ValueError, match="activations_every"):
        fit(TwoNets(), [TrainSignalsCallback(optimizer_index=0, activations_every=5)], steps=2)


# ------------------------------------------------------------------------------------------
# Lifecycle and configuration
# ------------------------------------------------------------------------------------------
def test_grad_scaler_skipped_steps_are_info_and_norms_are_unscaled() -> None:
    from lightning.pytorch.plugins import MixedPrecision

    class Overflow(L.Callback):
        """Makes one parameter's gradient infinite during backward at steps 30 and 31."""

        on = False

        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            self.handle = next(pl_module.parameters()).register_hook(lambda g: g * math.inf if self.on else g)

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            self.on = trainer.global_step in (30, 31)

    spy, direct = Spy(), GradSpy()
    cb = TrainSignalsCallback(ts.Monitor(recorder=spy), verbose=0)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)        # fp16 autocast + loss scaling on CPU
    trainer = fit(DigitsMLP(0), [Overflow(), direct, cb], steps=60,
                  plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)])
    assert trainer.global_step == 60 and cb.stopped_step is None
    assert [(e.step, e.severity, e.kind.value) for e in cb.events] == [(30, "info", "nonfinite")]
    rows = dict(spy.train_rows())
    assert "grad_norm" not in rows[30] and "grad_norm" not in rows[31]     # not fed: inf by design
    fed = [(s, r["grad_norm"]) for s, r in rows.items() if s not in (30, 31)]
    assert [g for _, g in fed] == pytest.approx([direct.norms[s] for s, _ in fed], rel=1e-5)
    assert max(g for _, g in fed) < 100                      # unscaled: the scale is 1024


def test_watcher_hooks_are_removed_after_fit() -> None:
    cb = TrainSignalsCallback(activations_every=1, verbose=0)
    seen: dict[str, int] = {}

    class Count(L.Callback):
        def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
            opt = trainer.optimizers[0]
            seen["pre"] = len(opt._optimizer_step_pre_hooks)
            seen["act"] = sum(len(m._forward_hooks) for m in pl_module.modules() if isinstance(m, nn.ReLU))

    model = DigitsMLP(0)
    trainer = fit(model, [cb, Count()], steps=5)
    assert seen == {"pre": 1, "act": 2}                     # installed during fit
    opt = trainer.optimizers[0]
    assert cb.watcher is None
    assert len(opt._optimizer_step_pre_hooks) == 0 and len(opt._optimizer_step_post_hooks) == 0
    assert all(len(m._forward_hooks) == 0 for m in model.modules())


def test_a_monitor_reused_by_a_second_fit_continues_its_steps() -> None:
    spy = Spy()
    cb = TrainSignalsCallback(ts.Monitor(recorder=spy), verbose=0)
    fit(DigitsMLP(0), [cb], steps=10)
    fit(DigitsMLP(0), [cb], steps=10)                       # a new Trainer: global_step from 0 again
    assert [s for s, _ in spy.train_rows()] == list(range(20))
    assert cb.monitor.recorder is spy                       # our tap is gone after each fit


def test_resuming_from_a_lightning_checkpoint_continues_the_monitor(tmp_path: Path) -> None:
    class Probe(L.Callback):
        def on_train_start(self, trainer: Any, pl_module: Any) -> None:   # after the restore
            self.state = json.dumps(resumed.monitor.state_dict(), sort_keys=True)

    def fit_steps(steps: int, callbacks: list[Any], ckpt: Path | None = None) -> Any:
        trainer = L.Trainer(accelerator="cpu", max_steps=steps, enable_progress_bar=False,
                            enable_model_summary=False, enable_checkpointing=False, logger=False,
                            callbacks=callbacks)
        trainer.fit(DigitsMLP(0), loaders(0)[0], ckpt_path=ckpt)
        return trainer

    first = TrainSignalsCallback(on_critical="warn", verbose=0)     # its Monitor: total_steps=40
    resumed = TrainSignalsCallback(on_critical="warn", verbose=0)   # 60 at first, 40 once restored
    probe = Probe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        fit_steps(40, [LRFault(25, 100.0), first]).save_checkpoint(tmp_path / "at40.ckpt")
        fit_steps(60, [resumed, probe], tmp_path / "at40.ckpt")
    assert first.events, "the fault made events before the checkpoint"
    assert probe.state == json.dumps(first.monitor.state_dict(), sort_keys=True)
    assert resumed.monitor.total_steps == 40 and resumed.monitor.step == 59
    assert [str(e) for e in resumed.events[:len(first.events)]] == [str(e) for e in first.events]
    assert all(resumed.event_counts[k] >= n for k, n in first.event_counts.items())


def test_missing_val_metric_warns_once() -> None:
    cb = TrainSignalsCallback(val_metric="val_acc", verbose=0)
    with pytest.warns(RuntimeWarning, match="val_acc") as record:
        fit(DigitsMLP(0), [cb], steps=30, val=True, val_check_interval=10)
    assert sum("val_acc" in str(w.message) for w in record) == 1


class LogitsMLP(DigitsMLP):
    """Returns its logits beside the loss and logs a validation accuracy."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        logits = self.net(x)
        return {"loss": F.cross_entropy(logits, y), "logits": logits}

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(-1) == y).float().mean())


def test_returned_logits_feed_pred_top_share_and_a_score_feeds_val_metric() -> None:
    spy = Spy()
    cb = TrainSignalsCallback(ts.Monitor(recorder=spy), score_metric="val_acc", verbose=0)
    fit(LogitsMLP(0), [cb], steps=30, val=True, val_check_interval=10)
    shares = [r["pred_top_share"] for _, r in spy.rows if "pred_top_share" in r]
    assert len(shares) == 30 and all(0.0 < v <= 1.0 for v in shares)
    scores = [r["val_metric"] for _, r in spy.rows if "val_metric" in r]
    assert len(scores) == 3 and all(0.0 <= v <= 1.0 for v in scores)
    assert all("val_loss" in r for _, r in spy.rows if "val_metric" in r)


class PredsRegression(DigitsMLP):
    """A regression of the digit's value that returns its predictions beside the loss."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        preds = self.net(x)[:, 0]
        return {"loss": F.mse_loss(preds, y.float()), "preds": preds}


def test_returned_predictions_feed_pred_spread() -> None:
    spy = Spy()
    cb = TrainSignalsCallback(ts.Monitor(recorder=spy), verbose=0)
    fit(PredsRegression(0), [cb], steps=20)
    spreads = [r["pred_spread"] for _, r in spy.rows if "pred_spread" in r]
    assert len(spreads) == 20 and all(v > 0.0 for v in spreads)
    assert not any("pred_top_share" in r for _, r in spy.rows)


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"preds_key": ""}, "preds_key"),
    ({"on_critical": "halt"}, "on_critical"),
    ({"also_stop_on": ("overfit",)}, "also_stop_on"),
    ({"verbose": 3}, "verbose"),
    ({"log_every_n_steps": -1}, "log_every_n_steps"),
    ({"optimizer_index": -1}, "optimizer_index"),
    ({"total_steps": 0}, "total_steps"),
    ({"val_metric": ""}, "val_metric"),
    ({"loss_key": ""}, "loss_key"),
    ({"logits_key": ""}, "logits_key"),
    ({"score_metric": 3}, "score_metric"),
    ({"per_layer": "tensor"}, "per_layer"),
    ({"update_ratio_every": -1}, "update_ratio_every"),
    ({"bogus_option": 1}, "bogus_option"),
    ({"scaler": None}, "scaler"),
])
def test_bad_configuration_raises_naming_the_parameter(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        TrainSignalsCallback(**kwargs)


def test_import_trainsignals_does_not_import_lightning() -> None:
    import subprocess
    import sys

    code = "import sys, trainsignals; print('lightning' in sys.modules or 'lightning.pytorch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
