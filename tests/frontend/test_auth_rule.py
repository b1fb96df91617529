"""The bearer token is read one way and the owner rule is one predicate, for every
route and hot path of the API and for the region's front end."""

from __future__ import annotations

from plait.server.auth import Principal, Role, bearer_token, may_touch


def test_a_bearer_header_gives_its_token_and_anything_else_none() -> None:
    assert bearer_token("Bearer plait_a_b") == "plait_a_b"
    assert bearer_token("bearer   plait_a_b  ") == "plait_a_b"  # (the scheme's case)
    for header in ("", "Bearer", "Bearer    ", "Basic plait_a_b", "plait_a_b", "Token x"):
        assert bearer_token(header) is None, header


def test_an_owner_touches_only_its_own_and_an_admin_everything() -> None:
    alice = Principal("t1", Role.OWNER, "alice")
    admin = Principal("t0", Role.ADMIN, "admin")
    machine = Principal("t2", Role.MACHINE, "alice")  # (named like an owner: not one)
    assert may_touch(alice, "alice")
    assert not may_touch(alice, "bob") and not may_touch(alice, None)
    assert may_touch(admin, "bob") and may_touch(admin, None)
    assert not may_touch(machine, "alice")
