"""Task output: agents send it, the control plane keeps a tail, users read and follow it."""

from livecp import wait_for

from plait.server.logs import TaskLogs

SPEC = {"name": "web", "entitlement": "web", "task_count": 2,
        "resources": {"cpu": 1, "memory_gb": 1}, "command": "serve", "args": ["--port", "1"]}


def test_the_tail_is_bounded_and_followers_are_told_what_they_missed():
    logs = TaskLogs(max_bytes=10, max_tasks=2)
    logs.append("a", 0, "m1", "0123456")
    assert logs.read("a", 0) == ("0123456", 7, False, "m1")
    logs.append("a", 0, "m1", "789abc")
    text, nxt, skipped, _ = logs.read("a", 0, after=7)
    assert (text, nxt, skipped) == ("789abc", 13, False)
    text, nxt, skipped, _ = logs.read("a", 0, after=0)  # 0..2 fell out of the tail
    assert (text, nxt, skipped) == ("3456789abc", 13, True)
    assert logs.read("a", 0, after=13)[:2] == ("", 13)
    logs.append("b", 0, "m2", "x")
    logs.append("c", 0, "m3", "y")  # a third task: the one heard from longest ago goes
    assert logs.read("a", 0) == ("", 0, False, None)
    assert logs.read("c", 0)[0] == "y"


def test_task_output_is_read_through_the_api_and_only_a_tasks_machine_may_send_it(live):
    live.admin.post("/v1/entitlements", json={"name": "web", "owner": "alice",
                                              "quota": {"machines": 4}})
    live.admin.post("/v1/jobs", json=SPEC)
    wait_for(lambda: "running on" in live.admin.get("/v1/jobs/web/tasks/0/logs").json()["data"])
    page = live.admin.get("/v1/jobs/web/tasks/0/logs").json()
    assert "starting serve --port 1 (version 1, revision 1)" in page["data"]
    machine = page["machine"]
    assert machine == live.admin.get("/v1/jobs/web/tasks").json()["tasks"][0]["machine"]

    join = live.admin.post("/v1/tokens", json={"role": "join", "name": "c"}).json()["token"]
    agent = live.client(live.client(join).post("/v1/agents/join", json={
        "machine": machine}).json()["token"])
    other = live.admin.get("/v1/jobs/web/tasks").json()["tasks"][1]["machine"]
    r = agent.post(f"/v1/machines/{machine}/output", json={"chunks": [
        {"job": "web", "index": 0, "data": "hello from the task\n"},
        {"job": "web", "index": 1 if other != machine else 7, "data": "not mine\n"}]})
    assert r.status_code == 200 and r.json() == {"machine": machine, "accepted": 1,
                                                 "refused": 1}
    assert agent.post(f"/v1/machines/{other if other != machine else 'm0000000'}/output",
                      json={"chunks": []}).status_code == 403
    follow = live.admin.get("/v1/jobs/web/tasks/0/logs", params={"after": page["next"]}).json()
    assert "hello from the task" in follow["data"] and "not mine" not in follow["data"]
    assert live.owner("bob").get("/v1/jobs/web/tasks/0/logs").status_code == 404
    assert live.admin.get("/v1/jobs/nope/tasks/0/logs").status_code == 404
    # an index or an offset no task can have is refused, naming it
    for path, params, field in (("/v1/jobs/web/tasks/-1/logs", {}, "index"),
                                ("/v1/jobs/web/tasks/100000/logs", {}, "index"),
                                ("/v1/jobs/web/tasks/0/logs", {"after": "9" * 30}, "after")):
        r = live.admin.get(path, params=params)
        assert r.status_code == 422 and r.json()["field"] == field, r.text
    # a task the job does not have is said to be one (it answered an empty tail)
    r = live.admin.get("/v1/jobs/web/tasks/99/logs")
    assert r.status_code == 404 and "job web has no task 99 (it has tasks 0..1)" in (
        r.json()["message"])
