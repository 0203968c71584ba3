"""``python -m trainsignals.curves``: build or inspect the synthetic suite.

A folder it may not write into is reported in one ``error:`` line, status 2, as ``trainsignals
datasets`` reports it; a bad option value is refused while the command line is parsed.
"""

import argparse

from trainsignals.cli.options import run_command
from trainsignals.curves import main

if __name__ == "__main__":
    raise SystemExit(run_command("python -m trainsignals.curves", lambda _args: main(), argparse.Namespace()))
