"""``python -m trainsignals.curves``: build or inspect the synthetic suite."""

from trainsignals.curves import main

if __name__ == "__main__":
    raise SystemExit(main())
