"""Cost of recording a trace, per step amortised, against baselines measured in the same run.

Run:  python benchmarks/bench_traces.py [--steps 200000] [--layers 50] [--json out.json]

Each step records loss, grad_norm, lr, update_ratio and ``--layers`` per-layer grad norms.
Measured (best of ``--repeat``, every flush and the final close included):

* ``TraceWriter.record`` (what ``Monitor(recorder=writer)`` calls) and ``TraceWriter.write``
  (manual use), at ``flush_every`` 100 and 1000;
* baseline: appending the same values to Python lists (a copy of the layer vector included);
* baseline: ``Monitor.update`` itself with the same signals (no recorder), and with a
  recorder (the recorder's share of a monitored step);
* ``Monitor.scan`` with and without a recorder (the batch path, per step).

Target (issue "Traces"): under 5 us a step amortised for the recorder.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np

TARGET_US = 5.0


def best(fn: Callable[[], None], repeat: int) -> float:
    """Best wall time of ``repeat`` runs of ``fn``, in seconds."""
    out = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out = min(out, time.perf_counter() - t0)
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200_000, help="steps written per measurement")
    ap.add_argument("--layers", type=int, default=50, help="per-layer grad norms per step")
    ap.add_argument("--monitor-steps", type=int, default=20_000, help="steps for the Monitor.update baselines")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement (the best is kept)")
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args(argv)

    import pyarrow as pa

    import trainsignals as ts
    from trainsignals.io.traces import TraceWriter, read_trace

    n, n_layers = args.steps, args.layers
    rng = np.random.default_rng(0)
    loss = (2.0 * np.exp(-np.arange(n) / (n / 3)) + 0.5).tolist()
    grad = np.exp(rng.normal(0, 0.1, n)).tolist()
    ratio = (3e-4 * np.exp(rng.normal(0, 0.1, n))).tolist()
    vecs = [np.exp(rng.normal(0, 0.2, n_layers)) for _ in range(256)]  # rotated: no cache tricks
    names = tuple(f"layer{i}" for i in range(n_layers))
    lr = 1e-3
    folder = tempfile.mkdtemp(prefix="bench_traces_")
    res: dict = {"python": sys.version.split()[0], "machine": platform.machine(), "numpy": np.__version__,
                 "pyarrow": pa.__version__, "trainsignals": ts.__version__, "steps": n, "layers": n_layers,
                 "target_us": TARGET_US}
    print(f"trace recording: {n} steps, loss + grad_norm + lr + update_ratio + {n_layers} layer norms; "
          f"best of {args.repeat}")

    def lists() -> None:
        cols: list[list] = [[] for _ in range(6)]
        s_, l_, g_, lr_, r_, v_ = (c.append for c in cols)
        for i in range(n):
            s_(i)
            l_(loss[i])
            g_(grad[i])
            lr_(lr)
            r_(ratio[i])
            v_(vecs[i & 255].copy())

    base = best(lists, args.repeat) / n
    res["baseline_lists_us"] = base * 1e6
    print(f"  baseline: append to Python lists          {base * 1e6:7.3f} us/step")

    def mon_update(recorder: TraceWriter | None, steps: int) -> None:
        mon = ts.Monitor(total_steps=steps, recorder=recorder)
        up = mon.update
        for i in range(steps):
            up(step=i, loss=loss[i], grad_norm=grad[i], lr=lr, update_ratio=ratio[i],
               layer_grad_norms=vecs[i & 255])

    m = min(args.monitor_steps, n)
    mon_plain = best(lambda: mon_update(None, m), args.repeat) / m
    res["monitor_update_us"] = mon_plain * 1e6
    print(f"  baseline: Monitor.update (no recorder)    {mon_plain * 1e6:7.3f} us/step")

    path_sizes: dict[int, int] = {}
    for fe in (100, 1000):
        path = os.path.join(folder, f"record_{fe}.arrow")

        def record(fe: int = fe, path: str = path) -> None:
            w = TraceWriter(path, flush_every=fe, layer_names=names)
            rec = w.record
            for i in range(n):
                rec(step=i, signals={"loss": loss[i], "grad_norm": grad[i], "lr": lr, "update_ratio": ratio[i]},
                    layer_grad_norms=(vecs[i & 255], names), activations=None, events=())
            w.close()

        def write(fe: int = fe, path: str = path) -> None:
            w = TraceWriter(path, flush_every=fe, layer_names=names)
            wr = w.write
            for i in range(n):
                wr(i, loss=loss[i], grad_norm=grad[i], lr=lr, update_ratio=ratio[i],
                   layer_grad_norms=vecs[i & 255])
            w.close()

        t_rec = best(record, args.repeat) / n
        path_sizes[fe] = os.path.getsize(path)
        rows = read_trace(path).num_rows
        assert rows == n, (rows, n)
        t_wr = best(write, args.repeat) / n

        def monitored(fe: int = fe, path: str = path) -> None:
            w = TraceWriter(path, flush_every=fe)
            mon_update(w, m)
            w.close()

        t_mon = best(monitored, args.repeat) / m
        res[f"record_flush{fe}_us"] = t_rec * 1e6
        res[f"write_flush{fe}_us"] = t_wr * 1e6
        res[f"monitor_update_with_recorder_flush{fe}_us"] = t_mon * 1e6
        res[f"record_flush{fe}_vs_lists"] = t_rec / base
        res[f"record_flush{fe}_vs_monitor_update"] = t_rec / mon_plain
        res[f"bytes_per_step_flush{fe}"] = path_sizes[fe] / n
        print(f"  flush_every={fe:<5d} TraceWriter.record        {t_rec * 1e6:7.3f} us/step "
              f"({t_rec / base:.2f}x lists, {100 * t_rec / mon_plain:.1f}% of Monitor.update) "
              f"[{'ok' if t_rec * 1e6 < TARGET_US else 'OVER'} < {TARGET_US} us]")
        print(f"                   TraceWriter.write         {t_wr * 1e6:7.3f} us/step ({t_wr / base:.2f}x lists)")
        print(f"                   Monitor.update + recorder {t_mon * 1e6:7.3f} us/step "
              f"(+{(t_mon - mon_plain) * 1e6:.3f} us over no recorder)")
        print(f"                   file                      {path_sizes[fe] / n:7.1f} bytes/step")

    # the batch path: Monitor.scan with and without a recorder
    steps = np.arange(n)
    mat = np.exp(rng.normal(0, 0.2, (n, n_layers)))
    layers = {nm: mat[:, j] for j, nm in enumerate(names)}
    kw = {"step": steps, "loss": np.asarray(loss), "grad_norm": np.asarray(grad), "lr": np.full(n, lr),
          "update_ratio": np.asarray(ratio), "layer_grad_norms": layers}
    scan_plain = best(lambda: ts.Monitor(total_steps=n).scan(**kw), 1) / n
    scan_path = os.path.join(folder, "scan.arrow")

    def scan_rec() -> None:
        with TraceWriter(scan_path, flush_every=1000) as w:
            ts.Monitor(total_steps=n, recorder=w).scan(**kw)

    scan_with = best(scan_rec, 1) / n
    res["monitor_scan_us"] = scan_plain * 1e6
    res["monitor_scan_with_recorder_us"] = scan_with * 1e6
    print(f"  Monitor.scan: {scan_plain * 1e6:.3f} us/step, with a recorder {scan_with * 1e6:.3f} us/step "
          f"(+{(scan_with - scan_plain) * 1e6:.3f} us)")

    t0 = time.perf_counter()
    table = read_trace(os.path.join(folder, "record_1000.arrow"))
    t_read = (time.perf_counter() - t0) / table.num_rows
    res["read_trace_us_per_row"] = t_read * 1e6
    print(f"  read_trace: {t_read * 1e6:.3f} us/row")
    worst = max(res["record_flush100_us"], res["record_flush1000_us"])
    res["target_met"] = worst < TARGET_US
    print(f"target: TraceWriter.record < {TARGET_US} us/step amortised: "
          f"{'MET' if res['target_met'] else 'NOT MET'} (worst {worst:.3f} us)")
    shutil.rmtree(folder, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=2)
        print(f"figures written to {args.json}")
    return res


if __name__ == "__main__":
    main()
