"""Thin wrapper: `python benchmarks/versions.py [flags]` == `plait bench versions [flags]`."""

import sys

from plait.cli.main import app

if __name__ == "__main__":
    sys.exit(app(["bench", "versions", *sys.argv[1:]]))
