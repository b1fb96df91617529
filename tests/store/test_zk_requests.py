"""ZooKeeper requests of several megabytes (decision 106): a transaction carrying
records of up to 1 MB each commits atomically on an ensemble that takes 16 MiB; one
past the limit is refused before it is sent, naming it, and the connection every
other request shares stays up."""

from __future__ import annotations

import pytest

from plait.errors import ValidationError
from plait.store.protocol import Transaction
from plait.store.zookeeper import MAX_TXN_BYTES, ZkStore


def test_a_transaction_of_megabytes_commits_and_one_past_the_limit_is_refused(zookeeper):
    store = ZkStore(zookeeper)
    try:
        big = b"x" * 900_000
        txn = Transaction()
        for j in range(4):  # (about 3.6 MB: past ZooKeeper's default 1 MiB)
            txn.create(f"/zk-requests/part{j}", big)
        store.commit(txn)
        assert store.children("/zk-requests") == [f"part{j}" for j in range(4)]
        over = Transaction()
        for j in range(MAX_TXN_BYTES // 900_000 + 1):
            over.create(f"/zk-requests/over{j}", big)
        with pytest.raises(ValidationError, match=r"jute\.maxbuffer"):
            store.commit(over)
        assert store.get("/zk-requests/part0")[0] == big  # the connection is still up
        assert not store.exists("/zk-requests/over0")
    finally:
        store.close()
