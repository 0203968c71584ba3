"""A hand-written PyTorch loop watched by :class:`trainsignals.adapters.torch.TorchWatcher`.

Trains a small MLP on scikit-learn's bundled 8x8 digits with Adam, with gradient clipping and
activation statistics, for 300 steps; at step 200 the learning rate is raised 1000x (a
mis-wired scheduler) and the watcher says what happened, when, and why, and stops the run.

With ``--rollback`` the watcher's guards act instead: non-finite steps are skipped on the device,
and on the critical divergence the model and optimizer go back to the last quiet snapshot with the
learning rate halved (the snapshot holds the optimizer's learning rate from before the fault),
and training goes on to the end.

With ``--sync-every N`` the watcher holds its measurements on the device and brings them to the
host once every N steps (``sync_every``): the same events, reported up to N - 1 steps later, and
the stop comes at the end of the block that holds the failure.

Run: ``python examples/torch_loop.py [--rollback | --sync-every 10]`` (a few seconds on a CPU).
"""

from __future__ import annotations

import argparse

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.nn import functional as F

from trainsignals.adapters.torch import TorchWatcher


def main(steps: int = 300, bump_at: int = 200, rollback: bool = False, sync_every: int = 1) -> None:
    X, y = load_digits(return_X_y=True)
    X_t, y_t = torch.tensor(X / 16.0, dtype=torch.float32), torch.tensor(y)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)
    guards = dict(rollback=True, rollback_every=50, rollback_lr_factor=0.5, skip_nonfinite_steps=True) \
        if rollback else {}
    watcher = TorchWatcher(model, optimizer, total_steps=steps, per_layer="module", activations_every=10,
                           sync_every=sync_every, **guards)
    for step in range(steps):
        idx = torch.randint(0, len(X_t), (128,), generator=gen)
        if step == bump_at:
            optimizer.param_groups[0]["lr"] *= 1000          # the injected failure
        loss = F.cross_entropy(model(X_t[idx]), y_t[idx])
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(model.parameters(), 100.0)   # norm before clipping
        optimizer.step()                                     # the watcher's hooks measure here
        for event in watcher.update(loss=loss, grad_norm=grad_norm):     # one host transfer
            print(event)
        optimizer.zero_grad()
        if watcher.should_stop:
            print(f"stopping at step {step}")
            break
    watcher.close()
    print(watcher.monitor.summary())


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    how = ap.add_mutually_exclusive_group()
    how.add_argument("--rollback", action="store_true", help="skip non-finite steps and roll back on divergence")
    how.add_argument("--sync-every", type=int, default=1, metavar="N", help="bring measurements to the host every N steps")
    args = ap.parse_args()
    main(rollback=args.rollback, sync_every=args.sync_every)
