"""The `weft` command.

Each subcommand lives in the module that owns its work and is imported only when run, so `weft config`
works on a board without onnx or llvmlite. A command module provides ``add_arguments(parser)`` and
``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence

from weft.errors import is_user_error

__all__ = ["COMMANDS", "main"]

#: name -> (module, one-line help). A module that does not exist yet is left out of `weft --help`.
COMMANDS: dict[str, tuple[str, str]] = {
    "config": ("weft.commands", "print the resolved config as JSON with its hash and derived values"),
    "isa": ("weft.commands", "print the ISA spec (json), a C header (c) or a Markdown table (md)"),
    "asm": ("weft.commands", "assemble a text program into instruction words (or disassemble with -d)"),
    "demo": ("weft.commands", "run the main demo job"),
    "bench": ("weft.commands", "run a benchmark and print its figures as JSON"),
    "rtl": ("weft.hw.cli", "write the accelerator's Verilog, spec JSON and C header"),
    "cosim": ("weft.sim.cosim_cli", "random cosimulation of the RTL against the functional simulator"),
    "compile": ("weft.compiler.cli", "compile an ONNX model into a .weft artifact"),
    "run": ("weft.runtime.cli", "run a .weft artifact on a device"),
    "inspect": ("weft.compiler.cli", "print the partitioned graph of a .weft artifact"),
    "deploy": ("weft.runtime.cli", "write what a board needs to run an artifact"),
    "bitstream": ("weft.runtime.cli", "generate board projects and list bitstreams"),
    "tune": ("weft.tools.tune_cli", "tune schedules of a model's accelerator layers"),
    "synth": ("weft.hw.cli", "synthesize the design with Yosys and report area"),
    "dse": ("weft.compiler.dse.cli", "sweep configs: cycles and area, CSV and Pareto plot"),
    "report": ("weft.runtime.report", "per-layer table and roofline plot"),
}


def _available(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="weft", description="One accelerator config: RTL, ISA, compiler, runtime."
    )
    parser.add_argument("--traceback", action="store_true", help="show the full traceback on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module, help_text) in COMMANDS.items():
        if not _available(module):
            continue
        mod = importlib.import_module(module)
        add_arguments = getattr(mod, f"add_{name}_arguments", None)
        if add_arguments is None:  # the module exists, but this command lands with a later issue
            continue
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        cmd.set_defaults(_module=module)
        add_arguments(cmd)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    mod = importlib.import_module(args._module)
    try:
        return int(getattr(mod, f"run_{args.command}")(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader stopped early (`weft config | head`): not an error. Point stdout at /dev/null so the
        # interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as err:  # every user-facing failure: one clear line and a non-zero exit
        if args.traceback or not is_user_error(err):
            raise
        print(f"weft {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
