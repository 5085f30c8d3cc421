"""AXI4 and AXI4-Lite interfaces, the internal read-client interface, and the read arbiter.

The accelerator has one AXI4 master to DRAM. Three units read (fetch, load, compute); each is a *read
client* with its own burst address stream and data stream, and the :class:`ReadArbiter` shares the AR
channel among them round-robin, tags each burst with the client's index as ARID and routes R beats back by
RID. A client only requests a burst when it can take every beat of it without waiting (see
:class:`weft.hw.dma.BurstReader`), so no client can hold the shared R channel hostage. The store unit is
the only writer and drives AW/W/B directly.

Signal names follow the AXI specification, so the flattened top-level ports read ``m_axi_araddr`` and so
on, as cocotbext-axi's ``AxiBus.from_prefix`` and vendor IP integrators expect.
"""

from __future__ import annotations

import operator
from functools import reduce

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from weft.isa.constants import AXI_ADDR_BITS, AXI_BOUNDARY_BYTES

__all__ = [
    "ADDR_BITS", "BOUNDARY_BITS", "BOUNDARY_BYTES", "BURST_INCR",
    "RESP_OKAY", "ReadArbiter", "axi4_lite_signature", "axi4_read_signature",
    "axi4_signature", "axi4_write_signature", "read_client_signature",
]

#: DRAM byte address width (owned by the ISA constants, which the runtime imports without amaranth).
ADDR_BITS = AXI_ADDR_BITS
#: No burst crosses a 4 KiB boundary: an address's low BOUNDARY_BITS are its offset within its 4 KiB page.
BOUNDARY_BYTES = AXI_BOUNDARY_BYTES
BOUNDARY_BITS = exact_log2(AXI_BOUNDARY_BYTES)
BURST_INCR = 1
RESP_OKAY = 0
#: AxCACHE "normal non-cacheable bufferable": safe on the Zynq HP ports.
CACHE_BITS = 0b0011


def axi4_read_signature(*, addr_bits: int, data_bits: int, id_bits: int) -> wiring.Signature:
    """AR and R channels of an AXI4 master."""
    return wiring.Signature({
        "arid": Out(id_bits), "araddr": Out(addr_bits), "arlen": Out(8), "arsize": Out(3),
        "arburst": Out(2), "arcache": Out(4), "arprot": Out(3), "arvalid": Out(1), "arready": In(1),
        "rid": In(id_bits), "rdata": In(data_bits), "rresp": In(2), "rlast": In(1), "rvalid": In(1),
        "rready": Out(1),
    })


def axi4_write_signature(*, addr_bits: int, data_bits: int, id_bits: int) -> wiring.Signature:
    """AW, W and B channels of an AXI4 master."""
    return wiring.Signature({
        "awid": Out(id_bits), "awaddr": Out(addr_bits), "awlen": Out(8), "awsize": Out(3),
        "awburst": Out(2), "awcache": Out(4), "awprot": Out(3), "awvalid": Out(1), "awready": In(1),
        "wdata": Out(data_bits), "wstrb": Out(data_bits // 8), "wlast": Out(1), "wvalid": Out(1),
        "wready": In(1),
        "bid": In(id_bits), "bresp": In(2), "bvalid": In(1), "bready": Out(1),
    })


def axi4_signature(*, addr_bits: int, data_bits: int, id_bits: int) -> wiring.Signature:
    """A whole AXI4 master, flat, with the specification's signal names."""
    members = dict(axi4_read_signature(addr_bits=addr_bits, data_bits=data_bits, id_bits=id_bits).members)
    members.update(axi4_write_signature(addr_bits=addr_bits, data_bits=data_bits, id_bits=id_bits).members)
    return wiring.Signature(members)


def axi4_lite_signature(*, addr_bits: int, data_bits: int = 32) -> wiring.Signature:
    """An AXI4-Lite master (flip it for the slave side)."""
    return wiring.Signature({
        "awaddr": Out(addr_bits), "awprot": Out(3), "awvalid": Out(1), "awready": In(1),
        "wdata": Out(data_bits), "wstrb": Out(data_bits // 8), "wvalid": Out(1), "wready": In(1),
        "bresp": In(2), "bvalid": In(1), "bready": Out(1),
        "araddr": Out(addr_bits), "arprot": Out(3), "arvalid": Out(1), "arready": In(1),
        "rdata": In(data_bits), "rresp": In(2), "rvalid": In(1), "rready": Out(1),
    })


def read_client_signature(*, addr_bits: int, data_bits: int) -> wiring.Signature:
    """What a unit that reads DRAM drives: bursts out (byte address, AXI len = beats - 1), beats in."""
    return wiring.Signature({
        "ar": Out(stream.Signature(data.StructLayout({"addr": addr_bits, "len": 8}))),
        "r": In(stream.Signature(data.StructLayout({"data": data_bits, "last": 1, "resp": 2}))),
    })


class ReadArbiter(wiring.Component):
    """Round-robin AR arbitration among `clients` read clients onto one AXI4 read channel.

    The granted request is registered (one cycle per burst), so ARVALID never depends on ARREADY. R
    beats go to the client named by RID; RREADY is that client's ready.
    """

    def __init__(self, *, clients: int, addr_bits: int, data_bits: int):
        if clients < 1:
            raise ValueError(f"ReadArbiter needs at least one client, got {clients}")
        self.n = clients
        self.id_bits = max(1, (clients - 1).bit_length())
        self.data_bits = data_bits
        super().__init__({
            "clients": In(read_client_signature(addr_bits=addr_bits, data_bits=data_bits)).array(clients),
            "axi": Out(axi4_read_signature(addr_bits=addr_bits, data_bits=data_bits, id_bits=self.id_bits)),
            "beats": Out(1),  # one R beat accepted this cycle
        })

    def elaborate(self, platform: object) -> Module:
        m = Module()
        axi, n = self.axi, self.n
        busy = Signal()
        last_grant = Signal(range(n))
        m.d.comb += [
            axi.arsize.eq((self.data_bits // 8 - 1).bit_length()),
            axi.arburst.eq(BURST_INCR),
            axi.arcache.eq(CACHE_BITS),
            axi.arvalid.eq(busy),
        ]
        with m.If(busy & axi.arready):
            m.d.sync += busy.eq(0)
        # Round robin: the first requesting client after the last one granted. Each client's ready is written
        # out on its own (no client ahead of it in the round's order requests), and the granted request is
        # taken by AND-OR of the takes, which are one-hot: no encoded grant lies ahead of the address's
        # multiplexer and its registers (the grant's encode and the select's decode, after every client's
        # request, were among tiny's longest paths after nextpnr), and the address registers load whenever
        # the channel is free (what they hold then counts only once ARVALID rises).
        order = [[(last + step) % n for step in range(1, n + 1)] for last in range(n)]
        takes = []
        for k in range(n):
            ahead = [Cat(*[self.clients[j].ar.valid for j in order[last][:order[last].index(k)]]).any()
                     for last in range(n)]
            m.d.comb += self.clients[k].ar.ready.eq(~busy & ~Cat(*ahead).bit_select(last_grant, 1))
            takes.append(self.clients[k].ar.valid & self.clients[k].ar.ready)
        grant = Signal(range(n))
        m.d.comb += grant.eq(reduce(operator.or_, [Mux(take, k, 0) for k, take in enumerate(takes)]))
        with m.If(Cat(*takes).any()):
            m.d.sync += [busy.eq(1), last_grant.eq(grant), axi.arid.eq(grant)]
        with m.If(~busy):
            for field, target in (("addr", axi.araddr), ("len", axi.arlen)):
                m.d.sync += target.eq(reduce(operator.or_, [
                    getattr(self.clients[k].ar.payload, field) & takes[k].replicate(len(target))
                    for k in range(n)]))
        # R: route by RID.
        for k in range(n):
            r = self.clients[k].r
            m.d.comb += [
                r.payload.data.eq(axi.rdata), r.payload.last.eq(axi.rlast), r.payload.resp.eq(axi.rresp),
                r.valid.eq(axi.rvalid & (axi.rid == k)),
            ]
        m.d.comb += axi.rready.eq(Mux(axi.rid < n, Cat(*[self.clients[k].r.ready for k in range(n)])
                                      .bit_select(axi.rid, 1), 1))
        m.d.comb += self.beats.eq(axi.rvalid & axi.rready)
        return m
