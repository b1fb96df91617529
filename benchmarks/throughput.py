"""Thin wrapper: `python benchmarks/throughput.py [flags]` == `plait bench throughput [flags]`."""

import sys

from plait.cli.main import app

if __name__ == "__main__":
    sys.exit(app(["bench", "throughput", *sys.argv[1:]]))
