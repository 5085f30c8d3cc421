"""`weft dse MODEL.onnx --sweep block=8,16 --sweep acc_kib=64,128`: cycles and area per config, CSV and plot."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from weft.cli_common import add_config_option
from weft.compiler.dse.knobs import KNOBS, expand_grid, parse_sweep, point_name
from weft.compiler.dse.pareto import pareto_front, plot_pareto, write_csv
from weft.compiler.dse.sweep import run_sweep
from weft.config import load_config
from weft.errors import UsageError, read_input, user_file
from weft.progress import Progress

__all__ = ["add_dse_arguments", "run_dse"]


def add_dse_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="an ONNX model")
    add_config_option(parser)
    parser.add_argument("--sweep", action="append", default=[], metavar="KNOB=V1,V2",
                        help="a knob and its values (repeatable); knobs: "
                             + ", ".join(f"{k} ({v[0]})" for k, v in KNOBS.items()))
    parser.add_argument("--area", choices=("synth", "none"), default="synth",
                        help="synth: Yosys area and board fit per point (cached); none: cycles only")
    parser.add_argument("--family", choices=("xc7", "xcup"), default="xc7", help="synth_xilinx family")
    parser.add_argument("--resource", choices=("lut", "ff", "bram36", "dsp"), default="lut",
                        help="the resource on the Pareto plot's x axis (without area: MACs per cycle)")
    parser.add_argument("--workers", type=int, default=None, help="local worker processes (default: cores)")
    parser.add_argument("--scheduler", metavar="ADDRESS", default=None,
                        help="run the points on this Dask scheduler (tcp://host:8786) instead of locally")
    parser.add_argument("--seed", type=int, default=0, help="seed of the calibration inputs")
    parser.add_argument("-o", "--output", default="dse", help="output stem: STEM.csv and STEM.png")


def run_dse(args: argparse.Namespace) -> int:
    model = read_input(args.model, "model")
    base = load_config(args.config)
    valid, skipped = expand_grid(base, parse_sweep(args.sweep))
    for knobs, reason in skipped:
        print(f"skipped {point_name(base.name, knobs)}: {reason}", file=sys.stderr)
    if not valid:
        raise UsageError("every point of the sweep breaks a config rule; nothing to run")
    area = args.area == "synth"
    with Progress(len(valid), "dse") as bar:
        rows = run_sweep(model, valid, area=area, family=args.family, seed=args.seed, workers=args.workers,
                         scheduler=args.scheduler, on_done=lambda _: bar.advance())
    rows += [{"config": point_name(base.name, knobs), **knobs, "error": reason} for knobs, reason in skipped]
    x = args.resource if area else "macs_per_cycle"
    front = set(pareto_front(rows, x))
    for i, r in enumerate(rows):
        r["pareto"] = i in front
    stem = Path(args.output)
    with user_file(stem.with_suffix(".csv"), "output"):
        csv_path = write_csv(rows, stem.with_suffix(".csv"))
    with user_file(stem.with_suffix(".png"), "output"):
        png_path = plot_pareto(rows, x, stem.with_suffix(".png"), title=f"weft dse: {Path(args.model).name}")
    for r in rows:
        figures = r.get("error") or f"{r['cycles']} cycles, {r['latency_us']:.1f} us" + (
            f", {r[x]:g} {x}, fits: {r.get('fits') or 'none'}" if area else "")
        print(f"{'*' if r['pareto'] else ' '} {r['config']}: {figures}")
    print(f"wrote {csv_path} and {png_path} ({len(valid)} points, {len(skipped)} skipped; * = Pareto front)")
    return 0
