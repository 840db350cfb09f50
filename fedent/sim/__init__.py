"""The in-process simulator: the round engine over the sequential executor, and its progress bar."""

from fedent.sim.simulator import SimResult, SimulationError, run_simulation

__all__ = ["SimResult", "SimulationError", "run_simulation"]
