"""The ``trainsignals`` command: demo, playground, bench, datasets, replay, plot, watch, convert."""

from __future__ import annotations

import argparse
import sys

from trainsignals.cli.options import check_out_folder, nonnegative_int, positive_int, run_command


def _demo(args: argparse.Namespace) -> int:
    from trainsignals.cli.demo import run_demo

    return run_demo(seed=args.seed, per_kind=args.per_kind,
                    output="json" if args.json else "markdown" if args.markdown else "table")


def _playground(args: argparse.Namespace) -> int:
    from trainsignals.cli.playground import run_playground

    return run_playground(args.lr, args.steps, args.sweep)


def _bench(args: argparse.Namespace) -> int:
    from trainsignals.eval import bench

    return int(bench.run_from_args(args))


def _datasets(args: argparse.Namespace) -> int:
    argv = ["build", "--seed", str(args.seed)]
    if args.out:  # refused now, not after the minutes a real suite trains for
        check_out_folder(args.out)
        argv += ["--out", args.out]
    if getattr(args, "suite", "synthetic") == "real":
        from trainsignals.curves import real_runs

        return int(real_runs.main([*argv, "--jobs", str(args.jobs)]) or 0)
    from trainsignals import curves

    return int(curves.main(argv) or 0)


def build_parser() -> argparse.ArgumentParser:
    """The ``trainsignals`` command's parser, every subcommand on it."""
    p = argparse.ArgumentParser(
        prog="trainsignals",
        description="Watch a training run's vital signs and say early, with reasons, what goes wrong.",
    )
    from trainsignals import __version__

    p.add_argument("--version", action="version", version=f"trainsignals {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="generate labeled failure curves, run the Monitor, show what it found")
    d.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the generated curves (default 0)")
    d.add_argument("--per-kind", type=positive_int, default=1, help="curves per failure kind (default 1)")
    fmt = d.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print the curves and totals as JSON")
    fmt.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    d.set_defaults(func=_demo)

    from trainsignals.cli.playground import add_playground_arguments

    g = sub.add_parser("playground", help="gradient descent on (w - 3)**2 with a live status line")
    add_playground_arguments(g)
    g.set_defaults(func=_playground)

    b = sub.add_parser("bench", help="score the detectors and the baselines on a labeled suite")
    from trainsignals.eval import bench

    bench.add_arguments(b)
    b.set_defaults(func=_bench)

    s = sub.add_parser("datasets", help="regenerate a committed labeled suite (synthetic: the same values once loaded)")
    s.add_argument("--seed", type=nonnegative_int, default=0, help="suite seed (default 0)")
    s.add_argument("--out", default=None, help="output folder (default: datasets/<suite>)")
    s.add_argument("--suite", choices=("synthetic", "real"), default="synthetic",
                   help="synthetic curves, or real PyTorch runs (needs torch and scikit-learn; 6-10 min on 2 cores)")
    s.add_argument("--jobs", type=positive_int, default=2, help="worker processes for --suite real (default 2)")
    s.set_defaults(func=_datasets)

    from trainsignals.cli.traces import add_trace_commands

    add_trace_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the ``trainsignals`` command; returns its exit status.

    A bad option value stops the parse (argparse: a usage line, ``error:`` and status 2); a
    missing or unusable path or value the command finds while it runs is reported in the
    same ``trainsignals <command>: error: <message>`` form, status 2, never as a traceback.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    return run_command(f"{parser.prog} {args.command}", args.func, args)


if __name__ == "__main__":
    sys.exit(main())
