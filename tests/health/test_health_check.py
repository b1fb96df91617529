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
