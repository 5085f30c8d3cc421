"""Depthwise convolution (one filter per channel: ONNX ``group`` == channels, MobileNet's 3x3 layers) on the
channel-blocked layout, with the fused epilogue of :func:`~weft.compiler.llvm.nn.conv_kernel`.

Input and output share the channel block b, and channel c of a block only ever meets channel c of its
filter, so the SIMD vector runs across the b channels of a pixel::

    parallel for (n, oh.o, c.o):               # bands of rows first: a thread keeps the rows its core wrote
      for oh.i, ow.o:
        acc[r][b] = 0                          # r SIMD registers
        for kh, kw:
          for r (unrolled):                    # one weight vector, r input vectors: r FMAs
            acc[r][:] += x[n, c.o, oh*s + kh, (ow.o*r + r)*s + kw, :] * w[c.o, kh, kw, :]
        y = act(acc + bias (+ residual))

A grouped convolution with several channels per group is the ordinary convolution kernel restricted to
its group (``conv_kernel(groups=...)``): that one reuses each input value over many output channels,
which a depthwise layer has not got.
"""

from __future__ import annotations

import numpy as np

from weft.compiler.llvm.elementwise import Operand
from weft.compiler.llvm.expr import Buffer, Var
from weft.compiler.llvm.layout import Layout
from weft.compiler.llvm.nn import ConvSpec, conv_epilogue
from weft.compiler.llvm.target import Target
from weft.compiler.llvm.te import Kernel, compute, reduce_axis, reduce_sum

__all__ = ["MAX_ROW_BAND", "depthwise_kernel", "depthwise_tile", "grouped_tiles", "pack_depthwise_weights", "row_band"]


def pack_depthwise_weights(w: np.ndarray, b: int) -> np.ndarray:
    """(C, 1, KH, KW) float weights -> (C/b, KH, KW, b)."""
    c, _, kh, kw = w.shape
    return np.ascontiguousarray(w.reshape(c // b, b, kh, kw).transpose(0, 2, 3, 1), dtype=np.float32)


def depthwise_tile(out_w: int, target: Target) -> int:
    """Output pixels per tile along W: the largest divisor of the width that leaves registers for the
    weight vector and the input loads besides the accumulators."""
    budget = max(2, target.vector_registers - 4)
    return max(r for r in range(1, min(out_w, budget) + 1) if out_w % r == 0)


#: at most this many output rows of one channel block run in one task
MAX_ROW_BAND = 8


def row_band(out_h: int) -> int:
    """Output rows a task computes for one channel block, consecutively (the largest divisor of the height
    up to :data:`MAX_ROW_BAND`): its input rows are reused from L1 as the window slides down, and tasks go
    by bands of rows before channel blocks, so threads split the rows (a thread keeps the rows its core
    wrote; measured on an AVX-512 Xeon: whole rows before blocks cost a 28x28x192 layer 35% on one thread,
    blocks before rows cost MobileNetV2 4% on two)."""
    return max(r for r in range(1, min(out_h, MAX_ROW_BAND) + 1) if out_h % r == 0)


def grouped_tiles(out_w: int, target: Target) -> tuple[int, int]:
    """(r, ocb) for a grouped convolution's :func:`~weft.compiler.llvm.nn.conv_kernel`: its blocks are the
    few channels of a group, often narrower than a SIMD register, so each input broadcast feeds one
    block, and as many output pixels as registers allow hide the FMA latency (measured on AVX2: twice as
    fast as the ungrouped heuristic's tiles on ResNeXt's 3x3, group 32)."""
    budget = max(2, target.vector_registers - 2)
    return max(r for r in range(1, min(out_w, budget) + 1) if out_w % r == 0), 1


def depthwise_kernel(name: str, spec: ConvSpec, target: Target, *, act: str = "none", clip: tuple | None = None,
                     residual: Operand | None = None) -> Kernel:
    """Depthwise convolution + bias (+ residual) (+ ReLU or clip). `spec` has cin == cout and bi == bo
    (the block b); parameters: x, w (C/b, KH, KW, b), bias (C/b, b), [residual], y."""
    s = spec
    if s.cin != s.cout or s.bi != s.bo:
        raise ValueError(f"'{name}': a depthwise convolution keeps its channels and their block, got {s}")
    b = s.bo
    oh_, ow_ = s.out_hw
    x = Buffer("x", (s.n, s.cin // b, s.h, s.w, b))
    w = Buffer("w", (s.cin // b, s.kh, s.kw, b))
    bias = Buffer("bias", (s.cin // b, b))
    rkh, rkw = reduce_axis(s.kh, "rkh"), reduce_axis(s.kw, "rkw")
    sh, sw = s.stride
    dy, dx = s.offset
    out_layout = Layout(b)

    def body(n: Var, cb: Var, oh: Var, ow: Var, c: Var):
        return reduce_sum(x[n, cb, oh * sh + (rkh + dy), ow * sw + (rkw + dx), c] * w[cb, rkh, rkw, c], [rkh, rkw])

    epilogue = conv_epilogue(bias, residual, (s.n, s.cout, oh_, ow_), out_layout, act, clip)

    domain = (s.n, s.cout // b, oh_, ow_, b)
    if s.out_halo:
        halo = Layout(b, s.out_halo)
        y = compute("y", domain, body, epilogue=epilogue, buffer_shape=halo.physical((s.n, s.cout, oh_, ow_)),
                    store=lambda idx: halo.at(*idx))
    else:
        y = compute("y", domain, body, epilogue=epilogue)
    n, cb, oh, ow, c = y.axes
    owo, owi = y.split(ow, depthwise_tile(ow_, target))
    ohb, ohi = y.split(oh, row_band(oh_))
    y.reorder(n, ohb, cb, ohi, owo, rkh, rkw, owi, c)
    y.cache_write()
    if b > 1:
        y.vectorize(c)
    y.unroll(owi)
    y.parallel(y.fuse(n, ohb, cb))
    inputs = [x, w, bias] + ([residual.buffer] if residual is not None else [])
    return Kernel(name, inputs, [y.out], [y])
