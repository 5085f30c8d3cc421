"""A small tensor-expression level: affine loop nests, schedule primitives, and folding onto the ISA.

A layer is declared as a :class:`Compute`: named axes (spatial or reduction) and, per tensor it touches,
an :class:`Access`, one affine :class:`Expr` per tensor dimension. Tensors are counted in *rows* of the
SRAM they pass through (an inp row is ``batch x block_in`` elements, a wgt row ``block_out x block_in``,
an acc row ``batch x block_out``), so the element loops inside a row are exactly the tensor intrinsic and
disappear from the nest (:func:`tensorize` checks that the rows match the intrinsic of the ISA spec).

Schedule primitives rewrite the compute, as in TVM:

* ``split(c, axis, factor)``: ``axis`` becomes ``axis.o * factor + axis.i``.
  before: ``for oh in 56: body(oh)``; after: ``for oh.o in 4: for oh.i in 14: body(oh.o*14 + oh.i)``.
* ``tile_box(access, inner)``: the box of tensor rows that the ``inner`` axes touch for fixed outer axes
  (a ``cache_read``/``cache_write`` at the tile): its extent per dimension and the outer part of its origin.
* ``fold(...)``: the loop nest of one tile body over SRAM row indices becomes one GEMM or ALU instruction:
  two axes go to the instruction's ``iter_out``/``iter_in`` loops and the rest are enumerated as micro-ops
  (VTA's FoldUopLoop). The innermost micro-op axis is always a spatial axis with at least two values, so
  consecutive executions never write one accumulator row (the pipeline's hazard, by construction).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from weft.isa.encoding import UOP_DTYPE

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = [
    "Access", "Axis", "Box", "Compute", "Expr", "Kernel", "Nest", "fold", "split", "tensorize", "tile_box", "var",
]


@dataclass(frozen=True)
class Axis:
    name: str
    extent: int
    reduce: bool = False


@dataclass(frozen=True)
class Expr:
    """``const + sum(coef * axis)`` over axis names."""

    coef: tuple[tuple[str, int], ...] = ()
    const: int = 0

    def get(self, axis: str) -> int:
        return dict(self.coef).get(axis, 0)

    def __add__(self, other: Expr | int) -> Expr:
        if isinstance(other, int):
            return Expr(self.coef, self.const + other)
        merged = dict(self.coef)
        for name, k in other.coef:
            merged[name] = merged.get(name, 0) + k
        return Expr(tuple((n, k) for n, k in merged.items() if k), self.const + other.const)

    def __sub__(self, other: int) -> Expr:
        return self + (-other)

    def __mul__(self, k: int) -> Expr:
        return Expr(tuple((n, c * k) for n, c in self.coef if c * k), self.const * k)

    def substitute(self, name: str, replacement: Expr) -> Expr:
        k = self.get(name)
        if not k:
            return self
        rest = Expr(tuple((n, c) for n, c in self.coef if n != name), self.const)
        return rest + replacement * k

    def restrict(self, names: Iterable[str]) -> Expr:
        """The part of the expression over `names` (no constant)."""
        keep = set(names)
        return Expr(tuple((n, k) for n, k in self.coef if n in keep))

    def value(self, point: Mapping[str, int]) -> int:
        return self.const + sum(k * point[n] for n, k in self.coef)


def var(name: str) -> Expr:
    return Expr(((name, 1),))


@dataclass(frozen=True)
class Access:
    """Rows of `tensor` indexed by one expression per dimension (the tensor is row-major in DRAM)."""

    tensor: str
    index: tuple[Expr, ...]


@dataclass(frozen=True)
class Compute:
    """``out[...] op= f(operands[...])`` over `axes`: the layer before scheduling."""

    name: str
    axes: tuple[Axis, ...]
    accesses: Mapping[str, Access]
    shapes: Mapping[str, tuple[int, ...]]  # tensor -> shape in rows

    def axis(self, name: str) -> Axis:
        for a in self.axes:
            if a.name == name:
                return a
        raise KeyError(f"compute '{self.name}' has no axis '{name}'")


def split(c: Compute, name: str, factor: int) -> Compute:
    """Split axis `name` into ``name.o`` (extent/factor) and ``name.i`` (factor); factor must divide it."""
    axis = c.axis(name)
    if factor < 1 or axis.extent % factor:
        raise ValueError(f"compute '{c.name}': split factor {factor} does not divide axis {name} ({axis.extent})")
    outer, inner = Axis(f"{name}.o", axis.extent // factor, axis.reduce), Axis(f"{name}.i", factor, axis.reduce)
    axes: list[Axis] = []
    for a in c.axes:
        axes += [outer, inner] if a.name == name else [a]
    repl = var(outer.name) * factor + var(inner.name)
    accesses = {k: Access(a.tensor, tuple(e.substitute(name, repl) for e in a.index)) for k, a in c.accesses.items()}
    return Compute(c.name, tuple(axes), accesses, c.shapes)


@dataclass(frozen=True)
class Box:
    """The rows of a tensor one tile touches: per dimension, an origin that depends on the outer axes
    and an extent fixed by the inner ones. The tile buffer holds the box row-major (padding included)."""

    tensor: str
    origin: tuple[Expr, ...]
    extent: tuple[int, ...]
    inner: tuple[Expr, ...]  # per dimension, the index relative to the origin (inner axes only)

    @property
    def rows(self) -> int:
        return int(np.prod(self.extent))

    def strides(self) -> tuple[int, ...]:
        """Row-major strides of the tile buffer."""
        out, step = [], 1
        for e in reversed(self.extent):
            out.append(step)
            step *= e
        return tuple(reversed(out))

    def sram(self, base: int) -> Expr:
        """The SRAM row of an element of the box, over the inner axes, for a buffer at `base`."""
        expr = Expr(const=base)
        for stride, idx in zip(self.strides(), self.inner, strict=True):
            expr = expr + idx * stride
        return expr

    def origin_at(self, point: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(e.value(point) for e in self.origin)


def tile_box(c: Compute, key: str, inner: Sequence[str]) -> Box:
    """The box of `c.accesses[key]` that the axes `inner` sweep (the other axes fixed)."""
    extents = {a.name: a.extent for a in c.axes}
    acc = c.accesses[key]
    origin, extent, rel = [], [], []
    for e in acc.index:
        inside = e.restrict(inner)
        if any(k < 0 for _, k in inside.coef):
            raise ValueError(f"compute '{c.name}': {key} decreases along an inner axis")
        origin.append(Expr(tuple((n, k) for n, k in e.coef if n not in set(inner)), e.const))
        extent.append(1 + sum(k * (extents[n] - 1) for n, k in inside.coef))
        rel.append(inside)
    return Box(acc.tensor, tuple(origin), tuple(extent), tuple(rel))


def tensorize(config: AcceleratorConfig, intrinsic: Mapping[str, Any]) -> None:
    """Check that a row of each buffer is what the intrinsic reads and writes (the element loops that a
    nest over rows leaves out): ``acc[b, o] += sum_i inp[b, i] * wgt[o, i]`` on the spec's row shapes."""
    c = config
    shape = intrinsic["shape"]
    scopes = intrinsic["scopes"]
    want = {
        "inp": [shape["batch"], shape["block_in"]], "wgt": [shape["block_out"], shape["block_in"]],
        "acc": [shape["batch"], shape["block_out"]], "out": [shape["batch"], shape["block_out"]],
    }
    for scope, rows in want.items():
        if list(scopes[scope]["row_shape"]) != rows:
            raise ValueError(f"intrinsic '{intrinsic['name']}': {scope} rows are {scopes[scope]['row_shape']}, "
                             f"the GEMM needs {rows}")
    if (shape["batch"], shape["block_in"], shape["block_out"]) != (c.batch, c.block_in, c.block_out):
        raise ValueError(f"intrinsic '{intrinsic['name']}' does not match config '{c.name}'")


# ---- folding a tile body onto one instruction ----------------------------------------------------------


@dataclass(frozen=True)
class Nest:
    """A tile body: loops over `axes` (outer to inner) of one intrinsic call whose operands are the SRAM
    rows ``dst``, ``src`` and ``wgt`` (affine in the axes). ``src``/``wgt`` may be None (reset GEMM,
    ALU with an immediate)."""

    axes: tuple[Axis, ...]
    dst: Expr
    src: Expr | None = None
    wgt: Expr | None = None

    @property
    def executions(self) -> int:
        return int(np.prod([a.extent for a in self.axes], dtype=np.int64))

    def restrict(self, ranges: dict[str, tuple[int, int]]) -> Nest:
        """The executions whose axes named in `ranges` lie in their ``[lo, hi)`` (the axis then counts from
        lo: its operands shift by it)."""
        axes, dst, src, wgt = list(self.axes), self.dst, self.src, self.wgt
        for name, (lo, hi) in ranges.items():
            axes = [Axis(a.name, hi - lo, a.reduce) if a.name == name else a for a in axes]
            if lo:
                shifted = Expr(((name, 1),), lo)
                dst = dst.substitute(name, shifted)
                src = None if src is None else src.substitute(name, shifted)
                wgt = None if wgt is None else wgt.substitute(name, shifted)
        return Nest(tuple(axes), dst, src, wgt)


@dataclass(frozen=True)
class Kernel:
    """One GEMM/ALU instruction's loop fields and its micro-ops (absolute SRAM rows)."""

    uops: np.ndarray = field(repr=False)
    iter_out: int
    iter_in: int
    dst_factor: tuple[int, int]
    src_factor: tuple[int, int]
    wgt_factor: tuple[int, int]

    @property
    def executions(self) -> int:
        return len(self.uops) * self.iter_out * self.iter_in

    def key(self) -> bytes:
        return self.uops.tobytes()


def _coef(e: Expr | None, axis: str) -> int:
    return 0 if e is None else e.get(axis)


def fold(nest: Nest, max_uops: int | None = None) -> Kernel:
    """Fold a tile body into one instruction: the two loops take the largest axes, the micro-ops
    enumerate the rest, and the last micro-op axis is a spatial axis with at least two values (so two
    consecutive executions write different accumulator rows, given a dst that is one-to-one on the
    spatial axes). A body whose spatial axes all have one value has a single destination row: its
    reduction must then run one execution per instruction or be split (see :func:`split_single_row`)."""
    axes = [a for a in nest.axes if a.extent > 1]
    spatial = [a for a in axes if not a.reduce and _coef(nest.dst, a.name)]
    reduce_axes = [a for a in axes if a.reduce or not _coef(nest.dst, a.name)]
    if not spatial and reduce_axes:
        raise ValueError("a body with one destination row cannot run its reduction in one instruction")
    innermost = min(spatial, key=lambda a: a.extent) if spatial else None
    rest = [a for a in axes if a is not innermost]
    loops = sorted(rest, key=lambda a: a.extent, reverse=True)[:2]
    uop_axes = [a for a in rest if a not in loops] + ([innermost] if innermost else [])
    while len(loops) < 2:
        loops.append(Axis("_unit", 1))
    count = int(np.prod([a.extent for a in uop_axes], dtype=np.int64))
    if max_uops is not None and count > max_uops:
        raise ValueError(f"the tile body needs {count} micro-ops, more than the {max_uops} available")
    uops = _uops_over(nest, uop_axes)
    if nest.src is None:
        uops["src"] = 0
    out, inn = loops
    return Kernel(
        uops, out.extent, inn.extent,
        (_coef(nest.dst, out.name), _coef(nest.dst, inn.name)),
        (_coef(nest.src, out.name), _coef(nest.src, inn.name)),
        (_coef(nest.wgt, out.name), _coef(nest.wgt, inn.name)),
    )


def flat_uops(nest: Nest) -> np.ndarray:
    """Every execution of a nest as one micro-op each, in loop order (for single-row reductions)."""
    return _uops_over(nest, [a for a in nest.axes if a.extent > 1])


def _uops_over(nest: Nest, axes: list[Axis]) -> np.ndarray:
    """One micro-op per point of `axes` (the last varying fastest): the nest's address expressions
    evaluated there (the other axes at 0)."""
    count = int(np.prod([a.extent for a in axes], dtype=np.int64))
    grids = np.meshgrid(*[np.arange(a.extent) for a in axes], indexing="ij") if axes else []
    uops = np.zeros(count, dtype=UOP_DTYPE)
    for name, expr in (("dst", nest.dst), ("src", nest.src), ("wgt", nest.wgt)):
        if expr is None:
            continue
        col = np.full(count, expr.const, dtype=np.int64)
        for a, g in zip(axes, grids, strict=True):
            col += expr.get(a.name) * g.reshape(-1)
        uops[name] = col
    return uops


def split_single_row(nest: Nest, spare_row: int) -> tuple[Kernel, int]:
    """A reduction into one row, as one instruction without the hazard: executions alternate between
    the row and `spare_row` (the reduction is associative), so consecutive executions never write one
    row. Returns the kernel and the destination row; the caller combines ``row op= spare_row`` after."""
    uops = flat_uops(nest)
    row = int(uops["dst"][0]) if len(uops) else int(nest.dst.const)
    uops["dst"][1::2] = spare_row
    return Kernel(uops, 1, 1, (0, 0), (0, 0), (0, 0)), row
