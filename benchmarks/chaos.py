"""Thin wrapper: `python benchmarks/chaos.py [flags]` == `plait bench chaos [flags]`."""

import sys

from plait.cli.main import app

if __name__ == "__main__":
    sys.exit(app(["bench", "chaos", *sys.argv[1:]]))
