"""Thin wrapper: `python benchmarks/observability.py [flags]` ==
`plait bench observability [flags]`."""

import sys

from plait.cli.main import app

if __name__ == "__main__":
    sys.exit(app(["bench", "observability", *sys.argv[1:]]))
