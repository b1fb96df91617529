"""Helpers shared by the store tests (a module of its own: test modules import it,
not conftest)."""

ZK_SERVER = "/usr/share/zookeeper/bin/zkServer.sh"
