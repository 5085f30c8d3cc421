"""Pre-quantized (QDQ / QOperator) models: the model's own quantization, made float-graph ops.

An int8 model exported by onnxruntime's ``quantize_static`` or PyTorch carries its quantization as
``QuantizeLinear`` / ``DequantizeLinear`` pairs (QDQ format) or as integer ops (``QLinearConv``,
``QLinearMatMul``, ``ConvInteger``, ``MatMulInteger``). The importer turns all of them into three IR ops
whose numpy kernels reproduce onnxruntime's arithmetic (``x / scale`` in float32, round half to even, add
the zero point, saturate):

* ``DequantizeLinear`` of a constant folds into a float constant holding exactly the dequantized values
  (the weights and biases);
* a ``QuantizeLinear`` read by a ``DequantizeLinear`` with the same parameters becomes one float
  ``QuantizeDequantize`` ("fake quant": attributes ``scale``, ``zero_point``, ``qmin``, ``qmax``), so the
  float graph, the cpu target and calibration compute what the model computes;
* anything else stays ``QuantizeLinear`` / ``DequantizeLinear`` (integer tensors on the host).

Every fake quant records its tensor's parameters in ``graph.meta["qdq_scales"]`` (value name ->
``[scale, zero_point, qmin, qmax]``, under both the input and the output name). For the accel target
:func:`absorb_fake_quant` removes the fake quants before fusion and the quantizer takes those tensors'
scales from the model instead of calibrating (:func:`weft_scale`). weft's activations are symmetric
without a zero point: a symmetric model scale is used as is (bit-compatible with onnxruntime up to the
requantization rounding); an asymmetric one (uint8 with a zero point) becomes the symmetric scale that
covers the model's float range, and its saturation stays a float ``Clip`` that fuses into the layer, so
results then differ from onnxruntime by rounding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from weft.core.errors import ModelError, UnsupportedError
from weft.core.ir import Graph, Node

__all__ = [
    "FAKE_QUANT", "QParams", "absorb_fake_quant", "dequantize", "fake_quant", "model_scales", "quantize",
    "quantize_dtype", "read_qparams", "run_dequantize", "run_quantize", "weft_scale",
]

#: The IR op of an activation Q -> DQ pair.
FAKE_QUANT = "QuantizeDequantize"

_RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int32": (-(1 << 31), (1 << 31) - 1)}


@dataclass(frozen=True)
class QParams:
    """One QuantizeLinear/DequantizeLinear's parameters: per tensor (``axis`` None) or per ``axis``."""

    scale: np.ndarray  # float32, scalar or 1-D
    zero_point: np.ndarray  # int64, same shape as scale
    dtype: str  # "int8", "uint8" or "int32"
    axis: int | None

    @property
    def qmin(self) -> int:
        return _RANGES[self.dtype][0]

    @property
    def qmax(self) -> int:
        return _RANGES[self.dtype][1]

    def attrs(self) -> dict[str, Any]:
        """The per-tensor IR attributes of a fake quant."""
        return {"scale": float(self.scale), "zero_point": int(self.zero_point), "qmin": self.qmin, "qmax": self.qmax}


def read_qparams(graph: Graph, inputs: Sequence[str], attrs: dict[str, Any], *, node: str, op: str,
                 rank: int | None, default_dtype: str = "uint8") -> QParams:
    """The parameters of a (De)QuantizeLinear reading ``inputs = [x, scale, zero_point]``: constant scale
    and zero point, int8/uint8 (int32 for a DequantizeLinear of biases), per tensor or per axis."""
    if attrs.get("block_size", 0):
        raise UnsupportedError(f"blocked quantization (block_size={attrs['block_size']}) is not supported; "
                               "weft takes per-tensor or per-axis scales", node=node, op=op)
    scale_name = inputs[1]
    zp_name = inputs[2] if len(inputs) > 2 else ""
    if not graph.is_constant(scale_name) or (zp_name and not graph.is_constant(zp_name)):
        raise UnsupportedError("the scale and zero point must be constants (initializers)", node=node, op=op)
    scale = np.asarray(graph.constants[scale_name], np.float32)
    if zp_name:
        zp_array = graph.constants[zp_name]
        dtype = str(zp_array.dtype)
        if dtype not in _RANGES:
            raise UnsupportedError(f"{dtype} quantization is not supported; only int8, uint8 (and int32 biases)",
                                   node=node, op=op)
        zero_point = np.asarray(zp_array, np.int64)
        if zero_point.ndim == 0:  # one zero point for every channel's scale
            zero_point = np.broadcast_to(zero_point, scale.shape)
    elif default_dtype in _RANGES:
        dtype, zero_point = default_dtype, np.zeros(scale.shape, np.int64)
    else:
        raise UnsupportedError(f"{default_dtype} quantization is not supported; only int8 and uint8", node=node, op=op)
    if scale.ndim > 1 or zero_point.shape != scale.shape:
        raise ModelError(f"scale {list(scale.shape)} and zero point {list(zero_point.shape)} must be scalars or "
                         "matching 1-D arrays", node=node, op=op)
    if not np.all(scale > 0) or not np.all(np.isfinite(scale)):
        raise ModelError("the scale must be positive and finite", node=node, op=op)
    axis = None
    if scale.ndim == 1 and scale.size > 1:
        axis = int(attrs.get("axis", 1))
        if rank is not None:
            axis %= rank
    elif scale.ndim == 1:
        scale, zero_point = scale.reshape(()), zero_point.reshape(())
    return QParams(scale, zero_point, dtype, axis)


def _along(p: QParams, ndim: int) -> tuple[np.ndarray, np.ndarray]:
    if p.axis is None:
        return p.scale, p.zero_point
    shape = [1] * ndim
    shape[p.axis] = -1
    return p.scale.reshape(shape), p.zero_point.reshape(shape)


def quantize(x: np.ndarray, p: QParams) -> np.ndarray:
    """onnxruntime's QuantizeLinear: ``saturate(round_half_even(x / scale) + zero_point)``."""
    scale, zp = _along(p, x.ndim)
    q = np.rint(np.asarray(x, np.float32) / scale).astype(np.float64) + zp
    return np.clip(q, p.qmin, p.qmax).astype(p.dtype)


def dequantize(q: np.ndarray, p: QParams) -> np.ndarray:
    """DequantizeLinear: ``(q - zero_point) * scale`` in float32."""
    scale, zp = _along(p, q.ndim)
    return ((q.astype(np.int64) - zp).astype(np.float32) * scale).astype(np.float32)


def _from_attrs(attrs: dict[str, Any]) -> QParams:
    scale = np.asarray(attrs["scale"], np.float32)
    dtype = next(k for k, r in _RANGES.items() if r == (attrs["qmin"], attrs["qmax"]))
    return QParams(scale, np.asarray(attrs["zero_point"], np.int64), dtype, attrs.get("axis"))


def fake_quant(node: Node, x: np.ndarray) -> np.ndarray:
    """The float kernel of a fake quant: quantize then dequantize, exactly as the model does."""
    p = _from_attrs(node.attrs)
    return dequantize(quantize(x, p), p)


def quantize_dtype(node: Node) -> str:
    """The integer dtype a QuantizeLinear node produces."""
    return _from_attrs(node.attrs).dtype


def run_quantize(node: Node, x: np.ndarray) -> np.ndarray:
    return quantize(x, _from_attrs(node.attrs))


def run_dequantize(node: Node, q: np.ndarray) -> np.ndarray:
    return dequantize(q, _from_attrs(node.attrs))


def model_scales(graph: Graph) -> dict[str, list[float]]:
    """The model's own activation parameters: value name -> [scale, zero_point, qmin, qmax]."""
    return graph.meta.get("qdq_scales", {})


def weft_scale(entry: Sequence[float], bits: int) -> float:
    """weft's symmetric scale for a tensor the model quantizes with `entry`: the model's scale when its
    integer range is weft's, else the scale whose symmetric range covers the model's float range."""
    scale, zp, qmin, qmax = entry
    top = (1 << (bits - 1)) - 1
    if zp == 0 and (qmin, qmax) == (-top - 1, top):
        return float(scale)
    return float(scale) * max(abs(qmin - zp), abs(qmax - zp)) / top


def absorb_fake_quant(bits: int = 8) -> Callable[[Graph], Graph]:
    """The accel pass that removes fake quants (their parameters are in ``meta["qdq_scales"]``): each
    becomes an Identity (dropped by ``remove_identity``), or a Clip to the model's float range when
    weft's `bits`-wide symmetric integers at :func:`weft_scale` would not saturate where the model does
    (a uint8 tensor, or an int8 one with zero point -128, clamps at zero: the ReLU the exporter dropped)."""

    def absorb(graph: Graph) -> Graph:
        g = graph.copy()
        uses = g.consumers()
        nodes: list[Node] = []
        for node in g.nodes:
            if node.op != FAKE_QUANT:
                nodes.append(node)
                continue
            a = node.attrs
            # Where the model rounds a layer's result before a residual Add, a (no-op) Clip keeps the conv
            # and the Add apart, so weft rounds there too instead of adding in the accumulator.
            rounds_before_add = any(u.op == "Add" for u in uses.get(node.outputs[0], []))
            entry = (a["scale"], a["zero_point"], a["qmin"], a["qmax"])
            s = weft_scale(entry, bits)
            top = (1 << (bits - 1)) - 1
            lo, hi = a["scale"] * (a["qmin"] - a["zero_point"]), a["scale"] * (a["qmax"] - a["zero_point"])
            if not rounds_before_add and lo <= -(top + 1) * s * (1 - 1e-6) and hi >= top * s * (1 - 1e-6):
                nodes.append(Node("Identity", node.inputs, node.outputs, {}, node.name))
                continue
            bounds = [g.set_constant(g.unique_name(f"{node.name}_{k}"), np.array(v, np.float32))
                      for k, v in (("min", lo), ("max", hi))]
            nodes.append(Node("Clip", [node.inputs[0], *bounds], node.outputs, {}, node.name))
        g.nodes = nodes
        return g

    return absorb
