"""The store unit: STORE OUT, the output buffer to DRAM with AXI4 burst writes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from amaranth import Module, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from weft.hw.axi import ADDR_BITS, axi4_write_signature
from weft.hw.dma import Store2D
from weft.hw.unit import UnitBase, request_dma_once
from weft.isa.encoding import layout_of

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["StoreUnit"]


class StoreUnit(UnitBase):
    """Runs the store unit's instructions; reads the out buffer through ``out_addr``/``out_data`` (one
    cycle latency). A STORE with x_size == 0 moves nothing and only carries its dependency flags."""

    def __init__(self, config: AcceleratorConfig):
        c = config
        self.config = c
        self.layout = layout_of(c)
        super().__init__(
            flags={"pop_prev": "g2s", "push_prev": "s2g"},
            members={
                "axi": Out(axi4_write_signature(addr_bits=ADDR_BITS, data_bits=c.bus_width, id_bits=1)),
                "out_addr": Out(c.acc_index_bits), "out_data": In(c.out_row_bits),
                "error": Out(1), "error_index": Out(32), "beats": Out(1),
            },
        )

    def elaborate(self, platform: object) -> Module:
        m = Module()
        c, layout = self.config, self.layout
        done = Signal()
        insn, index, start = self.gate(m, layout.formats["finish"].as_struct_layout(), done)
        f = data.View(layout.formats["mem"].as_struct_layout(), insn)
        m.submodules.dma = dma = Store2D(bus_bytes=c.bus_width // 8, elem_bytes=c.out_row_bits // 8,
                                         sram_bits=layout.sram_bits, size_bits=layout.size_bits)
        wiring.connect(m, wiring.flipped(self.axi), dma.axi)
        over = request_dma_once(m, dma, self.busy, f.x_size, start)
        m.d.comb += [
            *[getattr(dma.cmd.payload, name).eq(getattr(f, name)) for name in (
                "sram_base", "dram_base", "y_size", "x_size", "x_stride")],
            self.out_addr.eq(dma.rd_addr), dma.rd_data.eq(self.out_data), self.beats.eq(dma.beats),
        ]
        with m.If(dma.error & ~self.error):
            m.d.sync += [self.error.eq(1), self.error_index.eq(index)]
        m.d.comb += done.eq(self.busy & over)
        return m
