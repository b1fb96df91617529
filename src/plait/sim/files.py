"""Scenario files: ``plait sim run FILE [--plot out.png]``.

A scenario file is YAML with a ``scenario`` key naming its kind; the rest are the
kind's parameters, validated strictly (an unknown key is an error that names it).
Each kind runs on the simulated clock, returns one flat dict of figures (printed as
one JSON object) and can draw its plot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plait.errors import ValidationError
from plait.model.base import Value, parse


@dataclass(frozen=True)
class Kind:
    model: type[Value]
    #: (scenario, progress) -> (figures, plot(path))
    run: Callable[[Any, Callable[[float], None] | None],
                  tuple[dict[str, Any], Callable[[str], None]]]


def _diurnal(scn: Any, progress: Callable[[float], None] | None
             ) -> tuple[dict[str, Any], Callable[[str], None]]:
    from plait.sim import diurnal

    result = diurnal.run(scn, progress)
    return result.figures, lambda path: diurnal.plot(result, path)


def _week(scn: Any, progress: Callable[[float], None] | None
          ) -> tuple[dict[str, Any], Callable[[str], None]]:
    from plait.sim import autoscale

    result = autoscale.run(scn, progress)
    return result.figures, lambda path: autoscale.plot(result, path)


def _surge(scn: Any, progress: Callable[[float], None] | None
           ) -> tuple[dict[str, Any], Callable[[str], None]]:
    from plait.sim import surge

    result = surge.run(scn, progress)
    return result.figures, lambda path: surge.plot(result, path)


def _fig14(scn: Any, progress: Callable[[float], None] | None
           ) -> tuple[dict[str, Any], Callable[[str], None]]:
    from plait.sim import fig14

    result = fig14.run(scn, progress)
    return result.figures, lambda path: fig14.plot(result, path)


def _release_day(scn: Any, progress: Callable[[float], None] | None
                 ) -> tuple[dict[str, Any], Callable[[str], None]]:
    from plait.sim import releaseday

    result = releaseday.run(scn, progress)
    return result.figures, lambda path: releaseday.plot(result, path)


def _kinds() -> dict[str, Kind]:
    from plait.sim.autoscale import AutoscaleWeek
    from plait.sim.diurnal import Diurnal
    from plait.sim.fig14 import Fig14
    from plait.sim.releaseday import ReleaseDay
    from plait.sim.surge import Surge

    return {"diurnal": Kind(Diurnal, _diurnal), "autoscale-week": Kind(AutoscaleWeek, _week),
            "surge": Kind(Surge, _surge), "fig14": Kind(Fig14, _fig14),
            "release-day": Kind(ReleaseDay, _release_day)}


def load(path: Path, overrides: dict[str, Any] | None = None) -> tuple[Kind, Value]:
    """The scenario in ``path`` (with ``overrides`` of its top-level parameters)."""
    import yaml

    try:
        from plait.yamlfloats import with_floats

        doc = yaml.load(path.read_text(), Loader=with_floats(yaml.SafeLoader))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValidationError("file", f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ValidationError("file", f"{path}: not valid YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise ValidationError("file", f"{path}: a scenario is a mapping with a "
                                      "'scenario' key")
    kinds = _kinds()
    name = doc.get("scenario")
    kind = kinds.get(name) if isinstance(name, str) else None
    if kind is None:
        raise ValidationError("scenario", f"{path}: scenario {name!r} is not one of "
                                          f"{', '.join(sorted(kinds))}")
    return kind, parse(kind.model, {**doc, **(overrides or {})})
