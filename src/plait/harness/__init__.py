"""Whole regions on one box, for tests, demos and benchmarks (not the product).

* ``region``: ``plait up`` in a child process, driven from outside (``LocalRegion``:
  the demo, ``plait bench recovery``);
* ``replicas``: a ZooKeeper ensemble, replicas of the control plane and agents on
  loopback (``ReplicatedRegion``: fault tests, ``plait bench failover``);
* ``shards``: scheduler shards, a front end and agents in one process
  (``ShardedBox``: tests, the entitlement move of ``plait bench failover``);
* ``zkensemble``: a ZooKeeper ensemble from Debian's ``zookeeper`` package.
"""
