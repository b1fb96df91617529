"""Each task's credential comes with its entry of its machine's desired set: derived
from its job's TaskControl key (``signing.task_credential``), one per task, served
to the machine that runs it and no other (live control plane, simulated agents)."""

from __future__ import annotations

import httpx
from livecp import Live, wait_for

from plait.taskcontrol import signing


def _job(name: str, entitlement: str, tasks: int) -> dict:
    return {"name": name, "entitlement": entitlement, "task_count": tasks,
            "command": "serve", "resources": {"cpu": 1, "memory_gb": 1}}


def _placed(client: httpx.Client, job: str, tasks: int) -> dict[int, str]:
    """Task index -> the machine it is placed on, once every task is."""
    found: dict[int, str] = {}

    def every() -> bool:
        found.clear()
        found.update({t["index"]: t["machine"]
                      for t in client.get(f"/v1/jobs/{job}/tasks").json()["tasks"]
                      if t.get("machine")})
        return len(found) == tasks
    wait_for(every)
    return dict(found)


def test_each_task_is_served_its_own_credential_on_its_machine_only(live: Live) -> None:
    for name, owner in (("ea", "alice"), ("eb", "bob")):
        assert live.admin.post("/v1/entitlements", json={
            "name": name, "owner": owner, "quota": {"machines": 12}}).status_code == 201
    alice, bob = live.owner("alice"), live.owner("bob")
    assert alice.post("/v1/jobs", json=_job("web", "ea", 4)).status_code == 201
    assert bob.post("/v1/jobs", json=_job("db", "eb", 3)).status_code == 201
    keys = {"web": alice.get("/v1/jobs/web/controller-key").json()["key"],
            "db": bob.get("/v1/jobs/db/controller-key").json()["key"]}
    placed = {("web", i): m for i, m in _placed(alice, "web", 4).items()}
    placed |= {("db", i): m for i, m in _placed(bob, "db", 3).items()}
    want = {task: signing.task_credential(keys[task[0]], *task) for task in placed}
    assert len(set(want.values())) == len(want)  # (one per task)

    seen: dict[tuple[str, int], str] = {}
    for machine in sorted(set(placed.values())):
        agent, _ = live.agent(machine)  # (the machine's own credential)

        def served(agent: httpx.Client = agent, machine: str = machine) -> bool:
            r = agent.get(f"/v1/machines/{machine}/desired")
            assert r.status_code == 200, r.text
            tasks = r.json()["tasks"]
            mine = {t for t, m in placed.items() if m == machine}
            if {(t["job"], t["index"]) for t in tasks} != mine:
                return False  # (not in its set yet)
            for t in tasks:
                assert t["credential"] == want[(t["job"], t["index"])], t
                seen[(t["job"], t["index"])] = t["credential"]
            # no other task's credential, of its job or another's, is in it
            for task, credential in want.items():
                if task not in mine:
                    assert credential not in r.text, (machine, task)
            return True
        wait_for(served)
        agent.close()
    assert seen == want
    # an owner's view of the job's tasks carries none
    assert not any(c in alice.get("/v1/jobs/web/tasks").text for c in want.values())


def test_a_job_made_again_under_its_name_has_new_credentials(live: Live) -> None:
    assert live.admin.post("/v1/entitlements", json={
        "name": "ea", "owner": "alice", "quota": {"machines": 12}}).status_code == 201
    alice = live.owner("alice")

    def served() -> dict[int, str]:
        got: dict[int, str] = {}
        for index, machine in _placed(alice, "web", 2).items():
            for t in live.admin.get(f"/v1/machines/{machine}/desired").json()["tasks"]:
                if t["job"] == "web" and t["index"] == index:
                    got[index] = t["credential"]
        return got

    assert alice.post("/v1/jobs", json=_job("web", "ea", 2)).status_code == 201
    key = alice.get("/v1/jobs/web/controller-key").json()["key"]
    first: dict[int, str] = {}
    wait_for(lambda: len(first.update(served()) or first) == 2)
    assert first == {i: signing.task_credential(key, "web", i) for i in (0, 1)}
    assert alice.delete("/v1/jobs/web").status_code in (200, 202)
    wait_for(lambda: alice.get("/v1/jobs/web").status_code == 404)
    assert alice.post("/v1/jobs", json=_job("web", "ea", 2)).status_code == 201
    again = alice.get("/v1/jobs/web/controller-key").json()["key"]
    assert again != key
    second: dict[int, str] = {}
    wait_for(lambda: len(second.update(served()) or second) == 2)
    assert second == {i: signing.task_credential(again, "web", i) for i in (0, 1)}
    assert not set(second.values()) & set(first.values())
