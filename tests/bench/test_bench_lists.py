"""The lists benchmark's figures (behaviour, not speed), small: jobs listed whole, by
pages and by `plait job list`, against a `plait serve` process."""

import json

from typer.testing import CliRunner

from plait.cli.main import app


def test_lists_prints_one_json_object_and_every_job_is_listed_once():
    res = CliRunner().invoke(app, ["bench", "lists", "--jobs", "12", "--machines", "12",
                                   "--clients", "3", "--repeat", "2", "--page", "5"])
    assert res.exit_code == 0, res.output
    figures = json.loads(res.stdout)
    assert figures["create_failures"] == 0
    for key in ("list_first_ms", "list_all_ms", "list_page_ms", "list_paged_all_ms",
                "cli_job_list_s"):
        assert figures[key] > 0, key
    assert figures["list_all_bytes"] > figures["list_page_bytes"] > 0
    assert figures["list_page_items"] == 5
    assert figures["list_paged_items"] == figures["list_paged_distinct"] == 12
    assert figures["cli_job_list_rows"] == 12 and figures["cli_job_list_exit"] == 0
