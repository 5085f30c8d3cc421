"""2-D DMA transfers for tile boxes: padding, splitting what does not fit the fields, merging what is
contiguous.

A tile buffer holds a box of a row-major DRAM tensor (counted in the rows of the memory it goes to), row
after row, padding included: the parts of the box outside the tensor are zeros that the load makes
itself (``y_pad``/``x_pad``), never bytes read from DRAM. :func:`box_transfers` turns one box into LOAD or
STORE transfers that respect the instruction's field widths (``layout_of(config)``): paddings wider than
the pad field become zero-fill loads (``y_size = 0``), strides wider than ``x_stride`` become one transfer
per row; :func:`merge` then joins transfers that are contiguous in both SRAM and DRAM.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING

from weft.isa.constants import MemId
from weft.isa.encoding import layout_of

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["Transfer", "box_transfers", "merge"]


@dataclass(frozen=True)
class Transfer:
    """One LOAD/STORE: `y` rows of `x` elements, DRAM rows `stride` apart, pads (top, bottom, left, right)."""

    mem: MemId
    sram: int
    dram: int
    y: int
    x: int
    stride: int
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)

    @property
    def sram_rows(self) -> int:
        return (self.pads[0] + self.y + self.pads[1]) * (self.pads[2] + self.x + self.pads[3])

    @property
    def padded(self) -> bool:
        return any(self.pads)


@lru_cache(maxsize=32)
def _limits(config: AcceleratorConfig) -> tuple[int, int, int]:
    """(widest pad, largest x_size and y_size, widest stride) the mem format can encode."""
    fmt = layout_of(config).formats["mem"]
    return fmt.field("y_pad_0").max, min(fmt.field("x_size").max, fmt.field("y_size").max), fmt.field("x_stride").max


def box_transfers(config: AcceleratorConfig, mem: MemId, shape: Sequence[int], dram_base: int,
                  origin: Sequence[int], extent: Sequence[int], sram_base: int,
                  strides: Sequence[int] | None = None) -> list[Transfer]:
    """Transfers that move the box ``[origin, origin + extent)`` of a row-major tensor of `shape` rows at
    DRAM row `dram_base` to (or from) SRAM rows from `sram_base`, padding out-of-range rows with zeros.
    `strides` (DRAM rows per step of each dimension; default: row-major over `shape`) describes a view
    of a larger tensor instead, e.g. every other row of an image; the dimensions below the x one must
    stay contiguous.

    Only the last two dimensions that are not fully covered may stick out of the tensor (the y and x of
    a 2-D DMA); outer dimensions must be in range."""
    dims = len(shape)
    if not (len(origin) == len(extent) == dims):
        raise ValueError("box and tensor ranks differ")
    strides = list(strides) if strides is not None else [math.prod(shape[d + 1:]) for d in range(dims)]
    k = dims - 1  # the x dimension: the last one the box does not cover entirely (and contiguous in DRAM)
    while k > 0 and origin[k] == 0 and extent[k] == shape[k] and strides[k - 1] == math.prod(shape[k:]):
        k -= 1
    unit = math.prod(shape[k + 1:])  # contiguous rows below the x dimension
    box_strides = [math.prod(extent[d + 1:]) for d in range(dims)]
    y_dim = k - 1 if k > 0 else None
    outer = range(y_dim) if y_dim is not None else range(0)
    for d in outer:
        if origin[d] < 0 or origin[d] + extent[d] > shape[d]:
            raise ValueError(f"the box sticks out of dimension {d} of a {list(shape)} tensor (origin {list(origin)}, "
                             f"extent {list(extent)}): only the two innermost dimensions can be padded")

    def span(d: int) -> tuple[int, int, int]:  # (pad before, valid count, pad after) along dimension d
        lo, hi = origin[d], origin[d] + extent[d]
        before = min(extent[d], max(0, -lo))
        after = min(extent[d] - before, max(0, hi - shape[d]))
        return before, extent[d] - before - after, after

    xb, xv, xa = span(k)
    yb, yv, ya = span(y_dim) if y_dim is not None else (0, 1, 0)
    x_first = max(origin[k], 0)
    y_first = max(origin[y_dim], 0) if y_dim is not None else 0
    y_stride = strides[y_dim] if y_dim is not None else 0
    out: list[Transfer] = []
    for idx in itertools.product(*(range(origin[d], origin[d] + extent[d]) for d in outer)):
        dram = dram_base + sum(i * strides[d] for d, i in enumerate(idx)) + x_first * unit
        dram += y_first * y_stride
        sram = sram_base + sum((i - origin[d]) * box_strides[d] for d, i in enumerate(idx))
        out += _plane(config, mem, sram, dram, (yb, yv, ya), (xb * unit, xv * unit, xa * unit), y_stride)
    return out


def _plane(config: AcceleratorConfig, mem: MemId, sram: int, dram: int, ys: tuple[int, int, int],
           xs: tuple[int, int, int], stride: int) -> list[Transfer]:
    """One padded 2-D block, split where a field is too narrow."""
    pad_max, size_max, stride_max = _limits(config)
    yb, yv, ya = ys
    xb, xv, xa = xs
    width = xb + xv + xa
    if yv == 0 or xv == 0:  # nothing to read: the whole block is padding
        return _zeros(config, mem, sram, (yb + yv + ya) * width)
    if mem in (MemId.WGT, MemId.UOP, MemId.OUT) and (yb or ya or xb or xa):
        raise ValueError(f"{mem.name} transfers cannot pad (a box outside the tensor)")
    fits = max(yb, ya, xb, xa) <= pad_max and (yv == 1 or stride <= stride_max) and max(xv, yv) <= size_max
    if fits:
        return [Transfer(mem, sram, dram, yv, xv, stride if yv > 1 else xv, (yb, ya, xb, xa))]
    out = _zeros(config, mem, sram, yb * width)  # top padding rows
    row_sram = sram + yb * width
    if xb <= pad_max and xa <= pad_max and max(xv, yv) <= size_max and (yv == 1 or stride <= stride_max):
        out.append(Transfer(mem, row_sram, dram, yv, xv, stride if yv > 1 else xv, (0, 0, xb, xa)))
    else:  # row by row: zeros, data, zeros
        for r in range(yv):
            base = row_sram + r * width
            out += _zeros(config, mem, base, xb)
            for lo in range(0, xv, size_max):
                n = min(size_max, xv - lo)
                out.append(Transfer(mem, base + xb + lo, dram + r * stride + lo, 1, n, n))
            out += _zeros(config, mem, base + xb + xv, xa)
    out += _zeros(config, mem, row_sram + yv * width, ya * width)  # bottom padding rows
    return out


def _zeros(config: AcceleratorConfig, mem: MemId, sram: int, rows: int) -> list[Transfer]:
    """Zero-fill `rows` SRAM rows with loads that read nothing (y_size 0, one padding row)."""
    if rows and mem not in (MemId.INP, MemId.ACC, MemId.ACC_NARROW):
        raise ValueError(f"{mem.name} loads cannot zero-fill")
    _, size_max, _ = _limits(config)
    out = []
    while rows > 0:
        n = min(rows, size_max)
        out.append(Transfer(mem, sram, 0, 0, n, n, (1, 0, 0, 0)))
        sram, rows = sram + n, rows - n
    return out


def merge(config: AcceleratorConfig, transfers: Sequence[Transfer]) -> list[Transfer]:
    """Join transfers that continue each other in SRAM and DRAM (unpadded ones only): contiguous runs
    become one row, equal rows at a constant DRAM step become one 2-D transfer."""
    _, size_max, stride_max = _limits(config)
    flat: list[Transfer] = []
    for t in transfers:  # a 2-D block whose rows touch is one long row
        if not t.padded and t.y > 1 and t.stride == t.x and t.y * t.x <= size_max:
            t = replace(t, y=1, x=t.y * t.x, stride=t.y * t.x)
        prev = flat[-1] if flat else None
        if (prev is not None and not prev.padded and not t.padded and prev.y == t.y == 1 and prev.mem == t.mem
                and t.dram == prev.dram + prev.x and t.sram == prev.sram + prev.x and prev.x + t.x <= size_max):
            flat[-1] = replace(prev, x=prev.x + t.x, stride=prev.x + t.x)
        else:
            flat.append(t)
    out: list[Transfer] = []
    for t in flat:
        prev = out[-1] if out else None
        if (prev is not None and not prev.padded and not t.padded and t.y == 1 and prev.mem == t.mem
                and t.x == prev.x and t.sram == prev.sram + prev.y * prev.x):
            step = t.dram - prev.dram if prev.y == 1 else prev.stride
            if t.x <= step <= stride_max and t.dram == prev.dram + prev.y * step and prev.y < size_max:
                out[-1] = replace(prev, y=prev.y + 1, stride=step)
                continue
        out.append(t)
    return out
