"""``python -m plait.cli.agent ...``: the ``plait agent`` command alone, with the same
options, without building the rest of the CLI. ``plait up`` starts one per machine:
on a box with few cores, twenty agents starting at once is mostly interpreter and
CLI start-up."""

import typer

from plait.cli.daemons import agent

if __name__ == "__main__":
    typer.run(agent)
