"""``import trainsignals`` stays light: NumPy and the standard library, nothing heavy.

Its time is measured in ``benchmarks/bench_import.py`` (the test suite does not time things).
"""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("scipy", "pyarrow", "matplotlib", "pandas", "polars", "rich", "torch", "jax", "keras", "tensorflow",
         "lightning", "transformers", "river", "statsmodels", "sklearn")


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}; import sys, json; print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_import_pulls_in_nothing_heavy():
    mods = _modules_after("import trainsignals")
    heavy = sorted(m for m in mods if m.split(".")[0] in HEAVY)
    assert heavy == [], f"import trainsignals imported {heavy}"


def test_a_monitor_update_pulls_in_nothing_heavy():
    mods = _modules_after("import trainsignals as ts; m = ts.Monitor(); [m.update(loss=1.0 / (t + 1), grad_norm=1.0)"
                          " for t in range(50)]")
    assert not [m for m in mods if m.split(".")[0] in HEAVY]


def test_scipy_arrives_when_a_batch_path_needs_it():
    mods = _modules_after("import numpy as np, trainsignals as ts; ts.scan(loss=np.linspace(2, 1, 5000))")
    assert "scipy.signal" in mods
