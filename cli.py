"""The `weft` command.

Each subcommand lives in the module that owns its work: ``add_<name>_arguments(parser)`` declares its
options and ``run_<name>(args) -> int`` runs it. Those modules import their heavy dependencies inside
``run_<name>``, so `weft config` works on a board without onnx or llvmlite.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from weft.errors import is_user_error

__all__ = ["COMMANDS", "main"]

#: name -> (module that provides ``add_<name>_arguments`` and ``run_<name>``, one-line help).
COMMANDS: dict[str, tuple[str, str]] = {
    "config": ("weft.commands", "print the resolved config as JSON with its hash and derived values"),
    "isa": ("weft.commands", "print the ISA spec (json), a C header (c) or a Markdown table (md)"),
    "asm": ("weft.commands", "assemble a text program into instruction words (or disassemble with -d)"),
    "demo": ("weft.commands", "run the main demo job"),
    "bench": ("weft.commands", "run a benchmark and print its figures as JSON"),
    "rtl": ("weft.hw.cli", "write the accelerator's Verilog, spec JSON and C header"),
    "cosim": ("weft.sim.cosim_cli", "random cosimulation of the RTL against the functional simulator"),
    "model": ("weft.compiler.model_cli", "write a built-in test model (.onnx) or random calibration inputs for it"),
    "compile": ("weft.compiler.cli", "compile an ONNX model into a .weft artifact"),
    "run": ("weft.runtime.cli", "run a .weft artifact on a device"),
    "inspect": ("weft.compiler.cli", "print the partitioned graph of a .weft artifact"),
    "deploy": ("weft.runtime.cli", "write what a board needs to run an artifact"),
    "bitstream": ("weft.runtime.cli", "generate board projects and list bitstreams"),
    "tune": ("weft.tools.tune_cli", "tune schedules of a model's accelerator layers"),
    "synth": ("weft.hw.cli", "synthesize the design with Yosys and report area"),
    "dse": ("weft.tools.dse.cli", "sweep configs: cycles and area, CSV and Pareto plot"),
    "report": ("weft.runtime.report", "per-layer table and roofline plot"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="weft", description="One accelerator config: RTL, ISA, compiler, runtime."
    )
    parser.add_argument("--traceback", action="store_true", help="show the full traceback on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module, help_text) in COMMANDS.items():
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        cmd.set_defaults(_module=module)
        getattr(importlib.import_module(module), f"add_{name}_arguments")(cmd)
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
    except Exception as err:
        # A user's mistake is one line naming the culprit; anything else is a bug in weft, whose traceback
        # (and exit status 1) is what a report of it needs.
        if args.traceback or not is_user_error(err):
            raise
        print(f"weft {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
