"""A Lightning run watched by :class:`trainsignals.adapters.lightning.TrainSignalsCallback`.

Trains a small MLP on scikit-learn's bundled 8x8 digits with SGD for up to 400 optimizer
steps, validating every 50. At step 200 a helper callback raises the learning rate 100x (a
mis-wired scheduler); the callback reports what happened, when and why, and stops the trainer.
The signals and event counts land in a CSV log next to Lightning's own metrics.

Run: ``python examples/lightning_digits.py`` (a few seconds on a CPU).
"""

from __future__ import annotations

import csv
import logging
import tempfile
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger
from sklearn.datasets import load_digits
from torch import nn
from torch.nn import functional as F

from trainsignals.adapters.lightning import TrainSignalsCallback


class DigitsMLP(L.LightningModule):
    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.net(x), y))   # fed to the Monitor as val_loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class LRFault(L.Callback):
    """The injected failure: the learning rate times ``factor`` from optimizer step ``at`` on."""

    def __init__(self, at: int, factor: float) -> None:
        self.at, self.factor, self.done = at, factor, False

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if trainer.global_step == self.at and not self.done:
            self.done = True
            for group in trainer.optimizers[0].param_groups:
                group["lr"] *= self.factor
            print(f"-- step {self.at}: learning rate x{self.factor:g} (the injected failure)")


def main(steps: int = 400, fault_at: int = 200) -> None:
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*LeafSpec.*")
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    X, y = load_digits(return_X_y=True)
    data = torch.utils.data.TensorDataset(torch.tensor(X / 16.0, dtype=torch.float32), torch.tensor(y))
    train, val = torch.utils.data.random_split(data, [1500, len(data) - 1500],
                                               generator=torch.Generator().manual_seed(0))
    train_loader = torch.utils.data.DataLoader(train, batch_size=128, shuffle=True)
    val_loader = torch.utils.data.DataLoader(val, batch_size=len(val))

    watch = TrainSignalsCallback(per_layer="module", update_ratio_every=10, activations_every=10)
    with tempfile.TemporaryDirectory() as logs:
        trainer = L.Trainer(
            accelerator="cpu", max_steps=steps, val_check_interval=50, check_val_every_n_epoch=None,
            log_every_n_steps=10, logger=CSVLogger(logs, name="digits"), callbacks=[LRFault(fault_at, 100.0), watch],
            enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
        )
        trainer.fit(DigitsMLP(), train_loader, val_loader)   # events print as they fire (logging)

        print(f"\ntrained {trainer.global_step} of {steps} optimizer steps; "
              f"stopped by trainsignals at step {watch.stopped_step}")
        print("events seen:", ", ".join(f"{e.kind.value} ({e.severity}) at {e.step}" for e in watch.events))
        with open(Path(trainer.logger.log_dir) / "metrics.csv", newline="") as f:
            rows = [r for r in csv.DictReader(f) if r.get("trainsignals/grad_norm")]
        print(f"{len(rows)} rows of trainsignals/* metrics in the CSV log; the last one:")
        print({k: v for k, v in rows[-1].items() if v})
    print()
    print(watch.monitor.summary())


if __name__ == "__main__":
    main()
