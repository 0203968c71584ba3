"""Per-step cost of :class:`trainsignals.adapters.distributed.DistributedWatcher` against the DDP step.

Two processes on the CPU (``gloo``, one thread each) train an MLP (``--depth`` linear layers of
``--width``, random data, SGD with momentum) wrapped in ``DistributedDataParallel``. Each step
(forward, backward with DDP's all-reduce, ``optimizer.step()``, the watcher's ``update()``,
``zero_grad()``) is timed, and so are its phases, with:

* ``bare``: no watcher;
* ``local``: the single-process ``TorchWatcher`` on each rank (no aggregation: the ranks'
  Monitors may disagree) — what measuring costs without the distributed part;
* ``gather``: ``DistributedWatcher(check_every=0)``: the communication hook, the one all-gather a
  step, the combination on the host, the replica comparisons that run every step (step, lr,
  grad norm) and the bad-rank rule;
* ``gather+fp/1``: ``DistributedWatcher(check_every=1)``: the same plus the replica fingerprints
  (:func:`~trainsignals.adapters.distributed.bit_checksum` of every parameter and gradient) on
  every step;
* ``gather+fp/10``: the default, fingerprints every 10 steps.

The variants are interleaved over ``--repeats`` rounds in one run. On a shared machine the
difference of two whole-step medians is noise, so the costs are taken from the phases, each a
median over every timed step (the slower rank's): **aggregation** = ``update()`` of ``gather``
minus ``update()`` of ``local`` (the all-gather — waiting for the other rank included — and the
host work; both run the same Monitor), **backward overhead** = backward of ``gather`` minus
backward of ``bare`` (the communication hook's bucket norms), **one fingerprint check** =
``optimizer.step()`` of ``gather+fp/1`` minus that of ``gather`` (the pre-hook). Each is printed
in ms and as a ratio to the bare DDP step.

Run: ``python benchmarks/bench_distributed.py [--steps 40] [--repeats 5] [--depth 8] [--width 512]``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn import functional as F

VARIANTS = ("bare", "local", "gather", "gather+fp/1", "gather+fp/10")
PHASES = ("step", "backward", "opt_step", "update")


def mlp(depth: int, width: int) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(64, width), nn.ReLU()]
    for _ in range(depth - 2):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers)


def time_variant(variant: str, args: argparse.Namespace, x: torch.Tensor, y: torch.Tensor
                 ) -> dict[str, list[float]]:
    """Seconds of each phase of each of ``args.steps`` DDP steps (after 5 warm-up steps)."""
    from trainsignals.adapters.distributed import DistributedWatcher
    from trainsignals.adapters.torch import TorchWatcher

    model = nn.parallel.DistributedDataParallel(mlp(args.depth, args.width))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    watcher: Any = None
    if variant == "local":
        watcher = TorchWatcher(model.module, opt, update_ratio_every=10)
    elif variant.startswith("gather"):
        every = {"gather": 0, "gather+fp/1": 1, "gather+fp/10": 10}[variant]
        watcher = DistributedWatcher(model, opt, check_every=every, update_ratio_every=10, timeout=60.0)
    sink: Any = None
    times: dict[str, list[float]] = {p: [] for p in PHASES}

    def step(record: bool) -> None:
        nonlocal sink
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        sink = watcher.update(loss=loss) if watcher is not None else loss.detach()
        t4 = time.perf_counter()
        opt.zero_grad()
        t5 = time.perf_counter()
        if record:
            for p, dt in zip(PHASES, (t5 - t0, t2 - t1, t3 - t2, t4 - t3)):
                times[p].append(dt)

    for _ in range(5):
        step(False)
    dist.barrier()
    for _ in range(args.steps):
        step(True)
    if watcher is not None:
        watcher.close()
    del sink
    return times


def rank_main(rank: int, world: int, store: str, args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(args.batch, 64, generator=g), torch.randint(0, 10, (args.batch,), generator=g)
    per = {v: {p: [] for p in PHASES} for v in VARIANTS}
    for _ in range(args.repeats):
        for v in VARIANTS:                       # interleaved: drift and other load hit every variant alike
            for p, ts_ in time_variant(v, args, x, y).items():
                per[v][p].extend(ts_)
    mine = torch.tensor([statistics.median(per[v][p]) for v in VARIANTS for p in PHASES], dtype=torch.float64)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    if rank == 0:
        worst = torch.stack(every).max(dim=0).values.tolist()       # a step lasts as long as its slowest rank
        m = {v: dict(zip(PHASES, worst[i * len(PHASES):(i + 1) * len(PHASES)])) for i, v in enumerate(VARIANTS)}
        n_params = sum(p.numel() for p in mlp(args.depth, args.width).parameters())
        bare = m["bare"]["step"]
        print(f"DDP on {world} CPU processes (gloo, 1 thread each): MLP depth {args.depth} width {args.width} "
              f"({2 * args.depth} parameter tensors, {n_params / 1e6:.2f} M parameters), batch {args.batch} per "
              f"rank; medians over {args.repeats} x {args.steps} steps, slower rank, ms")
        print(f"  {'variant':13s} " + " ".join(f"{p:>9s}" for p in PHASES))
        for v in VARIANTS:
            print(f"  {v:13s} " + " ".join(f"{m[v][p] * 1e3:9.3f}" for p in PHASES))
        costs = {
            "aggregation (update: gather - local)": m["gather"]["update"] - m["local"]["update"],
            "comm hook (backward: gather - bare)": m["gather"]["backward"] - m["bare"]["backward"],
            "one fingerprint check (opt.step: fp/1 - gather)": m["gather+fp/1"]["opt_step"] - m["gather"]["opt_step"],
            "single-process watcher (update: local - bare)": m["local"]["update"] - m["bare"]["update"],
        }
        for name, c in costs.items():
            print(f"  {name:50s} {c * 1e3:+8.3f} ms = {c / bare:+.4f} x the bare DDP step")
        agg, fp = list(costs.values())[:3], list(costs.values())[2]
        total = sum(agg) - fp + fp / 10
        print(f"  {'distributed part at the default (check_every=10)':50s} {total * 1e3:+8.3f} ms = "
              f"{total / bare:+.4f} x the bare DDP step")
        print(f"  (whole steps, noisy on a shared machine: bare {bare * 1e3:.2f} ms, gather+fp/10 "
              f"{m['gather+fp/10']['step'] * 1e3:.2f} ms)")
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--world", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(rank_main, args=(args.world, os.path.join(tmp, "store"), args), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
