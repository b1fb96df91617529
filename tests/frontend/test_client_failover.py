"""The SDK given both replicas' URLs: when the leader is killed, its calls go on
through the replica that takes over (the 503s of the election are retried)."""

from __future__ import annotations

from livecp import wait_for
from test_replicas import JOB, Replica

from plait.client import Client


def test_the_client_fails_over_to_the_new_leader_when_the_leader_is_killed(tmp_path):
    first = Replica(tmp_path)
    wait_for(lambda: first.role() == "leader")
    second = Replica(tmp_path, first.token)
    wait_for(lambda: second.role() == "follower")
    try:
        with Client([first.url, second.url], token=first.token, retry_timeout=60) as c:
            c.entitlements.create({"name": "e", "owner": "o", "quota": {"machines": 4}})
            assert c.jobs.create(JOB)["created"]
            assert c.url == first.url
            first.die()
            first.server.stop()  # its port refuses connections from now on
            view = c.jobs.get("j")  # refused by the first, retried until the second leads
            assert view["name"] == "j" and c.url == second.url
            assert second.role() == "leader"
            ack = c.jobs.resize("j", 3)
            assert ack["version"] == 2
            assert c.jobs.get("j")["task_count"] == 3
            assert [j["name"] for j in c.jobs.list()] == ["j"]
    finally:
        first.api.close()
        first.cp.store.close()
        second.close()
