"""The Pareto front of latency against a resource, the sweep's CSV and its plot."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from weft.core.files import write_atomic
from weft.hw.synth import BOARDS

__all__ = ["pareto_front", "plot_pareto", "write_csv"]


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


def plot_pareto(rows: list[dict[str, Any]], x: str, path: str | Path, *, title: str = "weft dse") -> Path:
    """Latency against resource `x`, the Pareto front as a line (its points labelled with their knobs), each
    point coloured by the smallest board it fits (hollow: none)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    points = [r for r in rows if r.get(x) is not None and r.get("latency_us") is not None]
    # Colour: the smallest board (fewest LUTs) the point fits; hollow: it fits none.
    by_size = sorted(BOARDS, key=lambda b: (BOARDS[b].lut, b))
    colours = {b: f"C{i}" for i, b in enumerate(by_size)}
    seen: set[str] = set()
    for r in points:
        fitting = [b for b in by_size if b in (r.get("fits") or "").split(",")]
        key = fitting[0] if fitting else ("no board" if r.get("fits") is not None else "")
        colour = colours.get(key, "grey")
        ax.scatter(r[x], r["latency_us"], s=30, facecolors=colour if fitting or r.get("fits") is None else "none",
                   edgecolors=colour, label=(f"fits {key} (smallest)" if fitting else key or None)
                   if key not in seen else None)
        seen.add(key)
        if r.get("pareto"):
            ax.annotate(r["config"].split("-", 1)[-1], (r[x], r["latency_us"]), fontsize=6, xytext=(3, 3),
                        textcoords="offset points")
    front = [rows[i] for i in pareto_front(rows, x)]
    if front:
        ax.plot([r[x] for r in front], [r["latency_us"] for r in front], color="black", lw=0.8,
                label="Pareto front")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    ax.set_xlabel(x)
    ax.set_ylabel("latency (us, timing model)")
    ax.set_title(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    return write_atomic(Path(path), buf.getvalue())
