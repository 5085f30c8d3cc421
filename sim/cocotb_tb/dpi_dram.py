"""The testbench's handle on the DRAM model inside the design (``weft_sim``, :mod:`weft.sim.dram_model`): its
memory is the image file mapped here too, its counts and its hold input are ports of the top level, and the
rules broken are lines of its log. The same methods as :class:`weft.sim.cocotb_tb.dram.DramModel`'s."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from weft.sim.dram_model import open_image

__all__ = ["DpiDram"]


class DpiDram:
    """The dpi model of `dut` (a ``weft_sim``) over the `size`-byte image file `image`, logging to `log`."""

    def __init__(self, dut: Any, *, image: Path, log: Path, size: int):
        self.dut, self.log = dut, log
        self.mem = open_image(image, size)
        self._seen = 0
        dut.dram_hold.value = 0

    @property
    def read_bursts(self) -> int:
        return int(self.dut.dram_read_bursts.value)

    @property
    def write_bursts(self) -> int:
        return int(self.dut.dram_write_bursts.value)

    def set_faults(self, ranges: list[tuple[int, int]]) -> None:
        if ranges:
            raise ValueError("the dpi DRAM model injects no bus errors: run fault ranges on the axiram model")

    def take_violations(self) -> list[str]:
        """The rules broken since the last take."""
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        taken, self._seen = lines[self._seen:], len(lines)
        return taken

    def hold(self) -> None:
        """Stop answering reads (a stuck bus, for watchdog tests) for the rest of the simulation."""
        self.dut.dram_hold.value = 1
