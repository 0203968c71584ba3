"""Replay speed: a recorded trace through the default suite, against streaming it step by step.

Run:  python benchmarks/bench_replay.py [--steps 1000000] [--stream 1000000] [--json out.json]

Writes ``--steps`` steps of loss + grad_norm (a healthy run with heavy-tailed noise and a few
spikes) with ``write_trace``, then measures in the same run:

* ``replay(path)`` end to end (read the file, ``trace_signals``, ``Monitor.scan`` with the
  default suite, status timeline): steps/s, best of ``--repeat``;
* streaming the same trace's rows through ``Monitor.update`` (the values already Python
  floats, so only the Monitor is timed): steps/s over the first ``--stream`` rows;
* the ratio of the two, and that both give the same events on the streamed rows;
* where replay's time goes (read_trace, trace_signals, scan), and replay with a default
  ``Monitor()`` (stall patience 200 instead of 10 % of the steps) for comparison.

Targets (issue "Trace replay"): replay >= 5 million steps/s; >= 20x streaming.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_core import healthy  # noqa: E402  (the same long healthy run as the core benchmark)

TARGET_STEPS_PER_S = 5e6
TARGET_RATIO = 20.0


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1_000_000, help="steps in the trace (default 1,000,000)")
    ap.add_argument("--stream", type=int, default=None,
                    help="rows streamed through Monitor.update (default: all of them)")
    ap.add_argument("--repeat", type=int, default=3, help="replays timed; the best counts (default 3)")
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args(argv)

    import trainsignals as ts
    from trainsignals.io.report import replay
    from trainsignals.io.traces import read_trace, trace_signals, write_trace

    n = args.steps
    n_stream = min(n, args.stream or n)
    loss, grad = healthy(n)
    res: dict = {"python": sys.version.split()[0], "machine": platform.machine(), "numpy": np.__version__,
                 "steps": n, "stream_steps": n_stream}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "run.arrow")
        t0 = time.perf_counter()
        write_trace(path, step=np.arange(n), loss=loss, grad_norm=grad, metadata={"bench": "replay"})
        res["write_s"] = time.perf_counter() - t0
        res["trace_mb"] = os.path.getsize(path) / 1e6
        print(f"write_trace: {n:,} steps in {res['write_s']:.3f} s ({res['trace_mb']:.1f} MB)")

        def best_of(fn):  # (best seconds, last result)
            best, out = float("inf"), None
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                out = fn()
                best = min(best, time.perf_counter() - t0)
            return best, out

        best, report = best_of(lambda: replay(path))
        res["replay_s"] = best
        res["replay_steps_per_s"] = n / best
        print(f"replay(path), Monitor(total_steps={n:,}) (read + scan + timeline): {best:.3f} s = "
              f"{n / best / 1e6:.2f} M steps/s, {len(report.events)} event(s), status {report.final_status}")
        # where the time goes
        t_read, table = best_of(lambda: read_trace(path))
        t_sig, sig = best_of(lambda: trace_signals(table))
        t_scan, _ = best_of(lambda: ts.Monitor(total_steps=n).scan(**sig))
        t_scan200, _ = best_of(lambda: ts.Monitor().scan(**sig))
        best200, _ = best_of(lambda: replay(path, monitor=ts.Monitor()))
        res.update(read_s=t_read, trace_signals_s=t_sig, scan_s=t_scan, scan_default_patience_s=t_scan200,
                   replay_default_patience_steps_per_s=n / best200)
        print(f"  read_trace {t_read:.3f} s, trace_signals {t_sig:.3f} s, Monitor(total_steps={n:,}).scan "
              f"{t_scan:.3f} s (stall patience {n // 10:,}); Monitor().scan {t_scan200:.3f} s (patience 200)")
        print(f"replay(path, monitor=Monitor()): {best200:.3f} s = {n / best200 / 1e6:.2f} M steps/s")

        steps = table.column("step").to_numpy()[:n_stream].tolist()
        xs = table.column("loss").to_numpy()[:n_stream].tolist()
        gs = table.column("grad_norm").to_numpy()[:n_stream].tolist()
        mon = ts.Monitor(total_steps=n)
        update = mon.update
        streamed: list = []
        t0 = time.perf_counter()
        for s, x, g in zip(steps, xs, gs):
            ev = update(step=s, loss=x, grad_norm=g)
            if ev:
                streamed.extend(ev)
        stream_s = time.perf_counter() - t0
        res["stream_s"] = stream_s
        res["stream_steps_per_s"] = n_stream / stream_s
        res["ratio"] = res["replay_steps_per_s"] / res["stream_steps_per_s"]
        same = [e.to_dict() for e in streamed] == [e.to_dict() for e in report.events if e.step < n_stream]
        res["same_events"] = same
        print(f"stream (Monitor.update per row): {n_stream:,} steps in {stream_s:.3f} s = "
              f"{n_stream / stream_s / 1e6:.3f} M steps/s ({stream_s / n_stream * 1e6:.2f} us/step)")
        print(f"replay / stream: {res['ratio']:.1f}x; same events on the streamed rows: {same}")

    res["targets_met"] = bool(res["replay_steps_per_s"] >= TARGET_STEPS_PER_S and res["ratio"] >= TARGET_RATIO
                              and same)
    print(f"targets (>= {TARGET_STEPS_PER_S / 1e6:g} M steps/s, >= {TARGET_RATIO:g}x, same events): "
          f"{'met' if res['targets_met'] else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return res


if __name__ == "__main__":
    main()
