"""ZooKeeper ACLs: with credentials (zk://hosts?auth_file=PATH), every znode plait
creates is readable and writable only with them."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from plait.errors import ValidationError
from plait.store.backup import open_store


def test_a_client_without_the_credentials_reads_and_writes_nothing(zookeeper, tmp_path):
    creds = tmp_path / "zk-auth"
    creds.write_text("plait:s3cret\n")
    store = open_store(f"zk://{zookeeper}?auth_file={creds}")
    try:
        store.create("/acl-test/auth/tokens/t1", b"hash")
        assert store.get("/acl-test/auth/tokens/t1")[0] == b"hash"
        stranger = KazooClient(hosts=zookeeper, timeout=5)
        stranger.start(timeout=10)
        try:
            with pytest.raises(NoAuthError):
                stranger.get("/acl-test/auth/tokens/t1")
            with pytest.raises(NoAuthError):
                stranger.create("/acl-test/auth/tokens/forged", b"x")
            with pytest.raises(NoAuthError):
                stranger.set("/acl-test/auth/tokens/t1", b"changed")
            with pytest.raises(NoAuthError):
                stranger.get_children("/acl-test/auth/tokens")
        finally:
            stranger.stop()
            stranger.close()
        # another plait process with the same credentials does both
        again = open_store(f"zk://{zookeeper}?auth_file={creds}")
        assert again.get("/acl-test/auth/tokens/t1")[0] == b"hash"
        again.close()
    finally:
        store.close()


def test_bad_credential_files_and_urls_are_refused(tmp_path):
    with pytest.raises(ValidationError, match="cannot read"):
        open_store(f"zk://127.0.0.1:1?auth_file={tmp_path / 'missing'}")
    (tmp_path / "bad").write_text("no-colon\n")
    with pytest.raises(ValidationError, match="user:password"):
        open_store(f"zk://127.0.0.1:1?auth_file={tmp_path / 'bad'}")
    with pytest.raises(ValidationError, match="auth_file"):
        open_store("zk://127.0.0.1:1?password=x")
