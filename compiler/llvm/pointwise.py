"""1x1 convolutions as one packed matrix product over the pixels, where the direct kernel tiles poorly.

The direct kernel (:func:`~weft.compiler.llvm.nn.conv_kernel`) blocks pixels along one output row, so its
register tile must divide the width: a 7-wide row (the last stage of every ImageNet network) leaves it
7x1 tiles, 8 loads for 7 FMAs. Here the pixels are one axis instead::

    xp[c.o, p, c.i] = x[n, c.o, oh*s + dy, ow*s + dx, c.i]    # packed: p = (n, oh, ow), rounded up
    y[n, k.o, oh, ow, k.i] = act(sum_c xp[c.o, p, c.i] * w[k.o, c.o, c.i, k.i] + bias (+ residual))

(register tiles of the pixel axis; a batch-1 stride-1 input with no border is read where it lies, unpacked).

The pixel axis is rounded up to a multiple of the best tile's height (the padding pixels repeat the last
one; storing them rewrites its value) so that a full register tile fits (6x2, or 4x3 for a multiple of three output
blocks); the weights are packed as the direct kernel's, and each sum adds the same products in the same
order as it does.
"""

from __future__ import annotations

from weft.compiler.llvm.elementwise import Operand
from weft.compiler.llvm.expr import Buffer, Expr, Var, minimum
from weft.compiler.llvm.layout import Layout
from weft.compiler.llvm.nn import ConvSpec, conv_epilogue, conv_tiles, padded_rows, register_tiles, tile_score
from weft.compiler.llvm.target import Target
from weft.compiler.llvm.te import Kernel, compute, reduce_axis, reduce_sum

__all__ = ["MARGIN", "pointwise_applies", "pointwise_kernel", "pointwise_tile"]

#: how much faster (modelled) the pixel axis's tile must be than the direct kernel's for this kernel to win
MARGIN = 1.10

def _pixels(spec: ConvSpec, target: Target) -> tuple[int, int]:
    """(pixels, padded): the pixel count, and the count the product runs over (:func:`padded_rows`)."""
    oh, ow = spec.out_hw
    pixels = spec.n * oh * ow
    return pixels, padded_rows(pixels, spec.cout // spec.bo, target)


def pointwise_tile(spec: ConvSpec, target: Target) -> tuple[int, int]:
    """(r, ocb): the register tile :func:`pointwise_kernel` runs `spec` with (pixels by channel blocks)."""
    _, padded = _pixels(spec, target)
    return register_tiles(padded, spec.cout // spec.bo, target)


def pointwise_applies(spec: ConvSpec, target: Target) -> bool:
    """Whether a 1x1 convolution (blocked input and output) runs faster as :func:`pointwise_kernel`: when
    the (rounded) pixel axis gives a register tile modelled :data:`MARGIN` faster than the best one the
    direct kernel's rows allow. The margin is this kernel's own cost (the pixel's row and column in the
    epilogue, the packing pass of a strided input): measured on Zen 4, a 14-wide row (direct 2x4) runs 13%
    faster here (6x2), 7-wide rows 25%, while 56- and 28-wide rows (direct 4x2, modelled 7% slower than 6x2)
    run 1 to 4% slower here."""
    if (spec.kh, spec.kw) != (1, 1) or spec.bi == 1 or spec.bo == 1:
        return False
    pixels, padded = _pixels(spec, target)
    flat = tile_score(*pointwise_tile(spec, target)) * pixels / padded
    return flat > tile_score(*conv_tiles(spec, target)) * MARGIN


def pointwise_kernel(name: str, spec: ConvSpec, target: Target, *, act: str = "none", clip: tuple | None = None,
                     residual: Operand | None = None) -> Kernel:
    """1x1 convolution + bias (+ residual) (+ ReLU or clip) as a packed matrix product (see the module
    docstring). Parameters as :func:`~weft.compiler.llvm.nn.conv_kernel`'s (the same packed weights), then
    the scratch buffers xp and acc."""
    s = spec
    if (s.kh, s.kw) != (1, 1):
        raise ValueError(f"'{name}': a pointwise kernel computes 1x1 convolutions, got {s}")
    oh_, ow_ = s.out_hw
    pixels, padded = _pixels(s, target)
    cb_, kb_ = s.cin // s.bi, s.cout // s.bo
    sh, sw = s.stride
    dy, dx = s.offset
    w = Buffer("w", (kb_, cb_, 1, 1, s.bi, s.bo))
    bias = Buffer("bias", (kb_, s.bo))

    def pixel(p: Expr) -> tuple[Expr, Expr, Expr]:
        """(n, oh, ow) of pixel `p`; a padding pixel is the last one again."""
        q = minimum(p, pixels - 1) if padded > pixels else p
        return q // (oh_ * ow_), q % (oh_ * ow_) // ow_, q % ow_

    stages = []
    if s.n == 1 and s.stride == (1, 1) and s.offset == (0, 0) and (s.h, s.w) == (oh_, ow_):
        # the pixels of each channel block are already one contiguous row: read them where they are
        x = Buffer("x", (cb_, oh_ * ow_, s.bi))
        src = x
        clamp = (lambda p: minimum(p, pixels - 1)) if padded > pixels else (lambda p: p)
    else:
        x = Buffer("x", (s.n, cb_, s.h, s.w, s.bi))

        def pack(cb: Var, p: Var, c: Var) -> Expr:
            n, oh, ow = pixel(p)
            return x[n, cb, oh * sh + dy, ow * sw + dx, c]

        xp = compute("xp", (cb_, padded, s.bi), pack)
        cb, p, c = xp.axes
        xp.vectorize(c)
        xp.parallel(cb)
        stages.append(xp)
        src = xp.out
        clamp = lambda p: p  # noqa: E731 (the packed rows have the padding pixels)

    rco, rci = reduce_axis(cb_, "rc.o"), reduce_axis(s.bi, "rc.i")
    out_shape = (s.n, s.cout, oh_, ow_)
    epilogue = conv_epilogue(bias, residual, out_shape, Layout(s.bo), act, clip)
    halo = Layout(s.bo, s.out_halo)

    def store(idx: list[Expr]) -> tuple[Expr, ...]:  # a padding pixel rewrites the last one's same value
        kb, p, k = idx
        n, oh, ow = pixel(p)
        return halo.at(n, kb, oh, ow, k)

    y = compute("y", (kb_, padded, s.bo),
                lambda kb, p, k: reduce_sum(src[rco, clamp(p), rci] * w[kb, rco, 0, 0, rci, k], [rco, rci]),
                epilogue=lambda acc, kb, p, k: epilogue(acc, *pixel(p)[:1], kb, *pixel(p)[1:], k),
                buffer_shape=halo.physical(out_shape), store=store)
    r, ocb = pointwise_tile(s, target)
    kb, p, k = y.axes
    po, pi = y.split(p, r)
    kbo, kbi = y.split(kb, ocb)
    y.reorder(kbo, po, rco, rci, pi, kbi, k)
    y.cache_write()
    y.vectorize(k)
    y.unroll(pi)
    y.unroll(kbi)
    y.parallel(y.fuse(kbo, po))
    stages.append(y)
    inputs = [x, w, bias] + ([residual.buffer] if residual is not None else [])
    return Kernel(name, inputs, [y.out], stages)
