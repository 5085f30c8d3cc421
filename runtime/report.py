"""`weft report`: a per-layer table (cycles, MACs, utilization, bytes moved) and a roofline plot.

The figures come from one run of the artifact on the functional simulator ("fsim" device: bit-exact
results, DRAM bytes counted per layer, cycles from the timing model). The roofline of a config: compute
roof = ``config.macs_per_cycle`` MACs per cycle, memory roof = the bus's bytes per cycle
(``bus_width / 8``) times the arithmetic intensity (MACs per DRAM byte); each accelerator layer is a
point at its intensity and attained MACs per cycle.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from weft.core.files import write_atomic
from weft.errors import user_file
from weft.runtime.session import InferenceSession

__all__ = ["add_report_arguments", "layer_table", "plot_roofline", "run_report"]

COLUMNS = ("layer", "op", "target", "cycles", "macs", "macs_per_cycle", "utilization", "array_utilization", "bytes",
           "intensity", "bound", "why")


def layer_table(stats: Mapping[str, Any], config: Any,
                host_reasons: Mapping[str, str | None] | None = None) -> list[dict[str, Any]]:
    """One row per layer from a session's stats. Host layers carry no cycles, bytes or utilization; their
    "why" is the compiler's reason from `host_reasons` (layer name -> reason).

    ``utilization`` is the layer's useful MACs (its logical count: a grouped convolution's real MACs) over
    what the GEMM core could do in its cycles; ``array_utilization`` counts the MACs the array executes,
    zeros included (channel padding, the block-diagonal weight tiles of grouped layers), so the gap between
    the two is the work the mapping wastes."""
    peak = config.macs_per_cycle
    bus = config.bus_width // 8
    ridge = peak / bus  # MACs per byte where the memory roof meets the compute roof
    rows = []
    for layer in stats["layers"]:
        row: dict[str, Any] = {"layer": layer["name"], "op": layer["op"], "target": layer["target"],
                               "cycles": layer.get("cycles"), "macs": int(layer["macs"]),
                               "why": (host_reasons or {}).get(layer["name"]) if layer["target"] != "accel" else None}
        moved = sum(int(v) for v in (layer.get("bytes") or {}).values())
        row["bytes"] = moved if layer["target"] == "accel" else None
        cycles = row["cycles"]
        accel_macs = int(layer.get("accel_macs") or 0)
        if layer["target"] == "accel" and cycles:
            row["macs_per_cycle"] = row["macs"] / cycles
            row["utilization"] = row["macs"] / (peak * cycles)
            row["array_utilization"] = accel_macs / (peak * cycles)
        else:
            row["macs_per_cycle"] = row["utilization"] = row["array_utilization"] = None
        if row["bytes"]:
            row["intensity"] = row["macs"] / row["bytes"]
            row["bound"] = "compute" if row["intensity"] >= ridge else "memory"
        else:
            row["intensity"] = row["bound"] = None
        rows.append(row)
    return rows


def plot_roofline(rows: list[dict[str, Any]], config: Any, path: str | Path) -> Path:
    """Write a log-log roofline PNG of the accelerator layers in `rows` to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    peak = config.macs_per_cycle
    bus = config.bus_width // 8
    points = [r for r in rows if r["intensity"] and r["macs_per_cycle"]]
    lo = min([r["intensity"] for r in points] + [peak / bus]) / 4
    hi = max([r["intensity"] for r in points] + [peak / bus]) * 4
    fig, ax = plt.subplots(figsize=(7, 5))
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(xs, [min(peak, bus * x) for x in xs], color="black", label=f"roof: {peak} MACs/cycle, {bus} B/cycle")
    for r in points:
        ax.scatter(r["intensity"], r["macs_per_cycle"], s=20)
        ax.annotate(r["layer"], (r["intensity"], r["macs_per_cycle"]), fontsize=6, xytext=(3, 3),
                    textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (MACs / DRAM byte)")
    ax.set_ylabel("attained MACs / cycle")
    ax.set_title(f"roofline: {config.name} ({config.clock_mhz} MHz)")
    ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    return write_atomic(Path(path), buf.getvalue())


def _format(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("artifact", help="a .weft file compiled for the accelerator")
    parser.add_argument("--config", default=None, help="config to run on (default: the artifact's)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    parser.add_argument("--csv", metavar="TABLE.csv", help="write the per-layer table as CSV")
    parser.add_argument("--json", metavar="TABLE.json", help="write the per-layer table as JSON")
    parser.add_argument("--roofline", metavar="PLOT.png", help="write the roofline plot (needs matplotlib)")


def run_report(args: argparse.Namespace) -> int:
    import numpy as np

    sess = InferenceSession(args.artifact, device="fsim", config=args.config)
    rng = np.random.default_rng(args.seed)
    feeds = {a.name: rng.standard_normal(a.shape).astype(np.float32) for a in sess.get_inputs()}
    sess.run(None, feeds)
    assert sess.stats is not None
    config = sess.device.config
    rows = layer_table(sess.stats, config, {n.name: n.attrs.get("host_reason") for n in sess.artifact.graph.nodes})
    widths = [max(len(c), *(len(_format(r[c])) for r in rows)) for c in COLUMNS]
    print("  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=True)))
    for r in rows:
        print("  ".join(_format(r[c]).ljust(w) for c, w in zip(COLUMNS, widths, strict=True)))
    print(f"total: {sess.stats['cycles']} cycles, {sess.stats['macs']:,} MACs, config {config.name}")
    if args.csv:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
        with user_file(args.csv, "CSV file"):
            write_atomic(Path(args.csv), buf.getvalue().encode())
    if args.json:
        with user_file(args.json, "JSON file"):
            write_atomic(Path(args.json), json.dumps(rows, indent=2).encode())
    if args.roofline:
        with user_file(args.roofline, "plot"):
            plot_roofline(rows, config, args.roofline)
        print(f"roofline: {args.roofline}")
    return 0
