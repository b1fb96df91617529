"""Tokens: hashes only, revocation seen by other processes after the cache lapses."""

import pytest

from plait.server.auth import AuthError, Role, TokenStore
from plait.store import SqliteStore


def test_a_token_revoked_elsewhere_is_refused_once_the_cache_lapses(tmp_path):
    now = [0.0]
    path = str(tmp_path / "plait.db")
    here = TokenStore(SqliteStore(path), cache_seconds=2.0, clock=lambda: now[0])
    there = TokenStore(SqliteStore(path))  # another front-end process
    info, token = here.create(Role.OWNER, "alice", now=0)
    assert here.verify(token).name == "alice"
    there.revoke(info.id)
    now[0] = 1.0
    assert here.verify(token).name == "alice"  # still cached
    now[0] = 3.0
    with pytest.raises(AuthError, match="revoked"):
        here.verify(token)


def test_names_and_roles_are_checked(tmp_path):
    tokens = TokenStore(SqliteStore(str(tmp_path / "plait.db")))
    with pytest.raises(Exception, match="not a valid name"):
        tokens.create(Role.OWNER, "Bad Name", now=0)
    with pytest.raises(ValueError):
        tokens.create("root", "x", now=0)
    _info, token = tokens.create(Role.JOIN, "cluster", now=0)
    assert tokens.verify(token).role is Role.JOIN
    with pytest.raises(AuthError, match="unknown token"):
        tokens.verify("plait_ffff_" + token.rsplit("_", 1)[1])


def test_a_machine_has_one_live_credential_rotated_or_joined_again(tmp_path):
    """Each join replaces the machine's credential and revokes the one before; a
    rotated credential is the machine's in its place (a later join revokes it)."""
    tokens = TokenStore(SqliteStore(str(tmp_path / "plait.db")))
    first, _, before = tokens.issue_machine("m1", now=0)
    assert before is None
    second, token, before = tokens.issue_machine("m1", now=1)
    assert before == first.id and tokens.verify(token).name == "m1"
    assert {t.id: t.revoked for t in tokens.list()} == {first.id: True, second.id: False}
    rotated, _ = tokens.rotate(second.id, now=2)
    third, _, before = tokens.issue_machine("m1", now=3)
    assert before == rotated.id
    live = [t.id for t in tokens.list() if not t.revoked]
    assert live == [third.id]
    # another machine's credentials are its own
    _other, _, before = tokens.issue_machine("m2", now=4)
    assert before is None and not next(t for t in tokens.list() if t.id == third.id).revoked
