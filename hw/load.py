"""The load unit: LOAD INP and LOAD WGT, 2-D strided DMA from DRAM with zero padding (inp only)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from amaranth import Module, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import Out

from weft.hw.axi import ADDR_BITS, read_client_signature
from weft.hw.dma import Load2D
from weft.hw.regs import register_widths
from weft.hw.unit import UnitBase, request_dma_once
from weft.isa.constants import MemId, Unit
from weft.isa.semantics import row_bytes

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["LoadUnit"]

_WGT, _INP = range(2)


class LoadUnit(UnitBase):
    """Runs the load unit's instructions; writes the inp and wgt buffers through ``inp_w`` and ``wgt_w``.

    A LOAD with x_size == 0 moves nothing and only carries its dependency flags.
    """

    def __init__(self, config: AcceleratorConfig):
        c = config
        super().__init__(c, Unit.LOAD, {
            "bus": Out(read_client_signature(addr_bits=ADDR_BITS, data_bits=c.bus_width)),
            "inp_w": Out(data.StructLayout({"en": 1, "addr": c.inp_index_bits, "data": c.inp_row_bits})),
            "wgt_w": Out(data.StructLayout({"en": 1, "addr": c.wgt_index_bits, "data": c.wgt_row_bits})),
            "error": Out(1), "error_index": Out(register_widths(c)["error_index"]),
        })

    def elaborate(self, platform: object) -> Module:
        m = Module()
        c = self.config
        done = Signal()
        insn, index, start, moves = self.gate(m, done)
        f = self.view(insn, "mem")
        rows = row_bytes(c)
        m.submodules.dma = dma = Load2D(bus_bytes=c.bus_width // 8, targets=(rows[MemId.WGT], rows[MemId.INP]),
                                        mem_format=self.layout.formats["mem"])
        wiring.connect(m, wiring.flipped(self.bus), dma.bus)
        over = request_dma_once(m, dma, self.busy, f, start, moves, target=f.mem_id == MemId.INP)
        m.d.comb += [
            self.inp_w.en.eq(dma.write.en & (dma.write.target == _INP)),
            self.inp_w.addr.eq(dma.write.addr), self.inp_w.data.eq(dma.write.data),
            self.wgt_w.en.eq(dma.write.en & (dma.write.target == _WGT)),
            self.wgt_w.addr.eq(dma.write.addr), self.wgt_w.data.eq(dma.write.data),
        ]
        with m.If(dma.error & ~self.error):
            m.d.sync += [self.error.eq(1), self.error_index.eq(index)]
        m.d.comb += done.eq(self.busy & over)
        return m
