"""``plait bench failover``: a replicated scheduler shard on a 3-member ZooKeeper
ensemble, behind a ``plait frontend`` process (all on loopback, started here; with
``frontend=False`` the replicas of an unsharded control plane, called directly), real
agents running sleeping tasks, and a client creating jobs continuously through the
front end. First ``steady_seconds`` with no fault
(every leader change then is spurious: the session timeout is too short for this
host), then SIGKILL of the leading replica.

* ``failover_s``: from the SIGKILL until the writer's first acknowledged write after it
  (a follower was elected, loaded the state and serves);
* ``new_leader_s``: from the SIGKILL until a replica says it leads;
* ``task_restarts``: tasks whose process changed (pid) across the whole run;
* ``acknowledged_writes`` / ``lost_writes``: jobs the control plane acknowledged (201)
  and, of those, jobs it does not have at the end;
* ``spurious_failovers``: leader elections during the steady window;
* then, on the same ensemble (in a part of its tree of its own), two scheduler shards
  and their front end in this process, with real agents: an entitlement whose tasks
  run moves from one shard to the other while a client writes to it 20 times a second
  (``plait.harness.shards.measure_move``). ``entitlement_move_unavailable_s`` is what the
  client saw: from its first write refused (409) to its first write accepted after
  the move began; ``entitlement_move_server_s`` what the front end measured (map
  marked moving to map pointing at the new shard); ``entitlement_move_task_restarts``
  the entitlement's tasks whose process changed.
"""

from __future__ import annotations

import contextlib
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from plait.errors import Conflict
from plait.harness.replicas import NOT_YET, ReplicatedRegion, Writer
from plait.harness.shards import measure_move
from plait.store.zookeeper import ZkStore
from plait.testing import wait_for


def run(replicas: int = 2, machines: int = 3, tasks: int = 6, steady_seconds: float = 120.0,
        rate: float = 10.0, session_timeout: float = 1.0, timeout: float = 120.0,
        work: Path | None = None, frontend: bool = True) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="plait-failover-") as tmp:
        region = ReplicatedRegion(Path(work or tmp), replicas=replicas, machines=machines,
                                  session_timeout=session_timeout, frontend=frontend)
        with region:
            admin = region.admin
            assert admin is not None
            r = admin.post("/v1/entitlements", json={
                "name": "bench", "owner": "bench", "quota": {"machines": machines}})
            r.raise_for_status()
            r = admin.post("/v1/jobs", json={
                "name": "sleepers", "entitlement": "bench", "task_count": tasks,
                "command": "sleep", "args": ["infinity"],
                "resources": {"cpu": 0.1, "memory_gb": 0.1}})
            r.raise_for_status()
            wait_for(lambda: region.running("sleepers", tasks)
                     and len(region.task_pids()) == tasks, timeout, "the tasks run",
                     poll=0.02, ignore=NOT_YET)
            pids = region.task_pids()
            elected = len(region.events("leader_elected"))
            writer = Writer(region, "bench", rate=rate).start()
            try:
                time.sleep(steady_seconds)
                spurious = len(region.events("leader_elected")) - elected
                leader = region.leader()
                assert leader is not None, "no replica leads"
                before = len(writer.acked)
                killed = time.time()
                region.kill_replica(leader)
                wait_for(lambda: region.leader() is not None, timeout, "a new leader",
                         poll=0.02, ignore=NOT_YET)
                new_leader_s = time.time() - killed
                wait_for(lambda: len(writer.acked) > before
                         and writer.acked[-1][1] > killed, timeout, "a write after the kill",
                         poll=0.02, ignore=NOT_YET)
                failover_s = next(t for _, t in writer.acked[before:] if t > killed) - killed
                time.sleep(2.0)  # the writer goes on against the new leader
            finally:
                writer.stop()
            lost = writer.lost()
            wait_for(lambda: len(region.task_pids()) == tasks, timeout, "tasks recorded",
                     poll=0.02, ignore=NOT_YET)
            now = region.task_pids()
            restarts = sum(1 for k, pid in pids.items() if now.get(k) != pid)
            loads = [float(m.group(1)) for e in region.events("leader_elected")
                     if (m := re.search(r"state loaded in ([0-9.]+)s", e["message"]))]
            root = ZkStore(region.ensemble.hosts)
            with contextlib.suppress(Conflict):
                root.create("/sharded", b"")
            root.close()
            move = measure_move(Path(work or tmp) / "shards",
                                store=f"{region.ensemble.url}/sharded")
    return {
        "failover_s": round(failover_s, 3),
        "new_leader_s": round(new_leader_s, 3),
        "task_restarts": restarts,
        "acknowledged_writes": len(writer.acked),
        "lost_writes": len(lost),
        "write_failures": writer.failed,
        "spurious_failovers": spurious,
        **move,
        "steady_seconds": steady_seconds,
        "session_timeout_s": session_timeout,
        "state_load_s": loads[-1] if loads else None,
        "replicas": replicas,
        "behind_frontend": frontend,
        "zk_members": 3,
        "machines": machines,
        "tasks": tasks,
        "write_rate_per_s": rate,
    }
