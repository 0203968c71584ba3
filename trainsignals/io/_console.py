"""The one place the commands build their rich consoles.

On a terminal a console is as wide as the terminal. Anywhere else — a CI log, ``| cat``, a file
— rich would assume 80 columns and squeeze tables until names read ``tr…``; there the console is
:data:`PIPE_WIDTH` columns wide (``TRAINSIGNALS_WIDTH`` overrides it, ``COLUMNS`` does not:
CI runners often set it to 80), colours are off and tables keep their natural width up to it.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["PIPE_WIDTH", "make_console", "output_width"]

#: Columns of a console that does not write to a terminal.
PIPE_WIDTH = 250


def output_width(stream: TextIO | None = None) -> int | None:
    """The width to give a console writing to ``stream`` (default stdout): None on a terminal
    (rich measures it), else ``TRAINSIGNALS_WIDTH`` or :data:`PIPE_WIDTH`.
    """
    stream = sys.stdout if stream is None else stream
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    if tty:
        return None
    raw = os.environ.get("TRAINSIGNALS_WIDTH", "")
    try:
        width = int(raw)
    except ValueError:
        width = 0
    return width if width >= 40 else PIPE_WIDTH


def make_console(stderr: bool = False) -> Console:
    """A rich console for a command's output (stdout) or messages (``stderr=True``).

    Args:
        stderr: Write to standard error.

    Returns:
        The console: terminal width on a terminal, :func:`output_width` columns elsewhere;
        no syntax highlighting of numbers and paths (tables carry their own styles). A reader
        that goes away (``| head``) raises ``BrokenPipeError``, which
        :func:`trainsignals.cli.options.run_command` turns into a quiet exit, status 141.
    """
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            # rich would exit with status 1 here; the command's runner stops quietly with 141 (as
            # a Unix tool stopped by SIGPIPE), as for the plain print()s
            self.quiet = True
            raise BrokenPipeError(32, "the reader of the output went away")

    width = output_width(sys.stderr if stderr else sys.stdout)
    return _Console(stderr=stderr, highlight=False, width=width)
