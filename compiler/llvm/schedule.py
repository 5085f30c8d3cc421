"""Schedule primitives: how a stage's loops are split, ordered, fused and annotated.

A stage starts with one loop per axis, spatial axes outside, reduce axes inside, in definition order.
Every primitive rewrites the list of *leaf* loops and how each original axis is computed from them; the
stage's definition never changes, so any schedule computes the same values (up to float rounding of a
reordered reduction). Each primitive below shows the loop nest before and after, for
``C[i, j] = sum_k A[i, k] * B[k, j]`` with extents I, J, K.

Annotations decide how the code generator emits a leaf loop: ``serial`` (a loop), ``unroll`` (the body
repeated with constant indices), ``vectorize`` (one SIMD instruction per lane group; innermost only),
``parallel`` (iterations spread over threads; outermost only) and, on GPUs, ``blockIdx.x`` /
``threadIdx.x`` style bindings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from weft.compiler.llvm.expr import Buffer, Expr, Var, const, substitute
from weft.errors import WeftError

__all__ = ["KINDS", "THREAD_TAGS", "Axis", "CacheRead", "Schedule", "ScheduleError"]

THREAD_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z")
KINDS = ("serial", "unroll", "vectorize", "parallel", *THREAD_TAGS)


class ScheduleError(WeftError, ValueError):
    """A primitive applied where it cannot be: names the stage, the axis and what was expected."""


class Axis(Var):
    """A loop variable with its extent; ``reduce`` axes are combined over, the others index the output."""

    __slots__ = ("extent", "reduce")

    def __init__(self, name: str, extent: int, reduce: bool = False):
        super().__init__(name, "i64")
        if int(extent) < 1:
            raise ValueError(f"axis '{name}' needs a positive extent, got {extent}")
        self.extent = int(extent)
        self.reduce = reduce

    def __repr__(self) -> str:
        return self.name


@dataclass
class CacheRead:
    """Stage a region of `buffer` in a `scope` buffer ("local" or "shared") at the top of loop `at`."""

    buffer: Buffer
    scope: str
    at: Axis


class Schedule:
    """The loop structure of one stage (mixed into :class:`~weft.compiler.llvm.te.Stage`)."""

    def __init__(self, axes: Sequence[Axis], reduce_axes: Sequence[Axis], name: str):
        self._sched_name = name
        self._roots = (tuple(axes), tuple(reduce_axes))
        self.reset()

    def reset(self) -> None:
        """Forget every primitive applied so far: one loop per axis again (to schedule for another target)."""
        axes, reduce_axes = self._roots
        self.leaves: list[Axis] = [*axes, *reduce_axes]
        #: original axis -> its value in terms of the current leaves
        self.root_value: dict[Axis, Expr] = {a: a for a in self.leaves}
        self.kinds: dict[Axis, str] = {}
        #: conditions (over leaves) that non-dividing splits need; (condition, involves a reduce axis)
        self.guards: list[tuple[Expr, bool]] = []
        self.cached = False
        self.cache_reads: list[CacheRead] = []

    # ---- helpers -----------------------------------------------------------------------------------
    def _err(self, message: str) -> ScheduleError:
        return ScheduleError(f"stage '{self._sched_name}': {message}")

    def _leaf(self, axis: Axis) -> int:
        for k, a in enumerate(self.leaves):
            if a is axis:
                return k
        raise self._err(f"'{axis.name}' is not a current loop (loops: {', '.join(a.name for a in self.leaves)})")

    def _replace(self, mapping: dict[Var, Expr]) -> None:
        self.root_value = {r: substitute(v, mapping) for r, v in self.root_value.items()}
        self.guards = [(substitute(g, mapping), red) for g, red in self.guards]

    # ---- loop structure ----------------------------------------------------------------------------
    def split(self, axis: Axis, factor: int) -> tuple[Axis, Axis]:
        """Split `axis` into an outer loop of ceil(extent / factor) and an inner loop of `factor`.

        before: ``for i in I: for j in J: ...`` ; ``split(j, 16)``
        after:  ``for i in I: for j.o in ceil(J/16): for j.i in 16: ... j = j.o*16 + j.i``

        When `factor` does not divide the extent, the body is guarded by ``j.o*16 + j.i < J``.
        """
        k = self._leaf(axis)
        if axis in self.kinds:
            raise self._err(f"split '{axis.name}' before annotating it ({self.kinds[axis]})")
        factor = int(factor)
        if factor < 1:
            raise self._err(f"split factor of '{axis.name}' must be positive, got {factor}")
        outer = Axis(f"{axis.name}.o", -(-axis.extent // factor), axis.reduce)
        inner = Axis(f"{axis.name}.i", factor, axis.reduce)
        value = outer * factor + inner
        self.leaves[k: k + 1] = [outer, inner]
        self._replace({axis: value})
        if axis.extent % factor:
            self.guards.append((value.lt(const(axis.extent)), axis.reduce))
        return outer, inner

    def fuse(self, *axes: Axis) -> Axis:
        """Merge adjacent loops (outer first) into one whose extent is their product.

        before: ``for i in I: for j in J: ...`` ; ``fuse(i, j)``
        after:  ``for ij in I*J: ... i = ij // J, j = ij % J``
        """
        if len(axes) < 2:
            raise self._err("fuse needs at least two loops")
        ks = [self._leaf(a) for a in axes]
        if ks != list(range(ks[0], ks[0] + len(ks))):
            raise self._err(f"fused loops must be adjacent and in order, got {[a.name for a in axes]}")
        if len({a.reduce for a in axes}) != 1:
            raise self._err("cannot fuse a reduce loop with a spatial loop")
        for a in axes:
            if a in self.kinds:
                raise self._err(f"fuse '{a.name}' before annotating it ({self.kinds[a]})")
        extent = 1
        for a in axes:
            extent *= a.extent
        fused = Axis("_".join(a.name for a in axes), extent, axes[0].reduce)
        mapping: dict[Var, Expr] = {}
        inner_size = extent
        for n, a in enumerate(axes):
            inner_size //= a.extent
            v: Expr = fused // inner_size if inner_size > 1 else fused
            mapping[a] = v % a.extent if n > 0 else v
        self.leaves[ks[0]: ks[-1] + 1] = [fused]
        self._replace(mapping)
        return fused

    def reorder(self, *axes: Axis) -> None:
        """Put the given loops, in the given order, into the positions they occupy together.

        before: ``for i: for j: for k: ...`` ; ``reorder(k, j)``
        after:  ``for i: for k: for j: ...``
        """
        ks = sorted(self._leaf(a) for a in axes)
        if len(set(ks)) != len(ks):
            raise self._err("reorder lists a loop twice")
        for k, a in zip(ks, axes, strict=True):
            self.leaves[k] = a

    def tile(self, x: Axis, y: Axis, fx: int, fy: int) -> tuple[Axis, Axis, Axis, Axis]:
        """Split two loops and order the pieces outer-outer-inner-inner (a 2-D block).

        before: ``for i in I: for j in J`` ; ``tile(i, j, 4, 16)``
        after:  ``for i.o: for j.o: for i.i in 4: for j.i in 16``
        """
        xo, xi = self.split(x, fx)
        yo, yi = self.split(y, fy)
        self.reorder(xo, yo, xi, yi)
        return xo, yo, xi, yi

    # ---- annotations -------------------------------------------------------------------------------
    def _annotate(self, axis: Axis, kind: str) -> None:
        self._leaf(axis)
        if kind not in KINDS:
            raise self._err(f"unknown loop kind '{kind}' (known: {', '.join(KINDS)})")
        self.kinds[axis] = kind

    def vectorize(self, axis: Axis) -> None:
        """Emit the innermost loop `axis` as SIMD instructions over all its lanes at once.

        before: ``for j.i in 16: C[i, j.o*16+j.i] = ...``
        after:  ``C[i, j.o*16 : j.o*16+16] = <16 x f32> ...`` (contiguous loads/stores, broadcasts of
        lane-invariant values, gathers only where the index is not affine in the lane)
        """
        self._annotate(axis, "vectorize")

    def unroll(self, axis: Axis) -> None:
        """Repeat the body `extent` times with constant indices (small, fixed loops: register tiles).

        before: ``for r in 4: acc[r] += x[r] * w``
        after:  ``acc[0] += x[0] * w; acc[1] += x[1] * w; acc[2] += ...; acc[3] += ...``
        """
        self._annotate(axis, "unroll")

    def parallel(self, axis: Axis) -> None:
        """Spread the iterations of the outermost loop `axis` over the kernel's threads.

        before: ``for n_co_h in 224: ...``
        after:  threads take iterations from a shared counter until none remain; the call returns when
        all are done
        """
        self._annotate(axis, "parallel")

    def bind(self, axis: Axis, tag: str) -> None:
        """GPU: make loop `axis` the grid (``blockIdx.*``) or block (``threadIdx.*``) index.

        before: ``for i.o in 64: for i.i in 256: ...`` ; ``bind(i.o, "blockIdx.x"); bind(i.i, "threadIdx.x")``
        after:  no loops; ``i = blockIdx.x*256 + threadIdx.x`` in a launch of 64 blocks of 256 threads
        """
        if tag not in THREAD_TAGS:
            raise self._err(f"unknown thread tag '{tag}' (known: {', '.join(THREAD_TAGS)})")
        self._annotate(axis, tag)

    # ---- memory ------------------------------------------------------------------------------------
    def cache_write(self) -> None:
        """Accumulate into a local buffer covering the spatial loops inside the first reduce loop, and
        write the output (through the epilogue) once per element when the reduction ends.

        before: ``for i: for k: for j.i in 16: C[i, j.i] += A[i, k] * B[k, j.i]``
        after:  ``for i: acc[0:16] = 0; for k: for j.i: acc[j.i] += ...; for j.i: C[i, j.i] = epi(acc[j.i])``
        With the spatial loops inside the reduction unrolled, ``acc`` lives in registers.
        """
        if not any(a.reduce for a in self.leaves):
            raise self._err("cache_write needs a reduction")
        self.cached = True

    def cache_read(self, buffer: Buffer, scope: str, at: Axis) -> None:
        """Copy the region of `buffer` that the loops inside `at` (and the block's threads) read into a
        `scope` buffer at the top of each `at` iteration; reads inside then use the copy.

        before: ``for k.o: for k.i: C[i, j] += A[i, k.o*8+k.i] * ...``  ; ``cache_read(A, "shared", k.o)``
        after:  ``for k.o: As = A[rows of the block, k.o*8 : k.o*8+8]; barrier; for k.i: C[i, j] +=
        As[i - row0, k.i] * ...; barrier``
        """
        self._leaf(at)
        if scope not in ("local", "shared"):
            raise self._err(f"cache_read scope must be 'local' or 'shared', got '{scope}'")
        if any(c.buffer is buffer for c in self.cache_reads):
            raise self._err(f"'{buffer.name}' is already cached")
        self.cache_reads.append(CacheRead(buffer, scope, at))

    # ---- queries -----------------------------------------------------------------------------------
    def kind(self, axis: Axis) -> str:
        return self.kinds.get(axis, "serial")

    def describe(self) -> list[str]:
        """The leaf loops, outermost first, as ``name[extent]:kind`` (for logs and tests)."""
        return [f"{a.name}[{a.extent}]" + (f":{self.kind(a)}" if self.kind(a) != "serial" else "")
                for a in self.leaves]
