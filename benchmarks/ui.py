"""Thin wrapper: `python benchmarks/ui.py [flags]` == `plait bench ui [flags]`."""

import sys

from plait.cli.main import app

if __name__ == "__main__":
    sys.exit(app(["bench", "ui", *sys.argv[1:]]))
