"""The AXI4-Lite control and status block, built by iterating the register map of :mod:`weft.hw.regs`.

Each field of the map becomes a port of this component, named after the field: a ``rw`` field is an
output holding what the driver wrote, ``w1s`` an output pulse, ``ro`` an input shown to the driver (64-bit
counters are one input shown through a LO/HI pair), ``w1c`` a sticky output set by the input
``<name>_set`` and cleared by writing 1 (or by the input ``<name>_clear``), ``const`` a value baked in.
Unmapped addresses answer SLVERR. Writes honour WSTRB byte by byte.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from weft.hw.axi import RESP_OKAY, axi4_lite_signature
from weft.hw.regs import DATA_BITS, addr_bits, register_map, register_widths

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["RESP_SLVERR", "ControlBlock"]

RESP_SLVERR = 2


class ControlBlock(wiring.Component):
    """AXI4-Lite slave exposing the accelerator's registers."""

    def __init__(self, config: AcceleratorConfig):
        self.regs = register_map(config)
        self.addr_bits = addr_bits(self.regs)
        widths = register_widths(config)
        access: dict[str, str] = {}
        for reg in self.regs:
            for f in reg.fields:
                if access.setdefault(f.name, f.access) != f.access:
                    raise ValueError(f"register field '{f.name}' appears with two access kinds")
        inits = {f.name: f.value for reg in self.regs for f in reg.fields if f.access == "rw"}
        members: dict[str, object] = {"bus": In(axi4_lite_signature(addr_bits=self.addr_bits))}
        for name, kind in access.items():
            if kind == "ro":
                members[name] = In(widths[name])
            elif kind == "rw":
                members[name] = Out(widths[name], init=inits[name])
            elif kind == "w1s":
                members[name] = Out(widths[name])
            elif kind == "w1c":
                members[name] = Out(widths[name])
                members[f"{name}_set"] = In(widths[name])
                members[f"{name}_clear"] = In(1)
        self.field_access = access
        super().__init__(members)

    def elaborate(self, platform: object) -> Module:
        m = Module()
        bus = self.bus
        word = bus.awaddr[2:]
        strobe = Cat(*[b.replicate(8) for b in bus.wstrb])
        do_write = bus.awvalid & bus.wvalid & ~bus.bvalid
        m.d.comb += [bus.awready.eq(do_write), bus.wready.eq(do_write)]
        with m.If(bus.bvalid & bus.bready):
            m.d.sync += bus.bvalid.eq(0)
        with m.If(do_write):
            m.d.sync += [bus.bvalid.eq(1), bus.bresp.eq(RESP_SLVERR)]

        # Pulses last one cycle; sticky flags are set by the hardware before a clearing write applies.
        for name, kind in self.field_access.items():
            if kind == "w1s":
                m.d.sync += getattr(self, name).eq(0)
            elif kind == "w1c":
                value, set_, clear = getattr(self, name), getattr(self, f"{name}_set"), getattr(self, f"{name}_clear")
                m.d.sync += value.eq(Mux(clear, 0, value) | set_)

        read_value = Signal(DATA_BITS)
        read_hit = Signal()
        with m.Switch(bus.araddr[2:]):
            for reg in self.regs:
                with m.Case(reg.offset >> 2):
                    parts = Const(0, DATA_BITS)
                    for f in reg.fields:
                        if f.access == "const":
                            value = Const(f.value, f.width)
                        elif f.access == "w1s":
                            value = Const(0, f.width)
                        else:
                            value = getattr(self, f.name)[f.source_lsb:f.source_lsb + f.width]
                        parts = parts | (value.as_unsigned() << f.lsb)
                    m.d.comb += [read_value.eq(parts), read_hit.eq(1)]
            with m.Default():
                m.d.comb += read_hit.eq(0)
        with m.Switch(word):
            for reg in self.regs:
                with m.Case(reg.offset >> 2):
                    with m.If(do_write):
                        m.d.sync += bus.bresp.eq(RESP_OKAY)
                        for f in reg.fields:
                            bits = bus.wdata[f.lsb:f.lsb + f.width]
                            mask = strobe[f.lsb:f.lsb + f.width]
                            target = getattr(self, f.name) if f.access not in ("ro", "const") else None
                            if f.access == "rw":
                                m.d.sync += target.eq((target & ~mask) | (bits & mask))
                            elif f.access == "w1s":
                                m.d.sync += target.eq(bits & mask)
                            elif f.access == "w1c":
                                m.d.sync += target.eq((target & ~(bits & mask)) | getattr(self, f"{f.name}_set"))

        do_read = bus.arvalid & ~bus.rvalid
        m.d.comb += bus.arready.eq(do_read)
        with m.If(bus.rvalid & bus.rready):
            m.d.sync += bus.rvalid.eq(0)
        with m.If(do_read):
            m.d.sync += [bus.rvalid.eq(1), bus.rdata.eq(read_value),
                         bus.rresp.eq(Mux(read_hit, RESP_OKAY, RESP_SLVERR))]
        return m
