"""The Job Control Plane's reconciliation rules, each a test: a push keeps its share
while the job is resized, canaries never overlap pushed tasks, a canary by hardware
lands on that hardware, nothing moves that need not, and what cannot be satisfied is
reported."""

from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from plait.jcp import Canary, Push, Sizing, round_half_up, unify

STABLE, PUSHED, CANARY = 1, 2, 3


def test_a_fifty_percent_push_stays_fifty_percent_as_the_autoscaler_resizes():
    """The post's Figures 4 and 6: the autoscaler shrinks a job in the middle of a 50 %
    push; half the job still runs the old spec."""
    u = unify(STABLE, 100, push=Push(PUSHED, Fraction(50)))
    assert u.count("push") == 50 and u.count("stable") == 50
    for size in (60, 7, 1, 2, 33, 100, 250):
        u = unify(STABLE, 100, push=Push(PUSHED, Fraction(50)), sizing=Sizing(size),
                  previous=u)
        assert u.task_count == size
        assert u.count("push") == round_half_up(Fraction(size, 2))
        assert u.versions.count(PUSHED) == u.count("push")


def test_rounding_is_half_up_and_documented():
    assert [round_half_up(Fraction(x, 2)) for x in range(6)] == [0, 1, 1, 2, 2, 3]
    u = unify(STABLE, 5, push=Push(PUSHED, Fraction(50)))
    assert u.count("push") == 3
    assert unify(STABLE, 3, push=Push(PUSHED, Fraction(10))).count("push") == 0


def test_canary_tasks_never_overlap_pushed_ones():
    u = unify(STABLE, 10, push=Push(PUSHED, Fraction(50)))
    pushed = {i for i, r in enumerate(u.roles) if r == "push"}
    u2 = unify(STABLE, 10, push=Push(PUSHED, Fraction(50)),
               canaries=[Canary("c", CANARY, 2)], previous=u)
    canary = {i for i, r in enumerate(u2.roles) if r == "canary:c"}
    assert len(canary) == 2 and not canary & pushed  # taken from the stable tasks
    assert {i for i, r in enumerate(u2.roles) if r == "push"} == pushed  # nothing moved
    assert u2.count("push") == 5 and not u2.conflicts


def test_a_canary_by_hardware_lands_on_that_hardware_or_is_placed_there():
    placed = {i: ("gpu" if i in (3, 7) else "cpu") for i in range(10)}
    u = unify(STABLE, 10, canaries=[Canary("hw", CANARY, 3, hardware="gpu")],
              placed_on=placed)
    on = [i for i, r in enumerate(u.roles) if r == "canary:hw"]
    assert 3 in on and 7 in on and len(on) == 3
    third = next(i for i in on if i not in (3, 7))
    assert u.hardware == {third: "gpu"}  # to be placed on a gpu machine
    # once it is there, nothing is asked of it
    placed[third] = "gpu"
    again = unify(STABLE, 10, canaries=[Canary("hw", CANARY, 3, hardware="gpu")],
                  placed_on=placed, previous=u)
    assert again.roles == u.roles and not again.hardware


def test_what_cannot_be_satisfied_is_reported_not_guessed():
    u = unify(STABLE, 4, push=Push(PUSHED, Fraction(100)), canaries=[Canary("c", CANARY, 3)])
    assert u.count("canary:c") == 3 and u.count("push") == 1
    assert any("push" in c and "canaries leave 1" in c for c in u.conflicts)
    # canaries never take the whole job: one task at least runs its spec
    u = unify(STABLE, 2, canaries=[Canary("a", CANARY, 2), Canary("b", CANARY, 1)])
    assert u.count("canary:a") == 1 and u.count("canary:b") == 0 and u.count("stable") == 1
    assert any("canary a asks for 2 tasks; only 1" in c for c in u.conflicts)
    assert any("canary b" in c for c in u.conflicts)


def test_a_job_resized_below_its_canary_keeps_a_task_on_its_spec():
    # a canary of 9 tasks on a 5-task job ran the canary on every task: an ungated
    # push of the whole job
    u = unify(STABLE, 10, canaries=[Canary("c", CANARY, 9)])
    assert u.count("canary:c") == 9 and not u.conflicts
    u = unify(STABLE, 10, sizing=Sizing(5), canaries=[Canary("c", CANARY, 9)], previous=u)
    assert u.count("canary:c") == 4 and u.count("stable") == 1
    assert u.conflicts == ("canary c asks for 9 tasks; only 4 of the job's 5 are free of "
                           "other canaries (one at least runs the job's spec)",)
    assert unify(STABLE, 1, canaries=[Canary("c", CANARY, 1)]).roles == ("stable",)


def test_an_ended_canary_gives_its_tasks_back():
    u = unify(STABLE, 6, canaries=[Canary("c", CANARY, 2, until=100)], now=50)
    assert u.count("canary:c") == 2
    u = unify(STABLE, 6, canaries=[Canary("c", CANARY, 2, until=100)], now=100, previous=u)
    assert u.count("canary:c") == 0 and u.count("stable") == 6


intents = st.fixed_dictionaries({
    "base": st.integers(0, 40),
    "percent": st.none() | st.integers(0, 100),
    "canaries": st.lists(st.tuples(st.integers(1, 8), st.booleans()), max_size=3),
})


@settings(max_examples=300, deadline=None)
@given(first=intents, sizes=st.lists(st.integers(0, 60), min_size=1, max_size=6),
       types=st.lists(st.sampled_from(["cpu", "gpu"]), min_size=60, max_size=60))
def test_the_rules_hold_for_any_intents_and_any_resizes(first, sizes, types):
    push = None if first["percent"] is None else Push(PUSHED, Fraction(first["percent"]))
    canaries = [Canary(f"c{k}", CANARY + k, tasks, hardware="gpu" if hw else None)
                for k, (tasks, hw) in enumerate(first["canaries"])]
    placed = dict(enumerate(types))
    u = None
    for size in sizes:
        before = u
        u = unify(STABLE, first["base"], push=push, sizing=Sizing(size), canaries=canaries,
                  previous=before, placed_on=placed)
        assert u.task_count == len(u.roles) == len(u.versions) == size
        in_canaries = sum(u.count(f"canary:{c.name}") for c in canaries)
        assert in_canaries <= size
        for c in canaries:  # each canary gets its tasks, or says why not
            got = u.count(f"canary:{c.name}")
            assert got == c.tasks or any(f"canary {c.name}" in x for x in u.conflicts)
        if push is not None:  # the push's share of the whole job, or why not
            want = round_half_up(push.percent * size / 100)
            assert u.count("push") == min(want, size - in_canaries)
            assert u.count("push") == want or any("push" in x for x in u.conflicts)
        else:
            assert u.count("push") == 0
        for role, version in zip(u.roles, u.versions, strict=True):
            assert version == {"stable": STABLE, "push": PUSHED}.get(
                role, CANARY + int(role.removeprefix("canary:c")) if role.startswith("canary:")
                else -1)
        if before is not None:  # a resize moves no pushed task it need not move
            kept = {i for i, r in enumerate(before.roles[:size]) if r == "push"
                    and not u.roles[i].startswith("canary:")}
            now_pushed = {i for i, r in enumerate(u.roles) if r == "push"}
            assert kept <= now_pushed or len(now_pushed) < len(kept)
        # the same intents again move nothing
        again = unify(STABLE, first["base"], push=push, sizing=Sizing(size),
                      canaries=canaries, previous=u, placed_on=placed)
        assert again.roles == u.roles
