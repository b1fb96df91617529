"""Thin wrapper: `python benchmarks/createcost.py [flags]` == `plait bench createcost [flags]`."""

import sys

from plait.cli.main import app

if __name__ == "__main__":
    sys.exit(app(["bench", "createcost", *sys.argv[1:]]))
