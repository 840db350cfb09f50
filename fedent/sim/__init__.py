"""The in-process simulator (one process, one reused model) and the multi-algorithm comparison."""

from fedent.sim.inputs import SimInputs, load_inputs
from fedent.sim.simulator import SimResult, SimulationError, run_simulation

__all__ = ["SimInputs", "SimResult", "SimulationError", "load_inputs", "run_simulation"]
