"""`plait bench gates` runs both phases and reports every figure the issue names
(figures are not asserted, only that every push of the owners without tarpits
completed in each phase and the tarpit owner's pushes were cut off, not held)."""

from plait.bench import gates


def test_the_gates_bench_completes_every_push_and_reports_its_figures():
    figures = gates.run(jobs=20, owners=2, tarpits=2, rate=10.0, machines=20, timeout=120)
    # (the second phase pushes the tarpit jobs too, behind gates that answer)
    assert figures["pushes_completed"] == figures["pushes"] == 18 + 20, figures
    for key in ("gates_per_s", "other_owners_push_stage_p99_s",
                "other_owners_push_stage_p99_s_without_tarpits",
                "tarpit_owner_push_stage_p99_s"):
        assert isinstance(figures[key], float) and figures[key] > 0, (key, figures)
    assert figures["tarpits"] == 2
