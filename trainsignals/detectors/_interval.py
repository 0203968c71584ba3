"""Detectors on a stream logged every N steps: the same spans in steps, never fewer values than a rule needs.

A detector counts values. At one value a step, a 250-value lag is 250 steps; in a log that
holds one row every 50 steps (Hugging Face's ``logging_steps``, Lightning's
``log_every_n_steps``) the same lag spans 12,500 steps, longer than many runs. A detector class
says which of its constructor parameters are such spans (``spans``: the parameter and the
fewest values the rule needs it to cover, a number or the name of another parameter) and which are EWMA weights per value (``rates``);
:func:`interval_settings` turns a detector's settings for one value a step into settings for
one value every ``every`` steps:

* a span ``v`` becomes ``v // every`` values (rounded down, so a span that is a multiple of
  another stays one), but not fewer than its floor (a setting
  already below its floor stays as it is);
* a rate ``a`` becomes ``1 - (1 - a) ** every``, the weight that forgets as much per logged
  value as ``a`` does over ``every`` steps, but not more than ``max(a, RATE_CAP)``.

Counts that are sample sizes rather than spans (a run of 4 rises, evaluations of the
validation loss) stay as they are: those are counted in values whatever the interval. The
z-score and peak rules' warm-up is both: 20 values, or 8 (``MIN_VALUES``) once they cover 20
steps, so a log with one row every 50 steps is judged after 8 rows (400 steps), not after 20
(1,000 steps, longer than many runs); the rules read this from the values' steps, whatever
the interval they were told (:func:`covered`). Thresholds stay
too: they are relative to the run's own noise, which the detectors measure on the stream they
are given.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from .._validate import check_range

__all__ = ["MIN_HOLD", "MIN_VALUES", "MIN_WARM", "RATE_CAP", "covered", "interval_settings"]

#: the fewest values a window statistic is computed over: the smallest window the suite's window rules
#: accept (:class:`~trainsignals.LjungBoxSawtooth` and the swing-ratio rules refuse fewer than 8)
MIN_VALUES = 8
#: the fewest values watched after a jump or held at a level: two halves of one value. The watch starts
#: after the jump's row, so its second half, two rows on, is clear of an excursion that spans the jump's
#: row and the next (a bad batch straddling two rows of a window-mean log); each row of such a log is
#: already a mean over its interval, so a one-row half is not one noisy step
MIN_HOLD = 2
#: the fewest values that end a warm-up of ``n`` values once they cover ``n`` steps (:func:`covered`)
MIN_WARM = MIN_VALUES
#: the largest EWMA weight a rate is scaled to: an EWMA of weight ``a`` averages about ``2 / a - 1``
#: values, so 2 / 9 keeps MIN_VALUES of memory
RATE_CAP = 2.0 / (MIN_VALUES + 1)


def interval_settings(cls: type, every: int, settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``settings`` of detector class ``cls`` (its defaults where absent) for one value every ``every`` steps.

    Reads the class attributes ``spans`` (``{parameter: fewest values}``) and ``rates`` (EWMA
    weights); returns ``settings`` with those parameters scaled as the module docstring says
    (every other setting as given). ``every == 1`` returns ``settings`` unchanged.

    Raises:
        ValueError: ``every`` is not an integer >= 1.

    Example:
        >>> from trainsignals import GradLossDecoupling, TrendDivergence
        >>> interval_settings(GradLossDecoupling, 10)       # lag 250 steps = 25 values
        {'lag': 25, 'alpha': 0.2222222222222222}
        >>> interval_settings(TrendDivergence, 50, {"threshold": 8.0})   # a sample-size window: as given
        {'threshold': 8.0}
    """
    check_range("every", every, 1, None, integer=True)
    out = dict(settings or {})
    if every == 1:
        return out
    params = inspect.signature(cls).parameters

    def given(name: str) -> Any:
        return out[name] if name in out else params[name].default

    for name, least in getattr(cls, "spans", {}).items():
        v, floor = given(name), given(least) if isinstance(least, str) else least
        if isinstance(v, int) and not isinstance(v, bool):
            out[name] = max(min(v, floor), v // every)
    for name in getattr(cls, "rates", ()):
        a = given(name)
        if isinstance(a, float) and 0.0 < a < 1.0:
            out[name] = min(1.0 - (1.0 - a) ** every, max(a, RATE_CAP))
    return out


def covered(n: Any, first_step: Any, step: Any, need: int) -> Any:
    """Whether ``n`` values, the first at ``first_step``, end a warm-up of ``need`` values before a value at ``step``.

    ``need`` values, or MIN_WARM once they cover ``need`` steps: at one value a step ``need``
    values come first (nothing changes), and a log with one row every 50 steps is warm after 8
    rows, not 20 (1,000 steps, longer than many runs). The rules read it from the values' own
    steps, so it holds whatever interval a Monitor was told. NumPy arrays of counts and steps give it
    elementwise (the status timeline of a whole run).

    Example:
        >>> covered(20, 0, 19, 20), covered(12, 0, 19, 20), covered(12, 0, 550, 20), covered(5, 0, 550, 20)
        (True, False, True, False)
    """
    return (n >= need) | ((n >= MIN_WARM) & (step - first_step >= need))
