"""Winograd F(2x2, 3x3) for 3x3 stride-1 convolutions on the channel-blocked layout.

Each 2x2 block of outputs (a tile) comes from a 4x4 patch of input: ``Y = A^T [(G g G^T) * (B^T d B)] A``,
16 multiplies per input and output channel pair instead of the direct convolution's 36, so the
multiply-adds drop 2.25 times and become 16 independent matrix products, one per position of the 4x4
transformed tile. The kernel runs three stages over scratch buffers::

    v[pos, c.o, q, c.i] = (B^T d B)[pos]        # input transform: additions only, 16 outputs per patch
    m[pos, k.o, q, k.i] = sum_c v[..c..] * u[pos, k.o, c.o, c.i, k.i]   # 16 register-tiled GEMMs
    y[n, k.o, 2th + a, 2tw + b, k.i] = act((A^T m A)[a, b] + bias (+ residual))  # output transform, epilogue

where q = (n, th, tw) runs over every tile of every image as one axis (the GEMMs' rows). The weights are
transformed once when the plan is made (:func:`pack_winograd_weights`, in float64). The
transforms' coefficients are 0, 1/2 and +-1: the error this adds is a few float32 roundings per output,
measured against onnxruntime by the tests (relative error well under 1e-4). In each transform stage the
16 (or 4) positions are one unrolled loop, so every position's expression keeps only its own few terms.
"""

from __future__ import annotations

import numpy as np

from weft.compiler.llvm.elementwise import Operand
from weft.compiler.llvm.expr import Buffer, Expr, Var, minimum, select
from weft.compiler.llvm.layout import Layout
from weft.compiler.llvm.nn import ConvSpec, conv_epilogue, register_tiles, tile_score
from weft.compiler.llvm.target import Target
from weft.compiler.llvm.te import Kernel, compute, reduce_axis, reduce_sum

__all__ = ["pack_winograd_weights", "winograd_applies", "winograd_kernel"]

# F(2x2, 3x3) (Lavin and Gray, 2016): Y = A^T [(G g G^T) * (B^T d B)] A
_BT = ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1))
_G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])
_AT = ((1, 1, 1, 0), (0, 1, -1, -1))


def winograd_applies(spec: ConvSpec) -> bool:
    """Whether :func:`winograd_kernel` computes `spec`: 3x3, stride 1, blocked channels on both sides."""
    return (spec.kh, spec.kw, spec.stride) == (3, 3, (1, 1)) and spec.bi > 1 and spec.bo > 1


def pack_winograd_weights(w: np.ndarray, bi: int, bo: int) -> np.ndarray:
    """(O, C, 3, 3) float weights -> G g G^T as (16, O/bo, C/bi, bi, bo), float32."""
    o, c, _, _ = w.shape
    u = np.einsum("ai,ocij,bj->aboc", _G, w.astype(np.float64), _G).reshape(16, o, c)
    return np.ascontiguousarray(u.reshape(16, o // bo, bo, c // bi, bi).transpose(0, 1, 3, 4, 2), dtype=np.float32)


def _combine(terms: list[tuple[int, Expr]]) -> Expr:
    """The sum of +-1 multiples of expressions: additions and subtractions only (a positive term first)."""
    terms = sorted(terms, key=lambda t: -t[0])
    sign, total = terms[0]
    out = total if sign > 0 else -total
    for sign, e in terms[1:]:
        out = out + e if sign > 0 else out - e
    return out


def _chain(index: Expr, cases: list[Expr]) -> Expr:
    """``cases[index]`` as a chain of selects: once `index` is an unrolled loop's constant, LLVM keeps one."""
    out = cases[-1]
    for k in range(len(cases) - 2, -1, -1):
        out = select(index.eq(k), cases[k], out)
    return out


def _rows(tiles: int, blocks: int, target: Target) -> int:
    """The tile count rounded up to the multiple of a register tile's height with the best
    :func:`~weft.compiler.llvm.nn.tile_score` (a padding row costs its share of the work)."""

    def score(rows: int) -> float:
        return tile_score(*register_tiles(rows, blocks, target)) * tiles / rows

    return max(sorted({-(-tiles // r) * r for r in range(1, target.vector_registers + 1)}), key=score)


def winograd_kernel(name: str, spec: ConvSpec, target: Target, *, act: str = "none", clip: tuple | None = None,
                    residual: Operand | None = None) -> Kernel:
    """3x3 stride-1 convolution + bias (+ residual) (+ ReLU or clip) by F(2x2, 3x3) (see the module
    docstring); `spec` as for :func:`~weft.compiler.llvm.nn.conv_kernel` (:func:`winograd_applies`).
    Parameters: x, u (:func:`pack_winograd_weights`), bias (O/bo, bo), [residual], y, then the scratch
    buffers v and m."""
    s = spec
    if not winograd_applies(s):
        raise ValueError(f"'{name}': F(2x2, 3x3) needs a 3x3 stride-1 blocked convolution with even output "
                         f"sizes, got {s}")
    oh_, ow_ = s.out_hw
    th_, tw_ = (oh_ + 1) // 2, (ow_ + 1) // 2  # an odd size: the last tile's second row (column) is not stored
    last_h, last_w = s.h - 1, s.w - 1
    cb_, kb_ = s.cin // s.bi, s.cout // s.bo
    dy, dx = s.offset
    x = Buffer("x", (s.n, cb_, s.h, s.w, s.bi))
    u = Buffer("u", (16, kb_, cb_, s.bi, s.bo))
    bias = Buffer("bias", (kb_, s.bo))

    tiles = s.n * th_ * tw_  # the GEMMs' rows: every tile of every image, one axis (see below)

    def transform_in(pos: Var, cb: Var, q: Var, c: Var) -> Expr:
        n, th, tw = q // (th_ * tw_), q % (th_ * tw_) // tw_, q % tw_

        def d(i: int, j: int) -> Expr:
            # past the input's edge (only the 4th row or column of an odd size's last tile, which feeds
            # only the outputs that are not stored), read the edge: any finite value does
            row, col = th * 2 + (i + dy), tw * 2 + (j + dx)
            if 2 * (th_ - 1) + i + dy > last_h:
                row = minimum(row, last_h)
            if 2 * (tw_ - 1) + j + dx > last_w:
                col = minimum(col, last_w)
            return x[n, cb, row, col, c]

        return _chain(pos, [_combine([(_BT[a][i] * _BT[b][j], d(i, j)) for i in range(4) for j in range(4)
                                      if _BT[a][i] and _BT[b][j]]) for a in range(4) for b in range(4)])

    v = compute("v", (16, cb_, tiles, s.bi), transform_in)
    pos, cb, q, c = v.axes
    v.reorder(cb, q, pos, c)
    v.unroll(pos)
    v.vectorize(c)
    v.parallel(v.fuse(cb, q))

    # The 16 GEMMs run over all tiles as one axis of rows, rounded up to a multiple of the best register
    # tile's height (the extra rows repeat the last tile, and no output reads them): a row of tiles alone
    # (7 tiles in a 14-wide layer) would leave a 7x1 register tile, 8 loads for 7 FMAs.
    rows = _rows(tiles, kb_, target)
    rco, rci = reduce_axis(cb_, "rc.o"), reduce_axis(s.bi, "rc.i")
    last = tiles - 1
    m = compute("m", (16, kb_, rows, s.bo),
                lambda p, kb, q, k: reduce_sum(v.out[p, rco, minimum(q, last) if rows > tiles else q, rci]
                                               * u[p, kb, rco, rci, k], [rco, rci]))
    r, ocb = register_tiles(rows, kb_, target)
    pos, kb, q, k = m.axes
    qo, qi = m.split(q, r)
    kbo, kbi = m.split(kb, ocb)
    m.reorder(pos, kbo, qo, rco, rci, qi, kbi, k)
    m.cache_write()
    m.vectorize(k)
    m.unroll(qi)
    m.unroll(kbi)
    m.parallel(m.fuse(pos, kbo, qo))

    out_shape = (s.n, s.cout, oh_, ow_)
    epilogue = conv_epilogue(bias, residual, out_shape, Layout(s.bo), act, clip)

    def transform_out(n: Expr, kb: Expr, th: Expr, a: Expr, tw: Expr, b: Expr, k: Expr) -> Expr:
        q = (n * th_ + th) * tw_ + tw
        cases = [_combine([(_AT[ya][i] * _AT[xb][j], m.out[i * 4 + j, kb, q, k]) for i in range(4)
                           for j in range(4) if _AT[ya][i] and _AT[xb][j]]) for ya in range(2) for xb in range(2)]
        return _chain(a, [_chain(b, cases[0:2]), _chain(b, cases[2:4])])

    halo = Layout(s.bo, s.out_halo)
    if oh_ % 2 == 0 and ow_ % 2 == 0:  # whole tiles: the four outputs of a tile are one unrolled loop
        y = compute("y", (s.n, kb_, th_, 2, tw_, 2, s.bo), transform_out,
                    epilogue=lambda acc, n, kb, th, a, tw, b, k: epilogue(acc, n, kb, th * 2 + a, tw * 2 + b, k),
                    buffer_shape=halo.physical(out_shape),
                    store=lambda idx: halo.at(idx[0], idx[1], idx[2] * 2 + idx[3], idx[4] * 2 + idx[5], idx[6]))
        n, kb, th, a, tw, b, k = y.axes
        y.reorder(n, kb, th, tw, a, b, k)
        y.unroll(a)
        y.unroll(b)
    else:  # one output at a time, its place in the tile computed (the transform is small beside the GEMMs)
        y = compute("y", (s.n, kb_, oh_, ow_, s.bo),
                    lambda n, kb, oh, ow, k: transform_out(n, kb, oh // 2, oh % 2, ow // 2, ow % 2, k),
                    epilogue=epilogue, buffer_shape=halo.physical(out_shape), store=lambda idx: halo.at(*idx))
        n, kb, th, _, k = y.axes
    y.vectorize(k)
    y.parallel(y.fuse(n, kb, th))
    inputs = [x, u, bias] + ([residual.buffer] if residual is not None else [])
    return Kernel(name, inputs, [y.out], [v, m, y])
