"""Thin wrapper: `python benchmarks/failover.py [flags]` == `plait bench failover [flags]`."""

import sys

from plait.cli.main import app

if __name__ == "__main__":
    sys.exit(app(["bench", "failover", *sys.argv[1:]]))
