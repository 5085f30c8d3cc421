"""Host kernels for the activations, broadcasting binary ops, reductions and data movement (Transpose,
Expand, Tile, Split) and normalizations of float graphs.

Activations and binary ops are element-wise kernels (they keep their input's layout, channel-blocked or
plain); the others read and write plain tensors. Attribute defaults are ONNX's; shapes that depend on
constant inputs (Expand's shape, Tile's repeats, Split's sizes) are read from the outputs' static shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import reduce

import numpy as np

from weft.compiler.llvm import elementwise as ew
from weft.compiler.llvm import mathfn
from weft.compiler.llvm.elementwise import schedule_elementwise
from weft.compiler.llvm.expr import Buffer, Call, Expr, cast, const, exp, maximum, minimum, select
from weft.compiler.llvm.host_float import constant_tensor, elementwise_handler, global_pool
from weft.compiler.llvm.hostplan import Planner, Tensor, ident
from weft.compiler.llvm.layout import PLAIN
from weft.compiler.llvm.norm import normalize_kernel
from weft.compiler.llvm.te import Kernel, compute, reduce_axis, reduce_max, reduce_sum
from weft.core.errors import UnsupportedError
from weft.core.float_ops import FLOAT_OPS
from weft.core.ir import Node

__all__ = ["OP_HANDLERS"]


def _unary(fn: Callable[[Node, Expr], Expr]) -> Callable[[Planner, Node], None]:
    return elementwise_handler(lambda node, xs: fn(node, xs[0]))


def _attr(node: Node, name: str, default: float) -> float:
    return float(node.attrs.get(name, default))


def _gelu(node: Node, x: Expr) -> Expr:
    approximate = node.attrs.get("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise UnsupportedError(f"Gelu approximate='{approximate}' is not an ONNX mode", node=node.name, op=node.op)
    return mathfn.gelu_tanh(x) if approximate == "tanh" else mathfn.gelu(x)


def _pow(node: Node, xs: list[Expr]) -> Expr:
    base, exponent = xs
    return Call("pow", [base, cast(base.dtype, exponent)])


def _transpose(p: Planner, node: Node) -> None:
    src = p.get(node.inputs[0], PLAIN, node)
    rank = len(src.shape)
    perm = [int(a) % rank for a in node.attrs.get("perm", range(rank - 1, -1, -1))]
    out_shape = tuple(src.shape[a] for a in perm)
    x = src.operand("x").buffer

    def body(*axes: Expr) -> Expr:
        index: list[Expr] = [const(0)] * rank
        for k, a in enumerate(perm):
            index[a] = axes[k]
        return x[tuple(index)]

    stage = compute("transposed", out_shape or (1,), body, dtype=src.dtype)
    schedule_elementwise(stage, p.target)
    y = p.new(node.outputs[0], p.out_shape(node), PLAIN, src.dtype)
    p.step(node.name, Kernel("transpose", [x], [stage.out], [stage]), [src, y])


def _reduction(kind: str) -> Callable[[Planner, Node], None]:
    """ReduceSum/Mean/Max over the axes of the constant second input (or the ``axes`` attribute of older
    opsets); sums accumulate in float64, as numpy's pairwise sums are about that exact."""

    def handler(p: Planner, node: Node) -> None:
        src = p.get(node.inputs[0], PLAIN, node)
        rank = len(src.shape)
        if len(node.inputs) > 1 and node.inputs[1]:
            if not p.g.is_constant(node.inputs[1]):
                return _numpy_or_refuse(p, node, "reduction axes must be a constant")
            axes = [int(a) for a in np.asarray(p.g.constants[node.inputs[1]]).reshape(-1)]
        else:
            axes = [int(a) for a in node.attrs.get("axes", ())]
        if not axes:
            if node.attrs.get("noop_with_empty_axes", 0):
                p.alias(node.outputs[0], src, p.out_shape(node))
                return
            axes = list(range(rank))
        axes = sorted({a % rank for a in axes})
        kept = tuple(1 if d in axes else n for d, n in enumerate(src.shape))
        count = int(np.prod([src.shape[a] for a in axes], dtype=np.int64))
        x = src.operand("x").buffer
        raxes = {a: reduce_axis(src.shape[a], f"r{a}") for a in axes}

        def body(*out: Expr):
            index = tuple(raxes[d] if d in raxes else out[d] for d in range(rank))
            if kind == "max":
                return reduce_max(x[index], list(raxes.values()))
            return reduce_sum(cast("f64", x[index]), list(raxes.values()))

        def epilogue(acc: Expr, *out: Expr) -> Expr:
            return cast("f32", acc / float(count) if kind == "mean" else acc)

        y = compute("reduced", kept or (1,), body, epilogue=epilogue, dtype="f32")
        _schedule_reduction(y, p)
        out = p.new(f"{node.name}.kept", kept, PLAIN, primary=False)
        p.step(node.name, Kernel(f"reduce_{kind}", [x], [y.out], [y]), [src, out])
        p.alias(node.outputs[0], out, p.out_shape(node))

    return handler


def _schedule_reduction(y, p: Planner) -> None:
    """Reduce loops inside the output loops, the innermost output axis vectorized when it is not reduced."""
    spatial = [a for a in y.leaves if not a.reduce]
    red = [a for a in y.leaves if a.reduce]
    y.cache_write()
    *outer, last = spatial
    if last.extent > 1:
        y.reorder(*outer, *red, last)
        y.vectorize(last)
    else:
        outer = spatial
    if outer:
        fused = y.fuse(*outer) if len(outer) > 1 else outer[0]
        if y.out.size >= 1 << 14 and fused.extent > 1:
            y.parallel(fused)


def _expand(p: Planner, node: Node) -> None:
    """Expand: numpy broadcasting of the input to the output's (statically known) shape."""
    src = p.get(node.inputs[0], PLAIN, node)
    out_shape = p.out_shape(node)
    kernel = ew.elementwise_kernel("expand", out_shape, PLAIN, [src.operand("x")], lambda x: x, p.target,
                                   dtype=src.dtype)
    y = p.new(node.outputs[0], out_shape, PLAIN, src.dtype)
    p.step(node.name, kernel, [src, y])


def _tile(p: Planner, node: Node) -> None:
    """Tile: output element i reads input element i modulo the input's shape, axis by axis."""
    src = p.get(node.inputs[0], PLAIN, node)
    x = src.operand("x").buffer
    shape = src.shape

    def body(*axes: Expr) -> Expr:
        return x[tuple(a % n if n > 1 else const(0) for a, n in zip(axes, shape, strict=True))]

    stage = compute("tiled", p.out_shape(node) or (1,), body, dtype=src.dtype)
    schedule_elementwise(stage, p.target)
    y = p.new(node.outputs[0], p.out_shape(node), PLAIN, src.dtype)
    p.step(node.name, Kernel("tile", [x], [stage.out], [stage]), [src, y])


def _split(p: Planner, node: Node) -> None:
    """Split: each output is a slice of the input along `axis`, its extent the output's static shape."""
    src = p.get(node.inputs[0], PLAIN, node)
    axis = int(node.attrs.get("axis", 0)) % len(src.shape)
    start = 0
    for k, name in enumerate(node.outputs):
        out_shape = p.out_shape(node, k)
        if name:
            starts = [start if d == axis else 0 for d in range(len(src.shape))]
            kernel = ew.slice_kernel("split", src.operand("x"), starts, [1] * len(src.shape), out_shape, p.target)
            p.step(node.name, kernel, [src, p.new(name, out_shape, PLAIN, src.dtype)])
        start += out_shape[axis]


def _numpy_or_refuse(p: Planner, node: Node, why: str) -> None:
    """A case the generated kernel does not cover runs through numpy when numpy has the op."""
    if node.op not in FLOAT_OPS:
        raise UnsupportedError(why, node=node.name, op=node.op)
    p.numpy_step(node)


def _normalization(p: Planner, node: Node) -> None:
    """LayerNormalization (over the axes from ``axis``) and InstanceNormalization (over H, W... of each
    channel), with constant scale and shift; the optional Mean and InvStdDev outputs go to numpy."""
    if sum(1 for o in node.outputs if o) > 1 or not all(p.g.is_constant(v) for v in node.inputs[1:] if v):
        return _numpy_or_refuse(p, node, "normalization needs constant scale and shift, and one output")
    src = p.get(node.inputs[0], PLAIN, node)
    shape = src.shape
    consts = [np.asarray(p.g.constants[v], np.float32) if v else None for v in [*node.inputs[1:3], ""][:2]]
    if node.op == "LayerNormalization":
        axis = int(node.attrs.get("axis", -1)) % len(shape)
        rows, cols = int(np.prod(shape[:axis], dtype=np.int64)), int(np.prod(shape[axis:], dtype=np.int64))
        params = [np.broadcast_to(c, shape[axis:]).reshape(1, cols) if c is not None else np.zeros((1, cols))
                  for c in consts]
    else:
        channels = shape[1]
        rows, cols = shape[0] * channels, int(np.prod(shape[2:], dtype=np.int64))
        params = [c.reshape(channels, 1) if c is not None else np.zeros((channels, 1)) for c in consts]
    params = [np.ascontiguousarray(a, np.float32) for a in params]
    x2 = Tensor(src.name, (rows, cols), PLAIN, src.dtype, alias_of=src)
    p.all.append(x2)
    kernel = normalize_kernel(ident(node.op.lower()), rows, cols, float(node.attrs.get("epsilon", 1e-5)),
                              params[0].shape, p.target)
    y2 = p.new(f"{node.name}.rows", (rows, cols), PLAIN, primary=False)
    p.step(node.name, kernel, [x2, constant_tensor(p, node, "scale", params[0]),
                               constant_tensor(p, node, "shift", params[1]), y2])
    p.alias(node.outputs[0], y2, p.out_shape(node))


def _lrn(p: Planner, node: Node) -> None:
    """ONNX's LRN on a plain (N, C, ...) tensor: each pixel's square sum over its channel window, vectorized
    along the pixels (a window reads whole rows of neighbouring channels); ``t ** 0.75``, the usual beta,
    as ``sqrt(t) * sqrt(sqrt(t))`` (no libm call a lane)."""
    src = p.get(node.inputs[0], PLAIN, node)
    shape = src.shape
    if len(shape) < 3:
        raise UnsupportedError(f"LRN needs an (N, C, ...) input, got shape {list(shape)}", node=node.name, op=node.op)
    n_, c_, pixels = shape[0], shape[1], int(np.prod(shape[2:], dtype=np.int64))
    size = int(node.attrs["size"])
    alpha, beta, bias = _attr(node, "alpha", 1e-4), _attr(node, "beta", 0.75), _attr(node, "bias", 1.0)
    lo = (size - 1) // 2
    x = Buffer("x", (n_, c_, pixels))
    r = reduce_axis(size, "r")

    def body(n: Expr, c: Expr, q: Expr) -> Expr:
        cc = c + r - lo
        v = x[n, minimum(maximum(cc, 0), c_ - 1), q]
        return reduce_sum(select(cc.ge(0).logical_and(cc.lt(c_)), v * v, 0.0), [r])

    def epilogue(acc: Expr, n: Expr, c: Expr, q: Expr) -> Expr:
        t = bias + (alpha / size) * acc
        if beta == 0.75:
            root = Call("sqrt", [t])
            scale = root * Call("sqrt", [root])
        else:
            scale = Call("pow", [t, const(beta, "f32")])
        return x[n, c, q] / scale

    y = compute("y", (n_, c_, pixels), body, epilogue=epilogue)
    n, c, q = y.axes
    vec = max(d for d in range(1, p.target.lanes(4) + 1) if pixels % d == 0)
    qo, qi = y.split(q, vec)
    y.reorder(n, c, qo, r, qi)
    y.cache_write()
    if vec > 1:
        y.vectorize(qi)
    y.parallel(y.fuse(n, c))
    out = p.new(node.outputs[0], shape, PLAIN)
    p.step(node.name, Kernel("lrn", [x], [y.out], [y]), [src, out])


OP_HANDLERS: dict[str, Callable[[Planner, Node], None]] = {
    "Sigmoid": _unary(lambda n, x: mathfn.sigmoid(x)),
    "Tanh": _unary(lambda n, x: mathfn.tanh(x)),
    "HardSigmoid": _unary(lambda n, x: mathfn.hard_sigmoid(x, _attr(n, "alpha", 0.2), _attr(n, "beta", 0.5))),
    "HardSwish": _unary(lambda n, x: x * mathfn.hard_sigmoid(x, 1.0 / 6.0, 0.5)),
    "LeakyRelu": _unary(lambda n, x: select(x.lt(0.0), x * _attr(n, "alpha", 0.01), x)),
    "PRelu": elementwise_handler(lambda n, xs: select(xs[0].lt(0.0), xs[0] * xs[1], xs[0])),
    "Elu": _unary(lambda n, x: mathfn.elu(x, _attr(n, "alpha", 1.0))),
    "Softplus": _unary(lambda n, x: mathfn.softplus(x)),
    "Erf": _unary(lambda n, x: mathfn.erf(x)),
    "Gelu": _unary(_gelu),
    "Exp": _unary(lambda n, x: exp(x)),
    "Sqrt": _unary(lambda n, x: Call("sqrt", [x])),
    "Neg": _unary(lambda n, x: -x),
    "Abs": _unary(lambda n, x: Call("fabs", [x])),
    "Reciprocal": _unary(lambda n, x: 1.0 / x),
    "Max": elementwise_handler(lambda n, xs: reduce(maximum, xs)),
    "Min": elementwise_handler(lambda n, xs: reduce(minimum, xs)),
    "Pow": elementwise_handler(_pow),
    "LRN": _lrn,
    "GlobalMaxPool": global_pool,
    "Transpose": _transpose,
    "Expand": _expand,
    "Tile": _tile,
    "Split": _split,
    "LayerNormalization": _normalization,
    "InstanceNormalization": _normalization,
    "ReduceSum": _reduction("sum"),
    "ReduceMean": _reduction("mean"),
    "ReduceMax": _reduction("max"),
}
