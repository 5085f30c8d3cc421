"""Element-wise and data-movement kernels: arithmetic with broadcasting, layout changes, pad, concat,
slice, and the schedule they share.

Each builder returns a :class:`~weft.compiler.llvm.te.Kernel` whose stage is defined over the output's
*physical* axes; inputs are read through their own layouts, so the same definition serves plain and
channel-blocked tensors, and a layout conversion is just the identity op between two layouts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from weft.compiler.llvm.expr import Buffer, Expr, Load, const, maximum, minimum, select
from weft.compiler.llvm.layout import PLAIN, Layout
from weft.compiler.llvm.schedule import Axis
from weft.compiler.llvm.target import Target
from weft.compiler.llvm.te import Kernel, Stage, compute

__all__ = [
    "Operand", "block_concat_kernel", "concat_kernel", "elementwise_kernel", "layout_kernel", "pad_kernel",
    "schedule_elementwise", "slice_kernel",
]

#: below this many output elements a kernel runs on the calling thread: starting threads costs more
PARALLEL_MIN_ELEMENTS = 1 << 16
#: iterations of the parallel loop that share out evenly on any thread count
PARALLEL_CHUNKS = 64


@dataclass(frozen=True)
class Operand:
    """A kernel input: its buffer, its logical shape and its layout."""

    buffer: Buffer
    shape: tuple[int, ...]
    layout: Layout = PLAIN

    @staticmethod
    def make(name: str, shape: Sequence[int], layout: Layout = PLAIN, dtype: str = "f32") -> Operand:
        shape = tuple(int(d) for d in shape) or (1,)
        return Operand(Buffer(name, layout.physical(shape), dtype), shape, layout)


def read(op: Operand, out_shape: Sequence[int], out_layout: Layout, phys: Sequence[Expr],
         logical: Sequence[Expr]) -> Load:
    """Element of `op` that output element (`phys`, `logical`) sees under numpy broadcasting."""
    rank, rin = len(out_shape), len(op.shape)
    if rin > rank:
        raise ValueError(f"'{op.buffer.name}' of shape {list(op.shape)} does not broadcast to {list(out_shape)}")
    bcast = [op.shape[d] == 1 and out_shape[rank - rin + d] != 1 for d in range(rin)]
    if op.layout == out_layout and rin == rank and not op.layout.blocked:
        return op.buffer[tuple(const(0) if bcast[d] else phys[d] for d in range(rank))]
    if op.layout.blocked and out_layout.blocked and op.layout.block == out_layout.block and rin == rank:
        n, co, h, w, ci = phys  # the same blocks: only the halos may differ
        cb = bcast[1]
        zero = const(0)
        return op.buffer[op.layout.at(zero if bcast[0] else n, zero if cb else co, zero if bcast[2] else h,
                                      zero if bcast[3] else w, zero if cb else ci)]
    lidx = [const(0) if bcast[d] else logical[rank - rin + d] for d in range(rin)]
    return op.buffer[tuple(op.layout.physical_index(lidx))]


def elementwise_kernel(name: str, out_shape: Sequence[int], out_layout: Layout, inputs: Sequence[Operand],
                       fn: Callable[..., Expr], target: Target, *, dtype: str = "f32") -> Kernel:
    """``out = fn(*inputs)`` element by element, inputs broadcast numpy-style to `out_shape`."""
    out_shape = tuple(out_shape) or (1,)
    if out_layout.halo:
        raise ValueError(f"'{name}': element-wise kernels write tensors without a halo")
    phys_shape = out_layout.physical(out_shape)

    def body(*phys: Axis) -> Expr:
        logical = out_layout.logical_index(phys)
        return fn(*[read(op, out_shape, out_layout, phys, logical) for op in inputs])

    stage = compute(f"{name}_out", phys_shape, body, dtype=dtype)
    schedule_elementwise(stage, target)
    return Kernel(name, [op.buffer for op in inputs], [stage.out], [stage])


def schedule_elementwise(stage: Stage, target: Target, parallel_min: int = PARALLEL_MIN_ELEMENTS) -> None:
    """Vectorize the innermost axis (split to the SIMD width when it divides), fuse the outer loops into
    one of at least :data:`PARALLEL_CHUNKS` iterations, and run that loop in parallel when the output is
    large enough to pay for threads."""
    axes = list(stage.leaves)
    while len(axes) > 1 and axes[-1].extent == 1:  # trailing unit axes ride along with the one before
        axes[-2:] = [stage.fuse(axes[-2], axes[-1])]
    lanes = target.lanes(4)
    last = axes[-1]
    outer = axes[:-1]
    if last.extent % lanes == 0 and last.extent > lanes:
        lo, li = stage.split(last, lanes)
        outer.append(lo)
        vec = li
    elif last.extent <= 4 * lanes:
        vec = last
    else:
        lo, li = stage.split(last, _divisor_at_most(last.extent, lanes))
        outer.append(lo)
        vec = li
    if vec.extent > 1:
        stage.vectorize(vec)
    if not outer:
        return
    # fuse only the outer loops that give the threads enough iterations to share: the loops inside stay
    # loops, as a fused loop pays a division and a remainder per iteration for each index it recovers
    # (every vector, when all of them were fused: 11 GB/s on an affine op, measured)
    k = 1
    while k < len(outer) and math.prod(a.extent for a in outer[:k]) < PARALLEL_CHUNKS:
        k += 1
    fused = stage.fuse(*outer[:k]) if k > 1 else outer[0]
    if stage.out.size >= parallel_min and fused.extent > 1:
        stage.parallel(fused)


def _divisor_at_most(n: int, cap: int) -> int:
    for d in range(min(cap, n), 0, -1):
        if n % d == 0:
            return d
    return 1


def layout_kernel(name: str, src: Operand, out_layout: Layout, target: Target) -> Kernel:
    """Copy `src` into `out_layout` (plain <-> blocked, or between block sizes)."""
    return elementwise_kernel(name, src.shape, out_layout, [src], lambda x: x, target, dtype=src.buffer.dtype)


def pad_kernel(name: str, src: Operand, pads: Sequence[int], value: float, target: Target,
               out_layout: Layout | None = None) -> Kernel:
    """Constant padding: ``pads`` is (begin..., end...) per logical axis (negative values crop). With a
    blocked layout only H and W may be padded."""
    rank = len(src.shape)
    lo, hi = list(pads[:rank]), list(pads[rank:])
    out_shape = tuple(d + a + b for d, a, b in zip(src.shape, lo, hi, strict=True))
    layout = out_layout if out_layout is not None else src.layout.without_halo()
    if layout.blocked and (lo[1] or hi[1]):
        raise ValueError(f"'{name}': a channel-blocked tensor cannot be padded along its channels")
    dtype = src.buffer.dtype

    def body(*phys: Axis) -> Expr:
        logical = layout.logical_index(phys)
        inside, idx = None, []
        for d, i in enumerate(logical):
            j = i - lo[d] if lo[d] else i
            if lo[d] > 0 or hi[d] > 0:
                ok = j.ge(0).logical_and(j.lt(src.shape[d]))
                inside = ok if inside is None else inside.logical_and(ok)
                j = minimum(maximum(j, 0), src.shape[d] - 1)  # never load outside, even where unused
            idx.append(j)
        if src.layout.blocked and layout.blocked and src.layout.block == layout.block:
            x = src.buffer[src.layout.at(idx[0], phys[1], idx[2], idx[3], phys[4])]
        else:
            x = src.buffer[tuple(src.layout.physical_index(idx))]
        return x if inside is None else select(inside, x, const(value, dtype))

    stage = compute(f"{name}_out", layout.physical(out_shape), body, dtype=dtype)
    schedule_elementwise(stage, target)
    return Kernel(name, [src.buffer], [stage.out], [stage])


def concat_kernel(name: str, parts: Sequence[Operand], axis: int, out_layout: Layout, target: Target) -> Kernel:
    """Concatenate `parts` along logical `axis` (each part read through its own layout)."""
    rank = len(parts[0].shape)
    axis %= rank
    out_shape = list(parts[0].shape)
    out_shape[axis] = sum(p.shape[axis] for p in parts)
    offsets = []
    total = 0
    for p in parts:
        offsets.append(total)
        total += p.shape[axis]
    dtype = parts[0].buffer.dtype

    def body(*phys: Axis) -> Expr:
        logical = out_layout.logical_index(phys)
        i = logical[axis]
        result: Expr | None = None
        for p, off in reversed(list(zip(parts, offsets, strict=True))):
            j = minimum(maximum(i - off, 0), p.shape[axis] - 1)
            idx = list(logical)
            idx[axis] = j
            x = p.buffer[tuple(p.layout.physical_index(idx))]
            result = x if result is None else select(i.lt(off + p.shape[axis]), x, result)
        return result  # type: ignore[return-value]

    stage = compute(f"{name}_out", out_layout.physical(out_shape), body, dtype=dtype)
    schedule_elementwise(stage, target)
    return Kernel(name, [p.buffer for p in parts], [stage.out], [stage])


def block_concat_kernel(name: str, parts: Sequence[Operand], target: Target) -> Kernel:
    """Concatenate channel-blocked NCHW `parts` (same block, whole blocks each) along channels into an
    (N, C/b, H, W, b) tensor: one copy stage per part, each writing its own range of blocks of the one
    output (contiguous vectors, no per-element choice of part)."""
    block = parts[0].layout.block
    n, _, h, w = parts[0].shape
    total = sum(p.shape[1] for p in parts) // block
    out = Buffer(f"{name}_out", (n, total, h, w, block), parts[0].buffer.dtype)
    stages, first = [], 0
    for k, p in enumerate(parts):
        src, blocks, base = p, p.shape[1] // block, first
        stage = compute(f"{name}_{k}", (n, blocks, h, w, block),
                        lambda i, cb, y, x, c, src=src: src.buffer[src.layout.at(i, cb, y, x, c)],
                        buffer_shape=out.shape, store=lambda idx, base=base: (idx[0], idx[1] + base, *idx[2:]))
        stage.out = out  # every stage writes its blocks of the same tensor
        schedule_elementwise(stage, target)
        stages.append(stage)
        first += blocks
    return Kernel(name, [p.buffer for p in parts], [out], stages)


def slice_kernel(name: str, src: Operand, starts: Sequence[int], steps: Sequence[int], out_shape: Sequence[int],
                 target: Target) -> Kernel:
    """``out[i] = src[starts + i * steps]`` per axis (a plain-layout strided copy)."""
    if src.layout.blocked:
        raise ValueError(f"'{name}': slicing reads plain tensors")

    def body(*axes: Axis) -> Expr:
        return src.buffer[tuple(a * st + s0 if (st, s0) != (1, 0) else a
                                for a, s0, st in zip(axes, starts, steps, strict=True))]

    stage = compute(f"{name}_out", out_shape, body, dtype=src.buffer.dtype)
    schedule_elementwise(stage, target)
    return Kernel(name, [src.buffer], [stage.out], [stage])
