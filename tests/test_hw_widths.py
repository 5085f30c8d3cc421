# amaranth: UnusedElaboratable=no
"""The hardware's widths are the ISA's and the register map's: every DMA command field is as wide as the
instruction field it carries, every port that carries a register value is as wide as the register field,
and a wider ISA field makes the hardware follow (nothing truncates it on the way)."""

from __future__ import annotations

import dataclasses

import pytest
from amaranth import Shape, signed, unsigned
from amaranth.hdl import Fragment
from amaranth.sim import Simulator

from weft.config import PRESETS
from weft.hw.compute import ComputeUnit
from weft.hw.control import ControlBlock
from weft.hw.dma import Load2D, Store2D
from weft.hw.fetch import Fetch
from weft.hw.load import LoadUnit
from weft.hw.regs import COUNTERS, register_widths
from weft.hw.store import StoreUnit
from weft.hw.top import Core
from weft.isa import Field, Format, IsaLayout, MemId, Opcode, layout_of
from weft.isa.constants import INSN_BITS

#: Ports that carry an instruction index without being named after a register: ERROR_INDEX shows them.
_INDEX_PORTS = ("head_index", "finish_index")


def _shape(field: Field) -> Shape:
    return signed(field.width) if field.signed else unsigned(field.width)


def _dma(unit):
    """The unit's DMA engine, as its elaborate builds it."""
    module = unit.elaborate(None)
    Fragment.get(module, None)  # elaborate the submodules too, so none is left unused
    return module.submodules["dma"]


def _units(config):
    return LoadUnit(config), ComputeUnit(config), StoreUnit(config)


@pytest.mark.parametrize("name", list(PRESETS))
def test_each_dma_command_field_is_the_isa_field_it_carries(name):
    config = PRESETS[name]
    mem = layout_of(config).formats["mem"]
    for unit in _units(config):
        dma = _dma(unit)
        members = dma.cmd_layout.members
        carried = [f for f in mem.fields if f.name in members]
        assert {f.name for f in carried} == set(members) - {"target"}, type(unit).__name__
        for f in carried:
            assert Shape.cast(members[f.name]) == _shape(f), (type(unit).__name__, f.name)
        sram_port = dma.write.addr if isinstance(dma, Load2D) else dma.rd_addr
        assert len(sram_port) == mem.field("sram_base").width
        assert len(unit.cmd.payload.insn) == mem.bits == INSN_BITS


@pytest.mark.parametrize("name", list(PRESETS))
def test_each_port_that_carries_a_register_value_is_as_wide_as_its_field(name):
    config = PRESETS[name]
    widths = register_widths(config)
    counters = {name for name, _ in COUNTERS}
    components = [Core(config), Fetch(config), *_units(config), ControlBlock(config)]
    for component in components:
        members = component.signature.members
        carried = [reg for reg in widths if reg in members]
        assert carried, type(component).__name__
        for reg in carried:
            # A unit port named after a counter is the one-bit event the Core counts.
            event = reg in counters and not isinstance(component, (Core, ControlBlock))
            want = 1 if event else widths[reg]
            assert Shape.cast(members[reg].shape) == unsigned(want), (type(component).__name__, reg)
        for port in _INDEX_PORTS:
            if port in members:
                assert Shape.cast(members[port].shape) == unsigned(widths["error_index"]), port
        if "cmd" in members:  # a unit: fetch hands it the instruction's index
            assert len(component.cmd.payload.index) == widths["error_index"]
    for queue in Fetch(config).queues:
        assert len(queue.payload.index) == widths["error_index"]
    assert widths["insn_addr"] == len(Core(config).axi.araddr)


def _widened(fmt: Format, name: str, extra: int) -> Format:
    """`fmt` with field `name` `extra` bits wider and the fields above it moved up, as the ISA packs them."""
    fields, lsb = [], 0
    for f in fmt.fields:
        width = f.width + extra if f.name == name else f.width
        fields.append(dataclasses.replace(f, width=width, lsb=lsb))
        lsb += width
    widened = Format(fmt.name, tuple(fields), fmt.bits)
    assert widened.used_bits <= widened.bits
    return widened


@pytest.mark.parametrize("field", ["dram_base", "x_stride", "y_pad_1", "sram_base", "x_size"])
def test_a_wider_isa_field_widens_the_dma_commands(field):
    mem = _widened(layout_of(PRESETS["tiny"]).formats["mem"], field, 1)
    load = Load2D(bus_bytes=8, targets=(16, 4), mem_format=mem)
    store = Store2D(bus_bytes=8, elem_bytes=16, mem_format=mem)
    for dma in (load, store):
        members = dma.cmd_layout.members
        if field in members:
            assert Shape.cast(members[field]).width == mem.field(field).width
        Fragment.get(dma, None)  # still elaborates


def test_a_wider_isa_field_reaches_the_load_dma_untruncated(monkeypatch):
    """A layout whose x_stride is one bit wider (built here: IsaLayout has no knob for it) runs through the
    load unit: the DMA command gets the full value of the instruction's field."""
    config = PRESETS["tiny"]
    layout = IsaLayout(config)
    layout.formats["mem"] = mem = _widened(layout.formats["mem"], "x_stride", 1)
    monkeypatch.setattr("weft.hw.unit.layout_of", lambda _config: layout)
    unit = LoadUnit(config)
    module = unit.elaborate(None)
    dma = module.submodules["dma"]
    stride = (1 << (mem.field("x_stride").width - 1)) | 3  # only the widened top bit tells it apart
    fields = {"opcode": Opcode.LOAD, "mem_id": MemId.INP, "y_size": 1, "x_size": 1, "x_stride": stride,
              "dram_base": 5}
    word = sum(int(value) << mem.field(name).lsb for name, value in fields.items())
    seen = []

    async def bench(ctx):
        ctx.set(unit.cmd.payload.insn, word)
        ctx.set(unit.cmd.valid, 1)
        for _ in range(4):
            await ctx.tick()
            ctx.set(unit.cmd.valid, 0)
            if ctx.get(dma.cmd.valid):
                seen.append(ctx.get(dma.cmd.payload.x_stride))

    sim = Simulator(module)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert seen and seen[0] == stride
