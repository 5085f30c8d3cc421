"""Winograd F(2x2, 3x3) and F(4x4, 3x3) for 3x3 stride-1 convolutions on the channel-blocked layout.

Each t x t block of outputs (a tile, t = 2 or 4) comes from a (t+2) x (t+2) patch of input:
``Y = A^T [(G g G^T) * (B^T d B)] A``, (t+2)^2 multiplies per input and output channel pair instead of the
direct convolution's 9 t^2 (F(2x2): 16 for 36, F(4x4): 36 for 144), and they become (t+2)^2 independent
matrix products, one per position of the transformed tile. The kernel runs three stages over scratch
buffers::

    v[pos, c.o, q, c.i] = (B^T d B)[pos]        # input transform: additions and small multiples
    m[pos, k.o, q, k.i] = sum_c v[..c..] * u[pos, k.o, c.o, c.i, k.i]   # (t+2)^2 register-tiled GEMMs
    y[n, k.o, t th + a, t tw + b, k.i] = act((A^T m A)[a, b] + bias (+ residual))  # output transform

where q = (n, th, tw) runs over every tile of every image as one axis (the GEMMs' rows). The weights are
transformed once when the plan is made (:func:`pack_winograd_weights`, in float64). F(2x2)'s coefficients
are 0, 1/2 and +-1, F(4x4)'s reach 8 and 1/24, so its rounding error is larger: measured on one layer with
unit-scaled weights, 3e-7 (F(2x2)) and 6e-6 (F(4x4)) relative, and on whole networks against
onnxruntime about 1e-6 either way (the tests bound both by 1e-4). :func:`winograd_tile` picks F(4x4)
where its tiles are many. Each transform is computed row by row (:func:`_transform`), its positions one
unrolled loop.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from weft.compiler.llvm.elementwise import Operand
from weft.compiler.llvm.expr import Buffer, Expr, Var, const, minimum, select
from weft.compiler.llvm.layout import Layout
from weft.compiler.llvm.nn import ConvSpec, conv_epilogue, padded_rows, register_tiles
from weft.compiler.llvm.target import Target
from weft.compiler.llvm.te import Kernel, compute, reduce_axis, reduce_sum

__all__ = ["TRANSFORMS", "pack_winograd_weights", "winograd_applies", "winograd_kernel", "winograd_tile"]

# F(m x m, 3x3) (Lavin and Gray, 2016): Y = A^T [(G g G^T) * (B^T d B)] A, on (m + 2) x (m + 2) patches.
# F(2x2): interpolation points 0, +-1, inf (coefficients 0, +-1 and 1/2); F(4x4): 0, +-1, +-2, inf.
TRANSFORMS: dict[int, tuple[tuple[tuple[int, ...], ...], np.ndarray, tuple[tuple[int, ...], ...]]] = {
    2: (((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1)),
        np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]]),
        ((1, 1, 1, 0), (0, 1, -1, -1))),
    4: (((4, 0, -5, 0, 1, 0), (0, -4, -4, 1, 1, 0), (0, 4, -4, -1, 1, 0), (0, -2, -1, 2, 1, 0),
         (0, 2, -1, -2, 1, 0), (0, 4, 0, -5, 0, 1)),
        np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
                  [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]]),
        ((1, 1, 1, 1, 1, 0), (0, 1, -1, 2, -2, 0), (0, 1, 1, 4, 4, 0), (0, 1, -1, 8, -8, 1))),
}


#: Winograd tiles (its GEMMs' rows) per SIMD lane a layer needs before Winograd pays: every transformed weight
#: is loaded once per run and feeds one FMA per tile, so the wider the vectors (the more FMAs a cycle), the
#: more tiles it takes to keep the weight stream behind the arithmetic. Measured: ResNet's 7x7 layers (16
#: F(2x2) tiles) run faster by Winograd on Zen 4 with AVX2 (8 lanes) and 1.4 to 1.6 times slower than the
#: direct kernel on an AVX-512 Xeon (16 lanes), whose 14x14 layers (49 tiles) still gain.
TILES_PER_LANE = 2


def winograd_tile(spec: ConvSpec, target: Target) -> int:
    """m of the F(m x m, 3x3) that suits `spec` on `target`, 0 where the direct kernel does better.

    F(4x4) (36 multiplies per 16 outputs instead of 64) where that makes at least 32 tiles, F(2x2)
    elsewhere, and either only with :data:`TILES_PER_LANE` tiles per vector lane. Each transformed weight
    serves every tile once, and F(4x4) has 36 of them per filter (4 times the direct kernel's): with few
    tiles the layer is a stream of weights. Measured on Zen 4 (one thread): F(4x4) takes 0.55 to 0.65 of
    F(2x2)'s time at 56x56 and 28x28 (49 tiles and more), 1.6 times it at 14x14 (16 tiles)."""
    oh, ow = spec.out_hw
    need = TILES_PER_LANE * target.lanes(4)

    def tiles(m: int) -> int:
        return spec.n * -(-oh // m) * -(-ow // m)

    if tiles(4) >= max(32, need):
        return 4
    return 2 if tiles(2) >= need else 0


def winograd_applies(spec: ConvSpec) -> bool:
    """Whether :func:`winograd_kernel` computes `spec`: 3x3, stride 1, blocked channels on both sides."""
    return (spec.kh, spec.kw, spec.stride) == (3, 3, (1, 1)) and spec.bi > 1 and spec.bo > 1


def pack_winograd_weights(w: np.ndarray, bi: int, bo: int, m: int = 2) -> np.ndarray:
    """(O, C, 3, 3) float weights -> G g G^T of F(m x m, 3x3) as ((m+2)^2, O/bo, C/bi, bi, bo), float32."""
    o, c, _, _ = w.shape
    g = TRANSFORMS[m][1]
    t2 = (m + 2) ** 2
    u = np.einsum("ai,ocij,bj->aboc", g, w.astype(np.float64), g).reshape(t2, o, c)
    return np.ascontiguousarray(u.reshape(t2, o // bo, bo, c // bi, bi).transpose(0, 1, 3, 4, 2), dtype=np.float32)


def _combine(terms: list[tuple[int, Expr]]) -> Expr:
    """The sum of integer multiples of expressions: a +-1 multiple is an addition or a subtraction, any other
    a multiply by the constant (a positive term first)."""
    terms = sorted(terms, key=lambda t: -t[0])

    def scaled(k: int, e: Expr) -> Expr:
        return e if abs(k) == 1 else e * const(float(abs(k)), "f32")

    coef, first = terms[0]
    out = scaled(coef, first) if coef > 0 else -scaled(coef, first)
    for coef, e in terms[1:]:
        out = out + scaled(coef, e) if coef > 0 else out - scaled(coef, e)
    return out


def _transform(mat: tuple[tuple[int, ...], ...], a: int, b: int, value: Callable[[int, int], Expr]) -> Expr:
    """(mat X mat^T)[a, b] of the matrix whose (i, j) entry is value(i, j), row by row: the inner sums over j
    are the same expressions for every a, so the unrolled loop over positions computes each once (LLVM
    merges the identical loads and operations)."""
    rows = [(mat[a][i], _combine([(mat[b][j], value(i, j)) for j in range(len(mat[b])) if mat[b][j]]))
            for i in range(len(mat[a])) if mat[a][i]]
    return _combine(rows)


def _chain(index: Expr, cases: list[Expr]) -> Expr:
    """``cases[index]`` as a chain of selects: once `index` is an unrolled loop's constant, LLVM keeps one."""
    out = cases[-1]
    for k in range(len(cases) - 2, -1, -1):
        out = select(index.eq(k), cases[k], out)
    return out


def winograd_kernel(name: str, spec: ConvSpec, target: Target, *, act: str = "none", clip: tuple | None = None,
                    residual: Operand | None = None, tile: int | None = None) -> Kernel:
    """3x3 stride-1 convolution + bias (+ residual) (+ ReLU or clip) by F(tile x tile, 3x3) (see the module
    docstring; `tile` 2 or 4, default :func:`winograd_tile`); `spec` as for
    :func:`~weft.compiler.llvm.nn.conv_kernel` (:func:`winograd_applies`). Parameters: x, u
    (:func:`pack_winograd_weights` with the same tile), bias (O/bo, bo), [residual], y, then the scratch
    buffers v and m."""
    s = spec
    if not winograd_applies(s):
        raise ValueError(f"'{name}': Winograd needs a 3x3 stride-1 blocked convolution, got {s}")
    t = (winograd_tile(s, target) or 2) if tile is None else tile
    if t not in TRANSFORMS:
        raise ValueError(f"'{name}': Winograd tiles are {sorted(TRANSFORMS)} outputs wide, got {t}")
    bt, _, at = TRANSFORMS[t]
    size = t + 2  # the input patch of a tile, and the transformed tile: size x size positions
    positions = size * size
    oh_, ow_ = s.out_hw
    th_, tw_ = -(-oh_ // t), -(-ow_ // t)  # a size that t does not divide: the last tile stores fewer outputs
    last_h, last_w = s.h - 1, s.w - 1
    cb_, kb_ = s.cin // s.bi, s.cout // s.bo
    dy, dx = s.offset
    x = Buffer("x", (s.n, cb_, s.h, s.w, s.bi))
    u = Buffer("u", (positions, kb_, cb_, s.bi, s.bo))
    bias = Buffer("bias", (kb_, s.bo))

    tiles = s.n * th_ * tw_  # the GEMMs' rows: every tile of every image, one axis (see below)

    def transform_in(pos: Var, cb: Var, q: Var, c: Var) -> Expr:
        n, th, tw = q // (th_ * tw_), q % (th_ * tw_) // tw_, q % tw_

        def d(i: int, j: int) -> Expr:
            # past the input's edge (only the last rows or columns of the last tile of a size t does not
            # divide, which feed only the outputs that are not stored), read the edge: any finite value does
            row, col = th * t + (i + dy), tw * t + (j + dx)
            if t * (th_ - 1) + i + dy > last_h:
                row = minimum(row, last_h)
            if t * (tw_ - 1) + j + dx > last_w:
                col = minimum(col, last_w)
            return x[n, cb, row, col, c]

        return _chain(pos, [_transform(bt, a, b, d) for a in range(size) for b in range(size)])

    v = compute("v", (positions, cb_, tiles, s.bi), transform_in)
    pos, cb, q, c = v.axes
    v.reorder(cb, q, pos, c)
    v.unroll(pos)
    v.vectorize(c)
    v.parallel(v.fuse(cb, q))

    # The GEMMs (one per position) run over all tiles as one axis of rows, rounded up to a multiple of the
    # best register tile's height (the extra rows repeat the last tile, and no output reads them): a row of
    # tiles alone (7 tiles in a 14-wide layer) would leave a 7x1 register tile, 8 loads for 7 FMAs.
    rows = padded_rows(tiles, kb_, target)
    rco, rci = reduce_axis(cb_, "rc.o"), reduce_axis(s.bi, "rc.i")
    last = tiles - 1
    m = compute("m", (positions, kb_, rows, s.bo),
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
        cases = [_transform(at, ya, xb, lambda i, j: m.out[i * size + j, kb, q, k]) for ya in range(t)
                 for xb in range(t)]
        return _chain(a, [_chain(b, cases[ya * t:(ya + 1) * t]) for ya in range(t)])

    halo = Layout(s.bo, s.out_halo)
    if oh_ % t == 0 and ow_ % t == 0:  # whole tiles: the outputs of a tile are one unrolled loop
        y = compute("y", (s.n, kb_, th_, t, tw_, t, s.bo), transform_out,
                    epilogue=lambda acc, n, kb, th, a, tw, b, k: epilogue(acc, n, kb, th * t + a, tw * t + b, k),
                    buffer_shape=halo.physical(out_shape),
                    store=lambda idx: halo.at(idx[0], idx[1], idx[2] * t + idx[3], idx[4] * t + idx[5], idx[6]))
        n, kb, th, a, tw, b, k = y.axes
        y.reorder(n, kb, th, tw, a, b, k)
        y.unroll(a)
        y.unroll(b)
    else:  # one output at a time, its place in the tile computed (the transform is small beside the GEMMs)
        y = compute("y", (s.n, kb_, oh_, ow_, s.bo),
                    lambda n, kb, oh, ow, k: transform_out(n, kb, oh // t, oh % t, ow // t, ow % t, k),
                    epilogue=epilogue, buffer_shape=halo.physical(out_shape), store=lambda idx: halo.at(*idx))
        n, kb, th, _, k = y.axes
    y.vectorize(k)
    y.parallel(y.fuse(n, kb, th))
    inputs = [x, u, bias] + ([residual.buffer] if residual is not None else [])
    return Kernel(name, inputs, [y.out], [v, m, y])
