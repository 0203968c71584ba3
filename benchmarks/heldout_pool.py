"""The held-out figure reported first: the committed held-out suite pooled with fresh held-out draws.

usage: python benchmarks/heldout_pool.py --seeds 5059-5083 --dir DIR [--jobs 2] [--build-only] [-- BENCH OPTIONS]

Each seed's draw is built into ``DIR/<seed>`` with the real-run builder (``python -m
trainsignals.curves.real_runs build --heldout --seed S --jobs J --out DIR/<seed>``; about two
minutes a draw on two cores), unless that folder already holds a suite; then every draw is
scored with the held-out suite as one pool: ``trainsignals bench --suite heldout --suite
DIR/<seed> ... --no-baselines --target-window --rules`` (options after ``--`` replace those
three). Nothing here chooses a threshold: the draws are regenerated from seeds no rule was
tuned on, so the figure says how the defaults do on runs they never saw.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path


def seed_list(text: str) -> list[int]:
    """Seeds from ``"5059-5083"``, ``"5059,5061"`` or a mix (``"5059-5061,5070"``), in order, once each.

    >>> seed_list("5059-5061,5070,5060")
    [5059, 5060, 5061, 5070]
    """
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()) or (hi and int(hi) < int(lo)):
            raise argparse.ArgumentTypeError(f"seeds must look like 5059-5083 or 5059,5061, got {part!r}")
        out += [s for s in range(int(lo), int(hi or lo) + 1) if s not in out]
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else None
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=seed_list, required=True, help="draw seeds, e.g. 5059-5083")
    ap.add_argument("--dir", type=Path, required=True, help="where the draws are (or are built)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes of the builder (default 2)")
    ap.add_argument("--build-only", action="store_true", help="build the missing draws; score nothing")
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    for seed in args.seeds:
        out = args.dir / str(seed)
        if (out / "manifest.json").is_file():
            continue
        print(f"building draw {seed} into {out}", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "trainsignals.curves.real_runs", "build", "--heldout", "--seed",
                        str(seed), "--jobs", str(args.jobs), "--out", str(out)], check=True)
    if args.build_only:
        return 0
    suites = [arg for seed in args.seeds for arg in ("--suite", str(args.dir / str(seed)))]
    options = extra if extra is not None else ["--no-baselines", "--target-window", "--rules"]
    return subprocess.run([sys.executable, "-m", "trainsignals.eval.bench", "--suite", "heldout", *suites, *options],
                          check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
