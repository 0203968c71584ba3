"""plot_run: a PNG that shows what happened, and matplotlib only when plotting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from matplotlib.image import imread  # noqa: E402

from trainsignals.curves import generate  # noqa: E402
from trainsignals.io.plot import plot_run  # noqa: E402
from trainsignals.io.report import replay  # noqa: E402
from trainsignals.io.traces import read_trace, write_trace  # noqa: E402


def _signals(n: int = 600, blow_up: bool = False) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    t = np.arange(n)
    loss = (2.0 * np.exp(-t / 200) + 0.5) * np.exp(rng.normal(0, 0.01, n))
    grad = np.exp(rng.normal(0, 0.05, n))
    if blow_up:
        loss[400:] *= 1.15 ** np.arange(n - 400)  # geometric growth, then NaN
        grad[400:] *= 1.15 ** np.arange(n - 400)
        loss[500:] = np.nan
    return {"step": t, "loss": loss, "grad_norm": grad, "lr": np.full(n, 1e-3),
            "update_ratio": np.full(n, 3e-4) * np.exp(rng.normal(0, 0.1, n))}


def _reddish(img: np.ndarray) -> int:
    r, g, b = img[..., 0], img[..., 1], img[..., 2]
    return int(np.sum((r > 0.75) & (g < 0.35) & (b < 0.35)))


def test_png_shows_the_failure(tmp_path: Path) -> None:
    write_trace(tmp_path / "ok.arrow", **_signals())
    write_trace(tmp_path / "bad.arrow", **_signals(blow_up=True))
    fig_ok = plot_run(tmp_path / "ok.arrow", tmp_path / "ok.png")
    fig_bad = plot_run(tmp_path / "bad.arrow", tmp_path / "bad.png")
    ok, bad = imread(tmp_path / "ok.png"), imread(tmp_path / "bad.png")
    assert ok.shape == bad.shape and ok.shape[0] > 400 and ok.shape[1] > 800
    for img in (ok, bad):  # not a blank canvas: many colours, real contrast
        assert img[..., :3].std() > 0.1
        assert len(np.unique(img[..., :3].reshape(-1, 3), axis=0)) > 50
    assert np.abs(ok - bad).mean() > 0.005
    # red: critical event markers and spans, the diverging status band, non-finite crosses
    assert _reddish(bad) > 1000 and _reddish(ok) < 50
    assert "critical" in fig_bad.texts[0].get_text() and "healthy" in fig_ok.texts[0].get_text()
    labels = [a.get_ylabel() for a in fig_ok.axes]
    assert {"loss", "grad norm", "learning rate", "update ratio", "status"} <= set(labels)


def test_inputs_and_heatmap(tmp_path: Path) -> None:
    sig = generate("vanishing_gradient", seed=2).signals()
    kw = {k: sig[k] for k in ("step", "loss", "grad_norm", "layer_grad_norms")}
    write_trace(tmp_path / "v.arrow", **kw)
    rep = replay(tmp_path / "v.arrow")
    from_report = plot_run(rep, tmp_path / "v.png")
    from_table = plot_run(read_trace(tmp_path / "v.arrow"))
    assert len(from_report.axes) == len(from_table.axes)
    assert any(a.get_ylabel() == "layer" for a in from_report.axes)  # the heatmap panel
    assert imread(tmp_path / "v.png").shape[0] > 800  # main, heatmap and status panels
    assert not any(a.get_ylabel() == "learning rate" for a in from_report.axes)  # no lr: no panel
    rep.table = None  # a report from replay_many: the trace is read again
    assert len(plot_run(rep).axes) == len(from_report.axes)


def test_matplotlib_is_imported_only_to_plot() -> None:
    code = ("import sys, trainsignals, trainsignals.io.report, trainsignals.cli.traces; "
            "assert 'matplotlib' not in sys.modules, 'imported'; "
            "import trainsignals.io.plot; assert 'matplotlib' not in sys.modules, 'plot module'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_output_name_and_folder(tmp_path: Path) -> None:
    """``output`` without a suffix gets ``.png`` (matplotlib's own rule, now said); a folder is refused
    instead of becoming ``folder.png`` beside it."""
    from trainsignals.io.plot import _png_path

    write_trace(tmp_path / "ok.arrow", **_signals(200))
    plot_run(tmp_path / "ok.arrow", tmp_path / "fig")
    assert (tmp_path / "fig.png").is_file() and not (tmp_path / "fig").exists()
    assert _png_path(tmp_path / "fig") == str(tmp_path / "fig.png")
    assert _png_path(tmp_path / "fig.svg") == str(tmp_path / "fig.svg")
    folder = tmp_path / "figures"
    folder.mkdir()
    with pytest.raises(ValueError, match=r"output '.*figures' is a folder; give the image's file name, e\.g\. "):
        plot_run(tmp_path / "ok.arrow", folder)
    assert not (tmp_path / "figures.png").exists()
    # a log holding only a validation loss draws too
    csv = tmp_path / "v.csv"
    csv.write_text("step,val_loss\n0,1.0\n100,0.9\n200,0.8\n")
    fig = plot_run(csv, tmp_path / "v.png")
    assert "validation loss" in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
