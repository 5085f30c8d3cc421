"""What every command module shares: the ``--config`` option and JSON output.

The command modules live with their packages (``weft.hw.cli``, ``weft.sim.cosim_cli``, ``weft.compiler.cli``,
...), below the ``weft`` command that lists them (:mod:`weft.cli`); they take these from here, not from it.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from weft.config import PRESETS

__all__ = ["add_config_option", "print_json"]


def add_config_option(parser: argparse.ArgumentParser, aliases: tuple[str, ...] = ()) -> None:
    parser.add_argument(
        "--config", *aliases, dest="config", default="default",
        help=f"preset name ({', '.join(PRESETS)}) or a JSON file (weft or VTA format)",
    )


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")
