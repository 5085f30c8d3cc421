"""The Pareto front of latency against a resource, the sweep's CSV and its plot."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

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
    from weft.runtime.artifact import write_atomic

    columns: list[str] = []
    for r in rows:
        columns += [c for c in r if c not in columns]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    return write_atomic(Path(path), buf.getvalue().encode())


def plot_pareto(rows: list[dict[str, Any]], x: str, path: str | Path, *, title: str = "weft dse") -> Path:
    """Latency against resource `x`, the Pareto front as a line; each point labelled with the boards it fits
    (none: a hollow marker)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from weft.runtime.artifact import write_atomic

    fig, ax = plt.subplots(figsize=(7, 5))
    points = [r for r in rows if r.get(x) is not None and r.get("latency_us") is not None]
    for r in points:
        fits = r.get("fits")
        ax.scatter(r[x], r["latency_us"], s=28, facecolors="tab:blue" if fits or fits is None else "none",
                   edgecolors="tab:blue")
        label = r["config"].split("-", 1)[-1] + (f" [{fits}]" if fits else "")
        ax.annotate(label, (r[x], r["latency_us"]), fontsize=6, xytext=(3, 3), textcoords="offset points")
    front = [rows[i] for i in pareto_front(rows, x)]
    if front:
        ax.plot([r[x] for r in front], [r["latency_us"] for r in front], color="tab:red", label="Pareto front")
        ax.legend(fontsize=7)
    ax.set_xlabel(x)
    ax.set_ylabel("latency (us, timing model)")
    ax.set_title(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    return write_atomic(Path(path), buf.getvalue())
