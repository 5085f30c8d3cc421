"""The store unit: STORE OUT, the output buffer to DRAM with AXI4 burst writes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from amaranth import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from weft.hw.axi import ADDR_BITS, axi4_write_signature
from weft.hw.dma import Store2D
from weft.hw.regs import register_widths
from weft.hw.unit import UnitBase, request_dma_once
from weft.isa.constants import MemId, Unit
from weft.isa.semantics import row_bytes

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["StoreUnit"]


class StoreUnit(UnitBase):
    """Runs the store unit's instructions; reads the out buffer through ``out_addr``/``out_data`` (one
    cycle latency). A STORE with x_size == 0 moves nothing and only carries its dependency flags."""

    def __init__(self, config: AcceleratorConfig):
        c = config
        super().__init__(c, Unit.STORE, {
            "axi": Out(axi4_write_signature(addr_bits=ADDR_BITS, data_bits=c.bus_width, id_bits=1)),
            "out_addr": Out(c.acc_index_bits), "out_data": In(c.out_row_bits),
            "error": Out(1), "error_index": Out(register_widths(c)["error_index"]), "beats": Out(1),
        })

    def elaborate(self, platform: object) -> Module:
        m = Module()
        c = self.config
        done = Signal()
        insn, index, start, moves = self.gate(m, done)
        m.submodules.dma = dma = Store2D(bus_bytes=c.bus_width // 8, elem_bytes=row_bytes(c)[MemId.OUT],
                                         mem_format=self.layout.formats["mem"])
        wiring.connect(m, wiring.flipped(self.axi), dma.axi)
        over = request_dma_once(m, dma, self.busy, self.view(insn, "mem"), start, moves)
        m.d.comb += [self.out_addr.eq(dma.rd_addr), dma.rd_data.eq(self.out_data), self.beats.eq(dma.beats)]
        with m.If(dma.error & ~self.error):
            m.d.sync += [self.error.eq(1), self.error_index.eq(index)]
        m.d.comb += done.eq(self.busy & over)
        return m
