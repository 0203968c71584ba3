"""Data-parallel training watched by :class:`trainsignals.adapters.distributed.DistributedWatcher`.

Each process trains the same MLP, wrapped in ``DistributedDataParallel``, on its own shard of
scikit-learn's bundled 8x8 digits (``DistributedSampler``), with Adam. The watcher gathers every
rank's measurements in one collective a step, feeds every rank's Monitor the same values (so all
ranks stop together), compares the replicas and looks for a rank that stands out. A fault is
injected so there is something to see (``--fault``):

* ``bad-shard`` (default): from step 150 the last rank's shard has shuffled labels (a corrupted
  data shard) → ``bad_rank`` (a warning) naming that rank at step 152; the shuffled half of every
  batch then pulls the ranks' mean loss back up, and the Monitor reports the lost progress as
  ``divergence`` (critical, step 166 on 2 CPU processes): every rank stops there;
* ``bit-flip``: at step 147 one weight tensor of the last rank is multiplied by 1 + 1e-6 (silent
  corruption) → ``replica_divergence`` naming the tensor at the next fingerprint check; every
  rank stops;
* ``lr``: at step 150 every rank's learning rate is raised 1000x → the Monitor sees the
  divergence and every rank stops at the same step;
* ``none``: a healthy run.

Run (CPU, gloo; about 10-15 s)::

    torchrun --nproc-per-node 2 examples/torchrun_ddp.py [--fault bad-shard|bit-flip|lr|none]

On GPUs the ``nccl`` backend is used (one GPU per process).
"""

from __future__ import annotations

import argparse
import datetime
import os

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from trainsignals.adapters.distributed import DistributedWatcher


def main(fault: str = "bad-shard", steps: int = 300) -> None:
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        torch.cuda.set_device(local_rank)
    else:
        torch.set_num_threads(1)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")

    X, y = load_digits(return_X_y=True)
    data = TensorDataset(torch.tensor(X / 16.0, dtype=torch.float32), torch.tensor(y))
    sampler = DistributedSampler(data, shuffle=True, seed=0)           # each rank its own shard
    loader = DataLoader(data, batch_size=128 // world, sampler=sampler, drop_last=True)

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)).to(device)
    model = nn.parallel.DistributedDataParallel(net, device_ids=[local_rank] if cuda else None)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)
    # on every rank, before the first step; a collective waits at most 30 s for the other ranks
    watcher = DistributedWatcher(model, optimizer, total_steps=steps, timeout=30.0)
    last = world - 1
    step, epoch = 0, 0
    while step < steps and not watcher.should_stop:
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            if fault == "bad-shard" and rank == last and step >= 150:
                yb = yb[torch.randperm(len(yb), device=device)]         # the injected fault
            if fault == "lr" and step == 150:
                for g in optimizer.param_groups:
                    g["lr"] *= 1000.0
            loss = F.cross_entropy(model(xb), yb)                      # this rank's local loss
            loss.backward()                                            # DDP all-reduces the gradients
            optimizer.step()
            if fault == "bit-flip" and rank == last and step == 147:
                with torch.no_grad():
                    net[2].weight.mul_(1.0 + 1e-6)
            events = watcher.update(loss=loss)                         # one all-gather; same events everywhere
            optimizer.zero_grad()
            if rank == 0:
                for event in events:
                    print(event)
            step += 1
            if watcher.should_stop or step >= steps:
                break
        epoch += 1
    if rank == 0:
        if watcher.should_stop:
            print(f"every rank stopped after step {step - 1}")
        for f in watcher.findings:
            print(f"{f.event.kind.value} at step {f.event.step}: ranks {list(f.ranks)}"
                  + (f", tensors {list(f.layers)}" if f.layers else ""))
        print(watcher.monitor.summary())
    watcher.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fault", choices=("bad-shard", "bit-flip", "lr", "none"), default="bad-shard")
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    main(args.fault, args.steps)
