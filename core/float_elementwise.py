"""Float elementwise and reduction ops: activations, unary math, variadic/broadcast binaries,
comparisons and logic, the Reduce* family, ArgMax and GlobalMaxPool.

Kernels compute in the input's precision as onnxruntime does, except where float32 would lose more than
rounding (sums and means accumulate in float64; erf has no numpy ufunc and runs on math.erf).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from weft.core.float_base import Known, OpDef, Result, broadcast, err, need, same, shape_of
from weft.core.ir import Node, Value

__all__ = ["ELEMENTWISE_OPS", "erf", "reduce_axes"]

Unary = Callable[[Node, np.ndarray], np.ndarray]

_ERF = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    return _ERF(np.asarray(x, np.float64)).astype(np.float64)


def _unary(fn: Unary) -> OpDef:
    def run(node: Node, a: list[Any]) -> list[np.ndarray]:
        x = a[0]
        return [np.asarray(fn(node, x)).astype(x.dtype, copy=False)]

    return OpDef(same, run)


def _alpha(node: Node, default: float) -> np.float32:
    return np.float32(node.attrs.get("alpha", default))


def _sigmoid(node: Node, x: np.ndarray) -> np.ndarray:
    # exp of the negative magnitude only, so large |x| neither overflows nor loses the small side
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _hard_sigmoid(node: Node, x: np.ndarray) -> np.ndarray:
    return np.clip(_alpha(node, 0.2) * x + np.float32(node.attrs.get("beta", 0.5)), 0, 1)


def _gelu(node: Node, x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    if node.attrs.get("approximate", "none") == "tanh":
        return 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64 ** 3)))
    return 0.5 * x64 * (1 + erf(x64 / math.sqrt(2)))


def _elu(node: Node, x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x, _alpha(node, 1.0) * np.expm1(np.minimum(x, 0)))


def _softplus(node: Node, x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0, x.astype(np.float64))


_UNARY: dict[str, Unary] = {
    "Sigmoid": _sigmoid,
    "HardSigmoid": _hard_sigmoid,
    "HardSwish": lambda n, x: x * np.clip(x / np.float32(6) + np.float32(0.5), 0, 1),
    "Tanh": lambda n, x: np.tanh(x),
    "LeakyRelu": lambda n, x: np.where(x >= 0, x, _alpha(n, 0.01) * x),
    "Elu": _elu,
    "Softplus": _softplus,
    "Erf": lambda n, x: erf(x),
    "Gelu": _gelu,
    "Sqrt": lambda n, x: np.sqrt(x),
    "Exp": lambda n, x: np.exp(x),
    "Log": lambda n, x: np.log(x),
    "Neg": lambda n, x: np.negative(x),
    "Abs": lambda n, x: np.abs(x),
    "Reciprocal": lambda n, x: np.reciprocal(x),
    "Not": lambda n, x: np.logical_not(x),
    "Floor": lambda n, x: np.floor(x),
    "Ceil": lambda n, x: np.ceil(x),
    "Round": lambda n, x: np.round(x),  # halves to even, as ONNX
    "Sign": lambda n, x: np.sign(x),
    "Sin": lambda n, x: np.sin(x),
    "Cos": lambda n, x: np.cos(x),
    "Softsign": lambda n, x: x / (1 + np.abs(x)),
    "Selu": lambda n, x: np.float32(n.attrs.get("gamma", 1.0507009873554805)) * np.where(
        x > 0, x, np.float32(n.attrs.get("alpha", 1.6732632423543772)) * np.expm1(np.minimum(x, 0))),
    "Celu": lambda n, x: np.maximum(x, 0) + np.minimum(0, _alpha(n, 1.0) * np.expm1(x / _alpha(n, 1.0))),
    "ThresholdedRelu": lambda n, x: np.where(x > _alpha(n, 1.0), x, 0),
    "Mish": lambda n, x: x * np.tanh(np.logaddexp(0, x.astype(np.float64))),
}


def _variadic(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> OpDef:
    """Max/Min: any number of inputs, broadcast together."""

    def run(node: Node, a: list[Any]) -> list[np.ndarray]:
        out = a[0]
        for x in a[1:]:
            out = fn(out, x)
        return [np.asarray(out).astype(a[0].dtype, copy=False)]

    return OpDef(broadcast, run)


def _compare(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> OpDef:
    def infer(node: Node, ins: list[Value | None], known: Known) -> Result:
        return [(broadcast(node, ins, known)[0][0], "bool")]

    return OpDef(infer, lambda n, a: [np.asarray(fn(a[0], a[1]))])


def _run_pow(node: Node, a: list[Any]) -> list[np.ndarray]:
    return [np.power(a[0], a[1].astype(a[0].dtype)).astype(a[0].dtype, copy=False)]


def _infer_prelu(node: Node, ins: list[Value | None], known: Known) -> Result:
    x = shape_of(node, ins[0], "the input")
    out = broadcast(node, ins, known)[0][0]
    if out != x:
        raise err(node, f"slope {list(shape_of(node, ins[1], 'the slope'))} does not broadcast to {list(x)}")
    return [(x, ins[0].dtype)]  # type: ignore[union-attr]


def _infer_where(node: Node, ins: list[Value | None], known: Known) -> Result:
    return [(broadcast(node, ins, known)[0][0], ins[1].dtype)]  # type: ignore[union-attr]


# ---- reductions --------------------------------------------------------------------------------------


def reduce_axes(node: Node, rank: int, axes: np.ndarray | None) -> tuple[int, ...] | None:
    """The axes a Reduce* node reduces (normalized: axes are an input), or None for "no-op"."""
    listed = [] if axes is None else [int(a) for a in np.asarray(axes).reshape(-1)]
    if not listed:
        return None if node.attrs.get("noop_with_empty_axes", 0) else tuple(range(rank))
    if any(not -rank <= a < rank for a in listed):
        raise err(node, f"axes {listed} are out of range for a rank-{rank} input")
    return tuple(sorted({a % rank for a in listed}))


def _reducer(fn: Callable[..., np.ndarray], wide: bool) -> OpDef:
    def run(node: Node, a: list[Any]) -> list[np.ndarray]:
        x = a[0]
        axes = reduce_axes(node, x.ndim, a[1] if len(a) > 1 else None)
        if axes is None:
            return [x]
        keep = bool(node.attrs.get("keepdims", 1))
        y = fn(x.astype(np.float64) if wide and x.dtype.kind == "f" else x, axis=axes, keepdims=keep)
        return [np.asarray(y).astype(x.dtype, copy=False)]

    def infer(node: Node, ins: list[Value | None], known: Known) -> Result:
        x = shape_of(node, ins[0], "the input")
        axes = need(node, known, 1, "axes") if len(ins) > 1 and ins[1] is not None else None
        picked = reduce_axes(node, len(x), axes)
        if picked is None:
            return [(x, ins[0].dtype)]  # type: ignore[union-attr]
        keep = bool(node.attrs.get("keepdims", 1))
        out = tuple(1 if i in picked else d for i, d in enumerate(x) if keep or i not in picked)
        return [(out, ins[0].dtype)]  # type: ignore[union-attr]

    return OpDef(infer, run)


def _log_sum_exp(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    top = np.max(x, axis=axis, keepdims=True)
    y = np.log(np.sum(np.exp(x - top), axis=axis, keepdims=True)) + top
    return y if keepdims else np.squeeze(y, axis)


def _argmax(node: Node, x: np.ndarray) -> np.ndarray:
    axis = int(node.attrs.get("axis", 0)) % x.ndim
    if node.attrs.get("select_last_index", 0):
        flipped = np.flip(x, axis)
        y = x.shape[axis] - 1 - np.argmax(flipped, axis=axis)
    else:
        y = np.argmax(x, axis=axis)
    if node.attrs.get("keepdims", 1):
        y = np.expand_dims(y, axis)
    return y.astype(np.int64)


def _infer_argmax(node: Node, ins: list[Value | None], known: Known) -> Result:
    x = shape_of(node, ins[0], "the input")
    axis = int(node.attrs.get("axis", 0)) % len(x)
    keep = bool(node.attrs.get("keepdims", 1))
    return [(tuple(1 if i == axis else d for i, d in enumerate(x) if keep or i != axis), "int64")]


def _infer_global_pool(node: Node, ins: list[Value | None], known: Known) -> Result:
    x = shape_of(node, ins[0], "the input")
    if len(x) < 3:
        raise err(node, f"needs an N, C, spatial... input, got shape {list(x)}")
    return [((*x[:2], *([1] * (len(x) - 2))), ins[0].dtype)]  # type: ignore[union-attr]


ELEMENTWISE_OPS: dict[str, OpDef] = {
    **{op: _unary(fn) for op, fn in _UNARY.items()},
    "Max": _variadic(np.maximum),
    "Min": _variadic(np.minimum),
    "Mean": OpDef(broadcast, lambda n, a: [(sum(x.astype(np.float64) for x in a) / len(a)).astype(a[0].dtype)]),
    "Pow": OpDef(broadcast, _run_pow),
    "PRelu": OpDef(_infer_prelu, lambda n, a: [np.where(a[0] >= 0, a[0], a[0] * a[1]).astype(a[0].dtype)]),
    "Equal": _compare(np.equal),
    "Less": _compare(np.less),
    "LessOrEqual": _compare(np.less_equal),
    "Greater": _compare(np.greater),
    "GreaterOrEqual": _compare(np.greater_equal),
    "And": _compare(np.logical_and),
    "Or": _compare(np.logical_or),
    "Where": OpDef(_infer_where, lambda n, a: [np.where(a[0], a[1], a[2]).astype(a[1].dtype, copy=False)]),
    "ReduceMean": _reducer(np.mean, wide=True),
    "ReduceSum": _reducer(np.sum, wide=True),
    "ReduceMax": _reducer(np.max, wide=False),
    "ReduceMin": _reducer(np.min, wide=False),
    "ReduceProd": _reducer(np.prod, wide=True),
    "ReduceSumSquare": _reducer(lambda x, **k: np.sum(np.square(x), **k), wide=True),
    "ReduceL1": _reducer(lambda x, **k: np.sum(np.abs(x), **k), wide=True),
    "ReduceL2": _reducer(lambda x, **k: np.sqrt(np.sum(np.square(x), **k)), wide=True),
    "ReduceLogSumExp": _reducer(_log_sum_exp, wide=True),
    "ArgMax": OpDef(_infer_argmax, lambda n, a: [_argmax(n, a[0])]),
    "GlobalMaxPool": OpDef(_infer_global_pool,
                           lambda n, a: [a[0].max(axis=tuple(range(2, a[0].ndim)), keepdims=True)]),
}
