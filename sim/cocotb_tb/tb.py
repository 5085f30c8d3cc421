"""The testbench: clock, reset, the DRAM model on ``m_axi``, an ``AxiLiteMaster`` on ``s_axil``, and the
driver sequence of one run, written against the register map of :mod:`weft.hw.regs` (no offsets here).

The DRAM model is cocotbext-axi's AxiRam (:class:`~weft.sim.cocotb_tb.dram.DramModel`, on ``weft_top``), or
the one inside the design (:class:`~weft.sim.cocotb_tb.dpi_dram.DpiDram`, on ``weft_sim``; the manifest's or
setup's ``dpi`` names its image file and log). With the latter the design makes its own clock and nothing
in Python wakes per cycle while the accelerator runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from cocotb.clock import Clock
from cocotb.simtime import get_sim_time
from cocotb.triggers import ClockCycles, First, RisingEdge, Timer
from cocotbext.axi import AxiBus, AxiLiteBus, AxiLiteMaster

from weft.hw.regs import COUNTERS, register_map
from weft.sim.cocotb_tb.dpi_dram import DpiDram
from weft.sim.cocotb_tb.dram import DramModel, DramTiming

__all__ = ["PERIOD_NS", "RunResult", "Testbench"]

PERIOD_NS = 10  # 100 MHz, the Pynq-Z1 PL clock


@dataclass
class RunResult:
    """What the driver reads back after a run (or a timeout)."""

    timed_out: bool
    status: dict[str, int] = field(default_factory=dict)
    error_code: int = 0
    error_index: int = 0
    counters: dict[str, int] = field(default_factory=dict)
    sim_cycles: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"timed_out": self.timed_out, "status": self.status, "error_code": self.error_code,
                "error_index": self.error_index, "counters": self.counters, "sim_cycles": self.sim_cycles}


class Testbench:
    """One accelerator instance in the simulator."""

    def __init__(self, dut: Any, config: Any, *, dram_size: int, timing: DramTiming,
                 dpi: dict[str, str] | None = None):
        """`dpi` (``image``, ``log``: paths) when `dut` is ``weft_sim``, whose model has the timing built in."""
        self.dut = dut
        self.config = config
        self.regs = {r.name: r for r in register_map(config)}
        self.fields = {f.name: (r.offset, f) for r in self.regs.values() for f in r.fields}
        self.dram: DramModel | DpiDram
        #: Whether the DRAM model is the one inside the design (and the design makes its own clock).
        self.dpi = dpi is not None
        if dpi is not None:
            # weft_sim makes its own clock (of weft.sim.dram_model.PERIOD_NS, the same period)
            self.dram = DpiDram(dut, image=Path(dpi["image"]), log=Path(dpi["log"]), size=dram_size)
            #: The accelerator's core (the trace recorder's signals are below it).
            self.core = dut.top.core
        else:
            Clock(dut.clk, PERIOD_NS, unit="ns").start()
            # The bus models are not tied to rst: the DUT's reset is ours to drive, and they are idle until
            # the first transfer anyway.
            self.dram = DramModel(AxiBus.from_prefix(dut, "m_axi"), dut.clk, None, size=dram_size,
                                  timing=timing, period_ns=PERIOD_NS)
            self.core = dut.core
        self.axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axil"), dut.clk)

    async def reset(self) -> None:
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, 4)
        self.dut.rst.value = 0
        await ClockCycles(self.dut.clk, 2)

    async def read_reg(self, name: str) -> int:
        return await self.axil.read_dword(self.regs[name].offset)

    async def write_reg(self, name: str, value: int) -> None:
        await self.axil.write_dword(self.regs[name].offset, value)

    def field_value(self, name: str, word: int) -> int:
        _, f = self.fields[name]
        return (word >> f.lsb) & ((1 << f.width) - 1)

    def field_bits(self, **values: int) -> int:
        word = 0
        for name, value in values.items():
            _, f = self.fields[name]
            word |= (value & ((1 << f.width) - 1)) << f.lsb
        return word

    def load_dram(self, image: np.ndarray) -> None:
        """Put `image` at address 0 and zero the rest of the memory."""
        mem = self.dram.mem
        if isinstance(mem, np.ndarray):
            mem[image.size:] = 0
            mem[:image.size] = image
        else:
            mem[:] = bytes(len(mem))
            mem[:image.size] = image.tobytes()

    def read_dram(self, nbytes: int) -> np.ndarray:
        mem = self.dram.mem
        if isinstance(mem, np.ndarray):
            return np.array(mem[:nbytes])
        return np.frombuffer(bytes(mem[:nbytes]), dtype=np.uint8).copy()

    async def run(self, insn_addr: int, insn_count: int, timeout_cycles: int) -> RunResult:
        """Program the registers, START, wait for the interrupt, read status, error and counters."""
        await self.write_reg("INSN_ADDR", insn_addr)
        await self.write_reg("INSN_COUNT", insn_count)
        started = get_sim_time(unit="ns")
        await self.write_reg("CTRL", self.field_bits(start=1, irq_en=1))
        if not self.dut.irq.value:
            await First(RisingEdge(self.dut.irq), Timer(timeout_cycles * PERIOD_NS, unit="ns"))
        timed_out = not self.dut.irq.value
        result = RunResult(timed_out=timed_out,
                           sim_cycles=int((get_sim_time(unit="ns") - started) // PERIOD_NS))
        status = await self.read_reg("STATUS")
        result.status = {name: self.field_value(name, status) for name in ("busy", "done", "error")}
        result.error_code = await self.read_reg("ERROR_CODE")
        result.error_index = await self.read_reg("ERROR_INDEX")
        for name, _ in COUNTERS:
            lo = await self.read_reg(f"{name.upper()}_LO")
            hi = await self.read_reg(f"{name.upper()}_HI")
            result.counters[name] = hi << 32 | lo
        await self.write_reg("STATUS", self.field_bits(done=1))  # acknowledge: irq drops
        return result
