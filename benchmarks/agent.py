"""Thin wrapper: `python benchmarks/agent.py [flags]` == `plait bench agent [flags]`."""

import sys

from plait.cli.main import app

if __name__ == "__main__":
    sys.exit(app(["bench", "agent", *sys.argv[1:]]))
