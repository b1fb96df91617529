"""The dispatcher's bounds per tenant: one tenant's hostile controllers take only its
own slots, so another tenant's calls are sent and answered while they are held."""

from __future__ import annotations

import threading

import pytest

from plait.bench.controllers import ControllerFarm
from plait.taskcontrol.dispatch import Dispatcher
from plait.taskcontrol.protocol import ControllerAnswer, ControllerCall, TaskControlRequest
from plait.taskcontrol.urlpolicy import UrlPolicy, networks


@pytest.fixture
def farm():
    farm = ControllerFarm(keep=False)
    yield farm
    farm.stop()


def test_a_tenants_tarpits_never_hold_up_another_tenants_calls(farm) -> None:
    answers: dict[str, ControllerAnswer] = {}
    came = threading.Condition()

    def deliver(answer: ControllerAnswer) -> None:
        with came:
            answers[answer.job] = answer
            came.notify_all()

    # 4 slots in all, 2 of them at most mallory's: her 6 tarpits hold her 2
    dispatcher = Dispatcher(deliver, deadline=2.0, max_in_flight=4, per_tenant=2,
                            policy=UrlPolicy(allow=networks(("loopback",))))
    try:
        dispatcher.send(ControllerCall(f"m{i}", f"{farm.url}/tarpit/m{i}",
                                       TaskControlRequest(f"m{i}", sequence_number=1),
                                       tenant="mallory") for i in range(6))
        dispatcher.send([ControllerCall("web", f"{farm.url}/ack/web",
                                        TaskControlRequest("web", sequence_number=1),
                                        tenant="alice")])
        with came:
            assert came.wait_for(lambda: "web" in answers, timeout=60)
            assert answers["web"].error is None and answers["web"].response is not None
            assert not any(f"m{i}" in answers for i in range(6))
            # mallory's: two at a time, each cut off at the deadline
            assert came.wait_for(lambda: len(answers) == 7, timeout=120)
        assert all("deadline" in (answers[f"m{i}"].error or "") for i in range(6))
    finally:
        dispatcher.close()
