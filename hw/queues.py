"""A FIFO whose read data leaves a fabric register, not a block RAM's output.

An ECP5 block RAM (DP16KD, which Yosys maps without its output register) has its read data 5.8 ns after
the clock edge (nextpnr-ecp5, speed grade 6): any logic between it and the next register put tiny's paths
from the burst readers' buffers and the command queues past 10 ns. Kept in LUT RAM, whose asynchronous read
feeds the read port's register in the fabric, the same FIFO gives its data a register's clock-to-out, cycle
for cycle as before.
"""

from __future__ import annotations

from amaranth import Module
from amaranth.lib import fifo

__all__ = ["LutFIFO"]


class LutFIFO(fifo.SyncFIFOBuffered):
    """:class:`amaranth.lib.fifo.SyncFIFOBuffered` with its storage kept in LUT RAM (Yosys' ``ram_style``
    attribute, which synth_ecp5 and synth_xilinx honour): the same ports and cycles."""

    def elaborate(self, platform: object) -> Module:
        m = super().elaborate(platform)
        if self.depth > 1:  # (a depth of 1 is a register, without storage)
            m.submodules.storage.attrs["ram_style"] = "distributed"
        return m
