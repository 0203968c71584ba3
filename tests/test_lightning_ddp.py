"""The Lightning callback under DDP (2 CPU processes, gloo): a critical event on one rank stops
every rank at the same step, through the strategy's shared decision.

The test runs this file as a script; Lightning's DDP launcher starts the second rank by running
the same command again. On rank 1 only, from step ``FAULT`` on, the training loss it reports
carries a constant offset of 1e4 (gradients unchanged: only that rank's local loss jumps and stays
up); rank 0's run stays healthy. Each rank writes what it saw to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

FAULT = 120
STEPS = 300


def job(out: Path) -> None:
    import logging

    import lightning.pytorch as L
    import torch
    from sklearn import datasets as sklearn_datasets
    from torch import nn
    from torch.nn import functional as F

    from trainsignals.adapters.lightning import TrainSignalsCallback

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.set_num_threads(1)

    class Net(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            loss = F.cross_entropy(self.net(x), y)
            if self.global_rank == 1 and self.global_step >= FAULT:
                loss = loss + 1e4          # this rank's reported loss only; the gradient is unchanged
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.2)

    X, y = sklearn_datasets.load_digits(return_X_y=True)
    data = torch.utils.data.TensorDataset(torch.tensor(X / 16.0, dtype=torch.float32), torch.tensor(y))
    loader = torch.utils.data.DataLoader(data, batch_size=64, shuffle=True,
                                         generator=torch.Generator().manual_seed(0))
    cb = TrainSignalsCallback(verbose=0)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=STEPS, logger=False,
                        enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False)
    trainer.callbacks.append(cb)
    trainer.fit(Net(), loader)
    rank = trainer.global_rank
    (out / f"rank{rank}.json").write_text(json.dumps({
        "rank": rank,
        "global_step": trainer.global_step,
        "stopped_step": cb.stopped_step,
        "own_critical": [[e.kind.value, e.step] for e in cb.events if e.severity == "critical"],
        "loud": [[e.kind.value, e.step] for e in cb.events if e.severity in ("warning", "critical")],
    }))
    if torch.distributed.is_initialized():   # leave no communication thread running at exit
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    # the rank's result is written: leave before this function's locals are freed, where freeing the DDP
    # reducer joins gloo's worker thread while holding the GIL that thread may need (the deadlock py-spy
    # showed in the Hugging Face DDP test, at its job's return)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def test_one_ranks_critical_event_stops_every_rank_at_the_same_step(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env.pop("LOCAL_RANK", None)
    run = subprocess.run([sys.executable, __file__, "--out", str(tmp_path)], env=env, capture_output=True,
                         text=True, timeout=180)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    got = {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)}
    zero, one = got[0], got[1]
    # rank 1 found a critical event after its fault; rank 0, whose run is healthy, found none
    assert one["own_critical"] and all(step >= FAULT for _, step in one["own_critical"])
    assert zero["own_critical"] == [] and zero["loud"] == []
    # and both stopped at the same step, right where rank 1 failed, long before the end
    first = min(step for _, step in one["own_critical"])
    assert zero["stopped_step"] == one["stopped_step"] == first
    assert zero["global_step"] == one["global_step"] == first + 1 < STEPS


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    job(ap.parse_args().out)  # leaves the process itself (os._exit), see its end
