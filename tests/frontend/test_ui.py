"""The web UI over HTTP (the browser tests are in tests/ui): log in with a token, every
page answers, an owner sees nothing of another owner's, a job's ops chart has a bar
per task operation, the live stream follows new events; bad input is refused."""

from __future__ import annotations

import http.client
import re
from pathlib import Path

import httpx
import pytest
from livecp import Live, start_behind_front_end, start_live, stop_live, wait_for

JOB = {"name": "web", "entitlement": "e", "task_count": 3, "command": "serve",
       "resources": {"cpu": 1, "memory_gb": 1}, "update": {"max_unavailable": 1}}


@pytest.fixture(params=["direct", "front end"])
def region(request, tmp_path) -> Live:
    api = (start_live(tmp_path / "data") if request.param == "direct"
           else start_behind_front_end(tmp_path))
    yield api
    stop_live(api)


def browser(live: Live, token: str | None) -> httpx.Client:
    """A client that logs in to the UI as a browser does (a form, a cookie)."""
    c = httpx.Client(base_url=live.url, timeout=30, follow_redirects=False)
    if token is not None:
        r = c.post("/ui/login", data={"token": token, "next": "/ui/jobs"})
        assert r.status_code == 303, r.text
        assert r.headers["location"] == "/ui/jobs"
        cookie = r.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/ui" in cookie
    return c


def setup_two_owners(api: httpx.Client, live: Live) -> tuple[str, str]:
    tokens = []
    for owner, ent, job in (("alice", "e", "web"), ("bob", "bobs", "secretjob")):
        r = api.post("/v1/tokens", json={"role": "owner", "name": owner})
        tokens.append(r.json()["token"])
        assert api.post("/v1/entitlements", json={
            "name": ent, "owner": owner, "quota": {"machines": 4}}).status_code == 201
        assert live.client(tokens[-1]).post(
            "/v1/jobs", json={**JOB, "name": job, "entitlement": ent}).status_code == 201
    return tokens[0], tokens[1]


def test_pages_ops_chart_and_owner_isolation(region: Live) -> None:
    api = region.admin
    alice, _bob = setup_two_owners(api, region)
    wait_for(lambda: api.get("/v1/jobs/web").json()["settled"])
    wait_for(lambda: api.get("/v1/jobs/secretjob").json()["settled"])

    admin = browser(region, region.admin_token)
    for page in ("/ui", "/ui/", "/ui/entitlements", "/ui/jobs", "/ui/jobs/web",
                 "/ui/jobs/web/gantt", "/ui/machines", "/ui/events", "/ui/static/ui.css",
                 "/ui/static/ui.js"):
        r = admin.get(page)
        assert r.status_code == 200, (page, r.text[:300])
    home = admin.get("/ui/").text
    assert 'id="domains"' in home and "secretjob" not in home  # only the unavailable
    rows = re.findall(r"<tr><td>(dc\d+)</td><td>(msb\d+)</td><td>(\d+)</td>", home)
    assert len(rows) == 4 and sum(int(n) for *_, n in rows) == 24  # 2 DCs x 2 MSBs
    assert "(free pool)" in home
    assert 'id="n-jobs">2<' in home
    machines = admin.get("/ui/machines").text
    assert len(re.findall(r'<tr data-machine="', machines)) == 24
    r = admin.get("/ui/jobs/web")
    assert r.headers["content-security-policy"].startswith("default-src 'self'")
    assert len(re.findall(r'<tr data-task="', r.text)) == 3
    assert re.search(r'<table id="by-dc">.*?<td>dc\d+</td>', r.text, re.S)

    # a rolling update: the chart gets one update bar per task, and says who asked
    spec = {**JOB, "env": {"V": "2"}}
    owner_api = region.client(alice)
    put = owner_api.put("/v1/jobs/web", json=spec)
    assert put.status_code == 200
    request = put.headers["x-request-id"]
    wait_for(lambda: api.get("/v1/jobs/web").json()["settled"]
             and api.get("/v1/jobs/web").json()["version"] == 2)
    wait_for(lambda: len(re.findall(r'data-op="update"',
                                    admin.get("/ui/jobs/web/gantt").text)) == 3)
    chart = admin.get("/ui/jobs/web/gantt").text
    tasks = sorted(int(t) for t in re.findall(r'data-task="(\d+)" data-op="update"', chart))
    assert tasks == [0, 1, 2]
    assert len(re.findall(r'data-op="start"', chart)) == 3
    assert "update to version 2" in chart
    assert "owner:alice" in chart  # the job event "updated" names who asked
    updated = api.get("/v1/events", params={"job": "web", "kind": "updated"}).json()
    assert [e["actor"] for e in updated["events"]] == ["owner:alice"]
    # the events it caused carry its request id: the job event and each task's update
    assert updated["events"][0]["request"] == request
    caused = api.get("/v1/events", params={"request_id": request, "limit": 1000}).json()
    kinds = sorted(e["kind"] for e in caused["events"])
    assert kinds.count("op_started") == 3 and "updated" in kinds and "rollout_done" in kinds

    # alice sees her entitlement and job, and nothing of bob's
    mine = browser(region, alice)
    for page, shown in (("/ui/", 'data-entitlement="e"'), ("/ui/entitlements",
                        'data-entitlement="e"'), ("/ui/jobs", 'data-job="web"'),
                        ("/ui/events", '<a href="/ui/jobs/web">')):
        text = mine.get(page).text
        assert shown in text and "secretjob" not in text and "bobs" not in text, page
    for page in ("/ui/jobs/secretjob", "/ui/jobs/secretjob/gantt"):
        theirs, missing = mine.get(page), mine.get(page.replace("secretjob", "nosuchjob"))
        assert theirs.status_code == missing.status_code == 404
        assert theirs.text.replace("secretjob", "X") == missing.text.replace("nosuchjob", "X")
    assert mine.get("/ui/machines").status_code == 403  # machines are for admins
    assert 'id="domains"' not in mine.get("/ui/").text
    live_page = mine.get("/ui/events.json", params={"after": 0}).json()
    assert live_page["events"] and all(e["job"] in (None, "web") for e in live_page["events"])
    assert not any("secretjob" in str(e) or "bobs" in str(e) for e in live_page["events"])


def test_the_machine_summary_counts_by_fault_domain_state_and_entitlement(
        live: Live) -> None:
    api = live.admin
    assert api.post("/v1/entitlements", json={"name": "e", "owner": "alice",
                                               "quota": {"machines": 2}}).status_code == 201
    assert api.post("/v1/jobs", json={**JOB, "task_count": 2, "resources": {
        "cpu": 16, "memory_gb": 1}}).status_code == 201
    wait_for(lambda: api.get("/v1/jobs/web").json()["settled"])
    used = {t["machine"] for t in api.get("/v1/jobs/web/tasks").json()["tasks"]}
    victim = next(f"m{i:07d}" for i in range(24) if f"m{i:07d}" not in used)
    assert api.post(f"/v1/machines/{victim}/fail").status_code == 200
    wait_for(lambda: any(c["state"] == "failed" for c in api.get(
        "/v1/machines/summary").json()["cells"]))
    summary = api.get("/v1/machines/summary").json()
    assert summary["total"] == 24 and sum(c["machines"] for c in summary["cells"]) == 24
    failed = [c for c in summary["cells"] if c["state"] == "failed"]
    assert [c["machines"] for c in failed] == [1]
    one = api.get(f"/v1/machines/{victim}").json()["fault_domain"]
    assert (failed[0]["dc"], failed[0]["msb"]) == (one["dc"], one["msb"])
    entitled = sum(c["machines"] for c in summary["cells"] if c["entitlement"] == "e")
    assert entitled == len(used) == 2
    assert live.owner("alice").get("/v1/machines/summary").status_code == 403


def test_the_live_stream_gives_what_is_new_after_a_cursor(live: Live) -> None:
    ui = browser(live, live.admin_token)
    first = ui.get("/ui/events.json", params={"after": 0}).json()
    cursor = first["cursor"]
    assert live.admin.post("/v1/entitlements", json={
        "name": "later", "owner": "x", "quota": {"machines": 1}}).status_code == 201
    wait_for(lambda: any(e["kind"] == "entitlement_created" for e in ui.get(
        "/ui/events.json", params={"after": cursor}).json()["events"]))
    page = ui.get("/ui/events.json", params={"after": cursor}).json()
    made = next(e for e in page["events"] if e["kind"] == "entitlement_created")
    assert made["actor"].startswith("admin:")
    assert page["cursor"] > cursor
    assert httpx.get(f"{live.url}/ui/events.json").status_code == 401  # no cookie


def test_logging_in_refuses_bad_tokens_and_bad_input(live: Live) -> None:
    c = browser(live, None)
    r = c.get("/ui/jobs")
    assert r.status_code == 303 and r.headers["location"] == "/ui/login?next=/ui/jobs"
    r = c.post("/ui/login", data={"token": "not-a-token"})
    assert r.status_code == 401 and "not valid" in r.text and "set-cookie" not in r.headers
    r = c.post("/ui/login", data={"token": ""})
    assert r.status_code == 401 and "paste a token" in r.text
    r = c.post("/ui/login", content=b"token=" + b"x" * 10_000,
               headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 413 and "too large" in r.text
    join = live.admin.post("/v1/tokens", json={"role": "join", "name": "agents"}).json()
    r = c.post("/ui/login", data={"token": join["token"]})
    assert r.status_code == 401 and "admin or owner tokens only" in r.text
    # after logging in, only a page of the UI is a destination (never another site)
    for target in ("https://evil.example/", "//evil.example/ui", "/v1/tokens"):
        r = c.post("/ui/login", data={"token": live.admin_token, "next": target})
        assert r.status_code == 303 and r.headers["location"] == "/ui/", target
    # a revoked token's cookie sends the browser back to the login page
    r = live.admin.post("/v1/tokens", json={"role": "owner", "name": "gone"}).json()
    ui = browser(live, r["token"])
    assert live.admin.delete(f"/v1/tokens/{r['id']}").status_code == 200
    wait_for(lambda: ui.get("/ui/jobs").status_code == 303)
    r = c.post("/ui/logout")
    assert r.status_code == 303 and 'plait_ui_session=""' in r.headers["set-cookie"]
    # a token with a pasted zero-width space or quotes, or bytes that are no text
    for token in (live.admin_token + "\u200b", f"\u2018{live.admin_token}\u2019"):
        r = c.post("/ui/login", data={"token": token})
        assert r.status_code == 401 and "not valid" in r.text, token
    r = c.post("/ui/login", content=b"token=%ff",
               headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 401 and "not valid" in r.text
    r = httpx.get(f"{live.url}/ui/", headers={"cookie": "plait_ui_session=\u00e9".encode()})
    assert r.status_code == 303


def test_a_session_is_no_api_credential_and_ends_at_logout(live: Live) -> None:
    ui = browser(live, live.admin_token)
    sid = ui.cookies["plait_ui_session"]
    assert live.admin_token not in sid and sid not in live.admin_token
    # the cookie's value is no token of the API
    assert httpx.get(f"{live.url}/v1/jobs", headers={
        "Authorization": f"Bearer {sid}"}).status_code == 401
    assert ui.get("/ui/jobs").status_code == 200
    assert ui.post("/ui/logout").status_code == 303
    # the session ended on the server: the same cookie, sent again, logs in no one
    again = httpx.Client(base_url=live.url, cookies={"plait_ui_session": sid})
    r = again.get("/ui/jobs")
    assert r.status_code == 303 and r.headers["location"].startswith("/ui/login")
    assert again.get("/ui/events.json").status_code == 401


def test_a_login_or_logout_from_another_site_is_refused(live: Live) -> None:
    c = browser(live, None)
    host = httpx.URL(live.url).netloc.decode()
    for origin in ("http://evil.example", "null"):
        r = c.post("/ui/login", data={"token": live.admin_token, "next": "/ui/jobs"},
                   headers={"origin": origin})
        assert r.status_code == 403 and "set-cookie" not in r.headers, origin
        assert "this site" in r.text
    r = c.post("/ui/login", data={"token": live.admin_token},
               headers={"referer": "http://evil.example/login.html"})
    assert r.status_code == 403 and "set-cookie" not in r.headers
    # the site's own login page may
    r = c.post("/ui/login", data={"token": live.admin_token, "next": "/ui/jobs"},
               headers={"origin": f"http://{host}", "referer": f"http://{host}/ui/login"})
    assert r.status_code == 303 and r.headers["location"] == "/ui/jobs"
    # a logout posted by another site ends nothing
    r = c.post("/ui/logout", headers={"origin": "http://evil.example"})
    assert r.status_code == 403 and "set-cookie" not in r.headers
    assert c.get("/ui/jobs").status_code == 200


def test_a_revoked_sessions_live_stream_says_log_in_again(live: Live) -> None:
    made = live.admin.post("/v1/tokens", json={"role": "owner", "name": "tab"}).json()
    ui = browser(live, made["token"])
    assert ui.get("/ui/events.json").status_code == 200
    assert live.admin.delete(f"/v1/tokens/{made['id']}").status_code == 200
    wait_for(lambda: ui.get("/ui/events.json").status_code == 401)
    assert ui.get("/ui/events.json").json()["login"] == "/ui/login"
    # (the script goes to the login page on a 401, and polls no more)
    script = ui.get("/ui/static/ui.js").text
    assert "r.status === 401" in script and "location.assign" in script


def test_page_names_and_answers_outside_the_pages(live: Live) -> None:
    ui = browser(live, live.admin_token)
    # names no object may have, or another route's, are no page (not a 500, not a
    # page of an empty job)
    target = httpx.URL(live.url)
    for page in ("/ui/machines/summary", "/ui/machines/.", "/ui/jobs/./gantt",
                 "/ui/jobs/..", "/ui/jobs/Web!", "/ui/machines/-x"):
        # (http.client sends the path as given, dot segments and all, as curl's
        # --path-as-is does)
        conn = http.client.HTTPConnection(target.host, target.port, timeout=30)
        conn.request("GET", page, headers={
            "cookie": f"plait_ui_session={ui.cookies['plait_ui_session']}"})
        r = conn.getresponse()
        body = r.read().decode()
        conn.close()
        assert r.status == 404 and "not found" in body, (page, r.status)
    # a login keeps the query of the page it interrupts
    r = httpx.get(f"{live.url}/ui/events?job=web", follow_redirects=False)
    assert r.status_code == 303
    assert r.headers["location"] == "/ui/login?next=/ui/events%3Fjob%3Dweb"
    login = httpx.get(f"{live.url}{r.headers['location']}").text
    assert 'value="/ui/events?job=web"' in login
    # every answer of the UI carries its security headers, files and 404s too
    for page in ("/ui/static/ui.js", "/ui/nowhere"):
        r = ui.get(page)
        assert r.headers["x-content-type-options"] == "nosniff", page
        assert "frame-ancestors 'none'" in r.headers["content-security-policy"], page
    r = ui.get("/ui/logout")
    assert r.status_code == 405 and r.headers["x-content-type-options"] == "nosniff"


def test_the_machines_page_pages(live: Live, monkeypatch) -> None:
    import plait.ui.app

    monkeypatch.setattr(plait.ui.app, "MACHINES_PAGE", 10)
    ui = browser(live, live.admin_token)
    first = ui.get("/ui/machines", params={"state": "healthy"}).text
    assert len(re.findall(r'<tr data-machine="', first)) == 10
    assert "1-10 shown of 24" in first and 'id="previous"' not in first
    link = re.search(r'<a id="next" href="([^"]+)"', first).group(1).replace("&amp;", "&")
    assert link == "/ui/machines?offset=10&state=healthy"
    last = ui.get("/ui/machines", params={"offset": 20, "state": "healthy"}).text
    assert len(re.findall(r'<tr data-machine="', last)) == 4
    assert "21-24 shown of 24" in last and 'id="next"' not in last
    assert re.search(r'<a id="previous" href="/ui/machines\?offset=10&amp;state=healthy"', last)


def test_page_paths_are_not_metric_labels(live: Live) -> None:
    ui = browser(live, live.admin_token)
    for page in ("/ui/jobs/a", "/ui/jobs/b", "/ui/machines/m0000001"):
        ui.get(page)
    text = live.admin.get("/metrics").text
    assert 'route="/ui/jobs/{name}"' in text and "/ui/jobs/a\"" not in text


def test_the_templates_and_static_files_ship_with_the_package() -> None:
    import plait.ui

    here = Path(plait.ui.__file__).parent
    assert (here / "static" / "ui.js").exists() and (here / "templates" / "gantt.html").exists()
    assert "//cdn" not in (here / "templates" / "base.html").read_text()


def test_loans_show_on_the_entitlements_and_machines_pages(live: Live) -> None:
    api = live.admin
    for ent in ({"name": "web", "owner": "alice", "quota": {"machines": 24}, "lends": True},
                {"name": "batch", "owner": "bob", "quota": {"machines": 24},
                 "elastic": {"min_notice_seconds": 30,
                             "max_reclaim_fraction_per_minute": 0.25}}):
        assert api.post("/v1/entitlements", json=ent).status_code == 201
    assert api.post("/v1/jobs", json={**JOB, "name": "b", "entitlement": "batch",
                                      "task_count": 2}).status_code == 201
    wait_for(lambda: api.get("/v1/machines", params={"loaned": "true"}).json()["total"] >= 1)
    admin = browser(live, live.admin_token)
    entitlements = admin.get("/ui/entitlements").text
    assert "lends unused machines" in entitlements
    assert "elastic: 30.0s notice, at most 25.0%/min reclaimed" in entitlements
    assert "(on loan)" in admin.get("/ui/machines").text


def test_sessions_end_at_their_lifetime_and_the_oldest_goes_first() -> None:
    from plait.ui.app import Sessions

    now = [1000.0]
    sessions = Sessions(lifetime=60, most=2, clock=lambda: now[0])
    a = sessions.open("tok-a")
    assert sessions.token(a) == "tok-a" and sessions.token("nope") is None
    now[0] += 59
    b = sessions.open("tok-b")
    assert sessions.token(a) == "tok-a"
    now[0] += 1  # a's lifetime is over
    assert sessions.token(a) is None and sessions.token(b) == "tok-b"
    c, d = sessions.open("tok-c"), sessions.open("tok-d")  # at most two: b goes
    assert sessions.token(b) is None and len(sessions) == 2
    sessions.close(c)
    assert sessions.token(c) is None and sessions.token(d) == "tok-d"


def test_sessions_are_bounded_per_owner_and_apart_for_admins() -> None:
    from plait.ui.app import Sessions

    now = [0.0]
    sessions = Sessions(lifetime=60, most=4, clock=lambda: now[0], per_owner=3, admins=2)
    admin = sessions.open("tok-admin", None)
    alice = sessions.open("tok-alice", "alice")
    bobs = [sessions.open(f"tok-bob{k}", "bob") for k in range(10)]
    # bob's logins end only his own oldest sessions
    assert [sessions.token(s) for s in bobs[:7]] == [None] * 7
    assert all(sessions.token(s) is not None for s in bobs[7:])
    assert sessions.token(alice) == "tok-alice" and sessions.token(admin) == "tok-admin"
    # the owners' bound in all: the owner holding the most loses its oldest, never an
    # admin's session, and never alice's one while another holds more
    carol = sessions.open("tok-carol", "carol")
    assert sessions.token(bobs[7]) is None and sessions.token(bobs[8]) is not None
    assert sessions.token(alice) and sessions.token(carol) and sessions.token(admin)
    # admins' sessions have their own bound
    a2, a3 = sessions.open("tok-a2", None), sessions.open("tok-a3", None)
    assert sessions.token(admin) is None and sessions.token(a2) and sessions.token(a3)
    assert sessions.token(alice) == "tok-alice"


def test_one_owners_logins_end_neither_anothers_nor_an_admins_session(tmp_path,
                                                                      monkeypatch) -> None:
    import plait.ui.app

    monkeypatch.setattr(plait.ui.app, "MAX_SESSIONS", 4)
    monkeypatch.setattr(plait.ui.app, "MAX_SESSIONS_PER_OWNER", 2)
    live = start_live(tmp_path / "data")
    try:
        alice_token, bob_token = setup_two_owners(live.admin, live)
        admin, alice = browser(live, live.admin_token), browser(live, alice_token)
        bobs = [browser(live, bob_token) for _ in range(8)]
        for client in (admin, alice, bobs[-1], bobs[-2]):
            assert client.get("/ui/jobs").status_code == 200
        r = bobs[0].get("/ui/jobs")  # bob's oldest session ended: log in again
        assert r.status_code == 303 and r.headers["location"].startswith("/ui/login")
    finally:
        stop_live(live)
