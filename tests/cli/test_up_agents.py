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
