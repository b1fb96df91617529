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
