"""The DRAM model inside the simulated design ("dpi"), for Verilator: what builds it and what a run gives it.

Instead of cocotbext-axi's ``AxiRam`` serving every beat from Python ("axiram", :mod:`weft.sim.cocotb_tb.dram`),
the design simulated is ``weft_sim``: the accelerator's ``weft_top`` with ``cocotb_tb/weft_dram.sv`` on its
``m_axi`` port, an AXI4 slave with the same :class:`~weft.sim.dram_timing.DramTiming` (latencies, the duty's
pause pattern, the burst rules) whose bytes live in a file that ``cocotb_tb/weft_dram.cpp`` maps through
DPI-C. Python writes the DRAM image into that file (``numpy.memmap``) before a run and reads the outputs
after; during the run only the AXI-Lite registers and the interrupt involve it, and the clock is cocotb's
C clock, so no Python runs per cycle or per beat.

Icarus has no DPI: it keeps the AxiRam path, as do runs with SLVERR fault ranges. Random stalls
(``random_stalls``) come from a seeded xorshift generator in the Verilog, not Python's ``random``: the same
duty, another sequence.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from weft.core.files import sources_digest
from weft.errors import UsageError
from weft.sim.dram_timing import DramTiming

__all__ = [
    "DRAM_MODELS", "MAKE_ARGS", "MODEL_SOURCES", "PERIOD_NS", "TOPLEVEL", "VERILATOR_ARGS", "choose", "control_file",
    "fingerprint", "open_image", "pause_pattern", "plusargs", "wrapper_verilog",
]

#: "dpi": the model inside the design (Verilator only); "axiram": cocotbext-axi's AxiRam in Python.
DRAM_MODELS = ("dpi", "axiram")
#: The design's top level with the DPI model around the accelerator.
TOPLEVEL = "weft_sim"
_HERE = Path(__file__).resolve().parent
#: The Verilog and the C++ of the model.
MODEL_SOURCES = (_HERE / "cocotb_tb" / "weft_dram.sv", _HERE / "cocotb_tb" / "weft_dram.cpp")
#: Arguments to the make of a dpi build: the model's C++ at -O2 (Verilator's -Os builds faster, runs slower).
MAKE_ARGS = ("OPT_FAST=-O2",)
#: Verilator's arguments for a dpi build: weft_sim makes its own clock, a delay loop.
VERILATOR_ARGS = ("--timing",)
#: The clock period weft_sim makes, in ns (the timescale is 1ns/1ps): the testbench's PERIOD_NS.
PERIOD_NS = 10
#: Period of the fixed pause pattern of a duty below 1 (both models).
PAUSE_PERIOD = 20


def choose(sim: str, dram_model: str | None, *, faults: bool = False) -> str:
    """The DRAM model a run on `sim` uses: `dram_model` when given (checked), else "dpi" on Verilator unless
    the run injects bus errors (`faults`: the AxiRam path's SLVERR ranges)."""
    if dram_model is None:
        return "dpi" if sim == "verilator" and not faults else "axiram"
    if dram_model not in DRAM_MODELS:
        raise UsageError(f"unknown DRAM model '{dram_model}' (known: {', '.join(DRAM_MODELS)})")
    if dram_model == "dpi" and sim != "verilator":
        raise UsageError(f"the dpi DRAM model needs Verilator ({sim} has no DPI-C): use dram_model='axiram'")
    if dram_model == "dpi" and faults:
        raise UsageError("bus-error fault ranges need the axiram DRAM model")
    return dram_model


def pause_pattern(duty: float) -> list[bool]:
    """One period of the fixed pause pattern (True: no beat in that cycle) that lets `duty` of the cycles
    through."""
    go = round(duty * PAUSE_PERIOD)
    return [(k * go) // PAUSE_PERIOD == ((k + 1) * go) // PAUSE_PERIOD for k in range(PAUSE_PERIOD)]


def _mask(duty: float) -> int:
    return sum(1 << k for k, pause in enumerate(pause_pattern(duty)) if pause) if duty < 1.0 else 0


def plusargs(timing: DramTiming, image: Path, log: Path) -> list[str]:
    """The simulator's plusargs that give the model its image file, its violations log and its timing."""
    return [f"+weft_dram={image}", f"+weft_dram_log={log}",
            f"+weft_dram_read_latency={timing.read_latency}", f"+weft_dram_write_latency={timing.write_latency}",
            f"+weft_dram_read_pause={_mask(timing.read_duty)}", f"+weft_dram_write_pause={_mask(timing.write_duty)}",
            f"+weft_dram_random={int(timing.random_stalls)}",
            f"+weft_dram_read_pass={round(timing.read_duty * (1 << 24))}",
            f"+weft_dram_write_pass={round(timing.write_duty * (1 << 24))}",
            f"+weft_dram_seed={timing.seed & 0xFFFFFFFF}"]


def open_image(path: Path, size: int, *, create: bool = False) -> np.memmap:
    """The model's memory as bytes: the file at `path`, made `size` bytes of zeros first with `create`."""
    if create:
        with open(path, "wb") as handle:
            handle.truncate(size)
    return np.memmap(path, dtype=np.uint8, mode="r+", shape=(size,))


def fingerprint() -> str:
    """Hash of the model's sources (the Verilog, the C++, the wrapper's generator): part of the build's key."""
    return sources_digest((*MODEL_SOURCES, Path(__file__)), _HERE)[:8]


_PORT = re.compile(r"^\s*(input|output)\s+(?:\[(\d+):0\]\s+)?(\w+);", re.M)
#: weft_dram's AXI4 ports (the accelerator's m_axi_<name>), in the module's order.
_AXI = ("araddr", "arlen", "arsize", "arburst", "arid", "arvalid", "arready", "rid", "rdata", "rresp", "rlast",
        "rvalid", "rready", "awaddr", "awlen", "awsize", "awburst", "awid", "awvalid", "awready", "wdata", "wstrb",
        "wlast", "wvalid", "wready", "bid", "bresp", "bvalid", "bready")


#: The ports weft_sim adds to weft_top's (less m_axi): direction and width.
_EXTRA = {"dram_hold": ("input", 1), "dram_read_bursts": ("output", 32), "dram_write_bursts": ("output", 32)}
#: What the RTL device's trace recorder watches below the core: its run flag, each unit's busy and stall,
#: and the busy of each of the compute unit's pipes.
_TRACED = ("running", "busy", "stall", "busy_gemm", "busy_alu")


def _ports(top: str) -> dict[str, tuple[str, int]]:
    """weft_top's ports in `top` (the text of ``weft_top.v``): direction and width, by name."""
    body = top[top.index("module weft_top("):]
    body = body[:body.index("endmodule")]
    ports = {name: (direction, int(msb) + 1 if msb else 1) for direction, msb, name in _PORT.findall(body)}
    missing = [f"m_axi_{name}" for name in _AXI if f"m_axi_{name}" not in ports]
    if missing:
        raise UsageError(f"weft_top has no {', '.join(missing)}: the dpi DRAM model cannot attach to it")
    return ports


def control_file(top: str) -> str:
    """The Verilator control file of a dpi build (which leaves out ``--public-flat-rw``): what Python reaches,
    weft_sim's ports (its inputs writable) and, read-only, the signals the trace recorder watches. Anything
    marked writable is assumed to change at any time: each clock edge would evaluate again all the logic
    that reads it."""
    outer = {name: port for name, port in _ports(top).items() if not name.startswith("m_axi_")} | _EXTRA
    outer["clk"] = ("output", 1)
    lines = ["`verilator_config"]
    lines += [f'public_flat_{"rw" if direction == "input" else "rd"} -module "{TOPLEVEL}" -var "{name}"'
              for name, (direction, _) in outer.items()]
    lines += [f'public_flat_rd -module "*" -var "{name}"' for name in _TRACED]
    return "\n".join(lines) + "\n"


def wrapper_verilog(top: str) -> str:
    """The Verilog of ``weft_sim``: `top` (the text of ``weft_top.v``)'s module with the model on its m_axi
    port. Its ports are weft_top's others, plus ``dram_hold`` (stop answering reads) and the model's burst
    counts ``dram_read_bursts`` and ``dram_write_bursts``."""
    ports = _ports(top)

    def decl(kind: str, name: str, width: int) -> str:
        return f"  {kind} {f'[{width - 1}:0] ' if width > 1 else ''}{name};"

    outer = [name for name in ports if not name.startswith("m_axi_")]
    ports["clk"] = ("output", 1)
    lines = ["// generated by weft.sim.dram_model: weft_top with the dpi DRAM model on m_axi",
             f"module {TOPLEVEL}({', '.join([*outer, *_EXTRA])});"]
    lines += [decl(ports[name][0], name, ports[name][1]) for name in outer if name != "clk"]
    lines.append("  output clk;")
    lines += [decl(direction, name, width) for name, (direction, width) in _EXTRA.items()]
    lines += [decl("wire", name, width) for name, (_, width) in ports.items() if name.startswith("m_axi_")]
    # The clock is the design's own (Verilator --timing), not a VPI-driven input: no callback per edge.
    lines += ["  reg clk = 1'b1;", f"  always #{PERIOD_NS // 2} clk = ~clk;"]
    # rst reaches weft_top through a register (one cycle later, before any run starts): every next-state
    # expression of the design reads it, and on a top-level input Verilator evaluates all of them again at
    # each clock edge, most of the simulation's time.
    lines += ["  reg rst_q = 1'b1;", "  always @(posedge clk) rst_q <= rst;"]
    lines.append("  weft_top top (" + ", ".join(f".{name}({'rst_q' if name == 'rst' else name})" for name in ports)
                 + ");")
    lines.append(f"  weft_dram #(.DATA_W({ports['m_axi_rdata'][1]}), .ID_W({ports['m_axi_arid'][1]}), "
                 f".ADDR_W({ports['m_axi_araddr'][1]})) dram (.clk(clk), .hold(dram_hold), "
                 ".read_bursts(dram_read_bursts), .write_bursts(dram_write_bursts), "
                 + ", ".join(f".{name}(m_axi_{name})" for name in _AXI) + ");")
    lines.append("endmodule")
    return "\n".join(lines) + "\n"
