"""`weft report`: a per-layer table (cycles, MACs, utilization, gap to the ideal, bytes moved), a roofline
plot, and a before/after comparison with a table saved earlier (``--json`` then ``--baseline``).

The figures come from one run of the artifact on the functional simulator ("fsim" device: bit-exact
results, DRAM bytes counted per layer, cycles from the timing model). The roofline of a config: compute
roof = ``config.macs_per_cycle`` MACs per cycle, memory roof = the bus's bytes per cycle
(``bus_width / 8``) times the arithmetic intensity (MACs per DRAM byte); each accelerator layer is a
point at its intensity and attained MACs per cycle. A layer's ideal is its useful MACs at the compute roof
(``ceil(macs / macs_per_cycle)``: no layer can beat it, a pooling layer's is 0) and its gap the cycles above.

How far a layer is from the DRAM's limit: ``dram_cycles`` is the time its DRAM traffic needs at the bus's
rate under the DRAM timing it was timed with (reads and writes at their duty, on their own AXI channels, so
the larger of the two), ``dram_share`` that time over the layer's cycles. A memory-bound layer near 100% is
at the DRAM's limit; one well below it loses its cycles elsewhere (request latency, a serial schedule).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from weft.core.files import write_atomic
from weft.errors import user_file
from weft.runtime.fsim_device import new_timing_model
from weft.runtime.session import InferenceSession

__all__ = ["add_report_arguments", "compare", "format_comparison", "layer_table", "plot_roofline", "run_report",
           "summary"]

COLUMNS = ("layer", "op", "target", "cycles", "ideal_cycles", "gap", "macs", "macs_per_cycle", "utilization",
           "array_utilization", "bytes", "intensity", "bound", "dram_cycles", "dram_share", "dense", "why")
#: The DMA traffic a layer writes to DRAM (every other kind is read).
WRITTEN = frozenset({"out"})


def layer_table(stats: Mapping[str, Any], config: Any, host_reasons: Mapping[str, str | None] | None = None,
                dram: Any | None = None) -> list[dict[str, Any]]:
    """One row per layer from a session's stats. Host layers carry no cycles, bytes or utilization; their
    "why" is the compiler's reason from `host_reasons` (layer name -> reason).

    ``utilization`` is the layer's useful MACs (its logical count: a grouped convolution's real MACs) over
    what the GEMM core could do in its cycles; ``array_utilization`` counts the MACs the array executes,
    zeros included (channel padding, the block-diagonal weight tiles of grouped layers), so the gap between
    the two is the work the mapping wastes. `dram`: the DRAM timing the cycles were counted with (its
    ``read_duty``/``write_duty``; None: a beat every cycle)."""
    peak = config.macs_per_cycle
    bus = config.bus_width // 8
    ridge = peak / bus  # MACs per byte where the memory roof meets the compute roof
    read_rate = bus * (dram.read_duty if dram is not None else 1.0)  # bytes per cycle
    write_rate = bus * (dram.write_duty if dram is not None else 1.0)
    rows = []
    for layer in stats["layers"]:
        row: dict[str, Any] = {"layer": layer["name"], "op": layer["op"], "target": layer["target"],
                               "cycles": layer.get("cycles"), "macs": int(layer["macs"]),
                               "dense": bool(layer.get("dense")) if layer["target"] == "accel" else None,
                               "why": (host_reasons or {}).get(layer["name"]) if layer["target"] != "accel" else None}
        if layer.get("pooled"):
            row["pooled"] = layer["pooled"]  # (not a column: what compare() pairs with a baseline's max-pool)
        moved = {k: int(v) for k, v in (layer.get("bytes") or {}).items()}
        row["bytes"] = sum(moved.values()) if layer["target"] == "accel" else None
        written = sum(v for k, v in moved.items() if k in WRITTEN)
        dram_cycles = math.ceil(max((sum(moved.values()) - written) / read_rate, written / write_rate))
        row["dram_cycles"] = dram_cycles if row["bytes"] else None
        cycles = row["cycles"]
        accel_macs = int(layer.get("accel_macs") or 0)
        if layer["target"] == "accel" and cycles:
            row["ideal_cycles"] = math.ceil(row["macs"] / peak)
            row["gap"] = cycles - row["ideal_cycles"]
            row["macs_per_cycle"] = row["macs"] / cycles
            row["utilization"] = row["macs"] / (peak * cycles)
            row["array_utilization"] = accel_macs / (peak * cycles)
            row["dram_share"] = dram_cycles / cycles
        else:
            row["macs_per_cycle"] = row["utilization"] = row["array_utilization"] = None
            row["ideal_cycles"] = row["gap"] = row["dram_share"] = None
        if row["bytes"]:
            row["intensity"] = row["macs"] / row["bytes"]
            row["bound"] = "compute" if row["intensity"] >= ridge else "memory"
        else:
            row["intensity"] = row["bound"] = None
        rows.append(row)
    return rows


def summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Totals of a table: accelerator cycles, their ideal and gap, the roofline's bound (no layer faster than
    its compute ideal or its DRAM traffic), and the mean utilization of the convolutions (each layer counts
    once, whatever its size) with and without the first one, whose few input channels make it a case apart,
    and without the first one nor the dense layers (a dense layer, lowered as a convolution whose kernel
    covers its image, uses each weight once: its DRAM traffic bounds it, a few percent of the peak); and the
    convolutions after the first one together (their ideal cycles over their cycles: each counts by its
    size)."""
    accel = [r for r in rows if r.get("cycles")]
    conv_rows = [r for r in accel if r["op"] == "qconv2d" and r.get("utilization") is not None]
    convs = [r["utilization"] for r in conv_rows]
    spatial = [r["utilization"] for r in conv_rows[1:] if not r.get("dense")]
    rest_cycles = sum(int(r["cycles"]) for r in conv_rows[1:])
    rest_ideal = sum(int(r.get("ideal_cycles") or 0) for r in conv_rows[1:])
    cycles = sum(int(r["cycles"]) for r in accel)
    ideal = sum(int(r.get("ideal_cycles") or 0) for r in accel)
    # The roofline's bound: no schedule beats a layer's compute ideal nor its DRAM traffic at the bus's rate.
    roof = sum(max(int(r.get("ideal_cycles") or 0), int(r.get("dram_cycles") or 0)) for r in accel)
    return {"cycles": cycles, "ideal_cycles": ideal, "gap": cycles - ideal, "roofline_cycles": roof,
            "roofline_utilization": ideal / roof if roof else None,
            "utilization": ideal / cycles if cycles else None,
            "mean_conv_utilization": sum(convs) / len(convs) if convs else None,
            "mean_conv_utilization_after_first": sum(convs[1:]) / len(convs[1:]) if len(convs) > 1 else None,
            "conv_utilization_after_first": rest_ideal / rest_cycles if rest_cycles else None,
            "spatial_convs_after_first": len(spatial),
            "mean_spatial_conv_utilization_after_first": sum(spatial) / len(spatial) if spatial else None}


def compare(before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per accelerator layer of `after`, its cycles and utilization beside those of the layer of the same
    name in `before` (two tables of :func:`layer_table`, e.g. the same model compiled by two versions). A
    convolution with a max-pool fused in is compared with the two layers of `before`, where that one has
    the max-pool as a layer of its own."""
    old = {r["layer"]: r for r in before}
    out = []
    for r in after:
        if not r.get("cycles"):
            continue
        was = old.get(r["layer"], {})
        b = was.get("cycles")
        name = r["layer"]
        pool = old.get(r.get("pooled") or "", {})
        if b is not None and pool.get("cycles"):
            b, name = b + pool["cycles"], f"{name} + {r['pooled']}"
        out.append({"layer": name, "op": r["op"], "cycles_before": b, "cycles_after": r["cycles"],
                    "change": r["cycles"] / b - 1 if b else None, "utilization_before": was.get("utilization"),
                    "utilization_after": r.get("utilization")})
    return out


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def format_comparison(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows of :func:`compare` as a Markdown table, with a total row."""
    lines = ["| layer | cycles before | cycles after | change | GEMM % before | GEMM % after |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        before = "-" if r["cycles_before"] is None else f"{r['cycles_before']:,}"
        change = "-" if r["change"] is None else f"{100 * r['change']:+.1f}%"
        util_b = _pct(r["utilization_before"]) if r["utilization_before"] else "-"
        util_a = _pct(r["utilization_after"]) if r["utilization_after"] else "-"
        lines.append(f"| {r['layer']} | {before} | {r['cycles_after']:,} | {change} | {util_b} | {util_a} |")
    paired = [r for r in rows if r["cycles_before"] is not None]
    b = sum(r["cycles_before"] for r in paired)
    a = sum(r["cycles_after"] for r in paired)
    if b:
        lines.append(f"| total ({len(paired)} layers) | {b:,} | {a:,} | {100 * (a / b - 1):+.1f}% | | |")
    return "\n".join(lines)


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
    parser.add_argument("--baseline", metavar="BEFORE.json",
                        help="a table saved with --json (e.g. by an earlier version): print a before/after comparison")


def run_report(args: argparse.Namespace) -> int:
    import numpy as np

    sess = InferenceSession(args.artifact, device="fsim", config=args.config)
    rng = np.random.default_rng(args.seed)
    feeds = {a.name: rng.standard_normal(a.shape).astype(np.float32) for a in sess.get_inputs()}
    sess.run(None, feeds)
    assert sess.stats is not None
    config = sess.device.config
    timer = new_timing_model(config)
    rows = layer_table(sess.stats, config, {n.name: n.attrs.get("host_reason") for n in sess.artifact.graph.nodes},
                       dram=timer.dram if timer is not None else None)
    widths = [max(len(c), *(len(_format(r[c])) for r in rows)) for c in COLUMNS]
    print("  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=True)))
    for r in rows:
        print("  ".join(_format(r[c]).ljust(w) for c, w in zip(COLUMNS, widths, strict=True)))
    print(f"total: {sess.stats['cycles']} cycles, {sess.stats['macs']:,} MACs, config {config.name}")
    tot = summary(rows)
    if tot["cycles"]:
        print(f"ideal (useful MACs at {config.macs_per_cycle} per cycle): {tot['ideal_cycles']:,} cycles; gap "
              f"{tot['gap']:,} cycles; utilization {_pct(tot['utilization'])}; mean over convolutions "
              f"{_pct(tot['mean_conv_utilization'])} ({_pct(tot['mean_conv_utilization_after_first'])} without the "
              f"first; {_pct(tot['mean_spatial_conv_utilization_after_first'])} over the "
              f"{tot['spatial_convs_after_first']} after it that are not dense layers; "
              f"{_pct(tot['conv_utilization_after_first'])} over the cycles of those after the first together)")
        print(f"roofline bound (each layer at the larger of its ideal and its dram_cycles): "
              f"{tot['roofline_cycles']:,} cycles, {_pct(tot['roofline_utilization'])} of the GEMM peak")
    if args.baseline:
        with user_file(args.baseline, "baseline table"):
            before = json.loads(Path(args.baseline).read_text())
        print()
        print(format_comparison(compare(before, rows)))
    if args.csv:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore")
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
