"""What an agent does to converge its machine to its desired task set (pure).

Both agents, the real one (``plait.agent.daemon``) and the simulated one
(``plait.sim.agents``), decide with ``converge`` which tasks to stop and which to
start; only how they stop and start them differs. Stopping what is no longer
assigned here is the agent's fence: a task moved away while this machine was cut
off is stopped as soon as the agent hears its desired set again, so two copies of
a task never serve for long.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Converge(Generic[K]):
    #: held here and no longer assigned: stop them, forget them (the fence)
    remove: tuple[K, ...]
    #: held at another revision than assigned: stop them, then start the new one
    replace: tuple[K, ...]
    #: assigned and not held: start them
    add: tuple[K, ...]


def converge(have: Mapping[K, int], want: Mapping[K, int]) -> Converge[K]:
    """``have`` and ``want``: task -> revision, as held and as assigned."""
    return Converge(
        remove=tuple(k for k in have if k not in want),
        replace=tuple(k for k, rev in have.items() if k in want and want[k] != rev),
        add=tuple(k for k in want if k not in have),
    )
