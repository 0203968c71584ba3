"""The examples do what their docstrings say: each is run as documented (CPU, in a child
process) and every event it prints must be the one its docstring names, at the step it names.

Skipped where the example's framework is not installed. About 15 s each on two cores.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
#: ``step 152 WARNING bad_rank ...`` as the examples print events (Keras: after ``[trainsignals] ``)
EVENT = re.compile(r"^(?:\[trainsignals\] )?step (\d+) (WARNING|CRITICAL) (\w+)", re.MULTILINE)


def needs(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed")


def docstring(name: str) -> str:
    doc = ast.get_docstring(ast.parse((EXAMPLES / name).read_text(encoding="utf-8")))
    assert doc, f"{name} has no docstring"
    return " ".join(doc.split())  # one line: a claim may wrap anywhere


def run(argv: list[str], tmp_path: Path, **env: str) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", **env})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc.stdout


def test_torchrun_ddp_bad_shard_does_what_its_docstring_says(tmp_path: Path) -> None:
    needs("torch", "sklearn")
    out = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(EXAMPLES / "torchrun_ddp.py")], tmp_path)
    doc = docstring("torchrun_ddp.py")
    claim = doc[doc.index("``bad-shard`` (default)"):doc.index("``bit-flip``")]
    events = EVENT.findall(out)
    assert ("152", "WARNING", "bad_rank") in events and "bad_rank at step 152: ranks [1]" in out
    for step, _severity, kind in events:  # was: "bad_rank naming that rank; training goes on"
        assert f"``{kind}``" in claim and f"step {step}" in claim, (kind, step, claim)
    stopped = re.search(r"every rank stopped after step (\d+)", out)
    assert stopped is not None and "training goes on" not in claim and "every rank stops" in claim
    assert f"step {stopped[1]}" in claim


def test_keras_fit_reports_what_its_docstring_says(tmp_path: Path) -> None:
    needs("keras", "jax")
    out = run([sys.executable, str(EXAMPLES / "keras_fit.py")], tmp_path, KERAS_BACKEND="jax",
              JAX_PLATFORMS="cpu", PYTHONHASHSEED="0")
    doc = docstring("keras_fit.py")
    healthy, blowup = out.split("== 2.")
    assert EVENT.findall(healthy) == [] and "the callback stays quiet" in doc
    claim = doc[doc.index("2. the learning rate"):]
    events = EVENT.findall(blowup)
    assert events and ("90", "WARNING", "lr_anomaly") in events
    for step, _severity, kind in events:  # was: "reports the divergence within a few steps"
        assert f"``{kind}``" in claim and f"step {step}" in claim, (kind, step, claim)
    assert "divergence" not in {kind for _, _, kind in events} and "No ``divergence`` is reported" in claim
    stopped = re.search(r"stopped at step (\d+)", blowup)
    assert stopped is not None and f"step {stopped[1]}" in claim and "stops ``fit``" in claim
    critical = [int(step) for step, severity, _ in events if severity == "CRITICAL"]
    assert critical and min(critical) == int(stopped[1])
