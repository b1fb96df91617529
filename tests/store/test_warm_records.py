"""A follower's copy of the job records: watches mark what the leader wrote, a refresh
re-reads only that, and the copy equals the store after every refresh (both stores)."""

from plait.model import JobSpec, parse
from plait.persist.scheduler import JobStore
from plait.persist.warm import WarmRecords


def _spec(name: str, count: int = 1) -> JobSpec:
    return parse(JobSpec, {"name": name, "entitlement": "e", "task_count": count,
                           "command": "sleep", "resources": {"cpu": 1, "memory_gb": 1}})


def test_a_refresh_reads_what_changed_and_the_copy_matches_the_store(env):
    leader = JobStore(env.store)
    for k in range(5):
        leader.create(_spec(f"j{k}"), 1.0)
    env.store.create("/scheduler/state/j0", b'{"applied": 1}')
    warm = WarmRecords(env.other())
    try:
        assert warm.refresh() == 6  # the first refresh reads everything
        assert sorted(warm.docs) == [f"j{k}" for k in range(5)] and list(warm.states) == ["j0"]
        assert warm.refresh() == 0  # nothing changed
        leader.resize("j1", 3, 2.0)
        leader.create(_spec("j5"), 2.0)
        env.store.set("/scheduler/state/j0", b'{"applied": 2}', 0)

        def caught_up() -> bool:
            warm.refresh()
            return ("j5" in warm.docs and warm.docs["j1"][0].spec.task_count == 3
                    and warm.states["j0"][0] == b'{"applied": 2}')
        assert env.settle(caught_up)
        assert warm.last_read <= 3  # only the changed records, never all again
        leader.delete("j2", 3.0)  # (a delete request: the record stays until applied)
        _, version = env.store.get("/scheduler/jobs/j3")
        env.store.delete("/scheduler/jobs/j3", version)
        assert env.settle(lambda: (warm.refresh(), "j3" not in warm.docs)[1])
        # the copy is the store, record for record, version for version
        store_docs = {n: env.store.get(f"/scheduler/jobs/{n}")
                      for n in env.store.children("/scheduler/jobs")}
        assert {n: v for n, (_, v) in warm.docs.items()} == {
            n: v for n, (_, v) in store_docs.items()}
        assert warm.docs["j2"][0].deleting
    finally:
        warm.close()
