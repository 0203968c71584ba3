"""The calibrated knob values the default suite applies, read once from ``calibration.json``.

:mod:`trainsignals.eval.calibrate` writes the file (``python -m trainsignals.eval.calibrate
--write``): per default-suite entry, the knob, its value and the alarms per 10,000 healthy steps
it gave on the tuning suites, and (``--heldout-rates``) the alarms it gave at that value on
held-out healthy runs, measured only. This module only reads it (stdlib ``json``; no heavy import).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = ["calibrated", "heldout_rate"]

_FILE = Path(__file__).with_name("calibration.json")


@lru_cache(maxsize=1)
def _entries() -> dict[str, dict[str, Any]]:
    try:
        doc = json.loads(_FILE.read_text())
    except FileNotFoundError:
        return {}
    return dict(doc.get("entries", {}))


def calibrated(name: str) -> tuple[dict[str, Any], float | None]:
    """``({knob: value}, alarms per 10k healthy steps)`` for default-suite entry ``name``; ``({}, None)`` if none.

    Example:
        >>> calibrated("no such entry")
        ({}, None)
    """
    row = _entries().get(name)
    if row is None or row.get("limit") == "no_data":
        return {}, None
    if row.get("limit") == "measured":  # the class default, measured: nothing to apply
        return {}, float(row["per_10k"])
    return {row["param"]: row["value"]}, float(row["per_10k"])


def heldout_rate(name: str) -> float | None:
    """Alarms per 10,000 held-out healthy steps of default-suite entry ``name`` at its shipped value, or ``None``.

    Example:
        >>> heldout_rate("no such entry") is None
        True
    """
    row = _entries().get(name)
    held = None if row is None else row.get("heldout")
    return None if not held or not held.get("steps") else 1e4 * held["alarms"] / held["steps"]
