"""Thin wrapper: `python benchmarks/taskcontrol.py [flags]` == `plait bench taskcontrol [flags]`."""

import sys

from plait.cli.main import app

if __name__ == "__main__":
    sys.exit(app(["bench", "taskcontrol", *sys.argv[1:]]))
