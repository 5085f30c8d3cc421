"""Float neural-network ops beyond convolution: LRN, ConvTranspose (1-D, 2-D), InstanceNormalization and
LayerNormalization. Statistics accumulate in float64 and results are cast back to the input's type."""

from __future__ import annotations

from typing import Any

import numpy as np

from weft.core.errors import UnsupportedError
from weft.core.float_base import Known, OpDef, Result, err, same, shape_of
from weft.core.ir import Node, Value

__all__ = ["NN_OPS", "conv_transpose2d", "conv_transpose_geometry"]


def _run_lrn(node: Node, a: list[Any]) -> list[np.ndarray]:
    """ONNX's LRN: the square sum runs over channels [c - floor((size-1)/2), c + ceil((size-1)/2)]."""
    x = a[0]
    size = int(node.attrs["size"])
    alpha, beta = float(node.attrs.get("alpha", 1e-4)), float(node.attrs.get("beta", 0.75))
    bias = float(node.attrs.get("bias", 1.0))
    sq = np.square(x.astype(np.float64))
    lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
    padded = np.pad(sq, [(0, 0), (lo, hi)] + [(0, 0)] * (x.ndim - 2))
    csum = np.concatenate([np.zeros_like(padded[:, :1]), np.cumsum(padded, axis=1)], axis=1)
    window = csum[:, size:] - csum[:, :-size]
    return [(x / (bias + alpha / size * window) ** beta).astype(x.dtype)]


# ---- ConvTranspose -----------------------------------------------------------------------------------


def _as_2d(node: Node, x: tuple[int, ...], w: tuple[int, ...]) -> tuple[Node, tuple[int, ...], tuple[int, ...]]:
    """A 1-D ConvTranspose as the 2-D one over a height of 1: (node with 2-D attributes, x, w shapes)."""
    if len(x) != 3 or len(w) != 3:
        return node, x, w
    flat = node.copy()
    lead = {"strides": 1, "dilations": 1, "output_padding": 0, "output_shape": 1}
    for key, one in lead.items():
        if key in node.attrs:
            flat.attrs[key] = (one, *node.attrs[key][-1:])
    if "pads" in node.attrs:
        flat.attrs["pads"] = (0, node.attrs["pads"][0], 0, node.attrs["pads"][1])
    return flat, (x[0], x[1], 1, x[2]), (w[0], w[1], 1, w[2])


def conv_transpose_geometry(node: Node, x: tuple[int, ...], w: tuple[int, ...]) -> tuple[tuple[int, int, int, int],
                                                                                        tuple[int, int]]:
    """(pads (top, left, bottom, right), output HW) of a 2-D ConvTranspose, with output_shape and auto_pad
    resolved as onnxruntime does: the output is output_shape, or input * stride for auto_pad SAME_*; the
    odd padding goes to the start (the end for SAME_UPPER), and an output larger than the full result
    appends zeros (a negative end pad)."""
    if len(x) != 4 or len(w) != 4:
        raise UnsupportedError(f"only 1-D and 2-D ConvTranspose are supported, got input {list(x)} and weights "
                               f"{list(w)}", node=node.name, op=node.op)
    strides = tuple(node.attrs.get("strides", (1, 1)))
    dil = tuple(node.attrs.get("dilations", (1, 1)))
    extra = tuple(node.attrs.get("output_padding", (0, 0)))
    pads = list(node.attrs.get("pads", (0, 0, 0, 0)))
    auto_pad = node.attrs.get("auto_pad", "NOTSET")
    target = node.attrs.get("output_shape")
    full = [strides[a] * (x[2 + a] - 1) + extra[a] + (w[2 + a] - 1) * dil[a] + 1 for a in (0, 1)]
    if target is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        want = [int(t) for t in list(target)[-2:]] if target is not None else [x[2] * strides[0], x[3] * strides[1]]
        for a in (0, 1):
            total = max(full[a] - want[a], 0)
            head = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            pads[a], pads[a + 2] = head, full[a] - head - want[a]
    elif auto_pad == "VALID":
        pads = [0, 0, 0, 0]
    out = (full[0] - pads[0] - pads[2], full[1] - pads[1] - pads[3])
    if min(out) < 1:
        raise err(node, f"the output {list(out)} is empty")
    return (pads[0], pads[1], pads[2], pads[3]), out


def conv_transpose2d(node: Node, x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """Each input pixel scatters its kernel-weighted copy into the output (col2im), group by group; a 1-D
    input runs as a 2-D one of height 1."""
    if x.ndim == 3:
        flat, x4, w4 = _as_2d(node, x.shape, w.shape)
        y = conv_transpose2d(flat, x.reshape(x4), w.reshape(w4), b)
        return y.reshape(y.shape[0], y.shape[1], y.shape[3])
    n, c, h, wd = x.shape
    group = int(node.attrs.get("group", 1))
    og, kh, kw = w.shape[1], w.shape[2], w.shape[3]
    sh, sw = tuple(node.attrs.get("strides", (1, 1)))
    dh, dw = tuple(node.attrs.get("dilations", (1, 1)))
    pads, out_hw = conv_transpose_geometry(node, x.shape, w.shape)
    cg = c // group
    xg = x.astype(np.float64).reshape(n, group, cg, h * wd)
    wg = w.astype(np.float64).reshape(group, cg, og * kh * kw)
    cols = np.einsum("ngcp,gck->ngpk", xg, wg).reshape(n, group, h, wd, og, kh, kw)
    extra = tuple(node.attrs.get("output_padding", (0, 0)))
    full = np.zeros((n, group, og, sh * (h - 1) + extra[0] + (kh - 1) * dh + 1,
                     sw * (wd - 1) + extra[1] + (kw - 1) * dw + 1))
    for i in range(kh):
        for j in range(kw):
            full[:, :, :, i * dh: i * dh + sh * (h - 1) + 1: sh, j * dw: j * dw + sw * (wd - 1) + 1: sw] += \
                cols[..., i, j].transpose(0, 1, 4, 2, 3)
    grow = [(0, 0)] * 3 + [(max(-pads[0], 0), max(-pads[2], 0)), (max(-pads[1], 0), max(-pads[3], 0))]
    full = np.pad(full, grow)
    top, left = max(pads[0], 0), max(pads[1], 0)
    y = full.reshape(n, group * og, *full.shape[3:])[:, :, top: top + out_hw[0], left: left + out_hw[1]]
    if b is not None:
        y = y + b.reshape(1, -1, 1, 1)
    return np.ascontiguousarray(y.astype(x.dtype))


def _infer_conv_transpose(node: Node, ins: list[Value | None], known: Known) -> Result:
    x, w = shape_of(node, ins[0], "the input"), shape_of(node, ins[1], "the weights")
    group = int(node.attrs.get("group", 1))
    if len(x) == 4 and (len(w) != 4 or w[0] != x[1] or x[1] % group):
        raise err(node, f"weights {list(w)} do not match an input with {x[1]} channels in {group} group(s)")
    flat, x4, w4 = _as_2d(node, x, w)
    _, out = conv_transpose_geometry(flat, x4, w4)
    return [((x[0], w[1] * group, *(out if len(x) == 4 else out[1:])), ins[0].dtype)]  # type: ignore[union-attr]


# ---- normalizations ----------------------------------------------------------------------------------


def _run_instance_norm(node: Node, a: list[Any]) -> list[np.ndarray]:
    x, scale, bias = a
    axes = tuple(range(2, x.ndim))
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=axes, keepdims=True)
    var = x64.var(axis=axes, keepdims=True)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = (x64 - mean) / np.sqrt(var + node.attrs.get("epsilon", 1e-5)) * scale.reshape(shape) + bias.reshape(shape)
    return [y.astype(x.dtype)]


def _layer_norm_axis(node: Node, rank: int) -> int:
    axis = int(node.attrs.get("axis", -1))
    if not -rank <= axis < rank:
        raise err(node, f"axis {axis} is out of range for a rank-{rank} input")
    return axis % rank


def _run_layer_norm(node: Node, a: list[Any]) -> list[np.ndarray]:
    x, scale = a[0], a[1]
    bias = a[2] if len(a) > 2 else None
    axis = _layer_norm_axis(node, x.ndim)
    axes = tuple(range(axis, x.ndim))
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=axes, keepdims=True)
    inv = 1 / np.sqrt(np.square(x64 - mean).mean(axis=axes, keepdims=True) + node.attrs.get("epsilon", 1e-5))
    y = (x64 - mean) * inv * scale
    if bias is not None:
        y = y + bias
    return [y.astype(x.dtype), mean.astype(np.float32), inv.astype(np.float32)]


def _infer_layer_norm(node: Node, ins: list[Value | None], known: Known) -> Result:
    x = shape_of(node, ins[0], "the input")
    axis = _layer_norm_axis(node, len(x))
    stats = (*x[:axis], *([1] * (len(x) - axis)))
    return [(x, ins[0].dtype), (stats, "float32"), (stats, "float32")]  # type: ignore[union-attr]


NN_OPS: dict[str, OpDef] = {
    "LRN": OpDef(same, _run_lrn),
    "ConvTranspose": OpDef(_infer_conv_transpose,
                           lambda n, a: [conv_transpose2d(n, a[0], a[1], a[2] if len(a) > 2 else None)]),
    "InstanceNormalization": OpDef(same, _run_instance_norm),
    "LayerNormalization": OpDef(_infer_layer_norm, _run_layer_norm),
}
