"""`weft rtl` and `weft synth`: the accelerator's Verilog, spec and header, and a Yosys area report."""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from typing import Any

from weft.commands import add_config_option
from weft.config import load_config

__all__ = ["RTL_FILES", "add_rtl_arguments", "add_synth_arguments", "run_rtl", "run_synth", "write_rtl"]

#: What `weft rtl` writes, all from one config and stamped with its hash.
RTL_FILES = {"verilog": "weft_top.v", "spec": "weft_spec.json", "header": "weft_spec.h"}


def write_rtl(config: Any, out_dir: Path) -> dict[str, str]:
    """Write the Verilog, the spec JSON (ISA + register map) and the C header of `config` to `out_dir`."""
    from weft.hw.regs import registers_spec
    from weft.hw.top import generate_verilog
    from weft.isa import c_header, isa_spec

    out_dir.mkdir(parents=True, exist_ok=True)
    registers = registers_spec(config)
    texts = {
        "verilog": generate_verilog(config),
        "spec": json.dumps(isa_spec(config, registers=registers), indent=2) + "\n",
        "header": c_header(config, registers=registers),
    }
    written = {}
    for kind, name in RTL_FILES.items():
        path = out_dir / name
        path.write_text(texts[kind])
        written[kind] = str(path)
    return written


def add_rtl_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_option(parser)
    parser.add_argument("-o", "--output", required=True, help="directory for the Verilog, spec JSON and header")


def run_rtl(args: argparse.Namespace) -> int:
    from weft.cli import print_json

    config = load_config(args.config)
    started = time.perf_counter()
    written = write_rtl(config, Path(args.output))
    print_json({"config": config.name, "config_hash": config.hash, "files": written,
                "seconds": round(time.perf_counter() - started, 2)})
    return 0


def add_synth_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_option(parser)
    parser.add_argument("--target", choices=("xc7", "generic"), default="xc7",
                        help="xc7: Xilinx 7-series cells (LUT, FF, BRAM, DSP); generic: Yosys' internal cells")
    parser.add_argument("-o", "--output", help="also write the JSON report to this file")


_STAT_LINE = re.compile(r"^\s+(\d+)\s+(\S+)\s*$")


def synth_report(config: Any, target: str = "xc7") -> dict[str, Any]:
    """Synthesize ``weft_top`` with Yosys and count cells by type (the last ``stat`` of the log).

    Needs a full Yosys on PATH: the one bundled with Amaranth only converts designs and has no synthesis
    passes.
    """
    import shutil
    import subprocess
    import tempfile

    from weft.hw.top import TOP_NAME, generate_verilog

    yosys = shutil.which("yosys")
    if yosys is None:
        raise OSError("weft synth needs Yosys on PATH (the Yosys bundled with Amaranth has no synthesis "
                      "passes); install it, e.g. apt-get install yosys")
    command = "synth_xilinx -family xc7 -flatten -noiopad" if target == "xc7" else "synth -flatten"
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="weft-synth-") as tmp:
        source = Path(tmp) / f"{TOP_NAME}.v"
        source.write_text(generate_verilog(config))
        result = subprocess.run([yosys, "-p", f"read_verilog {source}; {command} -top {TOP_NAME}; stat"],
                                capture_output=True, text=True, check=False)
    if result.returncode:
        raise OSError(f"yosys failed: {result.stderr.strip()[-2000:]}")
    log = result.stdout
    section = log[log.rindex("Number of cells"):] if "Number of cells" in log else ""
    cells: dict[str, int] = {}
    for line in section.splitlines()[1:]:
        match = _STAT_LINE.match(line)
        if match:
            cells[match.group(2)] = int(match.group(1))
        elif cells and not line.strip():
            break
    return {"config": config.name, "config_hash": config.hash, "target": target, "cells": cells,
            "seconds": round(time.perf_counter() - started, 1)}


def run_synth(args: argparse.Namespace) -> int:
    from weft.cli import print_json

    report = synth_report(load_config(args.config), args.target)
    print_json(report)
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=2) + "\n")
    return 0
