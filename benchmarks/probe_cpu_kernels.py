"""Do the real runs depend on the CPU's vector extensions, and does pinning the kernels fix it?

Trains one MLP and one CNN run of ``trainsignals.curves.real_runs`` (200 steps each) in fresh
processes whose environment asks torch and MKL for another CPU's code (``ATEN_CPU_CAPABILITY``
and ``MKL_CBWR`` at avx2/AVX2 and at avx512/AVX512), once as they come and once with
:data:`trainsignals.curves.real_runs.CPU_KERNELS` on top (what ``build`` gives its workers); ``train``
turns oneDNN off in both. Prints a hash of each run's recorded arrays and its last loss, and the
seconds each process took. On an AVX-512 machine the unpinned hashes differ between the two
settings and the pinned ones agree.

Run: ``python benchmarks/probe_cpu_kernels.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

CHILD = r"""
import hashlib, numpy as np
from trainsignals.curves.real_runs import train
from trainsignals.curves.training import RunSpec
base = dict(kind="healthy", seed=1, steps=200, optimizer="sgd", lr=0.2, weight_decay=0.0, schedule="constant",
            warmup=0, batch_size=32, augment=(0.5, 0.05), val_every=25, val_at_zero=False, per_layer="module")
out = []
for name, fam, arch in (("p-mlp-0", "mlp", {"widths": [32, 32], "activation": "relu"}),
                        ("p-cnn-0", "cnn", {"channels": [8, 16], "hidden": 32, "activation": "relu"})):
    c = train(RunSpec(name=name, family=fam, arch=arch, **base))
    parts = [np.ascontiguousarray(a, dtype=np.float64).tobytes()
             for a in (c.loss, c.grad_norm, c.update_ratio, c.layer_grad_norms) if a is not None]
    out.append(f"{fam} {hashlib.sha1(b''.join(parts)).hexdigest()[:12]} last loss {float(c.loss[-1]):.10g}")
print("; ".join(out))
"""


def main() -> None:
    from trainsignals.curves.real_runs import CPU_KERNELS

    for pinned in (False, True):
        for cap, cbwr in (("avx2", "AVX2"), ("avx512", "AVX512")):
            env = {**os.environ, "ATEN_CPU_CAPABILITY": cap, "MKL_CBWR": cbwr}
            if pinned:
                env.update(CPU_KERNELS)
            t0 = time.perf_counter()
            res = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
            label = "pinned  " if pinned else "as found"
            print(f"{label} asked for {cap:6s}: {res.stdout.strip()}  ({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
