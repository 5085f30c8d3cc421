"""Normalization over the rows of a plain tensor viewed as (rows, cols): LayerNormalization (a row is the
trailing axes from ``axis``) and InstanceNormalization (a row is one channel of one image).

Three stages: each row's mean, then its 1 / sqrt(variance + epsilon) (two passes, as numpy computes it:
no cancellation of a one-pass E[x^2] - E[x]^2), both in float64, then the normalized, scaled and shifted
output. Scale and shift are (a, b) arrays read at (row % a, col % b): (1, cols) per column for layer
norm, (channels, 1) per row for instance norm.
"""

from __future__ import annotations

from weft.compiler.llvm.elementwise import schedule_elementwise
from weft.compiler.llvm.expr import Buffer, Call, Expr, cast, const
from weft.compiler.llvm.target import Target
from weft.compiler.llvm.te import Kernel, compute, reduce_axis, reduce_sum

__all__ = ["normalize_kernel"]


def normalize_kernel(name: str, rows: int, cols: int, epsilon: float, params: tuple[int, int], target: Target
                     ) -> Kernel:
    """Parameters: x (rows, cols), scale and shift (`params`), y (rows, cols)."""
    x = Buffer("x", (rows, cols))
    scale, shift = Buffer("scale", params), Buffer("shift", params)
    a, b = params
    r1, r2 = reduce_axis(cols, "r1"), reduce_axis(cols, "r2")
    mean = compute("mean", (rows,), lambda i: reduce_sum(cast("f64", x[i, r1]), [r1]),
                   epilogue=lambda acc, i: acc / float(cols), dtype="f64")

    def centered(i: Expr, j: Expr) -> Expr:
        return cast("f64", x[i, j]) - mean[i]

    inv_std = compute("inv_std", (rows,), lambda i: reduce_sum(centered(i, r2) * centered(i, r2), [r2]),
                      epilogue=lambda acc, i: 1.0 / Call("sqrt", [acc / float(cols) + epsilon]), dtype="f64")

    def out(i: Expr, j: Expr) -> Expr:
        at = (i % a if a > 1 else const(0), j % b if b > 1 else const(0))
        return cast("f32", centered(i, j) * inv_std[i]) * scale[at] + shift[at]

    y = compute("y", (rows, cols), out)
    for st in (mean, inv_std):
        if rows * cols >= 1 << 16 and rows > 1:
            st.parallel(st.leaves[0])
    schedule_elementwise(y, target)
    return Kernel(name, [x, scale, shift], [y.out], [mean, inv_std, y])
