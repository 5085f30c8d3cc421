"""`weft dse MODEL.onnx --sweep block=8,16 --sweep acc_kib=64,128`: cycles and area per config, CSV and plot."""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path
from typing import Any

from weft.cli_common import add_config_option
from weft.config import load_config
from weft.errors import UsageError, read_input, user_file
from weft.hw.synth import BOARDS
from weft.progress import Progress
from weft.tools.dse.knobs import DERIVED_KNOBS, KNOBS, expand_grid, parse_sweep, point_name
from weft.tools.dse.pareto import pareto_front, plot_pareto, read_csv, write_csv
from weft.tools.dse.sweep import run_sweep, sources_fingerprint

__all__ = ["add_dse_arguments", "run_dse"]

#: The plot's panels with area: latency against each resource a board can run out of first.
_PANELS = ("lut", "bram36", "dsp")


def _summary(row: dict[str, Any], area: bool) -> str:
    """One point on one line: its cycles and latency, and with `area` its resources and the boards it fits."""
    if "cycles" not in row:
        return f"{row['config']}: {row.get('error')}"
    text = f"{row['config']}: {row['cycles']} cycles, {row['latency_us']:.1f} us"
    if "fsim_cycles" in row:
        text += f" (fsim: {row['fsim_cycles']})"
    if row.get("error"):
        return f"{text}, {row['error']}"
    if area and row.get("lut") is None:
        return f"{text}, not synthesized (estimate: {row['bram36_est']:g} BRAM36, >= {row['dsp_min']:g} DSP)"
    if area:
        text += (f", {row['lut']:g} LUT, {row['ff']:g} FF, {row['bram36']:g} BRAM36, {row['dsp']:g} DSP, "
                 f"fits: {row.get('fits') or 'none'}")
    return text


def _resumable(path: Path, valid: list[tuple[dict[str, float], Any]], args: argparse.Namespace
               ) -> dict[str, dict[str, Any]]:
    """The rows of an earlier sweep's CSV at `path` that stand for points of `valid` today, by name: the same
    config hash, produced by the same sources, without an error, with Yosys's area when ``--area synth`` asks
    for it and with fsim's cycles when ``--fsim`` does. A missing file keeps nothing."""
    if not path.exists():
        return {}
    try:
        with user_file(path, "sweep to resume"):
            rows = read_csv(path)
    except (UnicodeDecodeError, csv.Error) as err:
        raise UsageError(f"{path}: not a sweep's CSV, nothing to resume from ({err})") from None
    wanted = {cfg.name: cfg.hash for _, cfg in valid}
    sources = sources_fingerprint()
    kept = {}
    for row in rows:
        if "config" not in row or wanted.get(row["config"]) != row.get("config_hash") \
                or row.get("sources") != sources or row.get("error") or "cycles" not in row \
                or (args.area == "synth" and "lut" not in row) or (args.fsim and "fsim_cycles" not in row):
            continue
        row.pop("pareto", None)  # the front is the whole sweep's, worked out again
        kept[row["config"]] = row
    return kept


def add_dse_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="an ONNX model")
    add_config_option(parser)
    parser.add_argument("--sweep", action="append", default=[], metavar="KNOB=V1,V2",
                        help="a knob and its values (repeatable); knobs: "
                             + ", ".join(f"{k} ({v[0]})" for k, v in [*KNOBS.items(), *DERIVED_KNOBS.items()]))
    parser.add_argument("--area", choices=("synth", "cached", "none"), default="synth",
                        help="synth: Yosys area and board fit per point (cached); cached: only the points the "
                             "synthesis cache holds have an area (no Yosys run); none: cycles only")
    parser.add_argument("--family", choices=("xc7", "xcup"), default="xc7", help="synth_xilinx family")
    parser.add_argument("--resource", choices=("lut", "ff", "bram36", "dsp"), default="lut",
                        help="the resource of the Pareto column and the '*' marks; the plot has a panel for "
                             "each of lut, bram36 and dsp (without area: one, MACs per cycle)")
    parser.add_argument("--board", choices=sorted(BOARDS), default="pynq-z2",
                        help="the board whose fitting points the plot fills in")
    parser.add_argument("--fsim", action="store_true",
                        help="also run each point on the functional simulator with the timing model (fsim_cycles)")
    parser.add_argument("--workers", type=int, default=None, help="local worker processes (default: cores)")
    parser.add_argument("--scheduler", metavar="ADDRESS", default=None,
                        help="run the points on this Dask scheduler (tcp://host:8786) instead of locally")
    parser.add_argument("--seed", type=int, default=0, help="seed of the calibration inputs")
    parser.add_argument("-o", "--output", default="dse", help="output stem: STEM.csv and STEM.png")
    parser.add_argument("--resume", action="store_true",
                        help="keep the points STEM.csv already holds that this weft produced (the same config "
                             "hash and sources fingerprint, no error, with the area and fsim columns asked "
                             "for) and run only the rest: a sweep of hours cut short goes on where it stopped")


def run_dse(args: argparse.Namespace) -> int:
    model = read_input(args.model, "model")
    base = load_config(args.config)
    valid, skipped = expand_grid(base, parse_sweep(args.sweep))
    for knobs, reason in skipped:
        print(f"skipped {point_name(base.name, knobs)}: {reason}", file=sys.stderr)
    if not valid:
        raise UsageError("every point of the sweep breaks a config rule; nothing to run")
    area = args.area != "none"
    stem = Path(args.output)
    kept = _resumable(stem.with_suffix(".csv"), valid, args) if args.resume else {}
    if kept:
        print(f"resuming: {len(kept)} of {len(valid)} points from {stem.with_suffix('.csv')}", file=sys.stderr)
    todo = [(knobs, cfg) for knobs, cfg in valid if cfg.name not in kept]
    finished: list[dict[str, Any]] = list(kept.values())
    with Progress(len(valid), "dse") as bar:
        def done(row: dict[str, Any]) -> None:
            # STEM.csv holds every point finished so far: a sweep of hours cut short keeps its figures.
            finished.append(row)
            with user_file(stem.with_suffix(".csv"), "output"):
                write_csv(finished, stem.with_suffix(".csv"))
            bar.advance(note=row["config"])
            if not bar.enabled:  # a log gets a line per point: a synthesized sweep takes hours
                print(f"dse {bar.done}/{len(valid)} {time.monotonic() - started:.0f}s {_summary(row, area)}",
                      file=sys.stderr, flush=True)

        started = time.monotonic()
        for row in kept.values():
            bar.advance(note=row["config"])
        ran = run_sweep(model, todo, area=area, family=args.family, seed=args.seed, workers=args.workers,
                        scheduler=args.scheduler, on_done=done, cached_only=args.area == "cached",
                        fsim=args.fsim) if todo else []
    by_name = {**kept, **{r["config"]: r for r in ran}}
    rows = [by_name[cfg.name] for _, cfg in valid]
    rows += [{"config": point_name(base.name, knobs), **knobs, "error": reason} for knobs, reason in skipped]
    x = args.resource if area else "macs_per_cycle"
    front = set(pareto_front(rows, x))
    for i, r in enumerate(rows):
        r["pareto"] = i in front
    with user_file(stem.with_suffix(".csv"), "output"):
        csv_path = write_csv(rows, stem.with_suffix(".csv"))
    with user_file(stem.with_suffix(".png"), "output"):
        png_path = plot_pareto(rows, _PANELS if area else x, stem.with_suffix(".png"), board=args.board,
                               title=f"weft dse: {Path(args.model).name}, {len(valid)} points")
    for r in rows:
        print(f"{'*' if r['pareto'] else ' '} {_summary(r, area)}")
    print(f"wrote {csv_path} and {png_path} ({len(valid)} points, {len(skipped)} skipped; * = Pareto front)")
    return 0
