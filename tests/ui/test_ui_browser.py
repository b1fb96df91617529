"""The web UI in a real browser (Debian's Chromium) against a running `plait up` with
real agents and processes: log in with a token, see the web job, run a rolling
update, open its ops chart and find one update bar per task; an owner's token sees
nothing of another owner's. Liveness bounds only; nothing asserts speed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, expect

from plait.localprocs import kill_groups, processes_under
from plait.testing import free_port, wait_for

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
WEB = {"name": "web", "entitlement": "web", "task_count": 4, "command": "sh",
       "args": ["-c", "exec python3 -m http.server ${PLAIT_PORT:-8000} --bind 127.0.0.1"],
       "resources": {"cpu": 0.5, "memory_gb": 0.25},
       "update": {"max_unavailable": 1}, "health": {"http": "/", "interval_seconds": 0.5}}


#: a liveness bound on the region's start and rollouts; a server not answering yet is
#: "not yet"
BOUND, NOT_YET = 90.0, (httpx.TransportError,)


@pytest.fixture(scope="module")
def region(tmp_path_factory) -> Iterator[tuple[str, httpx.Client, str]]:
    """`plait up` with 4 machines, the admin token, and an owner "web-team" with the
    web job; "data-team" owns an entitlement with a job of its own."""
    tmp = tmp_path_factory.mktemp("up")
    data, port = tmp / "region", free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PLAIT_CONFIG": str(tmp / "config.yaml")}
    log = open(tmp / "up.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen([sys.executable, "-m", "plait.cli.main", "up", "--data-dir",
                             str(data), "--machines", "4", "--port", str(port),
                             "--heartbeat-timeout", "5"], env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: httpx.get(f"{url}/healthz").status_code == 200, BOUND, "plait up",
                 ignore=NOT_YET)
        token = (data / "admin-token").read_text().strip()
        admin = httpx.Client(base_url=url, timeout=30,
                             headers={"Authorization": f"Bearer {token}"})
        for ent, owner in (("web", "web-team"), ("batch", "data-team")):
            r = admin.post("/v1/entitlements", json={"name": ent, "owner": owner,
                                                     "quota": {"machines": 2}})
            assert r.status_code == 201, r.text
        assert admin.post("/v1/jobs", json=WEB).status_code == 201
        secret = {**WEB, "name": "nightly-etl", "entitlement": "batch", "task_count": 1}
        assert admin.post("/v1/jobs", json=secret).status_code == 201
        wait_for(lambda: admin.get("/v1/jobs/web").json()["serving"] == 4, BOUND, "web serves",
                 ignore=NOT_YET)
        yield url, admin, token
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        kill_groups(processes_under(data))  # whatever Ctrl-C left (none, normally)
        log.close()


def log_in(page: Page, url: str, token: str) -> None:
    page.goto(f"{url}/ui/jobs")
    expect(page).to_have_url(f"{url}/ui/login?next=/ui/jobs")
    page.fill("#token", token)
    page.click("#login")
    expect(page).to_have_url(f"{url}/ui/jobs")


def test_log_in_see_the_job_update_it_and_read_its_ops_chart(
        region, browser_page: Page, screenshot) -> None:
    url, admin, token = region
    page = browser_page
    log_in(page, url, token)
    row = page.locator('tr[data-job="web"]')
    expect(row).to_be_visible()
    expect(row).to_contain_text("web")

    # a rolling update (a new environment: every task is replaced, one at a time)
    r = admin.put("/v1/jobs/web", json={**WEB, "env": {"RELEASE": "2"}})
    assert r.status_code == 200, r.text
    wait_for(lambda: (j := admin.get("/v1/jobs/web").json())["version"] == 2
             and j["settled"] and j["updated"] == 4, BOUND, "the rolling update",
             ignore=NOT_YET)

    page.click('tr[data-job="web"] a:text("web")')
    expect(page.locator("#tasks tbody tr")).to_have_count(4)
    page.click("#gantt-link")
    bars = page.locator('.gantt rect[data-op="update"]')
    expect(bars).to_have_count(4)
    tasks = sorted(int(bars.nth(i).get_attribute("data-task") or -1) for i in range(4))
    assert tasks == [0, 1, 2, 3]  # one update bar per task
    for i in range(4):
        assert bars.nth(i).get_attribute("data-end")  # each update finished
    # details on hover
    bars.nth(0).hover()
    tip = page.locator("#tip")
    expect(tip).to_be_visible()
    expect(tip).to_contain_text("update to version 2")
    expect(tip).to_contain_text("decision:")
    shot = screenshot(page, "gantt")
    assert shot.exists() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # the region overview and the live event stream
    page.click('nav a:text("region")')
    expect(page.locator("#domains")).to_be_visible()
    page.click('nav a:text("events")')
    expect(page.locator("#events tbody tr").first).to_be_visible()
    admin.post("/v1/jobs/web/tasks/0/restart")
    expect(page.locator("#events tbody tr.new").first).to_be_visible(timeout=60_000)
    screenshot(page, "events")


def test_an_owner_sees_nothing_of_another_owner(region, browser_page: Page,
                                                 screenshot) -> None:
    url, admin, _ = region
    r = admin.post("/v1/tokens", json={"role": "owner", "name": "web-team"})
    assert r.status_code == 201, r.text
    page = browser_page
    log_in(page, url, r.json()["token"])
    expect(page.locator('tr[data-job="web"]')).to_be_visible()
    assert "nightly-etl" not in page.content()
    for path in ("/ui/", "/ui/entitlements", "/ui/events", "/ui/jobs/nightly-etl",
                 "/ui/jobs/nightly-etl/gantt"):
        page.goto(f"{url}{path}")
        text = page.content()
        assert "nightly-etl" not in text.replace("/ui/jobs/nightly-etl", "") or (
            "not found" in text), path
        assert "data-team" not in text and 'data-entitlement="batch"' not in text, path
    page.goto(f"{url}/ui/jobs/nightly-etl")
    expect(page.locator("#error")).to_contain_text("not found")
    page.goto(f"{url}/ui/machines")
    expect(page.locator("#error")).to_contain_text("not allowed")
    screenshot(page, "owner-machines")
