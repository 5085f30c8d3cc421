"""GPU schedules for the loop IR: the same stage definitions, other loops.

* :func:`schedule_gpu` is the generic one every graph kernel gets: all output elements fused, one thread
  each, in blocks of 256; a reduction runs serially in that thread's registers. Correct for every stage.
* :func:`schedule_cross_thread` spreads a long reduction over the threads of a block (a shared-memory
  tree, see :func:`~weft.compiler.llvm.lower.lower`), one block per output.
* :func:`matmul_kernel` is the classic tiled product: a block computes a TM x TN tile of C, each thread
  an RM x RN register tile, and the block stages TM x TK of A and TK x TN of B in shared memory per step
  of the reduction.
"""

from __future__ import annotations

from weft.compiler.llvm.expr import Buffer, exp, maximum
from weft.compiler.llvm.te import Kernel, Stage, compute, reduce_axis, reduce_sum

__all__ = ["elementwise_kernel", "matmul_kernel", "row_sum_kernel", "schedule_cross_thread", "schedule_gpu"]

#: threads per block of the generic schedule (a multiple of the 32-thread warp)
BLOCK = 256


def schedule_gpu(stage: Stage, threads: int = BLOCK) -> None:
    """One thread per output element, `threads` per block; reductions serial per thread in a register."""
    stage.reset()
    spatial = [a for a in stage.leaves if not a.reduce]
    fused = stage.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    bx, tx = stage.split(fused, min(threads, fused.extent))
    stage.bind(bx, "blockIdx.x")
    stage.bind(tx, "threadIdx.x")
    if stage.reduce is not None:
        stage.cache_write()


def schedule_cross_thread(stage: Stage, threads: int = 128) -> None:
    """One block per output element; its `threads` threads share the (fused) reduction."""
    stage.reset()
    spatial = [a for a in stage.leaves if not a.reduce]
    red = [a for a in stage.leaves if a.reduce]
    fused = stage.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    r = stage.fuse(*red) if len(red) > 1 else red[0]
    ro, ri = stage.split(r, threads)
    stage.reorder(fused, ri, ro)
    stage.bind(fused, "blockIdx.x")
    stage.bind(ri, "threadIdx.x")


def elementwise_kernel(n: int, name: str = "gpu_axpy") -> Kernel:
    """``y = max(a * x + b, 0) * exp(-x)`` over n floats: arithmetic, a math function, one thread each."""
    x, b = Buffer("x", (n,)), Buffer("b", (n,))
    y = compute("y", (n,), lambda i: maximum(x[i] * 2.0 + b[i], 0.0) * exp(0.0 - x[i]))
    schedule_gpu(y)
    return Kernel(name, [x, b], [y.out], [y])


def row_sum_kernel(m: int, k: int, threads: int = 128, name: str = "gpu_row_sum") -> Kernel:
    """``y[i] = sum_j x[i, j]``: a cross-thread reduction, one block per row."""
    x = Buffer("x", (m, k))
    r = reduce_axis(k, "r")
    y = compute("y", (m,), lambda i: reduce_sum(x[i, r], [r]))
    schedule_cross_thread(y, threads)
    return Kernel(name, [x], [y.out], [y])


def matmul_kernel(m: int, n: int, k: int, tile: tuple[int, int, int] = (64, 64, 16),
                  per_thread: tuple[int, int] = (4, 4), name: str = "gpu_matmul") -> Kernel:
    """``c = a @ b`` tiled for shared memory and registers (`tile` = TM, TN, TK; `per_thread` = RM, RN)."""
    tm, tn, tk = tile
    rm, rn = per_thread
    a, b = Buffer("a", (m, k)), Buffer("b", (k, n))
    kk = reduce_axis(k, "k")
    c = compute("c", (m, n), lambda i, j: reduce_sum(a[i, kk] * b[kk, j], [kk]))
    i, j = c.axes
    io, ii = c.split(i, tm)
    jo, ji = c.split(j, tn)
    ty, ri = c.split(ii, rm)
    tx, rj = c.split(ji, rn)
    ko, ki = c.split(kk, tk)
    c.reorder(io, jo, ty, tx, ko, ki, ri, rj)
    c.bind(io, "blockIdx.y")
    c.bind(jo, "blockIdx.x")
    c.bind(ty, "threadIdx.y")
    c.bind(tx, "threadIdx.x")
    c.cache_write()
    c.unroll(ri)
    c.unroll(rj)
    c.cache_read(a, "shared", ko)
    c.cache_read(b, "shared", ko)
    return Kernel(name, [a, b], [c.out], [c])
