"""The simulated world: the same core on a discrete-event clock."""

from plait.sim.agents import Behaviour, SimAgent, default_behaviour
from plait.sim.harness import Simulation

__all__ = ["Behaviour", "SimAgent", "Simulation", "default_behaviour"]
