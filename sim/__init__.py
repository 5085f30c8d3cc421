"""weft.sim: the functional simulator (the bit-exact oracle of the ISA), random legal programs for
cosimulation, and benchmarks. Imports with numpy alone."""

from weft.sim.dram import Dram
from weft.sim.fsim import DeadlockError, FunctionalSimulator, RaceError, SimError, run_program

__all__ = ["DeadlockError", "Dram", "FunctionalSimulator", "RaceError", "SimError", "run_program"]
