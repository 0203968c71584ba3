"""Where ``Monitor.update``'s time goes: the default suite timed whole and without each group of rules.

usage: python benchmarks/probe_update_cost.py [--stream 20000]

Feeds loss, grad norm and learning rate (``bench_core.py``'s healthy stream) to a default Monitor,
then to Monitors whose suite lacks one group of rules (the same groups each time, removed through
the public ``ts.default_suite`` and ``ts.Monitor(suite=...)``), and to one with no detector at all
(the Monitor's own work). Each figure is the best of five passes, in microseconds a step; a
group's cost is the whole suite's time less the time without it. It measures; it sets nothing.
"""

from __future__ import annotations

import argparse
import time

from bench_core import healthy

import trainsignals as ts

#: the groups of default-suite entries that read the same signals with related rules
GROUPS: dict[str, tuple[str, ...]] = {
    "stall (plateau rules)": ("stall_grad_collapse", "stall_slowdown", "stall_frozen_updates",
                              "stall_never_improved", "stall_abrupt"),
    "spikes and level shifts": ("loss_spike", "loss_peak", "loss_spike_signed", "loss_shift", "grad_explosion",
                                "grad_peak", "grad_shift"),
    "oscillation": ("sawtooth", "edge_of_stability", "lr_edge_of_stability"),
    "divergence": ("early_climb", "trend_divergence", "lost_progress", "lost_progress_signed"),
    "coupling": ("grad_decoupling", "joint_collapse", "one_answer"),
    "learning rate and updates": ("lr_collapse", "frozen_optimizer", "frozen_gradients", "lr_anomaly",
                                  "update_ratio_high", "update_ratio_low"),
}


def per_step(monitor: ts.Monitor, xs: list[float], gs: list[float]) -> float:
    """Microseconds a step of ``update(loss, grad_norm, lr)``: the best of five passes over the stream."""
    best = float("inf")
    for _ in range(5):
        monitor.reset()
        t0 = time.perf_counter()
        for x, g in zip(xs, gs, strict=True):
            monitor.update(loss=x, grad_norm=g, lr=1e-3)
        best = min(best, (time.perf_counter() - t0) / len(xs) * 1e6)
    return best


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stream", type=int, default=20_000, help="steps fed to each Monitor")
    args = ap.parse_args(argv)
    loss, grad = healthy(args.stream)
    xs, gs = loss.tolist(), grad.tolist()
    whole = per_step(ts.Monitor(), xs, gs)
    print(f"default suite: {whole:.2f} us a step; no detector: {per_step(ts.Monitor(suite={}), xs, gs):.2f} us")
    for group, names in GROUPS.items():
        suite = {k: v for k, v in ts.default_suite().items() if k not in names}
        print(f"  {group:26s} ({len(names)} rules): {whole - per_step(ts.Monitor(suite=suite), xs, gs):5.2f} us a step")


if __name__ == "__main__":
    main()
