"""Thin wrapper: `python benchmarks/api.py [flags]` == `plait bench api [flags]`."""

import sys

from plait.cli.main import app

if __name__ == "__main__":
    sys.exit(app(["bench", "api", *sys.argv[1:]]))
