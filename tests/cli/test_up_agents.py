"""What `plait up` does about an agent of its region that exited (the decision alone;
``tests/e2e/test_e2e_up.py`` kills real agents)."""

from __future__ import annotations

import pytest

from plait.cli.up import RESTART_BURST, RESTART_WINDOW_SECONDS, agent_exit_action


@pytest.mark.parametrize(("tasks", "other", "restarts", "action"), [
    (0, None, [], "dead"),  # its machine died with it: left down, its tasks move
    (1, None, [], "restart"),  # only the agent died: a new one adopts its tasks
    (3, 4242, [], "adopt"),  # restarted by hand meanwhile: that one is its agent
    (0, 4242, [], "adopt"),
    (1, None, [100.0 - RESTART_WINDOW_SECONDS / 2] * (RESTART_BURST - 1), "restart"),
    (1, None, [100.0 - RESTART_WINDOW_SECONDS / 2] * RESTART_BURST, "give_up"),
    # restarts older than the window are forgotten
    (1, None, [100.0 - RESTART_WINDOW_SECONDS - 1] * RESTART_BURST, "restart"),
])
def test_an_exited_agent_is_restarted_only_while_its_tasks_run(tasks, other, restarts,
                                                                action):
    assert agent_exit_action(tasks, other, restarts, now=100.0) == action


def test_a_restart_that_cannot_start_is_said_and_tried_again_within_the_burst(
        tmp_path, monkeypatch):
    # an OSError of the restart (no process or file to spare) left the watch, and with
    # it plait up's main loop: the region's shutdown never ran
    import plait.cli.up as up

    class Exited:
        pid, returncode = 4242, -9

        def poll(self):
            return -9

    def start(name):
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(up, "processes_under", lambda root: {777})  # its task runs
    monkeypatch.setattr(up, "plait_processes", lambda root, verb: set())
    monkeypatch.setattr(up, "alive", lambda pid: True)
    watch = up.AgentWatch(tmp_path, {"m1": Exited()}, start)
    said, now = [], 100.0
    for _ in range(40):
        said += watch.check(now)
        now += up.AGENT_SETTLE_SECONDS
    tries = [s for s in said if "could not be restarted" in s]
    assert len(tries) == up.RESTART_BURST, said
    assert "Resource temporarily unavailable (tried again in a moment)" in tries[0]
    assert said[-1].startswith(f"agent m1 exited with -9 after {up.RESTART_BURST} restarts")
    assert len(said) == up.RESTART_BURST + 1 and "m1" in watch.down
