"""`weft rtl` and `weft synth`: the accelerator's Verilog, spec and header, and a Yosys area report."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from weft.cli_common import add_config_option, print_json
from weft.config import load_config
from weft.hw.regs import registers_spec
from weft.hw.synth import BOARDS, SynthError, default_cache, fits, place_and_route_ecp5_seeds, synthesize
from weft.isa import c_header, isa_spec
from weft.progress import Waiting

__all__ = ["RTL_FILES", "add_rtl_arguments", "add_synth_arguments", "run_rtl", "run_synth", "write_rtl"]

#: What `weft rtl` writes, all from one config and stamped with its hash.
RTL_FILES = {"verilog": "weft_top.v", "spec": "weft_spec.json", "header": "weft_spec.h"}


def write_rtl(config: Any, out_dir: Path) -> dict[str, str]:
    """Write the Verilog, the spec JSON (ISA + register map) and the C header of `config` to `out_dir`."""
    from weft.hw.top import generate_verilog  # amaranth: loaded only by the commands that build hardware

    out_dir.mkdir(parents=True, exist_ok=True)
    registers = registers_spec(config)
    with Waiting(f"generating the Verilog of config {config.name}"):
        verilog = generate_verilog(config)
    texts = {
        "verilog": verilog,
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
    config = load_config(args.config)
    started = time.perf_counter()
    written = write_rtl(config, Path(args.output))
    print_json({"config": config.name, "config_hash": config.hash, "files": written,
                "seconds": round(time.perf_counter() - started, 2)})
    return 0


def add_synth_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_option(parser)
    parser.add_argument("--board", choices=sorted(BOARDS), default=None,
                        help="check the fit on this board's part (default: every board); UltraScale+ parts "
                             "are fitted with the 7-series mapping unless --family xcup")
    parser.add_argument("--family", choices=("xc7", "xcup"), default="xc7",
                        help="Yosys synth_xilinx family (xc7: 7-series cells)")
    parser.add_argument("--pnr", choices=("ecp5",), default=None,
                        help="also place and route for a Lattice ECP5 (85k) with nextpnr: a real Fmax")
    parser.add_argument("--seed", type=int, default=None,
                        help="nextpnr's placement seed (with --pnr; default: nextpnr's own): the Fmax moves "
                             "by several MHz between seeds, so compare designs over a few")
    parser.add_argument("--seeds", type=_seed_list, default=None, metavar="N,N,...",
                        help="with --pnr: place and route one synthesis with each of these seeds ('default' for "
                             "nextpnr's own); the report's pnr is the fastest, pnr_seeds every one")
    parser.add_argument("--jobs", type=int, default=None,
                        help="with --seeds: nextpnr runs at a time (default: one per CPU)")
    parser.add_argument("--keep", metavar="DIR", default=None,
                        help="with --pnr: copy the place-and-route run's files into DIR (Verilog, Yosys' "
                             "netlist, nextpnr's report, log and routed SDF); places and routes again if cached")
    parser.add_argument("--no-cache", action="store_true", help="synthesize even when a cached result exists")
    parser.add_argument("-o", "--output", help="also write the JSON report to this file")


def _seed_list(text: str) -> list[int | None]:
    """``--seeds``: comma-separated seeds, ``default`` for nextpnr's own."""
    try:
        seeds = [None if part.strip() == "default" else int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds are integers or 'default', comma-separated: got '{text}'") from None
    if len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"a seed is named twice in '{text}'")
    return seeds


def _fastest(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the highest Fmax (its slowest clock's), fewer failing registers among equals."""
    return max(results, key=lambda r: (min(r["fmax_mhz"].values(), default=0.0), -r["slack"]["failing"]))


def synth_report(config: Any, *, family: str = "xc7", board: str | None = None, pnr: str | None = None,
                 cache: bool = True, seed: int | None = None, keep: str | None = None,
                 seeds: list[int | None] | None = None, jobs: int | None = None) -> dict[str, Any]:
    """Area (LUT, FF, BRAM36, DSP) of `config`, its fit on `board` (or every board), and ECP5 Fmax if
    `pnr` is "ecp5" (with `seeds`: the fastest of one run per seed as ``pnr``, each run's figures as
    ``pnr_seeds``)."""

    where = default_cache() if cache else None
    report = synthesize(config, family=family, cache=where)
    boards = [board] if board else sorted(BOARDS)
    report["boards"] = {name: fits(report["area"], BOARDS[name]) for name in boards}
    if pnr == "ecp5":
        runs = place_and_route_ecp5_seeds(config, seeds if seeds is not None else [seed], cache=where,
                                          keep=Path(keep) if keep is not None else None, jobs=jobs)
        report["pnr"] = _fastest(runs)
        if seeds is not None:
            report["pnr_seeds"] = [
                {"seed": r["seed"], "fmax_mhz": r["fmax_mhz"], "meets_clock": r["meets_clock"],
                 "failing": r["slack"]["failing"], "worst_slack_ns": r["slack"]["worst_slack_ns"],
                 "seconds": r["seconds"], "cached": r["cached"]} for r in runs]
    return report


def run_synth(args: argparse.Namespace) -> int:
    if (args.seed is not None or args.seeds is not None) and args.pnr is None:
        raise SynthError(f"--seed{'s' if args.seeds is not None else ''} is nextpnr's placement seed: "
                         "it needs --pnr ecp5")
    if args.seed is not None and args.seeds is not None:
        raise SynthError("--seed and --seeds: name one seed or several, not both")
    if args.jobs is not None and (args.seeds is None or args.jobs < 1):
        raise SynthError("--jobs is how many nextpnr runs of --seeds at a time: it needs --seeds and is at least 1")
    if args.keep is not None and args.pnr is None:
        raise SynthError("--keep keeps the place-and-route run's files: it needs --pnr ecp5")
    report = synth_report(load_config(args.config), family=args.family, board=args.board, pnr=args.pnr,
                          cache=not args.no_cache, seed=args.seed, keep=args.keep, seeds=args.seeds, jobs=args.jobs)
    print_json(report)
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=2) + "\n")
    return 0
