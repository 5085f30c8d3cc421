"""Buffers whose reads never use what a read returns in the cycle its row is written.

Amaranth's synchronous read port returns a row's old data when a write port writes the row in the read's
cycle. ECP5's pseudo-dual-port block RAM (PDPW16KD) leaves that output undefined, so Yosys emulates the old
data in the fabric: every write delayed a cycle, the read address compared with the delayed write's, and the
delayed data multiplexed after the RAM's output, on every bit of the row. On tiny the compare lay on the
accumulator's read address after the ALU pipe's row sum (10.5 ns after nextpnr at 2f70b8f), and the
multiplexers on every bank's data.

The buffers here never use such a read: the accumulator's pipes take the row their own F stage writes in the
read's cycle from a forward (:meth:`weft.hw.compute.ComputeUnit._datapath`), and the two pipes' rows lie in
different banks (spec "beside"); the out buffer is read by the store unit only after the token its writer
pushes as the instruction ends, and inp and wgt by the compute unit only after the load's token, their
writers' next rows (virtual threads) lying elsewhere. Yosys' ``no_rw_check`` attribute says so: the read port
returns a don't-care value on a collision, and no emulation is built.

That the design never uses those values is checked, not assumed: with `garble` the generator inverts a read's
data in the cycle after a collision on its port, and the cosimulations pass unchanged
(``tests/test_cosim_tiny.py``).
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.hdl import Value
from amaranth.lib import memory

__all__ = ["collision_free", "read_data"]


def collision_free(mem: memory.Memory) -> memory.Memory:
    """Mark `mem`'s reads as never used in the cycle a write port writes their row (Yosys ``no_rw_check``)."""
    mem.attrs["no_rw_check"] = 1
    return mem


def read_data(m: Module, rp: memory.ReadPort, wp: memory.WritePort, *, garble: bool, name: str) -> Value:
    """`rp`'s data; with `garble`, inverted where `wp` wrote the row read in the read's cycle (a test's check
    that nothing uses it, as the hardware leaves it undefined)."""
    if not garble:
        return rp.data
    collided = Signal(name=f"{name}_collided")
    m.d.sync += collided.eq(rp.en & wp.en & (wp.addr == rp.addr))
    return Mux(collided, ~rp.data, rp.data)
