"""The spec reference is generated from the models, says something about every field,
and docs/spec-reference.md is it."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from plait.cli.main import app
from plait.errors import NotFound
from plait.model import reference

DOC = Path(__file__).resolve().parents[2] / "docs" / "spec-reference.md"


def every_field():
    todo = list(reference.ROOTS.items())
    while todo:
        path, model = todo.pop()
        for f in reference.fields(model, path):
            yield f
            if f.model is not None:
                todo.append((f.path, f.model))


def test_every_field_has_a_type_and_a_meaning():
    found = list(every_field())
    assert len(found) > 50
    assert [f.path for f in found if not f.meaning or not f.kind] == []


def test_the_docs_page_is_the_generated_reference():
    assert DOC.read_text() == reference.markdown(), (
        "regenerate: plait explain --markdown > docs/spec-reference.md")


def test_a_field_is_explained_with_its_default_and_bounds():
    about, [field] = reference.explain("job.update.halt_after_failures")
    assert field.default == "3" and field.bounds == ">= 1, <= 100000"
    assert "halts" in field.meaning
    about, fields = reference.explain("job.policy.requirements")
    assert "Hard requirements" in about
    assert {f.path for f in fields} >= {"job.policy.requirements.dc",
                                        "job.policy.requirements.machine_types"}
    _, [count] = reference.explain("job.task_count")
    assert count.default == "" and count.bounds == ">= 0, <= 100000"  # required
    _, [args] = reference.explain("job.args")
    assert "each at most 65,536 characters" in args.bounds
    with pytest.raises(NotFound, match=r"^job has no field 'nope' \(its fields: name, "):
        reference.explain("job.nope")
    with pytest.raises(NotFound, match=r"^job\.update has no field 'nope'"):
        reference.explain("job.update.nope")
    with pytest.raises(NotFound, match="pod"):
        reference.explain("pod")


def test_plait_explain():
    runner = CliRunner()
    res = runner.invoke(app, ["explain", "job.update.max_unavailable"])
    assert res.exit_code == 0 and "default: 1" in res.output and "10%" in res.output
    res = runner.invoke(app, ["explain", "entitlement"])
    assert res.exit_code == 0 and "quota  <object>  required" in res.output
    res = runner.invoke(app, ["explain", "job.update.nope"])
    assert res.exit_code == 2 and "max_unavailable" in res.output
