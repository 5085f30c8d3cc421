"""Integer kernels of the quantized ops: the reference semantics the accelerator back end must match.

Every kernel reads and writes tensors in the layout their :class:`Value` declares: packed activations
``(N/batch, C/block, H, W, batch, block)`` (``Value.logical`` set) or plain logical arrays. Inside, work
happens on channel-last ``(N, H, W, C)`` integers, padding included, so a packed tensor's padded channels
and batch rows are computed exactly as the accelerator computes them.

GEMM sums are exact: int products summed in float32 or float64 when that is exact for the reduction length
(:func:`weft.isa.arith.float_dtype_for`), else in int64; then wrapped to ``acc_width`` like the GEMM
core, and the epilogue runs in ALU semantics (:mod:`weft.core.epilogue`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from weft.core.epilogue import narrow, run_steps
from weft.core.float_ops import im2col
from weft.core.ir import Node, Value, numpy_dtype
from weft.core.layout import from_nhwc, pack_act, to_nhwc, unpack_act, unpack_weights
from weft.isa.arith import float_dtype_for, wrap

__all__ = ["QKERNELS", "Widths"]


@dataclass(frozen=True)
class Widths:
    """The config's data widths, all a kernel needs to know about the accelerator."""

    inp: int
    wgt: int
    acc: int
    out: int


Kernel = Callable[[Node, list[Any], list[Value | None], list[Value], Widths], list[np.ndarray]]


def _nhwc(array: np.ndarray, value: Value) -> np.ndarray:
    if value.packed:
        return to_nhwc(array)
    if array.ndim == 2:
        return array.reshape(array.shape[0], 1, 1, array.shape[1])
    return array.transpose(0, 2, 3, 1)


def _from_nhwc(x: np.ndarray, value: Value) -> np.ndarray:
    if value.packed:
        return from_nhwc(x, value.shape[4], value.shape[5])  # type: ignore[index]
    if len(value.shape) == 2:  # type: ignore[arg-type]
        return np.ascontiguousarray(x.reshape(x.shape[0], x.shape[3]))
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def _logical(array: np.ndarray, value: Value) -> np.ndarray:
    return unpack_act(array, value.logical) if value.packed else array  # type: ignore[arg-type]


def _store(x: np.ndarray, value: Value) -> np.ndarray:
    """A logical integer tensor in the layout of `value`."""
    x = x.astype(numpy_dtype(value.dtype), copy=False)
    return pack_act(x, value.shape[4], value.shape[5]) if value.packed else x  # type: ignore[index]


def _int_matmul(cols: np.ndarray, w: np.ndarray, widths: Widths) -> np.ndarray:
    """Exact int64 (..., M, K) @ (..., K, O) of int8 operands."""
    dtype = float_dtype_for(cols.shape[-1], widths.inp, widths.wgt)
    if dtype is None:
        return cols.astype(np.int64) @ w.astype(np.int64)
    return (cols.astype(dtype) @ w.astype(dtype)).astype(np.int64)


def qconv2d(node: Node, args: list[Any], ins: list[Value | None], outs: list[Value],
        widths: Widths) -> list[np.ndarray]:
    x = _nhwc(args[0], ins[0])  # type: ignore[arg-type]
    w = args[1]
    # Logical weights are (O, C/group, kh, kw); packed ones hold each super-group's dense block-diagonal
    # matrix (see weft.compiler.groups), i.e. a grouped convolution with `super_groups` groups.
    packed = w.ndim == 6
    weights = unpack_weights(w) if packed else w
    groups = node.attrs.get("super_groups", 1) if packed else node.attrs.get("group", 1)
    o, i, kh, kw = weights.shape
    y_value = outs[0]
    n, _, _, c = x.shape
    if c != i * groups:
        raise ValueError(f"node '{node.name}': input has {c} channels, weights expect {i * groups}")
    # A max-pool fused into the convolution (weft.compiler.pool_fusion): the convolution's own size first
    out_hw = tuple(node.attrs["conv_hw"]) if "conv_hw" in node.attrs else _out_hw(y_value)
    cols = im2col(x, (kh, kw), node.attrs["strides"], node.attrs["pads"], out_hw)  # (N, Ho, Wo, kh, kw, C)
    cols = cols.reshape(-1, kh * kw, groups, i).transpose(2, 0, 1, 3).reshape(groups, -1, kh * kw * i)
    wg = weights.reshape(groups, o // groups, i, kh, kw).transpose(0, 3, 4, 2, 1).reshape(groups, kh * kw * i, -1)
    acc = _int_matmul(cols, wg, widths).transpose(1, 0, 2).reshape(-1, o)
    acc = wrap(acc, widths.acc).reshape(n, *out_hw, o)
    residual = _nhwc(args[2], ins[2]).astype(np.int64) if len(args) > 2 and args[2] is not None else None  # type: ignore[arg-type]
    y = narrow(run_steps(acc, node.attrs["epilogue"], widths.acc, residual), widths.out)
    if "pool_kernel" in node.attrs:
        fill = -(1 << (widths.out - 1))  # pads never win, as in qmaxpool
        y = im2col(y, node.attrs["pool_kernel"], node.attrs["pool_strides"], node.attrs["pool_pads"],
                   _out_hw(y_value), fill=fill).max(axis=(3, 4))
    return [_from_nhwc(y, y_value)]


def _out_hw(value: Value) -> tuple[int, int]:
    shape = value.logical_shape
    return (1, 1) if len(shape) == 2 else (shape[2], shape[3])  # type: ignore[arg-type,index,return-value]


def qmaxpool(node: Node, args: list[Any], ins: list[Value | None], outs: list[Value],
        widths: Widths) -> list[np.ndarray]:
    x = _nhwc(args[0], ins[0])  # type: ignore[arg-type]
    fill = -(1 << (widths.out - 1))  # pads never win: the window's valid elements decide
    cols = im2col(x, node.attrs["kernel"], node.attrs["strides"], node.attrs["pads"], _out_hw(outs[0]), fill=fill)
    return [_from_nhwc(cols.max(axis=(3, 4)), outs[0])]


def qavgpool(node: Node, args: list[Any], ins: list[Value | None], outs: list[Value],
        widths: Widths) -> list[np.ndarray]:
    x = _nhwc(args[0], ins[0])  # type: ignore[arg-type]
    cols = im2col(x, node.attrs["kernel"], node.attrs["strides"], node.attrs["pads"], _out_hw(outs[0]))
    acc = wrap(cols.sum(axis=(3, 4), dtype=np.int64), widths.acc)
    return [_from_nhwc(narrow(run_steps(acc, node.attrs["epilogue"], widths.acc), widths.out), outs[0])]


def qalu(node: Node, args: list[Any], ins: list[Value | None], outs: list[Value],
        widths: Widths) -> list[np.ndarray]:
    acc = _nhwc(args[0], ins[0]).astype(np.int64)  # type: ignore[arg-type]
    residual = _nhwc(args[1], ins[1]).astype(np.int64) if len(args) > 1 and args[1] is not None else None  # type: ignore[arg-type]
    return [_from_nhwc(narrow(run_steps(acc, node.attrs["epilogue"], widths.acc, residual), widths.out), outs[0])]


def quantize(node: Node, args: list[Any], ins: list[Value | None], outs: list[Value],
        widths: Widths) -> list[np.ndarray]:
    """float -> int: ``clip(rint(x / scale), -2**(bits-1), 2**(bits-1) - 1)``, division in float64."""
    bits = node.attrs["bits"]
    q = np.clip(np.rint(args[0].astype(np.float64) / node.attrs["scale"]), -(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    return [_store(q, outs[0])]


def dequantize(node: Node, args: list[Any], ins: list[Value | None], outs: list[Value],
        widths: Widths) -> list[np.ndarray]:
    """int -> float: ``float32(q) * float32(scale)``."""
    q = _logical(args[0], ins[0])  # type: ignore[arg-type]
    return [q.astype(np.float32) * np.float32(node.attrs["scale"])]


def qconcat(node: Node, args: list[Any], ins: list[Value | None], outs: list[Value],
        widths: Widths) -> list[np.ndarray]:
    parts = [_logical(a, v) for a, v in zip(args, ins, strict=True)]  # type: ignore[arg-type]
    return [_store(np.concatenate(parts, axis=node.attrs["axis"]), outs[0])]


def qreshape(node: Node, args: list[Any], ins: list[Value | None], outs: list[Value],
        widths: Widths) -> list[np.ndarray]:
    return [_store(_logical(args[0], ins[0]).reshape(outs[0].logical_shape), outs[0])]  # type: ignore[arg-type]


def qpad(node: Node, args: list[Any], ins: list[Value | None], outs: list[Value],
        widths: Widths) -> list[np.ndarray]:
    x = _logical(args[0], ins[0])  # type: ignore[arg-type]
    pads = node.attrs["pads"]
    rank = x.ndim
    y = np.pad(x, [(pads[a], pads[a + rank]) for a in range(rank)], constant_values=node.attrs["value"])
    return [_store(y, outs[0])]


def qim2col(node: Node, args: list[Any], ins: list[Value | None], outs: list[Value],
        widths: Widths) -> list[np.ndarray]:
    """Each output pixel's window, ``(kh, kw, C)`` in that order, then ``attrs["constants"]``, as its
    channels; pads hold 0, the integer a convolution's padding means (see :mod:`weft.compiler.im2col`).
    Packing padding (batch rows, channels) stays zero."""
    x_value, y_value = ins[0], outs[0]
    n, channels = x_value.logical_shape[:2]  # type: ignore[index,union-attr]
    x = _nhwc(args[0], x_value)[:n, ..., :channels]  # type: ignore[arg-type]
    cols = im2col(x, node.attrs["kernel"], node.attrs["strides"], node.attrs["pads"], _out_hw(y_value))
    cols = cols.reshape(*cols.shape[:3], -1)
    constants = np.asarray(node.attrs.get("constants", ()), cols.dtype)
    cols = np.concatenate([cols, np.broadcast_to(constants, (*cols.shape[:3], constants.size))], axis=3)
    return [_store(cols.transpose(0, 3, 1, 2), y_value)]


QKERNELS: dict[str, Kernel] = {
    "qconv2d": qconv2d, "qmaxpool": qmaxpool, "qavgpool": qavgpool, "qalu": qalu,
    "quantize": quantize, "dequantize": dequantize, "qconcat": qconcat, "qreshape": qreshape, "qpad": qpad,
    "qim2col": qim2col,
}
