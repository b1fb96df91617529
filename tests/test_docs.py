"""The docs a newcomer reads stay true: the README's Quick start names Makefile
targets, every plait command the README and the guide show exists with the options
they give it, every benchmark has a row in the README's figures and a section in
docs/benchmarks.md, every design decision has a row in the index of
docs/decisions.md, and no link leaves the repository."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
import typer

from plait.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
DECISIONS = DOCS / "decisions.md"


def section(text: str, heading: str) -> str:
    """The text under ``## heading``, up to the next ``## ``."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def shell_blocks(text: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", text, re.S)


def plait_commands(text: str) -> list[list[str]]:
    """Each ``.venv/bin/plait ...`` line of the text's sh blocks (continuation lines
    joined), as its words after ``plait``, without the comment or a trailing ``&``."""
    found = []
    for block in shell_blocks(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip()
            if line.startswith(".venv/bin/plait "):
                words = shlex.split(line, comments=True)[1:]
                found.append([w for w in words if w != "&"])
    return found


def test_the_quick_start_is_two_make_targets_of_the_makefile() -> None:
    commands = [line.split("#")[0].split()
                for block in shell_blocks(section(README.read_text(), "Quick start"))
                for line in block.splitlines() if line.strip()]
    assert [c[0] for c in commands] == ["make", "make"], commands
    makefile = (ROOT / "Makefile").read_text()
    for _, target in commands:
        assert re.search(rf"^{re.escape(target)}:", makefile, re.M), target


CLI = typer.main.get_command(app)


@pytest.mark.parametrize("doc", [README, DOCS / "guide.md"], ids=lambda p: p.name)
def test_every_plait_command_shown_exists_with_its_options(doc: Path) -> None:
    commands = plait_commands(doc.read_text())
    assert len(commands) >= 12
    for words in commands:
        command: click.Command = CLI
        ctx = click.Context(CLI)
        rest = list(words)
        while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
            sub = command.get_command(ctx, rest[0])
            assert sub is not None, f"{doc.name}: plait {' '.join(words)}: no command {rest[0]}"
            command, rest = sub, rest[1:]
        assert not isinstance(command, click.Group), f"{doc.name}: plait {' '.join(words)}"
        options = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
        for word in rest:
            if word.startswith("--"):
                name = word.split("=")[0]
                assert name in options, f"{doc.name}: plait {' '.join(words)}: no {name}"


def test_every_benchmark_has_a_figures_row_and_a_history_section() -> None:
    bench = CLI.get_command(click.Context(CLI), "bench")
    assert isinstance(bench, click.Group)
    names = bench.list_commands(click.Context(bench))
    assert "allocator" in names and "throughput" in names
    figures = section(README.read_text(), "Figures")
    history = (DOCS / "benchmarks.md").read_text()
    for name in names:
        assert re.search(rf"^\| `plait bench {name}\b", figures, re.M), name
        assert re.search(rf"^### `plait bench {name}\b", history, re.M), name
    # the README's rows are one line each: the history lives in docs/benchmarks.md
    assert max(len(line) for line in figures.splitlines()) < 400


INDEX_ROW = re.compile(r"^\| (\d+) \| (.+?) \| (current|superseded by (\d+)) \| ([\d, ]*) \|$")


def test_every_decision_has_a_row_in_the_index_with_its_status() -> None:
    text = DECISIONS.read_text()
    headings = {int(n): title for n, title in re.findall(r"^## (\d+)\. (.+)$", text, re.M)}
    index = section(text, "Index")
    rows = {}
    for line in index.splitlines():
        if line.startswith("| ") and line[2].isdigit():
            match = INDEX_ROW.match(line)
            assert match, f"an index row that is not number | title | status | changes: {line}"
            number, title, _status, by, changed = match.groups()
            rows[int(number)] = title
            for later in ([by] if by else []) + [c for c in changed.split(", ") if c]:
                assert int(later) in headings and int(later) > int(number), line
    assert rows == headings


@pytest.mark.parametrize("doc", [
    README, *sorted(DOCS.glob("*.md")),
], ids=lambda p: p.name)
def test_no_link_leaves_the_repository_and_every_link_resolves(doc: Path) -> None:
    text = doc.read_text()
    # a link is relative to its page; a path in backquotes, to the page or the root
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    paths = [t for t in re.findall(r"`([^`\s]+\.md)`", text) if "/" in t]
    for target in links + paths:
        if re.match(r"https?://(127\.0\.0\.1|localhost)[:/]", target) or target.startswith("#"):
            continue
        assert "://" not in target, f"{doc.name}: {target}"
        bases = [doc.parent] if target in links else [doc.parent, ROOT]
        for base in bases:
            path = (base / target.split("#")[0]).resolve()
            assert path.is_relative_to(ROOT), f"{doc.name}: {target} is outside the repository"
        assert any((base / target.split("#")[0]).exists() for base in bases), \
            f"{doc.name}: {target} does not exist"
