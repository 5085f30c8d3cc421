"""DRAM latency and bandwidth: one definition for the cocotb DRAM model and the timing model.

The cosimulation's DRAM (:mod:`weft.sim.cocotb_tb.dram`) answers with these numbers, and the timing model
(:mod:`weft.sim.timing`) predicts cycle counts from the same ones, so the two can never drift apart. This
module imports nothing beyond the standard library: the timing model runs where cocotb is not installed.

The Pynq-Z1 numbers (:data:`TIMINGS` "pynq", :meth:`DramTiming.pynq_z1`): the xc7z020's PL reaches DDR3
through a 64-bit AXI HP port at the 100 MHz PL clock (800 MB/s at one beat per cycle). Published HP-port
measurements on Zynq-7000 sustain about 600-700 MB/s per port and see a read latency of roughly 250-350 ns
from AR to first beat; we take 32 cycles (320 ns) of read latency, 16 cycles from the last write beat to
the B response, and 3 beats out of 4 cycles (600 MB/s) on both R and W.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["TIMINGS", "DramTiming"]


@dataclass(frozen=True)
class DramTiming:
    """Latency in clock cycles; ``*_duty`` is the share of cycles a beat may move (1.0: every cycle);
    ``random_stalls`` replaces the fixed duty pattern by seeded random pauses (stress tests)."""

    read_latency: int = 0
    write_latency: int = 0
    read_duty: float = 1.0
    write_duty: float = 1.0
    random_stalls: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("read_latency", "write_latency"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"DramTiming.{name} must be a non-negative number of cycles, got {value!r}")
        for name in ("read_duty", "write_duty"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise ValueError(f"DramTiming.{name} must be within (0, 1], got {value!r}")

    @classmethod
    def pynq_z1(cls) -> DramTiming:
        """The Pynq-Z1 HP port (see the module docstring)."""
        return TIMINGS["pynq"]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


TIMINGS: dict[str, DramTiming] = {
    "ideal": DramTiming(),
    "pynq": DramTiming(read_latency=32, write_latency=16, read_duty=0.75, write_duty=0.75),
    "stress": DramTiming(read_latency=9, write_latency=5, read_duty=0.6, write_duty=0.6, random_stalls=True),
}
