"""What the ``trainsignals`` commands share to refuse bad input: argparse types and one error path.

The types refuse an impossible value while the command line is parsed (argparse then prints
``trainsignals <command>: error: argument --flag: ...`` and exits with status 2). What only
running the command can find (a missing suite, a file that is not a calibration file) is raised
as :class:`UsageError` or an ``OSError`` about a path the user gave, and :func:`run_command`
turns it into the same one-line ``error:`` and status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["EXIT_BROKEN_PIPE", "USER_ERRORS", "UsageError", "check_out_folder", "error_message",
           "nonnegative_float", "nonnegative_int", "positive_float", "positive_int", "run_command"]


class UsageError(ValueError):
    """A value the user gave is wrong: :func:`run_command` prints its message as ``error:``."""


#: What :func:`run_command` reports in one line: a bad value, or a path the user gave that is
#: missing, of the wrong kind or not readable. Anything else is a bug and keeps its traceback.
USER_ERRORS: tuple[type[Exception], ...] = (UsageError, FileNotFoundError, FileExistsError, IsADirectoryError,
                                            NotADirectoryError, PermissionError)


#: Exit status when stdout's reader went away (``| head``): 128 + SIGPIPE, as a shell reports a
#: Unix tool stopped by SIGPIPE.
EXIT_BROKEN_PIPE = 141


def _integer(text: str, least: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be {what}, got {value}")
    return value


def _real(text: str, positive: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise argparse.ArgumentTypeError(f"must be a finite number {'> 0' if positive else '>= 0'}, got {text}")
    return value


def positive_int(text: str) -> int:
    """Argparse type: an integer >= 1 (a count, a number of steps or processes).

    Example:
        >>> positive_int("3")
        3
    """
    return _integer(text, 1, ">= 1")


def nonnegative_int(text: str) -> int:
    """Argparse type: an integer >= 0 (a seed).

    Example:
        >>> nonnegative_int("0")
        0
    """
    return _integer(text, 0, ">= 0")


def positive_float(text: str) -> float:
    """Argparse type: a finite number > 0 (a learning rate, an interval).

    Example:
        >>> positive_float("0.5")
        0.5
    """
    return _real(text, positive=True)


def nonnegative_float(text: str) -> float:
    """Argparse type: a finite number >= 0 (a timeout).

    Example:
        >>> nonnegative_float("0")
        0.0
    """
    return _real(text, positive=False)


def check_out_folder(path: str | os.PathLike[str], flag: str = "--out") -> Path:
    """Refuse, before any work, an output folder that cannot be written into or made.

    The folder may be missing, and so may the folders above it (writing makes them, as
    ``mkdir -p`` does); the nearest of them that exists must be a folder this process may create
    files in, and a ``manifest.json`` already in the folder must be writable. A command that
    works for minutes before it writes (``trainsignals datasets --suite real``) checks this first.

    Args:
        path: The folder the user gave.
        flag: The option that named it, for the message.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        UsageError: ``path`` is a file, a folder above it is a file or a broken link, or the
            nearest existing folder (``path`` itself, or the one its missing folders would be
            made in) or its ``manifest.json`` is not writable.

    Example:
        >>> check_out_folder(".").is_dir()
        True
    """
    folder = Path(path)
    shown = os.fspath(path)
    existing = folder
    while not os.path.lexists(existing) and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        what = "a file" if existing.exists() else "a broken link"
        if existing == folder:
            raise UsageError(f"{flag} {shown} is {what}; give the folder to write the suite into")
        raise UsageError(f"{flag} {shown}: {existing} is {what}, so the folder cannot be made in it")
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "into this folder" if existing == folder else f"into {existing}, where the folder would be made"
        raise UsageError(f"{flag} {shown}: no permission to write {where}")
    manifest = folder / "manifest.json"
    if existing == folder and manifest.is_file() and not os.access(manifest, os.W_OK):
        raise UsageError(f"{flag} {shown}: no permission to write {manifest}")
    return folder


def error_message(exc: Exception) -> str:
    """The one-line message of ``exc``: an ``OSError`` about a file as ``path: reason``.

    Example:
        >>> error_message(FileNotFoundError(2, "No such file or directory", "run.arrow"))
        'run.arrow: No such file or directory'
    """
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc)


def run_command(prog: str, func: Callable[[argparse.Namespace], Any], args: argparse.Namespace) -> int:
    """``func(args)`` as an exit status; a :data:`USER_ERRORS` error becomes ``prog: error: ...`` and 2.

    Args:
        prog: The command as the user typed it, e.g. ``"trainsignals bench"``.
        func: The command: parsed options -> exit status.
        args: The parsed options.

    Returns:
        ``func``'s exit status, or 2 (argparse's status for a usage error) after printing
        ``<prog>: error: <message>`` on stderr, or :data:`EXIT_BROKEN_PIPE` (141), silently,
        when stdout's reader went away (``| head``).
    """
    try:
        code = int(func(args))
        sys.stdout.flush()  # a reader that went away is found here, not at exit
        return code
    except USER_ERRORS as exc:
        sys.stderr.write(f"{prog}: error: {error_message(exc)}\n")
        return 2
    except BrokenPipeError:  # ``trainsignals replay runs/ | head -1``: stop quietly, as Unix tools do
        _drop_stdout()
        return EXIT_BROKEN_PIPE


def _drop_stdout() -> None:
    """Point stdout at the null device, so that the interpreter's last flush cannot fail again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real file descriptor (a test's capture)
        pass
