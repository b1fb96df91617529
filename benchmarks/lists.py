"""Thin wrapper: `python benchmarks/lists.py [flags]` == `plait bench lists [flags]`."""

import sys

from plait.cli.main import app

if __name__ == "__main__":
    sys.exit(app(["bench", "lists", *sys.argv[1:]]))
