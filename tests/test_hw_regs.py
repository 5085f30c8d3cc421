"""The register map (data, importable without amaranth), its place in the spec and header, and the
AXI-Lite control block built from it (Amaranth simulator)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from amaranth.sim import Simulator

from weft.config import PRESETS
from weft.hw.control import RESP_SLVERR, ControlBlock
from weft.hw.regs import COUNTERS, HW_VERSION, ErrorCode, register_map, registers_spec
from weft.isa import c_header, isa_spec


def test_register_map_imports_without_amaranth():
    code = textwrap.dedent("""
        import sys
        from weft.config import PRESETS
        from weft.hw.regs import register_map, registers_spec
        registers_spec(PRESETS["default"])
        assert "amaranth" not in sys.modules
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_register_map_is_word_aligned_and_carries_the_config_hash():
    config = PRESETS["default"]
    regs = register_map(config)
    offsets = [r.offset for r in regs]
    assert offsets == sorted(set(offsets)) and all(o % 4 == 0 for o in offsets)
    by_name = {r.name: r for r in regs}
    lo = by_name["CONFIG_HASH_LO"].fields[0].value
    hi = by_name["CONFIG_HASH_HI"].fields[0].value
    assert f"{hi << 32 | lo:016x}" == config.hash
    for name, _ in COUNTERS:  # every counter readable as a 64-bit LO/HI pair
        assert by_name[f"{name.upper()}_HI"].offset == by_name[f"{name.upper()}_LO"].offset + 4
    assert register_map(PRESETS["tiny"]) != regs  # another config, another hash


def test_spec_json_and_c_header_carry_registers_and_error_codes():
    config = PRESETS["tiny"]
    registers = registers_spec(config)
    spec = isa_spec(config, registers=registers)
    assert spec["registers"]["error_codes"]["ILLEGAL_OPCODE"]["code"] == ErrorCode.ILLEGAL_OPCODE
    names = [r["name"] for r in spec["registers"]["registers"]]
    assert names[:2] == ["CTRL", "STATUS"]
    header = c_header(config, registers=registers)
    assert "#define WEFT_REG_INSN_ADDR 0x0010" in header
    assert "#define WEFT_REG_STATUS_DONE_LSB 1" in header
    assert f"#define WEFT_ERR_DEADLOCK {int(ErrorCode.DEADLOCK)}" in header
    assert f'#define WEFT_CONFIG_HASH "{config.hash}"' in header


async def _write(ctx, bus, addr: int, data: int, strobe: int = 0xF) -> int:
    ctx.set(bus.awaddr, addr)
    ctx.set(bus.wdata, data)
    ctx.set(bus.wstrb, strobe)
    ctx.set(bus.awvalid, 1)
    ctx.set(bus.wvalid, 1)
    ctx.set(bus.bready, 1)
    await ctx.tick().until(bus.awready)
    ctx.set(bus.awvalid, 0)
    ctx.set(bus.wvalid, 0)
    await ctx.tick().until(bus.bvalid)
    resp = ctx.get(bus.bresp)
    await ctx.tick()
    return resp


async def _read(ctx, bus, addr: int) -> tuple[int, int]:
    ctx.set(bus.araddr, addr)
    ctx.set(bus.arvalid, 1)
    ctx.set(bus.rready, 1)
    await ctx.tick().until(bus.arready)
    ctx.set(bus.arvalid, 0)
    await ctx.tick().until(bus.rvalid)
    value, resp = ctx.get(bus.rdata), ctx.get(bus.rresp)
    await ctx.tick()
    return value, resp


def test_control_block_registers_over_axi_lite():
    config = PRESETS["tiny"]
    dut = ControlBlock(config)
    offset = {r.name: r.offset for r in dut.regs}
    pulses = []

    async def watch(ctx):
        async for _edge, _rst, start in ctx.tick().sample(dut.start):
            if start:
                pulses.append(1)

    async def bench(ctx):
        bus = dut.bus
        version, resp = await _read(ctx, bus, offset["VERSION"])
        assert resp == 0 and version == HW_VERSION[0] << 16 | HW_VERSION[1]
        lo, _ = await _read(ctx, bus, offset["CONFIG_HASH_LO"])
        hi, _ = await _read(ctx, bus, offset["CONFIG_HASH_HI"])
        assert f"{hi << 32 | lo:016x}" == config.hash
        # rw with byte strobes
        assert await _write(ctx, bus, offset["INSN_ADDR"], 0x12345678) == 0
        assert await _write(ctx, bus, offset["INSN_ADDR"], 0xAABBCCDD, strobe=0b0010) == 0
        assert (await _read(ctx, bus, offset["INSN_ADDR"]))[0] == 0x1234CC78
        assert ctx.get(dut.insn_addr) == 0x1234CC78
        # ro counters: a 64-bit value through LO/HI
        ctx.set(dut.cycles, 0x0000_0012_8000_0001)
        assert (await _read(ctx, bus, offset["CYCLES_LO"]))[0] == 0x8000_0001
        assert (await _read(ctx, bus, offset["CYCLES_HI"]))[0] == 0x12
        # w1s: START is a pulse and reads 0
        await _write(ctx, bus, offset["CTRL"], 0b11)
        assert pulses == [1]
        ctrl, _ = await _read(ctx, bus, offset["CTRL"])
        assert ctrl == 0b10 and ctx.get(dut.irq_en) == 1
        # w1c: DONE is set by the hardware and cleared by writing 1
        ctx.set(dut.done_set, 1)
        await ctx.tick()
        ctx.set(dut.done_set, 0)
        assert (await _read(ctx, bus, offset["STATUS"]))[0] & 0b10
        await _write(ctx, bus, offset["STATUS"], 0b10)
        assert not (await _read(ctx, bus, offset["STATUS"]))[0] & 0b10
        # unmapped addresses answer SLVERR
        assert (await _read(ctx, bus, 0x3C))[1] == RESP_SLVERR
        assert await _write(ctx, bus, 0x3C, 1) == RESP_SLVERR

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(watch, background=True)
    sim.add_testbench(bench)
    sim.run()
