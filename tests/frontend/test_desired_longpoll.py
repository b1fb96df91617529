"""The desired-set long-poll waits on an event of its machine, set when its set
changes, and runs nothing while it waits (no timer); directly and through the front
end."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from livecp import start_behind_front_end, start_live, stop_live, wait_for

from plait.server.controlplane.waiters import Waiters


def test_notify_wakes_the_polls_of_that_machine_only_from_another_thread():
    waiters = Waiters()
    ready = threading.Event()
    woken: dict[str, bool] = {}

    async def poll(machine: str) -> None:
        with waiters.waiting(machine) as event:
            ready.set()
            try:
                await asyncio.wait_for(event.wait(), 1.0)
                woken[machine] = True
            except TimeoutError:
                woken[machine] = False

    async def both() -> None:
        await asyncio.gather(poll("a"), poll("b"))

    runner = threading.Thread(target=asyncio.run, args=(both(),))
    runner.start()
    ready.wait(10)
    wait_for(lambda: waiters.count() >= 2, what="both polls wait")
    assert waiters.notify(["a", "c"]) == 1  # (from this thread: the pass's)
    runner.join(10)
    assert woken == {"a": True, "b": False}
    assert waiters.count() == 0  # every poll took its event away
    assert waiters.notify(["a"]) == 0 and waiters.notify_all() == 0


@pytest.fixture
def quiet(tmp_path):
    live = start_live(tmp_path / "data", sim_agents=False)
    yield live
    stop_live(live)


def _counting(cp, monkeypatch) -> list[int]:
    """Count the reads of desired-set generations (a poll on a timer reads it on each
    tick)."""
    reads = [0]
    read = cp.gateway.desired_generation

    def counted(machine: str) -> int:
        reads[0] += 1
        return read(machine)
    monkeypatch.setattr(cp.gateway, "desired_generation", counted)
    return reads


def test_a_waiting_poll_reads_nothing_until_it_times_out(quiet, monkeypatch):
    url = "/v1/machines/m0000000/desired"
    first = quiet.admin.get(url).json()
    reads = _counting(quiet.cp, monkeypatch)
    started = time.monotonic()
    same = quiet.admin.get(url, params={"since": first["generation"], "wait": 1.0}).json()
    assert time.monotonic() - started >= 0.9  # it waited out its time
    assert same["generation"] == first["generation"] and same["tasks"] == first["tasks"]
    # before and after the wait, and the answer's (a poll on a 20 ms timer: 50 more)
    assert reads[0] <= 8


def test_a_change_wakes_the_waiting_poll_with_the_new_set(quiet):
    admin = quiet.admin
    url = "/v1/machines/m0000000/desired"
    first = admin.get(url).json()
    answer: dict[str, object] = {}

    def poll() -> None:
        answer.update(admin.get(url, params={"since": first["generation"],
                                             "wait": 50}).json())
    poller = threading.Thread(target=poll)
    poller.start()
    wait_for(lambda: quiet.cp.gateway.waiters.count() >= 1, what="the poll waits")
    assert quiet.cp.gateway.waiters.count() == 1
    # the machine leaves this control plane's watch (as when its shard hands it over):
    # its generation moves on, and its poll is answered at once
    with quiet.cp.lock:
        quiet.cp.membership.disown("m0000000")
    poller.join(30)
    assert not poller.is_alive()
    assert answer["generation"] != first["generation"]
    assert quiet.cp.gateway.waiters.count() == 0


def test_the_long_poll_through_the_front_end(tmp_path):
    live = start_behind_front_end(tmp_path)
    try:
        url = "/v1/machines/m0000000/desired"
        first = live.admin.get(url)
        assert first.status_code == 200, first.text
        gen = first.json()["generation"]
        started = time.monotonic()
        same = live.admin.get(url, params={"since": gen, "wait": 0.5})
        assert same.status_code == 200, same.text
        assert same.json()["generation"] == gen
        assert time.monotonic() - started >= 0.4
    finally:
        stop_live(live)


def test_a_stopping_api_answers_its_waiting_polls_at_once(quiet):
    admin = quiet.admin
    url = "/v1/machines/m0000000/desired"
    gen = admin.get(url).json()["generation"]
    answers: list[int] = []
    poller = threading.Thread(target=lambda: answers.append(
        admin.get(url, params={"since": gen, "wait": 50}).status_code))
    poller.start()
    wait_for(lambda: quiet.cp.gateway.waiters.count() >= 1, what="the poll waits")
    quiet.cp.gateway.waiters.close()  # (what stopping the API does first)
    poller.join(30)
    assert answers == [200]
    # and a poll that comes later does not wait either
    started = time.monotonic()
    assert admin.get(url, params={"since": gen, "wait": 50}).json()["generation"] == gen
    assert time.monotonic() - started < 25


def test_a_long_poll_answered_after_its_replica_stopped_leading_is_a_503(tmp_path) -> None:
    """A long-poll that began while its replica led and ends after it stopped leading
    gets 503 (ask again, through the new leader), never the set this replica kept: it
    may have moved a task the new leader placed elsewhere."""
    import threading

    from livecp import start_live, stop_live

    live = start_live(tmp_path / "data", sim_agents=False)
    try:
        agent, _ = live.agent("m0000001")
        since = agent.get("/v1/machines/m0000001/desired").json()["generation"]
        answers = []
        poll = threading.Thread(target=lambda: answers.append(agent.get(
            "/v1/machines/m0000001/desired", params={"wait": 20, "since": since})))
        poll.start()
        wait_for(lambda: live.cp.gateway.waiters.count() >= 1, what="the poll waits")
        live.cp.leading = lambda: False
        live.cp.gateway.waiters.notify_all()  # (as a replica that lost its election does)
        poll.join(timeout=60)
        assert not poll.is_alive()
        assert answers[0].status_code == 503 and "stopped leading" in answers[0].json()[
            "message"], answers[0].text
    finally:
        stop_live(live)
