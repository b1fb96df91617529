"""Elastic loans through the CLI against a live API (simulated agents): a lender and
an elastic entitlement from a file, the borrower's machines listed with
``plait machine list --loaned``, its terms shown, and a revoke when the lender grows:
its machines come back, in the event log and the metrics."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
from test_cli_client import plait, write

from plait.testing import wait_for

ENTITLEMENTS = """\
name: web
owner: alice
quota: {machines: 24}
lends: true
---
name: batch
owner: bob
quota: {machines: 24}
elastic: {min_notice_seconds: 2, max_reclaim_fraction_per_minute: 1.0}
"""


def job(name: str, ent: str, tasks: int) -> str:
    return (f"name: {name}\nentitlement: {ent}\ntask_count: {tasks}\ncommand: serve\n"
            "resources: {cpu: 16, memory_gb: 8}\n")


def loaned() -> list[dict]:
    return json.loads(plait("machine", "list", "--loaned", "--limit", "100", "-o",
                            "json").stdout)["machines"]


def test_loans_are_listed_with_their_terms_and_revoked_when_the_lender_grows(plane,
                                                                            tmp_path: Path):
    made = plait("entitlement", "create", str(write(tmp_path, "e.yaml", ENTITLEMENTS)))
    assert "lends" in made.stdout and "elastic:" in made.stdout  # (the loans column)
    plait("job", "deploy", str(write(tmp_path, "w.yaml", job("w", "web", 2))))
    # (more tasks than the 22 machines lendable; 24 at most: its quota could never hold
    # more of these machine-sized tasks, and such a job is refused)
    plait("job", "deploy", str(write(tmp_path, "b.yaml", job("b", "batch", 24))))
    wait_for(lambda: len(loaned()) == 22)
    assert {m["loan"]["borrower"] for m in loaned()} == {"batch"}
    assert all(m["entitlement"] == "batch" and not m["loan"]["revoking"] for m in loaned())
    batch = json.loads(plait("entitlement", "show", "batch", "-o", "json").stdout)
    assert batch["elastic"] == {"min_notice_seconds": 2.0,
                                "max_reclaim_fraction_per_minute": 1.0}
    wait_for(lambda: json.loads(plait("entitlement", "show", "batch", "-o", "json").stdout)
               ["loans"] == {"lendable": 22, "on_loan": 22, "revoking": 0})
    # the lender needs 6 more machines: the free pool is empty, so loans come back
    plait("job", "resize", "w", "8")
    wait_for(lambda: json.loads(plait("job", "show", "w", "-o", "json").stdout)
               .get("serving") == 8)
    wait_for(lambda: len(loaned()) == 16)
    lines = plait("events", "--kind", "loan_returned", "-o", "json").stdout.splitlines()
    returned = [e for e in map(json.loads, filter(None, lines)) if e["kind"] == "loan_returned"]
    assert len(returned) >= 6 and all("past its deadline" not in e["message"]
                                      for e in returned)
    metrics = httpx.get(f"{plane.url}/metrics", headers={
        "Authorization": f"Bearer {plane.admin_token}"}).text
    revokes = re.search(r'plait_loan_revokes_total\{when="all"\} (\S+)', metrics)
    assert revokes is not None and float(revokes.group(1)) >= 6
    assert 'plait_loan_revokes_total{when="late"} 0.0' in metrics
    assert 'plait_loaned_machines{state="lent"} 16.0' in metrics
