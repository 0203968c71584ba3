"""``trainsignals datasets --out DIR`` refuses a folder it cannot write before it trains anything.

A real suite trains PyTorch runs for minutes before it writes; an output folder that is a file,
that cannot be made, or that may not be written into must be refused at once, in the usage
error's one line and status 2. Every test here replaces the builders by a failure: nothing trains.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import trainsignals.curves as curves_mod
from trainsignals.cli import main
from trainsignals.cli.options import UsageError, check_out_folder
from trainsignals.curves import real_runs

SUITES = ("real", "synthetic")


@pytest.fixture(autouse=True)
def _no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything would be trained or generated."""
    monkeypatch.setattr(real_runs, "build", lambda *a, **k: pytest.fail("trained the real suite"))
    monkeypatch.setattr(real_runs, "_map", lambda *a, **k: pytest.fail("trained the real suite"))
    monkeypatch.setattr(curves_mod, "standard_suite", lambda *a, **k: pytest.fail("generated the synthetic suite"))


def outcome(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def no_access(monkeypatch: pytest.MonkeyPatch, *denied: Path) -> None:
    """``os.access`` says no for ``denied`` (root may write anywhere, so a chmod alone proves nothing)."""
    real = os.access

    def access(path: Any, mode: int, **kw: Any) -> bool:
        if Path(path) in denied and mode & os.W_OK:
            return False
        return real(path, mode, **kw)

    monkeypatch.setattr(os, "access", access)


@pytest.mark.parametrize("suite", SUITES)
def test_an_out_that_is_a_file(suite: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "a_file"
    target.write_text("keep me\n")
    code, err = outcome(["datasets", "--suite", suite, "--out", str(target)], capsys)
    assert code == 2
    assert err == f"trainsignals datasets: error: --out {target} is a file; give the folder to write the suite into\n"
    assert target.read_text() == "keep me\n"


@pytest.mark.parametrize("suite", SUITES)
def test_an_out_below_a_file(suite: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("keep me\n")
    target = blocker / "suite"
    code, err = outcome(["datasets", "--suite", suite, "--out", str(target)], capsys)
    assert code == 2
    assert err == (f"trainsignals datasets: error: --out {target}: {blocker} is a file, so the folder cannot be "
                   "made in it\n")
    assert blocker.read_text() == "keep me\n"


def test_an_out_whose_parents_are_missing_below_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("x\n")
    target = blocker / "missing" / "also_missing" / "suite"
    code, err = outcome(["datasets", "--suite", "real", "--out", str(target)], capsys)
    assert code == 2 and err.count("\n") == 1
    assert f"{blocker} is a file, so the folder cannot be made in it" in err


def test_an_out_below_a_broken_link(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    link = tmp_path / "gone"
    link.symlink_to(tmp_path / "nowhere")
    code, err = outcome(["datasets", "--suite", "real", "--out", str(link / "suite")], capsys)
    assert code == 2 and f"{link} is a broken link" in err
    code, err = outcome(["datasets", "--suite", "real", "--out", str(link)], capsys)
    assert code == 2 and err == f"trainsignals datasets: error: --out {link} is a broken link; give the folder to " \
                                "write the suite into\n"


@pytest.mark.parametrize("suite", SUITES)
def test_an_out_without_write_permission(suite: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "locked"
    target.mkdir()
    no_access(monkeypatch, target)
    code, err = outcome(["datasets", "--suite", suite, "--out", str(target)], capsys)
    assert code == 2
    assert err == f"trainsignals datasets: error: --out {target}: no permission to write into this folder\n"


def test_a_missing_out_in_a_folder_without_write_permission(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    parent = tmp_path / "locked"
    parent.mkdir()
    target = parent / "missing" / "suite"
    no_access(monkeypatch, parent)
    code, err = outcome(["datasets", "--suite", "real", "--out", str(target)], capsys)
    assert code == 2
    assert err == (f"trainsignals datasets: error: --out {target}: no permission to write into {parent}, where the "
                   "folder would be made\n")
    assert not (parent / "missing").exists()


def test_a_manifest_that_cannot_be_overwritten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "manifest.json").write_text('{"format": "x"}\n')
    no_access(monkeypatch, tmp_path / "manifest.json")
    code, err = outcome(["datasets", "--suite", "real", "--out", str(tmp_path)], capsys)
    assert code == 2 and err == f"trainsignals datasets: error: --out {tmp_path}: no permission to write " \
                                f"{tmp_path / 'manifest.json'}\n"


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root may write into any folder")
def test_a_folder_really_without_write_permission(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "locked"
    target.mkdir()
    target.chmod(0o555)
    try:
        code, err = outcome(["datasets", "--suite", "real", "--out", str(target / "suite")], capsys)
    finally:
        target.chmod(0o755)
    assert code == 2 and "no permission to write into" in err


def test_a_folder_another_tool_wrote_is_refused_before_training(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "run1.arrow").write_text("x\n")
    code, err = outcome(["datasets", "--suite", "real", "--out", str(tmp_path)], capsys)
    assert code == 2 and err.startswith(f"trainsignals datasets: error: {tmp_path} holds .arrow files")
    assert (tmp_path / "run1.arrow").read_text() == "x\n"


@pytest.mark.parametrize("which", [[], ["--heldout"], ["--dev"]])
def test_the_real_runs_command_checks_before_training(which: list[str], tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("x\n")
    with pytest.raises(UsageError, match="is a file, so the folder cannot be made in it"):
        real_runs.main(["build", *which, "--out", str(blocker / "suite")])


def test_the_real_runs_module_reports_in_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("x\n")
    # an empty plan: a command that did not check first trains nothing here either
    proc = subprocess.run([sys.executable, "-m", "trainsignals.curves.real_runs", "build", "--dev", "--per-kind", "0",
                           "--healthy", "0", "--jobs", "1", "--out", str(blocker / "suite")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr == (f"python -m trainsignals.curves.real_runs: error: --out {blocker / 'suite'}: {blocker} is "
                           "a file, so the folder cannot be made in it\n")


def test_a_folder_that_can_be_made_is_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Missing folders are made when the suite is written (``mkdir -p``): the check lets them through."""
    calls: list[Path] = []

    def build(out: Path, *a: Any, **k: Any) -> dict[str, Any]:
        calls.append(Path(out))
        Path(out).mkdir(parents=True)
        return {"curves": [], "dropped": []}

    monkeypatch.setattr(real_runs, "build", build)
    target = tmp_path / "new" / "deeper" / "suite"
    assert main(["datasets", "--suite", "real", "--out", str(target)]) == 0
    assert calls == [target]
    assert "wrote 0 runs" in capsys.readouterr().out


def test_check_out_folder_takes_a_writable_folder(tmp_path: Path) -> None:
    assert check_out_folder(tmp_path) == tmp_path
    assert check_out_folder(str(tmp_path / "not" / "yet")) == tmp_path / "not" / "yet"
    assert not (tmp_path / "not").exists()  # the check makes nothing
