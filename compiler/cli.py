"""`weft compile` (ONNX -> .weft) and `weft inspect` (print a .weft's partitioned graph).

Heavy imports (onnx, the compiler) happen inside the run functions so `weft --help` stays light.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

from weft.cli_common import add_config_option, print_json
from weft.compiler.calibrate import load_calibration
from weft.compiler.partition import layer_summary
from weft.compiler.pipeline import build_pipeline, describe
from weft.config import load_config
from weft.core.artifact import Artifact
from weft.errors import UsageError, user_file

__all__ = ["add_compile_arguments", "add_inspect_arguments", "run_compile", "run_inspect"]


def _shape_arg(text: str) -> tuple[str, tuple[int, ...]]:
    name, sep, dims = text.partition("=")
    try:
        if not sep or not name:
            raise ValueError
        return name, tuple(int(d) for d in dims.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NAME=D0,D1,... (e.g. input=1,3,224,224), got '{text}'") from None


def add_compile_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", help="the ONNX model file")
    parser.add_argument("-o", "--output", help="the .weft file to write (default: MODEL with .weft)")
    parser.add_argument("--target", choices=("accel", "cpu"), default="accel",
                        help="accel: int8 layers for the accelerator; cpu: the float graph on the host")
    add_config_option(parser)
    parser.add_argument("--calibration", metavar="FILE.npz",
                        help="calibration inputs: one array per model input, named like it (a stack of batches, "
                             "or samples along the batch axis); default: seeded random inputs, with a warning")
    parser.add_argument("--input-shape", action="append", type=_shape_arg, default=[], metavar="NAME=D0,D1,...",
                        help="fix the shape of an input with dynamic dimensions (repeatable)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the default random calibration inputs")
    parser.add_argument("--tuning-log", metavar="LOG.jsonl", help="use the best schedules of a `weft tune` log")
    parser.add_argument("--no-verify", action="store_true", help="skip the graph verifier between passes")
    parser.add_argument("--list-passes", action="store_true", help="print the pass pipeline and exit")


def run_compile(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if args.list_passes:
        for p in describe(build_pipeline(args.target, config, [] if args.target == "accel" else None)):
            print(f"{p['name']:<18} {p['doc']}")
        return 0
    if not args.model:
        raise UsageError("give the ONNX model to compile")
    from weft.compiler.driver import compile_model  # optional dependency: onnx

    calibration: Any = load_calibration(args.calibration) if args.calibration else None
    output = Path(args.output) if args.output else Path(args.model).with_suffix(".weft")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        artifact = compile_model(args.model, target=args.target, config=config, calibration=calibration,
                                 input_shapes=dict(args.input_shape), verify=not args.no_verify, seed=args.seed,
                                 tuning_log=args.tuning_log)
    for w in caught:
        print(f"weft compile: warning: {w.message}", file=sys.stderr)
    with user_file(output, "output"):
        artifact.save(output)
    rows = layer_summary(artifact.graph)
    macs = sum(r["macs"] for r in rows)
    accel = sum(r["macs"] for r in rows if r["target"] == "accel")
    n_accel = sum(r["target"] == "accel" for r in rows)
    print(f"wrote {output}: {len(rows)} layers ({n_accel} on the accelerator, {len(rows) - n_accel} on the host), "
          f"{macs:,} MACs ({100 * accel / macs if macs else 0:.1f}% on the accelerator), config "
          f"'{config.name}' ({config.hash}), target {args.target}")
    _print_fallbacks(artifact.graph.meta.get("fallbacks", {}))
    return 0


def _print_fallbacks(fallbacks: dict[str, str], shown: int = 3) -> None:
    """Name the layers an accelerator limit sent to the host (the first few; `weft inspect` lists all)."""
    if not fallbacks:
        return
    named = "; ".join(f"{name}: {why}" for name, why in list(fallbacks.items())[:shown])
    more = f"; and {len(fallbacks) - shown} more" if len(fallbacks) > shown else ""
    print(f"{len(fallbacks)} layer(s) fell back to the host ({named}{more}); `weft inspect` says why for each")


def add_inspect_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("artifact", help="a .weft file")
    parser.add_argument("--json", action="store_true", help="print the layer table as JSON")


def _why(row: dict[str, Any], target: str) -> str:
    """Where a layer runs and why, for humans: "accel", or "host: <reason>"."""
    if row["target"] == "accel":
        pooled = row.get("pooled")
        return f"accel, with max-pool '{pooled}' in its epilogue" if pooled else "accel"
    if target == "cpu":
        return "host: cpu target"
    return f"host: {row['host_reason'] or 'not an accelerator layer'}"


def run_inspect(args: argparse.Namespace) -> int:
    artifact = Artifact.load(args.artifact)
    rows = layer_summary(artifact.graph)
    macs = sum(r["macs"] for r in rows)
    accel = sum(r["macs"] for r in rows if r["target"] == "accel")
    summary = {
        "model": artifact.graph.name, "target": artifact.target, "config": artifact.config.name,
        "config_hash": artifact.config_hash, "inputs": {n: list(artifact.graph.values[n].shape or ())
                                                        for n in artifact.graph.inputs},
        "outputs": list(artifact.graph.outputs), "macs": macs,
        "accel_mac_fraction": accel / macs if macs else 0.0, "sections": sorted(artifact.sections),
        "scales": artifact.graph.meta.get("quantization", {}).get("source"), "layers": rows,
    }
    if args.json:
        print_json(summary)
        return 0
    print(f"{artifact.graph.name}: target {artifact.target}, config '{artifact.config.name}' "
          f"({artifact.config_hash}), inputs {summary['inputs']}, outputs {summary['outputs']}")
    if summary["scales"]:
        print(f"int8 scales from: {summary['scales']}")
    width = max([len(r["name"]) for r in rows] + [5])
    print(f"{'#':>3}  {'layer':<{width}}  {'op':<12} {'where':<6} {'inputs':<28} {'output':<20} {'MACs':>14}  why")
    for k, r in enumerate(rows):
        shapes = " ".join("x".join(map(str, s)) for s in r["inputs"])
        out = "x".join(map(str, r["output"]))
        print(f"{k:>3}  {r['name']:<{width}}  {r['op']:<12} {r['target']:<6} {shapes:<28} {out:<20} {r['macs']:>14,}"
              f"  {_why(r, artifact.target)}")
    fallbacks = len(artifact.graph.meta.get("fallbacks", {}))
    print(f"total {macs:,} MACs, {100 * summary['accel_mac_fraction']:.1f}% on the accelerator"
          f"{f', {fallbacks} layer(s) on the host for an accelerator limit' if fallbacks else ''}; "
          f"sections: {', '.join(summary['sections']) or 'none'}")
    return 0
