"""The in-process simulator (one process, one reused model) and the multi-algorithm comparison."""

from fedent.sim.simulator import SimResult, SimulationError, run_simulation

__all__ = ["SimResult", "SimulationError", "run_simulation"]
