"""Thin wrapper: `python benchmarks/recovery.py [flags]` == `plait bench recovery [flags]`."""

import sys

from plait.cli.main import app

if __name__ == "__main__":
    sys.exit(app(["bench", "recovery", *sys.argv[1:]]))
