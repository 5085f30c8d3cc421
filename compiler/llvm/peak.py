"""The machine's practical peak, measured: a generated kernel of independent fused multiply-adds on registers.

``weft bench cpu`` compares operators with it; the host tuner's measurer uses the same kernel as a probe of
how busy the machine is.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from weft.compiler.llvm.expr import Buffer
from weft.compiler.llvm.jit import build
from weft.compiler.llvm.target import host_target
from weft.compiler.llvm.te import Kernel, compute, reduce_axis, reduce_sum

__all__ = ["call_times", "measure_peak", "peak_kernel"]


def call_times(fn: Callable[[], Any], repeat: int, warmup: int = 2) -> list[float]:
    """Seconds of each of `repeat` calls of `fn`, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def measure_peak(threads: int, samples: int = 200) -> float:
    """GFLOP/s of a register-only FMA loop on `threads` threads (the machine's practical peak)."""
    run, flops = peak_kernel(threads)
    # the best of many short calls, like the best run of an operator: other processes can only slow a
    # call down, and a short one often slips between their time slices
    best = min(call_times(run, samples, 2))
    return flops / best / 1e9


def peak_kernel(threads: int) -> tuple[Callable[[], None], int]:
    """A call of independent fused multiply-adds on registers on `threads` threads (each load feeds one FMA
    per accumulator, about 0.25 ms), and its FLOPs: the machine's practical peak, or a probe of how busy it is."""
    target = host_target()
    lanes = target.lanes(4)
    # independent accumulators: half the register file (the other half holds w; x is the FMA's memory
    # operand). Two FMA pipes of 4 cycles' latency need 8 in flight: with 6 (the old count) the probe was
    # latency-bound at 3/4 of the peak (measured on AVX2: 65 against 82 GFLOP/s, 8 chains; 12 spill)
    chains = max(2, target.vector_registers // 2)
    iters = 16384  # about 0.25 ms per call: the call overhead stays below 2%
    x = Buffer("x", (8, lanes))
    w = Buffer("w", (chains, lanes))
    r = reduce_axis(iters, "r")
    # per iteration one vector load shared by `chains` FMAs whose other operand stays in a register
    out = compute("out", (threads * 4, chains, lanes), lambda t, j, c: reduce_sum(x[r % 8, c] * w[j, c], [r]))
    t, j, c = out.axes
    out.reorder(t, r, j, c)
    out.cache_write()
    out.vectorize(c)
    out.unroll(j)
    out.parallel(t)
    fn = build(Kernel("fma_peak", [x, w], [out.out], [out]))
    a = np.full((8, lanes), 1e-3, np.float32)
    b = np.full((chains, lanes), 1e-3, np.float32)
    y = np.empty((threads * 4, chains, lanes), np.float32)
    flops = 2 * threads * 4 * chains * lanes * iters

    def run() -> None:
        fn(a, b, y, nthreads=threads)

    return run, flops
