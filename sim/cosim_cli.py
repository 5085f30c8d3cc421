"""`weft cosim`: the random regression of the RTL against the functional simulator, from the command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from weft.cli_common import add_config_option, print_json
from weft.config import load_config
from weft.core.files import write_atomic
from weft.errors import UsageError, user_file
from weft.progress import Progress
from weft.sim.cosim import run_random
from weft.sim.dram_model import DRAM_MODELS

__all__ = ["add_cosim_arguments", "run_cosim"]


def add_cosim_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_option(parser)
    parser.add_argument("--sim", choices=("icarus", "verilator"), default="verilator", help="Verilog simulator")
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument("--count", type=int, default=8, help="number of seeds (seed, seed+1, ...)")
    parser.add_argument("--insns", type=int, default=150, help="instructions per random program (about)")
    parser.add_argument("--dram", choices=("ideal", "pynq", "stress"), default="stress",
                        help="DRAM model: no latency, Pynq-Z1-like, or random stalls")
    parser.add_argument("--dram-model", choices=DRAM_MODELS, default=None,
                        help="the DRAM model inside the design (dpi: Verilator only, the default there) or "
                             "cocotbext-axi's AxiRam in Python (axiram: the default on Icarus)")
    parser.add_argument("--junit", metavar="FILE.xml",
                        help="also write a JUnit XML report (one test case per seed) for CI")
    parser.add_argument("--verbose", action="store_true",
                        help="show cocotb's commands on stderr (the simulator's build output is always in the "
                             "build's log, whose path the first build prints)")


def run_cosim(args: argparse.Namespace) -> int:
    if args.count < 1:
        raise UsageError(f"--count must be at least 1, got {args.count}")
    config = load_config(args.config)
    seeds = list(range(args.seed, args.seed + args.count))
    with Progress(len(seeds), f"cosim {config.name} on {args.sim}") as bar:
        report = run_random(config, args.sim, seeds, n_insns=args.insns, timing=args.dram, progress=bar,
                            verbose=args.verbose, dram_model=args.dram_model)
    print_json(report.summary())
    if args.junit:
        with user_file(args.junit, "JUnit report"):
            write_atomic(Path(args.junit), report.junit().encode())
    for result in report.results:
        if not result.passed:
            print(f"FAIL seed {result.seed}: {result.problem}", file=sys.stderr)
    return 0 if report.failed == 0 else 1
