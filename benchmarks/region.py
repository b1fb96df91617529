"""Thin wrapper: `python benchmarks/region.py [flags]` == `plait bench region [flags]`."""

import sys

from plait.cli.main import app

if __name__ == "__main__":
    sys.exit(app(["bench", "region", *sys.argv[1:]]))
