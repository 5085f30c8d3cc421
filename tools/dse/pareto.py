"""The Pareto front of latency against a resource, the sweep's CSV and its plot."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from weft.core.files import write_atomic
from weft.hw.synth import BOARDS

__all__ = ["pareto_front", "plot_pareto", "read_csv", "write_csv"]

#: A resource's estimate from the geometry alone (:func:`weft.hw.synth.estimate_area`), and what it is.
_ESTIMATES = {"bram36": "bram36_est", "dsp": "dsp_min"}
_ESTIMATE_KIND = {"bram36_est": "estimate", "dsp_min": "lower bound"}


def pareto_front(rows: list[dict[str, Any]], x: str, y: str = "latency_us") -> list[int]:
    """Indices of the rows no other row beats on both `x` and `y` (lower is better); rows without either
    figure (errors) are never on the front."""
    ok = [i for i, r in enumerate(rows) if r.get(x) is not None and r.get(y) is not None]
    front = []
    for i in ok:
        a = rows[i]
        dominated = any(rows[j][x] <= a[x] and rows[j][y] <= a[y] and (rows[j][x] < a[x] or rows[j][y] < a[y])
                        for j in ok if j != i)
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: rows[i][x])


def write_csv(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """All rows, with the union of their columns in first-seen order."""
    columns: list[str] = []
    for r in rows:
        columns += [c for c in r if c not in columns]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    return write_atomic(Path(path), buf.getvalue().encode())


def _value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"True": True, "False": False}.get(text, text)


#: A sweep's columns that hold names and hashes: text even where they look like numbers.
TEXT_COLUMNS = frozenset({"config", "config_hash", "sources", "fits", "error"})


def read_csv(path: str | Path) -> list[dict[str, Any]]:
    """The rows :func:`write_csv` wrote, with numbers and flags back as Python values (but the names and
    hashes of :data:`TEXT_COLUMNS`) and empty cells left out (a column another row had)."""
    text = Path(path).read_text(encoding="utf-8")
    return [{k: v if k in TEXT_COLUMNS else _value(v) for k, v in row.items() if v not in ("", None)}
            for row in csv.DictReader(io.StringIO(text))]


def plot_pareto(rows: list[dict[str, Any]], x: str | Sequence[str], path: str | Path, *, title: str = "weft dse",
                board: str = "pynq-z2") -> Path:
    """Latency against each resource of `x` (a panel each, side by side) with that resource's Pareto front as
    a line, its points labelled with their knobs. A point that fits `board` is filled, any other hollow; the
    colour names the smallest board it fits (black: none of :data:`~weft.hw.synth.BOARDS`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    resources = [x] if isinstance(x, str) else list(x)
    fig, axes = plt.subplots(1, len(resources), figsize=(6.5 * len(resources), 5.5), squeeze=False)
    # Colour: the smallest board (fewest LUTs) the point fits; boards on one part share a colour.
    by_size = sorted(BOARDS, key=lambda b: (BOARDS[b].lut, b))
    parts = list(dict.fromkeys(BOARDS[b].name for b in by_size))
    colours = {b: f"C{parts.index(BOARDS[b].name)}" for b in by_size}
    for ax, resource in zip(axes[0], resources, strict=True):
        _panel(ax, rows, resource, board, by_size, colours)
    fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return write_atomic(Path(path), buf.getvalue())


def _panel(ax: Any, rows: list[dict[str, Any]], x: str, board: str, by_size: list[str],
           colours: dict[str, str]) -> None:
    from matplotlib.ticker import FuncFormatter

    points = [r for r in rows if r.get(x) is not None and r.get("latency_us") is not None]
    seen: set[str] = set()
    for r in points:
        fits = (r.get("fits") or "").split(",") if r.get("fits") is not None else None
        fitting = [b for b in by_size if fits and b in fits]
        if fits is None:
            key, colour = "", "grey"
        elif fitting:
            # Boards on one part fit alike: name them all, the board asked for first.
            same = [b for b in fitting if BOARDS[b].name == BOARDS[fitting[0]].name]
            key, colour = "fits " + "/".join(sorted(same, key=lambda b: b != board)), colours[fitting[0]]
        else:
            key, colour = "fits no board", "black"
        filled = fits is None or board in fitting
        ax.scatter(r[x], r["latency_us"] / 1000, s=36, facecolors=colour if filled else "none", edgecolors=colour,
                   label=(key or None) if key not in seen else None, zorder=3)
        seen.add(key)
    # Points with no Yosys area, at the geometry's estimate: off the front, which compares synthesized points.
    estimated = [r for r in rows if r.get(x) is None and r.get(_ESTIMATES.get(x, "")) is not None
                 and r.get("latency_us") is not None]
    if estimated:
        column = _ESTIMATES[x]
        ax.scatter([r[column] for r in estimated], [r["latency_us"] / 1000 for r in estimated], marker="x", s=30,
                   color="grey", label=f"not synthesized: {column} ({_ESTIMATE_KIND[column]})", zorder=3)
    front = [rows[i] for i in pareto_front(rows, x)]
    for r in front:
        ax.annotate(r["config"].split("-", 1)[-1], (r[x], r["latency_us"] / 1000), fontsize=6, xytext=(3, 3),
                    textcoords="offset points")
    if front:
        ax.plot([r[x] for r in front], [r["latency_us"] / 1000 for r in front], color="black", lw=0.8,
                label="Pareto front", zorder=2)
    if board in BOARDS and x in ("lut", "ff", "bram36", "dsp"):
        ax.axvline(getattr(BOARDS[board], x), color="C3", ls="--", lw=0.8, label=f"{board} {x}")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    ax.set_xlabel(x + (" (Yosys synth_xilinx)" if x in ("lut", "ff", "bram36", "dsp") else ""))
    ax.set_ylabel("latency (ms, timing model)")
    ax.set_yscale("log")
    # Plain milliseconds on the log axis, not powers of ten.
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if str(f"{v:g}")[0] in "25" else ""))
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
