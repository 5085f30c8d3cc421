"""A FIFO whose read data leaves a fabric register, not a block RAM's output.

An ECP5 block RAM (DP16KD, which Yosys maps without its output register) has its read data 5.8 ns after
the clock edge (nextpnr-ecp5, speed grade 6): any logic between it and the next register put tiny's paths
from the burst readers' buffers and the command queues past 10 ns. Kept in LUT RAM, whose asynchronous read
feeds the read port's register in the fabric, the same FIFO gives its data a register's clock-to-out, cycle
for cycle as before.

Whether the storage holds an entry and whether it has room are registers too, kept beside its level: as
compares of the level (as :class:`amaranth.lib.fifo.SyncFIFOBuffered` has them) they lay ahead of the read
port's enable, whose fan-out is every bit of the data register, on the longest paths of tiny's burst readers
after nextpnr (1a2b4b4). The data register's enable does not wait on them at all: it loads whenever its
entry is not held (the read data count only while ``r_rdy`` is high), so the enable's fan-out and the
storage's flags need not be placed together (their round trip across the die was tiny's longest path after
nextpnr at 98777fe).
"""

from __future__ import annotations

from amaranth import Const, Module, Mux, Signal
from amaranth.hdl import Value
from amaranth.lib import fifo
from amaranth.lib.memory import Memory

__all__ = ["LutFIFO"]


def _next(pointer: Signal, modulo: int) -> Value:
    return pointer + 1 if modulo == 2 ** len(pointer) else Mux(pointer == modulo - 1, 0, pointer + 1)


class LutFIFO(fifo.SyncFIFOBuffered):
    """:class:`amaranth.lib.fifo.SyncFIFOBuffered`'s ports and cycles (a write into an empty queue is read
    two cycles later), with its storage kept in LUT RAM (Yosys' ``ram_style`` attribute, which synth_ecp5 and
    synth_xilinx honour) and its storage's full and empty flags kept in registers."""

    def elaborate(self, platform: object) -> Module:
        if self.depth < 2:  # (a register without storage: nothing to keep in LUT RAM)
            return super().elaborate(platform)
        m = Module()
        inner_depth = self.depth - 1
        inner_level = Signal(range(inner_depth + 1))
        holds = Signal()  # inner_level != 0
        room = Signal(init=1)  # inner_level != inner_depth
        do_write = self.w_en & room
        do_read = holds & (~self.r_rdy | self.r_en)  # an entry moves into the data register
        m.d.comb += [self.w_rdy.eq(room), self.level.eq(inner_level + self.r_rdy),
                     self.w_level.eq(self.level), self.r_level.eq(self.level)]

        m.submodules.storage = storage = Memory(shape=self.width, depth=inner_depth, init=[])
        storage.attrs["ram_style"] = "distributed"
        w_port, r_port = storage.write_port(), storage.read_port(domain="sync")
        produce, consume = Signal(range(inner_depth)), Signal(range(inner_depth))
        # The storage is written whenever it has room, an entry or not: `produce` names a free entry then
        # (never the one `consume` reads while the storage holds any), and only a write moves it on. Its
        # enable is a register, not the producer's valid (fetch's dispatch through the write's AND into the
        # enables of store_queue's LUT RAM, a long route to each, failed 100 MHz after nextpnr at bd8ef8e).
        m.d.comb += [w_port.addr.eq(produce), w_port.data.eq(self.w_data), w_port.en.eq(room),
                     r_port.addr.eq(consume), r_port.en.eq(~self.r_rdy | self.r_en), self.r_data.eq(r_port.data)]
        with m.If(do_write):
            m.d.sync += produce.eq(_next(produce, inner_depth))
        with m.If(do_read):
            m.d.sync += consume.eq(_next(consume, inner_depth))
        # The read state's next values (the level's picked by AND-OR from its sums, which start from the
        # register alone; the flags as ORs, not a multiplexer on the read and write, which Yosys made a
        # synchronous set on the flip-flop's set/reset input) are worked out from the registers for each of the
        # producer's and the consumer's choices, and the write and the take (the fetch's dispatch, a unit's
        # start after its token checks) pick one as the last step: through the read or the write into the sums
        # and flags they failed 100 MHz after nextpnr at 66d9af1 and 7f9ca06 (compute_queue, store_queue).
        # The four outcomes are kept wires (Yosys' `keep`), so that the pick is all that follows the write and
        # the take: left to ABC, the take went into a LUT ahead of the pick (a unit's start through it into
        # store_queue's and compute_queue's level, the default seed's longest paths after nextpnr at de4d77b).
        bits = len(inner_level)
        up, down = Signal.like(inner_level), Signal.like(inner_level)
        m.d.comb += [up.eq(inner_level + 1), down.eq(inner_level - 1)]

        def after(write: Value, read: Value) -> list[Value]:
            """The level, room and holds after a cycle in which an entry moves in (`write`) and out (`read`)."""
            return [(up & (write & ~read).replicate(bits)) | (down & (read & ~write).replicate(bits))
                    | (inner_level & ~(write ^ read).replicate(bits)),
                    read | (room & ~(write & (inner_level == inner_depth - 1))),
                    write | (holds & ~(read & (inner_level == 1)))]

        # (written: an entry moves in where there is room; taken: one moves out whenever the storage holds one,
        # else only into an empty data register)
        outcomes = {(w, r): after(room if w else Const(0), holds if r else holds & ~self.r_rdy)
                    for w in (0, 1) for r in (0, 1)}
        for k, reg in enumerate([inner_level, room, holds]):
            value = {}
            for (w, r), values in outcomes.items():
                value[w, r] = Signal(reg.shape(), name=f"{reg.name}_{w}{r}", attrs={"keep": 1})
                m.d.comb += value[w, r].eq(values[k])
            m.d.sync += reg.eq(Mux(self.w_en, Mux(self.r_en, value[1, 1], value[1, 0]),
                                   Mux(self.r_en, value[0, 1], value[0, 0])))
        m.d.sync += self.r_rdy.eq(Mux(self.r_en, holds, holds | self.r_rdy))
        return m
