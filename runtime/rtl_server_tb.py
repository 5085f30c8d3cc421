"""The cocotb test that serves the RTL simulation to a driver: a small command server on a TCP socket.

The parent (:class:`weft.runtime.rtl_device.RtlBackend`) listens on ``WEFT_RTL_SERVER`` (host:port); this
test connects and answers one command at a time: a JSON header line, then ``nbytes`` of payload. While it
waits for a command the simulation does not advance (simulated time only moves inside ``wait_irq`` and the
AXI-Lite transfers), so a slow host changes nothing the design sees.

Commands: read_reg, write_reg (AXI-Lite through ``AxiLiteMaster``), read_mem, write_mem (the DRAM model's
bytes; the parent reads and writes the dpi model's image file itself), wait_irq (run up to ``cycles``
clock cycles or until irq), hold_dram (stop answering DRAM reads, for watchdog tests; the parent resets by
starting a new simulation), trace_on (start an :class:`ActivityRecorder`), trace_take (its intervals so
far, which it then forgets), quit.

With the dpi DRAM model (``dpi`` in the setup: the design is ``weft_sim``) nothing here wakes per cycle
while the accelerator runs: wait_irq waits for the irq edge or a timer.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any

import cocotb
import numpy as np
from cocotb.simtime import get_sim_time
from cocotb.triggers import ClockCycles, FallingEdge, First, RisingEdge, Timer

from weft.config import load_config
from weft.isa.semantics import UNIT_NAMES
from weft.sim.cocotb_tb.dram import DramTiming
from weft.sim.cocotb_tb.tb import PERIOD_NS, Testbench

#: The signals the recorder watches, by track, as paths below the core (the Verilog keeps the hierarchy
#: and the submodule names of :class:`weft.hw.top.Core`): the core's run flag, each unit's busy register
#: (it drops for at least a cycle between two instructions, so every high interval is one instruction)
#: and its stall signal. Their high cycles are what the cycles, busy_* and stall_* counters count.
WATCHED = {"run": ("running",), **{unit: (unit, "busy") for unit in UNIT_NAMES},
           **{f"stall_{unit}": (unit, "stall") for unit in UNIT_NAMES},
           # the compute unit's two pipes (spec "beside"): its instructions may overlap, each pipe's do not
           "compute_gemm": ("compute", "busy_gemm"), "compute_alu": ("compute", "busy_alu")}


class ActivityRecorder:
    """High intervals [rise, fall) of the WATCHED signals, in clock cycles since time 0, from edge triggers:
    the simulation calls back into Python twice per instruction, never once per cycle."""

    def __init__(self, core: Any):
        """`core`: the accelerator's core in the simulated design (:attr:`Testbench.core`)."""
        self.intervals: dict[str, list[tuple[int, int]]] = {name: [] for name in WATCHED}
        for name, path in WATCHED.items():
            signal = core
            for part in path:
                signal = getattr(signal, part)
            cocotb.start_soon(self._watch(signal, self.intervals[name]))

    @staticmethod
    async def _watch(signal: Any, out: list[tuple[int, int]]) -> None:
        while True:
            if not (signal.value.is_resolvable and int(signal.value)):
                await RisingEdge(signal)
            rise = _cycle()
            await FallingEdge(signal)
            out.append((rise, _cycle()))

    def take(self) -> dict[str, list[tuple[int, int]]]:
        """The intervals closed so far, by track; the recorder forgets them."""
        taken = {name: list(spans) for name, spans in self.intervals.items()}
        for spans in self.intervals.values():
            spans.clear()
        return taken


def _cycle() -> int:
    """The clock cycle of now: signals change on rising clock edges, at multiples of the period."""
    return round(get_sim_time(unit="ns") / PERIOD_NS)


def recv_message(conn: socket.socket, stream: Any) -> tuple[dict[str, Any], bytes]:
    line = stream.readline()
    if not line:
        return {"op": "quit"}, b""
    header = json.loads(line)
    payload = stream.read(header.get("nbytes", 0)) if header.get("nbytes") else b""
    return header, payload


def send_message(conn: socket.socket, header: dict[str, Any], payload: bytes = b"") -> None:
    conn.sendall(json.dumps({**header, "nbytes": len(payload)}).encode() + b"\n" + payload)


@cocotb.test()
async def serve(dut: Any) -> None:
    host, port = os.environ["WEFT_RTL_SERVER"].rsplit(":", 1)
    setup = json.loads(os.environ["WEFT_RTL_SETUP"])
    config = load_config(setup["config"])
    tb = Testbench(dut, config, dram_size=setup["dram_size"], timing=DramTiming(**setup["timing"]),
                   dpi=setup.get("dpi"))
    await tb.reset()
    conn = socket.create_connection((host, int(port)))
    stream = conn.makefile("rb")
    recorder: list[ActivityRecorder] = []  # one, once trace_on asked for it
    try:
        while True:
            cmd, payload = recv_message(conn, stream)
            op = cmd["op"]
            if op == "quit":
                send_message(conn, {"ok": True})
                return
            try:
                if op == "trace_on":
                    if not recorder:
                        recorder.append(ActivityRecorder(tb.core))
                    reply, data = {}, b""
                elif op == "trace_take":
                    if not recorder:
                        raise ValueError("trace_take before trace_on")
                    reply, data = {"intervals": recorder[0].take()}, b""
                else:
                    reply, data = await _handle(tb, dut, cmd, payload)
            except Exception as err:  # reported to the parent, which raises it there
                reply, data = {"error": f"{type(err).__name__}: {err}"}, b""
            send_message(conn, {"ok": "error" not in reply, **reply}, data)
    finally:
        stream.close()
        conn.close()


async def _handle(tb: Testbench, dut: Any, cmd: dict[str, Any], payload: bytes) -> tuple[dict[str, Any], bytes]:
    op = cmd["op"]
    mem = tb.dram.mem
    if op == "read_reg":
        return {"value": await tb.axil.read_dword(cmd["offset"])}, b""
    if op == "write_reg":
        await tb.axil.write_dword(cmd["offset"], cmd["value"])
        return {}, b""
    if op == "read_mem":
        addr, n = cmd["addr"], cmd["n"]
        return {}, bytes(mem[addr:addr + n])
    if op == "write_mem":
        addr = cmd["addr"]
        mem[addr:addr + len(payload)] = np.frombuffer(payload, dtype=np.uint8) if tb.dpi else payload
        return {}, b""
    if op == "wait_irq":
        if not dut.irq.value:
            # a timer when the design makes its own clock: counting edges would call Python at each one
            limit = Timer(cmd["cycles"] * PERIOD_NS, unit="ns") if tb.dpi else ClockCycles(dut.clk, cmd["cycles"])
            await First(RisingEdge(dut.irq), limit)
        return {"irq": bool(dut.irq.value)}, b""
    if op == "hold_dram":  # one way: the parent restarts the simulation to reset it
        tb.dram.hold()
        return {}, b""
    raise ValueError(f"unknown command '{op}'")
