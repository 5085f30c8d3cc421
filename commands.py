"""The foundation's commands: config, isa, asm, demo, bench."""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
from pathlib import Path
from typing import Any

from weft.cli_common import add_config_option, print_json
from weft.config import load_config
from weft.core.files import write_atomic
from weft.errors import UsageError, read_input, user_file
from weft.isa import assemble, c_header, decode_insns, disassemble, encode_insns, isa_spec, markdown
from weft.isa.asm import AsmError, AsmFileError, check_words, read_source
from weft.isa.constants import INSN_BYTES

__all__ = ["BENCHES"]

#: benchmark name -> "module:function"; each function takes keyword options and returns JSON-ready data.
BENCHES: dict[str, str] = {
    "fsim": "weft.sim.bench:bench_fsim",
    "rtl": "weft.sim.bench_rtl:bench_rtl",
    "compile": "weft.tools.bench_accel:bench_compile",
    "latency": "weft.tools.bench_accel:bench_latency",
    "cpu": "weft.tools.bench_cpu:bench_cpu",
    "cpu-tune": "weft.tools.bench_cpu:bench_cpu_tune",
    "tune": "weft.tools.bench_tune:bench_tune",
    "zoo": "weft.tools.zoo:bench_zoo",
}


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_option(parser, aliases=("--preset",))
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="change one field of the config (repeatable), e.g. --set block_in=8")
    parser.add_argument("-o", "--output", help="write the config as a file that --config loads back (named after "
                                               "the file unless --set name=... says otherwise)")


def _field_value(text: str) -> tuple[str, Any]:
    """'block_in=8' -> ('block_in', 8): the value is read as JSON, or taken as a string when it is not JSON."""
    field, sep, value = text.partition("=")
    if not sep or not field.strip():
        raise UsageError(f"--set takes FIELD=VALUE, got {text!r}")
    try:
        return field.strip(), json.loads(value)
    except json.JSONDecodeError:
        return field.strip(), value


def run_config(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    changes = dict(_field_value(item) for item in args.set)
    if args.output and "name" not in changes:
        changes["name"] = Path(args.output).stem
    config = config.with_fields(changes)
    if args.output:
        with user_file(args.output, "output"):
            write_atomic(Path(args.output), (json.dumps(config.to_dict(), indent=2) + "\n").encode())
        print(f"wrote {args.output}: config '{config.name}', hash {config.hash}")
        return 0
    print_json(config.describe())
    return 0



def add_isa_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_option(parser)
    parser.add_argument("--format", choices=("json", "c", "md"), default="json")
    parser.add_argument("-o", "--output", help="write to this file instead of standard output")


def run_isa(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if args.format == "json":
        text = json.dumps(isa_spec(config), indent=2) + "\n"
    elif args.format == "c":
        text = c_header(config)
    else:
        text = markdown(config)
    _write_text(text, args.output)
    return 0


def _write_text(text: str, output: str | None) -> None:
    """`text` into the file `output` names, or to standard output without one."""
    if output:
        with user_file(output, "output"):
            Path(output).write_text(text)
    else:
        sys.stdout.write(text)


def add_asm_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_option(parser)
    parser.add_argument("input", help="assembly text file (or a binary with -d); '-' for standard input")
    parser.add_argument("-o", "--output", help="output file (binary words, or text with -d)")
    parser.add_argument("-d", "--disassemble", action="store_true", help="binary words in, text out")


def run_asm(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    name = "standard input" if args.input == "-" else args.input
    data = sys.stdin.buffer.read() if args.input == "-" else read_input(args.input, "input")
    if args.disassemble:
        _write_text(disassemble(decode_insns(config, check_words(data, name, INSN_BYTES))), args.output)
        return 0
    try:
        insns = assemble(read_source(data, name))
    except AsmError as err:
        raise AsmFileError(f"{name}: {err}") from None
    words = encode_insns(config, insns)
    if args.output:
        with user_file(args.output, "output"):
            Path(args.output).write_bytes(words)
    else:
        sys.stdout.write(words.hex() + "\n")
    return 0


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_option(parser)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="resnet18", help="the model to build, compile and run (default resnet18)")


def run_demo(args: argparse.Namespace) -> int:
    from weft.demo import run_demo as demo  # the demo compiles: onnx, loaded only when it runs

    return demo(load_config(args.config), seed=args.seed, model=args.model)


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", choices=sorted(BENCHES), help="what to measure")
    parser.add_argument("path", nargs="?", help="a folder of .onnx models (zoo; default: the onnx wheel's models)")
    add_config_option(parser)
    parser.add_argument("--model", help="model for model benchmarks: a built-in name (e.g. resnet18), or an "
                        ".onnx file (cpu, cpu-tune)")
    parser.add_argument("--repeat", type=int, default=None, help="repetitions (median is reported)")
    parser.add_argument("--threads", type=int, default=None, help="threads for benchmarks that use them (cpu)")
    parser.add_argument("--trials", type=int, default=None, help="tuning trials per workload (tune, cpu-tune)")
    parser.add_argument("-o", "--output", help="also write the JSON figures to this file")


def run_bench(args: argparse.Namespace) -> int:
    module_name, func_name = BENCHES[args.name].split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    options: dict[str, object] = {}
    if args.path:
        options["path"] = args.path
    if args.model:
        options["model"] = args.model
    if args.repeat is not None:
        options["repeat"] = args.repeat
    if args.threads is not None:
        options["threads"] = args.threads
    if args.trials is not None:
        options["trials"] = args.trials
    # Benchmarks take the config (preset name or file) first, then keyword options.
    accepted = inspect.signature(func).parameters
    unknown = [k for k in options if k not in accepted]
    if unknown:
        what = "folder argument" if unknown[0] == "path" else f"--{unknown[0]} option"
        raise UsageError(f"benchmark '{args.name}' takes no {what}")
    figures = func(args.config, **options)
    print_json(figures)
    if args.output:
        with user_file(args.output, "output"):
            Path(args.output).write_text(json.dumps(figures, indent=2, default=str) + "\n")
    return 0
