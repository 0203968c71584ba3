"""``LayerValues``: per-layer values as a mapping over a vector, fed to the Monitor as is."""

from __future__ import annotations

import numpy as np
import pytest

import trainsignals as ts

NAMES = ("embed", "block0", "block1", "block2", "head")


def norms(seed: int, n: int = 400, cliff_at: int = 250) -> np.ndarray:
    """Per-layer grad norms with noise; from ``cliff_at`` the middle layer falls 4 decades."""
    rng = np.random.default_rng(seed)
    m = np.exp(rng.normal(0.0, 0.2, (n, len(NAMES)))) * np.array([1.0, 0.5, 0.3, 0.4, 2.0])
    m[cliff_at:, 2] *= 1e-4
    return m


def test_behaves_as_the_equivalent_dict() -> None:
    values = np.array([0.5, 0.25, 0.125, 1.0, 2.0])
    lv = ts.LayerValues(NAMES, values)
    d = dict(zip(NAMES, values.tolist()))
    assert lv == d and dict(lv) == d
    assert list(lv) == list(NAMES) and len(lv) == 5
    assert lv["block1"] == 0.125 and isinstance(lv["block1"], float)
    assert "head" in lv and "tail" not in lv
    with pytest.raises(KeyError):
        lv["tail"]
    assert lv.array is values       # a float64 vector is kept without a copy
    assert ts.LayerValues(list(NAMES), values.tolist()) == lv


def test_bad_values_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match="one value per name"):
        ts.LayerValues(NAMES, [1.0, 2.0])
    with pytest.raises(ValueError, match="one value per name"):
        ts.LayerValues(NAMES[:2], [[1.0, 2.0]])
    with pytest.raises(TypeError, match="real numbers"):
        ts.LayerValues(NAMES[:1], ["x"])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_monitor_gives_the_same_events_as_for_a_dict(seed: int) -> None:
    m = norms(seed)
    by_dict, by_values = ts.Monitor(), ts.Monitor()
    a, b = [], []
    for t, row in enumerate(m):
        a += by_dict.update(loss=1.0, layer_grad_norms=dict(zip(NAMES, row.tolist())), step=t)
        b += by_values.update(loss=1.0, layer_grad_norms=ts.LayerValues(NAMES, row), step=t)
    cliffs = [e for e in b if e.kind == ts.Kind.VANISHING_GRADIENT]
    assert cliffs and cliffs[0].layer == "block1" and 250 <= cliffs[0].step <= 260
    assert [e.to_dict() for e in a] == [e.to_dict() for e in b]


@pytest.mark.parametrize("seed", [5, 6])
def test_layers_in_another_order_are_matched_by_name(seed: int) -> None:
    """A mapping (or LayerValues) giving the same layers in another order each step: the events of the fixed order."""
    m = norms(seed)
    rng = np.random.default_rng(seed)
    fixed, shuffled, scanned = ts.Monitor(), ts.Monitor(), ts.Monitor()
    a, b = [], []
    for t, row in enumerate(m):
        a += fixed.update(loss=1.0, layer_grad_norms=dict(zip(NAMES, row.tolist())), step=t)
        order = rng.permutation(len(NAMES))
        given = {NAMES[j]: float(row[j]) for j in order}
        b += shuffled.update(loss=1.0, layer_grad_norms=given if t % 2 else
                             ts.LayerValues([NAMES[j] for j in order], row[order]), step=t)
    assert any(e.kind == ts.Kind.VANISHING_GRADIENT for e in a)
    assert [e.to_dict() for e in a] == [e.to_dict() for e in b]
    half = len(m) // 2  # scan: the second chunk's columns in reverse order
    c = scanned.scan(loss=np.ones(half), layer_grad_norms=dict(zip(NAMES, m[:half].T)))
    c += scanned.scan(loss=np.ones(len(m) - half), layer_grad_norms=dict(zip(NAMES[::-1], m[half:, ::-1].T)))
    assert [(e.kind, e.step, e.layer) for e in c] == [(e.kind, e.step, e.layer) for e in a]


def test_changed_layers_are_refused() -> None:
    mon = ts.Monitor()
    mon.update(loss=1.0, layer_grad_norms=ts.LayerValues(NAMES, np.ones(5)))
    with pytest.raises(ValueError, match=r"layers changed.*a run's layers are fixed: give NaN"):
        mon.update(loss=1.0, layer_grad_norms=ts.LayerValues(NAMES[:4], np.ones(4)))
    with pytest.raises(ValueError, match="layers changed"):
        mon.update(loss=1.0, layer_grad_norms={**dict.fromkeys(NAMES[:4], 1.0), "other": 1.0})
    with pytest.raises(ValueError, match="must be >= 0"):
        mon.update(loss=1.0, layer_grad_norms=ts.LayerValues(NAMES, -np.ones(5)))
