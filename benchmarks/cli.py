"""Thin wrapper: `python benchmarks/cli.py [flags]` == `plait bench cli [flags]`."""

import sys

from plait.cli.main import app

if __name__ == "__main__":
    sys.exit(app(["bench", "cli", *sys.argv[1:]]))
