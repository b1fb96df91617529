"""Sidekick's book (pure core): pending machines, the transitions agents' reports
make, and what it keeps per machine."""

from plait.model.hostprofile import HostProfile, HostProfileSpec, default_profile
from plait.sidekick.book import DEFAULT_APPLIED, Applied, ProfileBook, out_for

WEB = HostProfile(spec=HostProfileSpec(name="web", turbo=True), version=1)
WEB2 = HostProfile(spec=HostProfileSpec(name="web", turbo=False), version=2)


def test_a_joining_machine_is_pending_until_its_agent_reports_the_profile():
    book = ProfileBook()
    book.define(WEB)
    assert book.target("web") == WEB and book.target(None) == default_profile()
    assert book.target("nope") is None and not book.ready(1, None)
    assert book.ready(1, WEB)  # not heard from: its agent is the guard
    book.joined(1, WEB)
    assert not book.ready(1, WEB) and book.applied[1] == DEFAULT_APPLIED
    assert book.report(1, Applied("default", 1), WEB) is None  # still switching
    assert not book.ready(1, WEB)
    switched = book.report(1, Applied("web", 1), WEB)
    assert switched is not None and switched.kind == "profile_switched"
    assert book.ready(1, WEB)
    # a machine that joins carrying the profile already is not pending
    book.joined(2, default_profile())
    assert book.ready(2, default_profile()) and 2 not in book.applied
    # back to the free pool: not pending any more
    book.joined(3, WEB)
    book.left(3)
    assert book.ready(3, default_profile())


def test_only_machines_off_default_are_kept():
    book = ProfileBook()
    book.define(WEB)
    for m in range(100):  # a region's agents reporting default: nothing kept
        assert book.report(m, Applied("default", 1), default_profile()) is None
    assert book.applied == {} and book.pending == set()
    book.joined(5, WEB)
    book.report(5, Applied("web", 1), WEB)
    assert set(book.applied) == {5}
    book.left(5)
    book.report(5, Applied("default", 1), default_profile())  # switched back
    assert book.applied == {}


def test_a_first_report_after_a_takeover_is_no_switch():
    book = ProfileBook()
    book.define(WEB)
    assert book.report(7, Applied("web", 1), WEB) is None


def test_failures_are_counted_and_out_of_service_doubles_until_the_profile_applies():
    book = ProfileBook()
    book.define(WEB)
    book.joined(1, WEB)
    first = book.report(1, Applied("default", 1, "no turbo", failures=1), WEB)
    assert first is not None and first.kind == "profile_switch_failed"
    assert first.reason == "no turbo" and first.failures == 1 and first.out_for == out_for(1)
    # each heartbeat repeats the count: no new failure
    assert book.report(1, Applied("default", 1, "no turbo", failures=1), WEB) is None
    second = book.report(1, Applied("default", 1, "no turbo", failures=2), WEB)
    assert second is not None and second.out_for == 2 * first.out_for
    assert out_for(100) == out_for(1000) == out_for(2**31)  # bounded (an agent's count)
    retried = book.report(1, Applied("web", 1, None, failures=0), WEB)
    assert retried is not None and retried.kind == "profile_switch_retried"
    assert retried.failures == 2 and 1 not in book.failing and book.ready(1, WEB)


def test_only_a_newer_version_replaces_a_profile():
    book = ProfileBook()
    assert book.define(WEB2) and not book.define(WEB)
    assert book.target("web") == WEB2
    book.forget("web")
    book.forget("default")
    assert book.target("web") is None and book.target("default") is not None
