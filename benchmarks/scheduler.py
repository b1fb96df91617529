"""Thin wrapper: `python benchmarks/scheduler.py [flags]` == `plait bench scheduler [flags]`."""

import sys

from plait.cli.main import app

if __name__ == "__main__":
    sys.exit(app(["bench", "scheduler", *sys.argv[1:]]))
