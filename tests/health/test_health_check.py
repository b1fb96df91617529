from plait.health import HealthCheck


def test_a_machine_goes_down_after_the_timeout_and_comes_back_at_its_next_beat():
    hc = HealthCheck(timeout=5)
    hc.watch("m1", now=0)
    hc.beat("m2", now=0)
    assert hc.check(now=5) == ([], [])
    hc.beat("m1", now=4)
    assert hc.check(now=6) == (["m2"], [])
    assert hc.check(now=7) == ([], [])  # reported once
    hc.beat("m2", now=8)
    assert hc.check(now=8) == ([], ["m2"])
    assert hc.check(now=10) == (["m1"], [])
    hc.beat("m2", now=3)  # a late, out-of-order beat does not move time back
    assert hc.last["m2"] == 8


def test_a_startup_grace_lasts_until_the_first_heartbeat():
    hc = HealthCheck(timeout=5)
    hc.watch("slow", now=0, grace=30)  # its agent is still starting
    hc.watch("dead", now=0, grace=30)  # its agent never comes
    hc.watch("quick", now=0, grace=30)
    assert hc.check(now=20) == ([], [])  # past the timeout, within the grace
    hc.beat("quick", now=1)
    assert hc.check(now=7) == (["quick"], [])  # after a beat only the timeout counts
    hc.beat("slow", now=28)
    assert hc.check(now=30) == ([], [])
    assert hc.check(now=30.1) == (["dead"], [])  # the grace is over
    assert hc.check(now=34) == (["slow"], [])


def _fleet(hc: HealthCheck, n: int, now: float = 0) -> list[str]:
    names = [f"m{i}" for i in range(n)]
    for m in names:
        hc.beat(m, now)
    return names


def test_most_machines_silent_together_fail_none_of_them():
    hc = HealthCheck(timeout=5)
    names = _fleet(hc, 6)
    assert hc.check(now=6) == ([], [])  # all six silent: none is down
    assert (hc.held, hc.silent, hc.was_held) == (6, 6, 0)  # (the hold began)
    assert hc.down == set()
    assert hc.check(now=7) == ([], []) and (hc.held, hc.was_held) == (6, 6)
    for m in names:  # the path is back: nothing to come back from
        hc.beat(m, now=7)
    assert hc.check(now=8) == ([], []) and (hc.held, hc.was_held) == (0, 6)  # (it ended)
    assert HealthCheck(timeout=5).was_held == 0  # (a new leader's: no hold to end)


def test_a_minority_silent_fails_and_past_the_share_the_rest_is_held():
    hc = HealthCheck(timeout=5, hold_fraction=0.5)
    names = _fleet(hc, 6)
    for m in names[:4]:
        hc.beat(m, now=4)
    assert hc.check(now=6) == (["m4", "m5"], [])  # two of six: failed
    assert hc.held == 0
    hc.beat("m0", now=9)
    assert hc.check(now=10) == ([], [])  # then five of six silent: the others held
    assert (hc.held, hc.silent) == (3, 5)
    assert hc.down == {"m4", "m5"}  # (those failed before stay failed)
    for m in names[1:3]:  # three of six silent: at the bound, the late one fails now
        hc.beat(m, now=10)
    assert hc.check(now=10) == (["m3"], []) and hc.held == 0


def test_machines_never_heard_from_fail_while_the_heard_ones_are_held():
    hc = HealthCheck(timeout=5)
    _fleet(hc, 4)
    for m in ("n1", "n2"):
        hc.watch(m, now=0)  # their agents never start
    assert hc.check(now=6) == (["n1", "n2"], [])
    assert hc.held == 4


def test_too_few_machines_heard_from_are_never_held():
    hc = HealthCheck(timeout=5, hold_min=3)
    _fleet(hc, 2)
    assert hc.check(now=6) == (["m0", "m1"], [])
    never = HealthCheck(timeout=5, hold_fraction=1.0)
    _fleet(never, 6)
    assert len(never.check(now=6)[0]) == 6


def test_a_forgotten_machine_is_neither_watched_nor_counted():
    hc = HealthCheck(timeout=5)
    names = _fleet(hc, 4)
    hc.check(now=6)
    for m in names[1:]:
        hc.forget(m)
    assert hc.check(now=7) == (["m0"], [])  # one machine heard from: below hold_min
    assert set(hc.last) == {"m0"} and hc.heard == {"m0"}
