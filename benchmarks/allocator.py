"""Thin wrapper: `python benchmarks/allocator.py [flags]` == `plait bench allocator [flags]`."""

import sys

from plait.cli.main import app

if __name__ == "__main__":
    sys.exit(app(["bench", "allocator", *sys.argv[1:]]))
