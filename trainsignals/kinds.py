"""Facts per failure kind that the edges share: how long after its onset a kind counts as caught.

The bench scores detection within this window, and the real-run builder checks its labels over
it, so both read it from here (the core), not from each other.
"""

from __future__ import annotations

__all__ = ["default_window"]


def default_window(kind: str, total_steps: int) -> int:
    """The detection window, in steps after the onset, for a failure kind.

    * ``stall``: ``max(150, 25 % of total_steps)``; the stall rule needs "no new best loss
      within 10 % of the planned steps", so it cannot fire sooner than that after onset;
    * ``overfitting``: ``max(300, 25 % of total_steps)``; validation runs only every 25 to
      100 steps, and a rise must show over several evaluations;
    * ``silent_collapse``, ``dead_units``, ``saturation``: ``max(250, 15 % of total_steps)``;
      these develop gradually (the suite's hard cases ramp over up to 250 steps: a grad norm
      sinking 2 decades, a layer's units dying one by one), and a healthy grad norm can drift
      over a decade in that time, so they are only certain well into the ramp;
    * every other kind: ``max(100, 10 % of total_steps)``.

    Example:
        >>> default_window("divergence", 2000), default_window("stall", 400)
        (200, 150)
    """
    if kind == "stall":
        return max(150, int(0.25 * total_steps))
    if kind == "overfitting":
        return max(300, int(0.25 * total_steps))
    if kind in ("silent_collapse", "dead_units", "saturation"):
        return max(250, int(0.15 * total_steps))
    return max(100, int(0.10 * total_steps))
