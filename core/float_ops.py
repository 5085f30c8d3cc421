"""Float operators of the IR: shape rules and numpy kernels (numpy alone, no onnx).

One definition per op serves four users: shape inference, constant folding, calibration (the float
graph run on sample inputs) and the float host layers of the runtime (softmax, and the whole graph for
``target="cpu"``). The op names and attribute meanings are ONNX's, normalized by the importer: optional
inputs that older opsets gave as attributes (Clip's bounds, Pad's pads, Slice's ranges, the axes of
Squeeze/Unsqueeze) are always inputs here, and pads are always explicit (top, left, bottom, right).

Activations, math, comparisons and reductions live in :mod:`~weft.core.float_elementwise`, layout ops
(Transpose, Split, Expand, Tile, Resize) in :mod:`~weft.core.float_tensor`, LRN, ConvTranspose and the
normalizations in :mod:`~weft.core.float_nn`; ``FLOAT_OPS`` merges their tables.

Two ops exist only in the IR: ``FusedConv`` (conv or dense + bias + optional residual add + optional
ReLU/clip, made by the fusion pass) and ``ChannelAffine`` (a per-channel ``x * scale + shift``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from weft.core.errors import UnsupportedError
from weft.core.float_base import Known, OpDef, Shape, by_running
from weft.core.float_base import broadcast as _broadcast
from weft.core.float_base import err as _err
from weft.core.float_base import need as _need
from weft.core.float_base import same as _same
from weft.core.float_base import shape_of as _shape
from weft.core.float_elementwise import ELEMENTWISE_OPS
from weft.core.float_nn import NN_OPS
from weft.core.float_tensor import TENSOR_OPS
from weft.core.ir import Node, Value, dtype_name, numpy_dtype
from weft.core.qdq import FAKE_QUANT, fake_quant, quantize_dtype, run_dequantize, run_quantize

__all__ = ["FLOAT_OPS", "OpDef", "conv_out_size", "full_pads", "macs_of", "pool_geometry",
           "slice_index"]

# ---- geometry ----------------------------------------------------------------------------------------


def conv_out_size(size: int, kernel: int, stride: int, pad_lo: int, pad_hi: int, ceil: bool = False) -> int:
    """Output extent of a sliding window (ONNX/PyTorch rule, including ceil mode)."""
    span = size + pad_lo + pad_hi - kernel
    out = (-(-span // stride) if ceil else span // stride) + 1
    if ceil and (out - 1) * stride >= size + pad_lo:  # the last window must start inside the input
        out -= 1
    return out


def pool_geometry(node: Node, shape: Shape) -> tuple[Shape, Shape, tuple[int, int, int, int], Shape]:
    """(kernel, strides, pads, output HW) of a 2-D Conv/pool node on an NCHW input shape."""
    if len(shape) != 4:
        raise UnsupportedError(f"only 2-D (NCHW) inputs are supported, got shape {list(shape)}",
                               node=node.name, op=node.op)
    kernel = tuple(node.attrs["kernel_shape"])
    strides = tuple(node.attrs.get("strides", (1, 1)))
    pads = tuple(node.attrs.get("pads", (0, 0, 0, 0)))
    ceil = bool(node.attrs.get("ceil_mode", 0))
    out = tuple(conv_out_size(shape[2 + a], kernel[a], strides[a], pads[a], pads[a + 2], ceil) for a in (0, 1))
    if min(out) < 1:
        raise _err(node, f"a {kernel[0]}x{kernel[1]} window does not fit the {shape[2]}x{shape[3]} input "
                         f"with pads {list(pads)}")
    return kernel, strides, pads, out  # type: ignore[return-value]


# ---- kernels -----------------------------------------------------------------------------------------


def im2col(x: np.ndarray, kernel: Shape, strides: Shape, pads: Sequence[int], out_hw: Shape,
           fill: float = 0.0) -> np.ndarray:
    """NHWC input -> (N, Ho, Wo, kh, kw, C) windows (a copy), padding with `fill`."""
    t, l, b, r = pads
    need_h = (out_hw[0] - 1) * strides[0] + kernel[0]
    need_w = (out_hw[1] - 1) * strides[1] + kernel[1]
    b = max(b, need_h - x.shape[1] - t)
    r = max(r, need_w - x.shape[2] - l)
    xp = np.pad(x, ((0, 0), (t, b), (l, r), (0, 0)), constant_values=fill)
    win = sliding_window_view(xp, kernel, axis=(1, 2))  # (N, H', W', C, kh, kw)
    win = win[:, : need_h - kernel[0] + 1 : strides[0], : need_w - kernel[1] + 1 : strides[1]]
    return np.ascontiguousarray(win.transpose(0, 1, 2, 4, 5, 3))


def conv2d(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, strides: Shape, pads: Sequence[int],
           group: int = 1) -> np.ndarray:
    """Float NCHW convolution (dilation 1) as im2col + one batched matmul over the `group` groups: input
    channels [g*C/G, (g+1)*C/G) feed output channels [g*O/G, (g+1)*O/G), as in ONNX."""
    n, _, h, wd = x.shape
    o, cg, kh, kw = w.shape
    out_hw = (conv_out_size(h, kh, strides[0], pads[0], pads[2]), conv_out_size(wd, kw, strides[1], pads[1], pads[3]))
    cols = im2col(x.transpose(0, 2, 3, 1), (kh, kw), strides, pads, out_hw)  # (N, Ho, Wo, kh, kw, C)
    og = o // group
    cols = cols.reshape(-1, kh * kw, group, cg).transpose(2, 0, 1, 3).reshape(group, -1, kh * kw * cg)
    wg = w.reshape(group, og, cg, kh, kw).transpose(0, 3, 4, 2, 1).reshape(group, kh * kw * cg, og)
    y = np.matmul(cols, wg).transpose(1, 0, 2).reshape(-1, o)  # (N*Ho*Wo, O)
    if b is not None:
        y += b
    return np.ascontiguousarray(y.reshape(n, *out_hw, o).transpose(0, 3, 1, 2))


def _pool(node: Node, x: np.ndarray, reduce: str) -> np.ndarray:
    kernel, strides, pads, out_hw = pool_geometry(node, x.shape)
    fill = -np.inf if reduce == "max" else 0.0
    cols = im2col(x.transpose(0, 2, 3, 1), kernel, strides, pads, out_hw, fill=fill)  # (N,Ho,Wo,kh,kw,C)
    if reduce == "max":
        y = cols.max(axis=(3, 4))
    else:
        total = cols.sum(axis=(3, 4), dtype=np.float64)
        # Divisors: the window's cells inside the input, or inside the padded input with
        # count_include_pad (never the extra cells ceil mode adds past the pads).
        t, l, b, r = pads
        if node.attrs.get("count_include_pad", 0):
            ones, where = np.ones((1, x.shape[2] + t + b, x.shape[3] + l + r, 1)), (0, 0, 0, 0)
        else:
            ones, where = np.ones((1, *x.shape[2:], 1)), pads
        counts = im2col(ones, kernel, strides, where, out_hw).sum(axis=(3, 4, 5))[0]
        y = total / counts[None, :, :, None]
    return np.ascontiguousarray(y.transpose(0, 3, 1, 2)).astype(x.dtype)


def _activation(node: Node, y: np.ndarray) -> np.ndarray:
    act = node.attrs.get("act", "none")
    if act == "relu":
        return np.maximum(y, 0, out=y)
    if act == "clip":
        lo, hi = node.attrs["clip"]
        return np.clip(y, -np.inf if lo is None else lo, np.inf if hi is None else hi, out=y)
    return y


def fused_conv(node: Node, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, residual: np.ndarray | None,
               observe: Callable[[np.ndarray], None] | None = None) -> np.ndarray:
    """FusedConv: conv (or dense on a 2-D input) + bias, then + residual, then the activation.
    `observe` sees the accumulator stage (conv + bias) before the residual and the activation."""
    x4 = x.reshape(*x.shape, 1, 1) if x.ndim == 2 else x
    y = conv2d(x4, w, b, node.attrs["strides"], node.attrs["pads"], node.attrs.get("group", 1))
    if observe is not None:
        observe(y)
    if residual is not None:
        y += residual.reshape(y.shape)
    y = _activation(node, y)
    return y.reshape(y.shape[0], y.shape[1]) if node.attrs.get("out_rank", 4) == 2 else y


def softmax(x: np.ndarray, axis: int, legacy: bool, log: bool = False) -> np.ndarray:
    """Softmax (LogSoftmax with `log`) along `axis`."""
    axis = axis % x.ndim if x.ndim else 0
    if legacy:  # opset < 13: the input is coerced to 2-D at `axis`
        y = softmax(x.reshape(int(np.prod(x.shape[:axis])), -1), 1, False, log)
        return y.reshape(x.shape)
    shifted = x - x.max(axis=axis, keepdims=True)
    e = np.exp(shifted)
    if log:
        return shifted - np.log(e.sum(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _reshape_target(node: Node, shape: Shape, target: np.ndarray) -> Shape:
    dims = [int(d) for d in target.reshape(-1)]
    allow_zero = bool(node.attrs.get("allowzero", 0))
    out = [shape[i] if (d == 0 and not allow_zero) else d for i, d in enumerate(dims)]
    total = int(np.prod(shape))
    if out.count(-1) > 1:
        raise _err(node, f"shape {dims} has more than one -1")
    if -1 in out:
        rest = int(np.prod([d for d in out if d != -1]))
        if rest == 0 or total % rest:
            raise _err(node, f"cannot reshape {list(shape)} into {dims}")
        out[out.index(-1)] = total // rest
    if int(np.prod(out)) != total:
        raise _err(node, f"cannot reshape {list(shape)} ({total} elements) into {dims}")
    return tuple(out)


def slice_index(node: Node, shape: Shape, starts: np.ndarray, ends: np.ndarray, axes: np.ndarray | None,
                steps: np.ndarray | None) -> tuple[slice, ...]:
    """The index of an ONNX Slice of a `shape` tensor (starts, ends, axes and steps clamped as ONNX does),
    shared by the numpy interpreter and the LLVM host code."""
    rank = len(shape)
    index = [slice(None)] * rank
    axes_l = list(range(len(starts))) if axes is None else [int(a) % rank for a in axes.reshape(-1)]
    steps_l = [1] * len(axes_l) if steps is None else [int(s) for s in steps.reshape(-1)]
    for a, s, e, st in zip(axes_l, starts.reshape(-1), ends.reshape(-1), steps_l, strict=True):
        if st == 0:
            raise _err(node, "a slice step is 0")
        big = np.iinfo(np.int64).max // 2
        s, e = max(min(int(s), big), -big), max(min(int(e), big), -big)
        index[a] = slice(*slice(s, e, st).indices(shape[a]))
    return tuple(index)


def _axes(node: Node, axes: np.ndarray | None, rank: int) -> list[int]:
    if axes is None:
        return []
    return sorted(int(a) % rank for a in axes.reshape(-1))


# ---- shape rules -------------------------------------------------------------------------------------


def _infer_conv(node: Node, ins: list[Value | None], known: Known) -> list[tuple[Shape, str]]:
    x, w = _shape(node, ins[0], "the input"), _shape(node, ins[1], "the weights")
    x4 = (*x, 1, 1) if len(x) == 2 else x
    group = int(node.attrs.get("group", 1))
    if len(w) != 4 or w[1] * group != x4[1] or w[0] % group:
        raise _err(node, f"weights {list(w)} do not match an input with {x4[1]} channels in {group} group(s)")
    node_k = node.copy()
    node_k.attrs["kernel_shape"] = (w[2], w[3])
    _, _, _, out_hw = pool_geometry(node_k, x4)
    if len(ins) > 2 and ins[2] is not None and _shape(node, ins[2], "the bias") != (w[0],):
        raise _err(node, f"bias shape {list(ins[2].shape)} is not [{w[0]}]")  # type: ignore[union-attr]
    if node.attrs.get("out_rank", 4) == 2:
        if out_hw != (1, 1):
            raise _err(node, f"a dense output needs a 1x1 result, got {out_hw[0]}x{out_hw[1]}")
        return [((x4[0], w[0]), "float32")]
    return [((x4[0], w[0], *out_hw), "float32")]


def _infer_pool(node: Node, ins: list[Value | None], known: Known) -> list[tuple[Shape, str]]:
    x = _shape(node, ins[0], "the input")
    _, _, _, out_hw = pool_geometry(node, x)
    return [((x[0], x[1], *out_hw), ins[0].dtype)]  # type: ignore[union-attr]


def _infer_gemm(node: Node, ins: list[Value | None], known: Known) -> list[tuple[Shape, str]]:
    a, b = _shape(node, ins[0], "A"), _shape(node, ins[1], "B")
    if len(a) != 2 or len(b) != 2:
        raise _err(node, f"Gemm needs 2-D inputs, got {list(a)} and {list(b)}")
    m, k = a[::-1] if node.attrs.get("transA", 0) else a
    k2, n = b[::-1] if node.attrs.get("transB", 0) else b
    if k != k2:
        raise _err(node, f"inner dimensions differ: A is {list(a)}, B is {list(b)}")
    if len(ins) > 2 and ins[2] is not None:
        try:
            np.broadcast_shapes(_shape(node, ins[2], "C"), (m, n))
        except ValueError:
            raise _err(node, f"C {list(ins[2].shape)} does not broadcast to {[m, n]}") from None  # type: ignore[union-attr]
    return [((m, n), "float32")]


def _infer_matmul(node: Node, ins: list[Value | None], known: Known) -> list[tuple[Shape, str]]:
    a, b = _shape(node, ins[0], "A"), _shape(node, ins[1], "B")
    if not a or not b:
        raise _err(node, "MatMul needs inputs of rank 1 or more")
    a2, b2 = (1, *a) if len(a) == 1 else a, (*b, 1) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise _err(node, f"cannot multiply {list(a)} by {list(b)}")
    try:
        batch = np.broadcast_shapes(a2[:-2], b2[:-2])
    except ValueError:
        raise _err(node, f"batch dimensions of {list(a)} and {list(b)} do not broadcast") from None
    out = (*batch, *([a2[-2]] if len(a) > 1 else []), *([b2[-1]] if len(b) > 1 else []))
    return [(tuple(out), "float32")]


def _infer_flatten(node: Node, ins: list[Value | None], known: Known) -> list[tuple[Shape, str]]:
    x = _shape(node, ins[0], "the input")
    axis = int(node.attrs.get("axis", 1))
    axis = axis + len(x) if axis < 0 else axis  # ONNX: a negative axis counts from the rank, not rank + 1
    return [((int(np.prod(x[:axis])), int(np.prod(x[axis:]))), ins[0].dtype)]  # type: ignore[union-attr]


def _infer_reshape(node: Node, ins: list[Value | None], known: Known) -> list[tuple[Shape, str]]:
    x = _shape(node, ins[0], "the input")
    return [(_reshape_target(node, x, _need(node, known, 1, "the target shape")), ins[0].dtype)]  # type: ignore[union-attr]


def _infer_concat(node: Node, ins: list[Value | None], known: Known) -> list[tuple[Shape, str]]:
    shapes = [_shape(node, v, f"input {k}") for k, v in enumerate(ins)]
    rank = len(shapes[0])
    axis = node.attrs["axis"] % rank
    for s in shapes[1:]:
        if len(s) != rank or any(s[a] != shapes[0][a] for a in range(rank) if a != axis):
            raise _err(node, f"inputs {[list(t) for t in shapes]} differ outside axis {axis}")
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    return [(tuple(out), ins[0].dtype)]  # type: ignore[union-attr]


def full_pads(node: Node, rank: int, pads: np.ndarray, axes: np.ndarray | None) -> np.ndarray:
    """Pad's (begin..., end...) amounts for every axis, expanding the opset-18 `axes` input."""
    pads = pads.reshape(-1).astype(np.int64)
    if axes is None:
        if pads.size != 2 * rank:
            raise _err(node, f"{pads.size} pads for a rank-{rank} input")
        return pads
    axes_l = [int(a) % rank for a in axes.reshape(-1)]
    if pads.size != 2 * len(axes_l):
        raise _err(node, f"{pads.size} pads for {len(axes_l)} axes")
    full = np.zeros(2 * rank, dtype=np.int64)
    for k, a in enumerate(axes_l):
        full[a], full[a + rank] = pads[k], pads[k + len(axes_l)]
    return full


def _infer_pad(node: Node, ins: list[Value | None], known: Known) -> list[tuple[Shape, str]]:
    x = _shape(node, ins[0], "the input")
    axes = _need(node, known, 3, "axes") if len(ins) > 3 and ins[3] is not None else None
    pads = full_pads(node, len(x), _need(node, known, 1, "pads"), axes)
    out = tuple(int(d + pads[a] + pads[a + len(x)]) for a, d in enumerate(x))
    if min(out) < 0:
        raise _err(node, f"pads {pads.tolist()} remove more than the input {list(x)} has")
    return [(out, ins[0].dtype)]  # type: ignore[union-attr]


def _infer_cos(node: Node, ins: list[Value | None], known: Known) -> list[tuple[Shape, str]]:
    shape = _need(node, known, 0, "the shape")
    value = node.attrs.get("value")
    dtype = dtype_name(value) if isinstance(value, np.ndarray) else "float32"
    return [(tuple(int(d) for d in shape.reshape(-1)), dtype)]


def _infer_shape(node: Node, ins: list[Value | None], known: Known) -> list[tuple[Shape, str]]:
    x = _shape(node, ins[0], "the input")
    return [((len(x[slice(node.attrs.get("start", 0), node.attrs.get("end"))]),), "int64")]


# ---- kernels by op -----------------------------------------------------------------------------------


def _run_clip(node: Node, a: list[Any]) -> list[np.ndarray]:
    lo = -np.inf if a[1] is None else a[1].item()
    hi = np.inf if len(a) < 3 or a[2] is None else a[2].item()
    return [np.clip(a[0], lo, hi).astype(a[0].dtype)]


def _run_gemm(node: Node, a: list[Any]) -> list[np.ndarray]:
    x = a[0].T if node.attrs.get("transA", 0) else a[0]
    w = a[1].T if node.attrs.get("transB", 0) else a[1]
    y = np.float32(node.attrs.get("alpha", 1.0)) * (x @ w)
    if len(a) > 2 and a[2] is not None:
        y = y + np.float32(node.attrs.get("beta", 1.0)) * a[2]
    return [y.astype(np.float32)]


def _run_bn(node: Node, a: list[Any]) -> list[np.ndarray]:
    x, scale, bias, mean, var = a
    shape = (1, -1) + (1,) * (x.ndim - 2)
    inv = (scale / np.sqrt(var.astype(np.float64) + node.attrs.get("epsilon", 1e-5))).astype(np.float32)
    return [((x - mean.reshape(shape)) * inv.reshape(shape) + bias.reshape(shape)).astype(np.float32)]


def _run_affine(node: Node, a: list[Any]) -> list[np.ndarray]:
    x, scale, shift = a
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return [(x * scale.reshape(shape) + shift.reshape(shape)).astype(np.float32)]


def _run_pad(node: Node, a: list[Any]) -> list[np.ndarray]:
    x = a[0]
    rank = x.ndim
    pads = full_pads(node, rank, a[1], a[3] if len(a) > 3 else None)
    value = 0 if len(a) < 3 or a[2] is None else a[2].item()
    lo, hi = pads[:rank], pads[rank:]
    crop = tuple(slice(max(-int(lo[i]), 0), x.shape[i] - max(-int(hi[i]), 0)) for i in range(rank))
    widths = [(max(int(lo[i]), 0), max(int(hi[i]), 0)) for i in range(rank)]
    return [np.pad(x[crop], widths, constant_values=value)]


def _run_cos(node: Node, a: list[Any]) -> list[np.ndarray]:
    value = node.attrs.get("value")
    fill = value.reshape(-1)[0] if isinstance(value, np.ndarray) else np.float32(0)
    return [np.full(tuple(int(d) for d in a[0].reshape(-1)), fill, dtype=np.asarray(fill).dtype)]


def _run_gather(node: Node, a: list[Any]) -> list[np.ndarray]:
    x, idx = a
    axis = node.attrs.get("axis", 0) % x.ndim
    idx = np.where(idx < 0, idx + x.shape[axis], idx)
    return [np.take(x, idx, axis=axis)]


def _run_unsqueeze(node: Node, a: list[Any]) -> list[np.ndarray]:
    x = a[0]
    out_rank = x.ndim + a[1].size
    return [np.expand_dims(x, tuple(_axes(node, a[1], out_rank)))]


def _run_squeeze(node: Node, a: list[Any]) -> list[np.ndarray]:
    x = a[0]
    axes = _axes(node, a[1] if len(a) > 1 else None, x.ndim) or [i for i, d in enumerate(x.shape) if d == 1]
    if any(x.shape[i] != 1 for i in axes):
        raise _err(node, f"cannot squeeze axes {axes} of shape {list(x.shape)}")
    return [np.squeeze(x, tuple(axes))]


def _run_slice(node: Node, a: list[Any]) -> list[np.ndarray]:
    extra = [a[k] if len(a) > k else None for k in (3, 4)]
    return [a[0][slice_index(node, a[0].shape, a[1], a[2], *extra)]]


def _binary(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable[[Node, list[Any]], list[np.ndarray]]:
    def run(node: Node, a: list[Any]) -> list[np.ndarray]:
        out = fn(a[0], a[1])
        return [np.asarray(out).astype(np.result_type(a[0], a[1]), copy=False)]

    return run


def _int_div(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if np.issubdtype(np.result_type(x, y), np.integer):
        return np.trunc(x / y).astype(np.result_type(x, y))  # ONNX integer Div truncates
    return x / y


FLOAT_OPS: dict[str, OpDef] = {
    "Identity": OpDef(_same, lambda n, a: [a[0]]),
    "Relu": OpDef(_same, lambda n, a: [np.maximum(a[0], 0).astype(a[0].dtype)]),
    "Clip": OpDef(_same, _run_clip),
    "Add": OpDef(_broadcast, _binary(np.add)),
    "Sub": OpDef(_broadcast, _binary(np.subtract)),
    "Mul": OpDef(_broadcast, _binary(np.multiply)),
    "Div": OpDef(_broadcast, _binary(_int_div)),
    "Conv": OpDef(_infer_conv, lambda n, a: [conv2d(a[0], a[1], a[2] if len(a) > 2 else None,
                                                     n.attrs["strides"], n.attrs["pads"], n.attrs.get("group", 1))]),
    "FusedConv": OpDef(_infer_conv, lambda n, a: [fused_conv(n, a[0], a[1], a[2], a[3] if len(a) > 3 else None)]),
    "Gemm": OpDef(_infer_gemm, _run_gemm),
    "MatMul": OpDef(_infer_matmul, lambda n, a: [np.matmul(a[0], a[1]).astype(np.float32)]),
    "BatchNormalization": OpDef(_same, _run_bn),
    "ChannelAffine": OpDef(_same, _run_affine),
    "MaxPool": OpDef(_infer_pool, lambda n, a: [_pool(n, a[0], "max")]),
    "AveragePool": OpDef(_infer_pool, lambda n, a: [_pool(n, a[0], "avg")]),
    "GlobalAveragePool": OpDef(
        lambda n, i, k: [((*_shape(n, i[0], "the input")[:2], 1, 1), "float32")],
        lambda n, a: [a[0].mean(axis=(2, 3), keepdims=True, dtype=np.float64).astype(np.float32)]),
    "Flatten": OpDef(_infer_flatten, lambda n, a: [a[0].reshape(_infer_flatten(
        n, [Value("x", a[0].shape, "float32")], lambda k: None)[0][0])]),
    "Reshape": OpDef(_infer_reshape, lambda n, a: [a[0].reshape(_reshape_target(n, a[0].shape, a[1]))]),
    "Concat": OpDef(_infer_concat, lambda n, a: [np.concatenate(a, axis=n.attrs["axis"])]),
    "Pad": OpDef(_infer_pad, _run_pad),
    "Softmax": OpDef(_same, lambda n, a: [softmax(a[0], n.attrs.get("axis", -1), n.attrs.get("legacy", False))
                                          .astype(np.float32)]),
    "LogSoftmax": OpDef(_same, lambda n, a: [softmax(a[0], n.attrs.get("axis", -1), n.attrs.get("legacy", False),
                                                     log=True).astype(np.float32)]),
    "ConstantOfShape": OpDef(_infer_cos, _run_cos),
    "Shape": OpDef(_infer_shape, lambda n, a: [np.array(
        a[0].shape[slice(n.attrs.get("start", 0), n.attrs.get("end"))], dtype=np.int64)]),
    # shape ops on small, statically known data: their values (not just shapes) decide the output shape
    "Gather": OpDef(by_running(_run_gather), _run_gather),
    "Unsqueeze": OpDef(by_running(_run_unsqueeze, (1,)), _run_unsqueeze),
    "Squeeze": OpDef(by_running(_run_squeeze, (1,)), _run_squeeze),
    "Slice": OpDef(by_running(_run_slice, (1, 2, 3, 4)), _run_slice),
    "Cast": OpDef(lambda n, i, k: [(_shape(n, i[0], "the input"), n.attrs["to"])],
                  lambda n, a: [a[0].astype(numpy_dtype(n.attrs["to"]))]),
    # A pre-quantized model's own quantization (see weft.core.qdq).
    FAKE_QUANT: OpDef(_same, lambda n, a: [fake_quant(n, a[0])]),
    "QuantizeLinear": OpDef(lambda n, i, k: [(_shape(n, i[0], "the input"), quantize_dtype(n))],
                            lambda n, a: [run_quantize(n, a[0])]),
    "DequantizeLinear": OpDef(lambda n, i, k: [(_shape(n, i[0], "the input"), "float32")],
                              lambda n, a: [run_dequantize(n, a[0])]),
    "CastLike": OpDef(lambda n, i, k: [(_shape(n, i[0], "the input"), i[1].dtype)],  # type: ignore[union-attr]
                      lambda n, a: [a[0].astype(a[1].dtype)]),
    "Size": OpDef(lambda n, i, k: [((), "int64")], lambda n, a: [np.array(a[0].size, np.int64)]),
    **ELEMENTWISE_OPS,
    **TENSOR_OPS,
    **NN_OPS,
}


def macs_of(node: Node, in_shapes: Sequence[Shape | None], out_shapes: Sequence[Shape | None]) -> int:
    """Multiply-accumulates of one float or quantized node on logical shapes (0 for data movement)."""
    op = node.op
    if op in ("Conv", "FusedConv", "qconv2d"):
        w, y = in_shapes[1], out_shapes[0]
        if op == "qconv2d":
            kh, kw = node.attrs["kernel"]
            cin, cout = node.attrs["channels"]
            # a max-pool fused in (weft.compiler.pool_fusion): the convolution's own output size
            spatial = tuple(node.attrs["conv_hw"]) if "conv_hw" in node.attrs else _spatial(y)  # type: ignore[arg-type]
            return int(np.prod(spatial)) * y[0] * cout * cin * kh * kw  # type: ignore[index]
        return int(np.prod(_spatial(y))) * y[0] * int(np.prod(w))  # type: ignore[arg-type,index]
    if op == "Gemm":
        y = out_shapes[0]
        a = in_shapes[0]
        k = a[0] if node.attrs.get("transA", 0) else a[1]  # type: ignore[index]
        return int(y[0] * y[1] * k)  # type: ignore[index]
    if op == "MatMul":
        a, y = in_shapes[0], out_shapes[0]
        return int(np.prod(y)) * int(a[-1])  # type: ignore[arg-type,index]
    if op == "ConvTranspose":  # every input element meets its group's (C_out / group) x kernel weights
        x, w = in_shapes[0], in_shapes[1]
        return int(np.prod(x)) * int(np.prod(w[1:]))  # type: ignore[arg-type,index]
    return 0


def _spatial(shape: Shape) -> Shape:
    return shape[2:] if len(shape) > 2 else (1,)
