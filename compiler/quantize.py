"""Post-training integer quantization: the calibrated float graph -> accelerator layers + host layers.

Scheme: symmetric activations with one scale per tensor (``scale = absmax / (2**(inp_width-1) - 1)``),
symmetric weights with one scale per output channel at ``wgt_width`` bits, int32 (acc_width) biases, and
requantization as an ALU epilogue (:mod:`weft.compiler.requant`). Widths come from the config, so an
int4-weight config quantizes weights to int4. A pre-quantized model's own activation scales
(``meta["qdq_scales"]``, see :mod:`weft.core.qdq`) take the place of calibrated ones; a tied group
with any of them takes the largest.

Ops that only move or select values (max-pool, ReLU/Clip alone, concat, reshape, pad) keep their input's
scale: the tensors they connect are tied together and share the largest calibrated range of the group.

Quantized ops (integer tensors named ``<float name>_q``; all in logical layout until ``pack_layout``):

* ``qconv2d`` (accel): conv or dense + bias + optional residual + activation + requantization. Inputs:
  the int8 activation, the weights (``int{wgt_width}`` in int8 storage; packed by ``pack_layout``), and
  optionally the residual. Attributes: ``kernel``, ``strides``, ``pads`` (top, left, bottom, right),
  ``channels`` (in per group, out), ``group`` (absent when 1; weights ``(O, C/group, kh, kw)``),
  ``epilogue`` (see :mod:`weft.core.epilogue`; its first ``add`` step is the int32 bias, with the
  pre-shift's rounding constant folded in), ``act`` and ``weight_scales``. The accumulator bound sums each
  output channel's own weights, so a grouped layer's bound covers exactly its group's reduction.
* ``qmaxpool``, ``qavgpool`` (accel): int max / int sum then requantization.
* ``qalu`` (accel): the epilogue alone on a loaded input: residual Add, ChannelAffine, ReLU/Clip.
* ``quantize``, ``dequantize``, ``qconcat``, ``qreshape``, ``qpad`` (host): the edges and data movement.
  (``qim2col``, a host layer too, comes later: :mod:`weft.compiler.im2col`.)

Anything else (Softmax, and any op without an integer form) stays a float host op between a
``dequantize`` and, when an integer layer reads its result, a ``quantize``. So does a layer whose integer
form would overflow the accumulator (its calibrated range, or no requantization that fits): it keeps its
float op, with ``attrs["host_reason"]`` saying why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from weft.compiler.requant import build_epilogue, clamp_steps
from weft.core.epilogue import EpilogueOverflow, Step
from weft.core.errors import QuantizationError
from weft.core.float_ops import pool_geometry
from weft.core.ir import Graph, Node, Value, act_dtype_name, int_dtype_name, numpy_dtype
from weft.core.qdq import model_scales, weft_scale
from weft.isa.encoding import layout_of

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["fuse_clamps", "quantize"]


def _pixels(shape: tuple) -> int | None:
    """Output pixels per channel (batch included) of an NCHW-like shape; None where it is not known."""
    try:
        return int(np.prod([int(d) for d in shape])) // int(shape[1])
    except (TypeError, ValueError, IndexError, ZeroDivisionError):
        return None


class _Overflow(Exception):
    """A layer whose integer form cannot fit the accumulator: it stays a float host layer instead."""


class _Ties:
    """Union-find over value names: tensors that must share one scale."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, *names: str) -> None:
        roots = [self.find(n) for n in names]
        for r in roots[1:]:
            self.parent[r] = roots[0]


#: Ops whose integer form only moves or selects values: their inputs and output share one scale.
_MOVES = ("MaxPool", "Relu", "Clip", "Concat", "Flatten", "Reshape", "Pad")


class _Quantizer:
    def __init__(self, graph: Graph, config: AcceleratorConfig):
        self.src = graph
        self.config = config
        c = config
        if c.inp_width != c.out_width:
            raise QuantizationError(f"config '{c.name}': activations are written with out_width={c.out_width} bits "
                                    f"and read back with inp_width={c.inp_width}; weft needs them equal")
        self.act_bits, self.wgt_bits, self.acc_bits = c.inp_width, c.wgt_width, c.acc_width
        self.qmax = (1 << (self.act_bits - 1)) - 1
        self.act_dtype = act_dtype_name(self.act_bits)
        self.wmax = (1 << (self.wgt_bits - 1)) - 1
        imm = layout_of(config).formats["alu"].field("imm")
        self.imm_range = (imm.min, imm.max)
        calibration = graph.meta.get("calibration") or {}
        # A pre-quantized model's own activation scales (weft.core.qdq) win over calibrated ones.
        self.model_scales = {x: weft_scale(e, self.act_bits) for x, e in model_scales(graph).items()}
        if not calibration and not self.model_scales:
            raise QuantizationError("the graph has no calibration ranges: run the 'calibrate' pass first")
        self.absmax: dict[str, float] = calibration.get("absmax", {})
        self.acc_absmax: dict[str, tuple[float, ...]] = calibration.get("acc_absmax", {})
        self.out = Graph(graph.name, inputs=graph.inputs, outputs=[], meta={
            k: v for k, v in graph.meta.items() if k not in ("calibration", "qdq_scales")})
        for x in graph.inputs:
            self.out.values[x] = graph.values[x]
        self.int_of: dict[str, str] = {}
        self.float_ok: set[str] = set(graph.inputs) | set(graph.constants)
        self.kind: dict[str, str] = {}
        self.scale: dict[str, float] = {}

    # ---- planning ----------------------------------------------------------------------------------
    def plan(self) -> None:
        g = self.src
        int_ready: set[str] = set()
        ties = _Ties()
        for node in g.nodes:
            kind = self._classify(node, int_ready)
            self.kind[node.name] = kind
            if kind != "float":
                int_ready.update(node.outputs)
                if node.op in _MOVES:
                    ties.union(*[x for x in node.inputs[:1 if node.op != "Concat" else None] if x], node.outputs[0])
        groups: dict[str, float] = {}
        for name, value in self.absmax.items():
            root = ties.find(name)
            groups[root] = max(groups.get(root, 0.0), value)
        from_model: dict[str, float] = {}
        for name, scale in self.model_scales.items():
            root = ties.find(name)
            from_model[root] = max(from_model.get(root, 0.0), scale)
        for name in {**self.absmax, **self.model_scales, **ties.parent}:
            root = ties.find(name)
            if root in from_model:
                self.scale[name] = from_model[root]
            elif root in groups:
                top = groups[root]
                self.scale[name] = top / self.qmax if top > 0 else 1.0 / self.qmax

    def _classify(self, node: Node, int_ready: set[str]) -> str:
        g = self.src
        rank_ok = all(len(g.value(x).shape or ()) in (2, 4) for x in [*node.inputs[:1], *node.outputs] if x)
        if not rank_ok:
            return "float"
        if node.op == "FusedConv":
            return "qconv2d"

        if node.op == "MaxPool":
            return "qmaxpool"
        if node.op == "GlobalAveragePool":
            return "qavgpool"
        if node.op == "AveragePool":
            return "qavgpool" if self._uniform_count(node) else "float"
        if node.op == "Add" and len(node.inputs) == 2 and not any(g.is_constant(x) for x in node.inputs) \
                and g.value(node.inputs[0]).shape == g.value(node.inputs[1]).shape == g.value(node.outputs[0]).shape:
            return "qalu"
        if node.op == "ChannelAffine":
            return "qalu"
        if node.op in ("Relu", "Clip") and node.inputs[0] in int_ready \
                and all(g.is_constant(x) for x in node.inputs[1:] if x):
            return "qalu"
        if node.op == "Concat" and any(x in int_ready for x in node.inputs) \
                and not any(g.is_constant(x) for x in node.inputs):
            return "qconcat"
        if node.op in ("Flatten", "Reshape") and node.inputs[0] in int_ready:
            return "qreshape"
        if node.op == "Pad" and node.inputs[0] in int_ready and all(g.is_constant(x) for x in node.inputs[1:] if x) \
                and len(node.inputs) < 4 and np.all(g.constants[node.inputs[1]] >= 0):
            return "qpad"
        return "float"

    def _uniform_count(self, node: Node) -> bool:
        """True when every window of an AveragePool divides by the same count."""
        shape = self.src.value(node.inputs[0]).shape
        kernel, strides, pads, out_hw = pool_geometry(node, shape)  # type: ignore[arg-type]
        extra = _ceil_extra(shape, kernel, strides, pads, out_hw)  # type: ignore[arg-type]
        if any(extra):
            return False
        return bool(node.attrs.get("count_include_pad", 0)) or not any(pads)

    # ---- emission helpers --------------------------------------------------------------------------
    def emit(self, node: Node) -> None:
        self.out.nodes.append(node)

    def need_int(self, x: str) -> str:
        if x in self.int_of:
            return self.int_of[x]
        if self.src.is_constant(x):
            raise QuantizationError(f"constant '{x}' cannot feed an integer layer")
        name = self.out.unique_name(f"{x}_q")
        value = self.src.value(x)
        self.emit(Node("quantize", [x], [name], {"scale": self._scale(x), "bits": self.act_bits},
                       self.out.unique_name(f"quantize_{x}")))
        self.out.values[name] = Value(name, value.shape, self.act_dtype, self._scale(x))
        self.int_of[x] = name
        return name

    def need_float(self, x: str) -> str:
        if x in self.float_ok:
            if self.src.is_constant(x) and x not in self.out.constants:
                self.out.set_constant(x, self.src.constants[x], self.src.values[x].dtype)
            return x
        q = self.int_of[x]
        self.emit(Node("dequantize", [q], [x], {"scale": self.out.values[q].scale},
                       self.out.unique_name(f"dequantize_{x}")))
        self.out.values[x] = Value(x, self.src.value(x).shape, "float32")
        self.float_ok.add(x)
        return x

    def _scale(self, x: str) -> float:
        if x not in self.scale:
            if self.model_scales and not self.absmax:
                raise QuantizationError(f"value '{x}' has no scale in the pre-quantized model; pass calibration data")
            raise QuantizationError(f"value '{x}' has no calibrated range")
        return self.scale[x]

    def new_int(self, x: str) -> str:
        name = self.out.unique_name(f"{x}_q")
        self.out.values[name] = Value(name, self.src.value(x).shape, self.act_dtype, self._scale(x))
        self.int_of[x] = name
        return name

    def _epilogue(self, node: Node, **kwargs: object) -> tuple[Step, ...]:
        try:
            # A model that brings its own scales defines its int8 results: round as close to them as the
            # accumulator allows, at some ALU cost (see build_epilogue).
            pixels = _pixels(self.src.value(node.outputs[0]).shape)
            return build_epilogue(acc_width=self.acc_bits, out_width=self.act_bits, imm_range=self.imm_range,
                                  precise=bool(self.model_scales), pixels=pixels, **kwargs)  # type: ignore[arg-type]
        except EpilogueOverflow as err:
            raise _Overflow(f"no requantization fits the {self.acc_bits}-bit accumulator ({err})") from None

    def _clamp(self, node: Node, scale: float) -> tuple[int, int]:
        lo, hi = -(self.qmax + 1), self.qmax
        act = node.attrs.get("act", "none") if node.op == "FusedConv" else node.op
        if act in ("relu", "Relu"):
            return 0, hi
        if act == "clip":
            a, b = node.attrs["clip"]
        elif act == "Clip":
            a, b = (float(self.src.constants[x].item()) if x else None for x in [*node.inputs[1:3], "", ""][:2])
        else:
            return lo, hi
        lo_q = lo if a is None else int(np.clip(np.round(a / scale), lo, hi))
        hi_q = hi if b is None else int(np.clip(np.round(b / scale), lo, hi))
        return lo_q, hi_q

    # ---- layers ------------------------------------------------------------------------------------
    def run(self) -> Graph:
        self.plan()
        for node in self.src.nodes:
            kind = self.kind[node.name]
            try:  # the emitters check the accumulator before they emit anything, so falling back is clean
                getattr(self, f"_emit_{kind}")(node)
            except _Overflow as why:
                self._emit_float(Node(node.op, node.inputs, node.outputs, {**node.attrs, "host_reason": str(why)},
                                      node.name))
        self.out.outputs = [self.need_float(x) for x in self.src.outputs]
        self.out.meta["quantization"] = {
            "act_bits": self.act_bits, "wgt_bits": self.wgt_bits, "acc_bits": self.acc_bits,
            "scheme": "symmetric per-tensor activations, symmetric per-output-channel weights",
            "source": ("model (QDQ)" if not self.absmax else "model (QDQ) and calibration") if self.model_scales
            else "calibration",
        }
        self.out.meta["config"] = self.config.to_dict()
        self.out.prune_values()
        return self.out

    def _emit_float(self, node: Node) -> None:
        inputs = [self.need_float(x) if x else "" for x in node.inputs]
        self.emit(Node(node.op, inputs, node.outputs, node.attrs, node.name))
        for o in node.outputs:
            if o:
                self.out.values[o] = self.src.value(o)
                self.float_ok.add(o)

    def _emit_qconv2d(self, node: Node) -> None:
        g = self.src
        x, w_name, b_name = node.inputs[:3]
        residual = node.inputs[3] if len(node.inputs) > 3 else ""
        y = node.outputs[0]
        w = g.constants[w_name].astype(np.float64)
        b = g.constants[b_name].astype(np.float64)
        o = w.shape[0]
        w_abs = np.abs(w.reshape(o, -1)).max(axis=1)
        s_w = np.where(w_abs > 0, w_abs / self.wmax, 1.0)
        w_q = np.clip(np.round(w / s_w[:, None, None, None]), -self.wmax, self.wmax)
        w_q = w_q.astype(numpy_dtype(int_dtype_name(self.wgt_bits)))
        s_x, s_y = self._scale(x), self._scale(y)
        acc_scale = s_x * s_w
        bias_q = np.round(b / acc_scale).astype(np.int64)
        bound = self._acc_bound(node, w_q, bias_q, acc_scale)
        lo, hi = self._clamp(node, s_y)
        extra = {"residual_real": np.full(o, self._scale(residual) / s_y), "residual_scale": self.wmax} if residual \
            else {}
        epilogue = self._epilogue(node, real=acc_scale / s_y, bound=bound, lo=lo, hi=hi, bias=bias_q, **extra)
        inputs = [self.need_int(x)]
        w_const = self.out.set_constant(self.out.unique_name(f"{node.name}_wq"), w_q, int_dtype_name(self.wgt_bits))
        inputs.append(w_const)
        if residual:
            inputs.append(self.need_int(residual))
        kh, kw = w.shape[2:]
        attrs = {
            "kernel": (kh, kw), "strides": node.attrs["strides"], "pads": node.attrs["pads"],
            "channels": (w.shape[1], o), "epilogue": epilogue, "act": node.attrs["act"],
            "weight_scales": s_w.astype(np.float32),
        }
        if node.attrs.get("group", 1) != 1:
            attrs["group"] = node.attrs["group"]
        self.emit(Node("qconv2d", inputs, [self.new_int(y)], attrs, node.name))

    def _acc_bound(self, node: Node, w_q: np.ndarray, bias_q: np.ndarray, acc_scale: np.ndarray) -> np.ndarray:
        """|conv| per channel: the exact worst case over all int inputs when that fits the accumulator
        with room to requantize, else twice the calibrated range (which must fit)."""
        top = (1 << (self.acc_bits - 1)) - 1
        worst = np.abs(w_q.reshape(w_q.shape[0], -1).astype(np.int64)).sum(axis=1) << (self.act_bits - 1)
        if int((worst + np.abs(bias_q)).max()) <= top // 2:
            return worst
        seen = self.acc_absmax.get(node.name)
        if seen is None:
            raise _Overflow(f"the worst-case accumulator {int(worst.max())} exceeds {self.acc_bits} bits and no "
                            "calibrated range is known")
        calibrated = np.ceil(np.asarray(seen) / acc_scale).astype(np.int64)
        if int((calibrated + np.abs(bias_q)).max()) > top:
            raise _Overflow(f"calibrated accumulator values reach {int(calibrated.max())}, beyond the "
                            f"{self.acc_bits}-bit accumulator")
        # Headroom for inputs beyond the calibration data: up to twice the range, as far as it fits.
        room = np.maximum(calibrated, (top - np.abs(bias_q)) * 3 // 4)
        return np.minimum(worst, np.minimum(2 * calibrated, room))

    def _emit_qmaxpool(self, node: Node) -> None:
        x, y = node.inputs[0], node.outputs[0]
        kernel, strides, pads, out_hw = pool_geometry(node, self.src.value(x).shape)  # type: ignore[arg-type]
        pads = _with_ceil(self.src.value(x).shape, kernel, strides, pads, out_hw)  # type: ignore[arg-type]
        attrs = {"kernel": kernel, "strides": strides, "pads": pads}
        self.emit(Node("qmaxpool", [self.need_int(x)], [self.new_int(y)], attrs, node.name))

    def _emit_qavgpool(self, node: Node) -> None:
        x, y = node.inputs[0], node.outputs[0]
        shape = self.src.value(x).shape
        if node.op == "GlobalAveragePool":
            kernel, strides, pads = (shape[2], shape[3]), (1, 1), (0, 0, 0, 0)  # type: ignore[index]
        else:
            kernel, strides, pads, _ = pool_geometry(node, shape)  # type: ignore[arg-type]
        count = kernel[0] * kernel[1]
        channels = shape[1]  # type: ignore[index]
        real = np.full(channels, self._scale(x) / (self._scale(y) * count))
        epilogue = self._epilogue(node, real=real, bound=np.full(channels, count << (self.act_bits - 1)),
                                  lo=-(self.qmax + 1), hi=self.qmax)
        attrs = {"kernel": tuple(kernel), "strides": tuple(strides), "pads": tuple(pads), "epilogue": epilogue}
        self.emit(Node("qavgpool", [self.need_int(x)], [self.new_int(y)], attrs, node.name))

    def _emit_qalu(self, node: Node) -> None:
        g = self.src
        x, y = node.inputs[0], node.outputs[0]
        channels = g.value(y).shape[1]  # type: ignore[index]
        s_x, s_y = self._scale(x), self._scale(y)
        bound = np.full(channels, 1 << (self.act_bits - 1))
        if node.op == "Add":
            residual = node.inputs[1]
            epilogue = self._epilogue(node, real=np.full(channels, s_x / s_y), bound=bound, lo=-(self.qmax + 1),
                                      hi=self.qmax, residual_real=np.full(channels, self._scale(residual) / s_y))
        elif node.op == "ChannelAffine":
            scale = g.constants[node.inputs[1]].astype(np.float64)
            shift = g.constants[node.inputs[2]].astype(np.float64)
            epilogue = self._epilogue(node, real=s_x * scale / s_y, bound=bound, lo=-(self.qmax + 1), hi=self.qmax,
                                      shift=shift / s_y)
        else:  # Relu / Clip, at the input's (tied) scale
            lo, hi = self._clamp(node, s_y)
            epilogue = tuple(clamp_steps(lo, hi, channels, self.act_bits))
        inputs = [self.need_int(x) for x in node.inputs[:2 if node.op == "Add" else 1]]
        self.emit(Node("qalu", inputs, [self.new_int(y)], {"epilogue": epilogue, "source_op": node.op}, node.name))

    def _emit_qconcat(self, node: Node) -> None:
        rank = len(self.src.value(node.outputs[0]).shape)  # type: ignore[arg-type]
        inputs = [self.need_int(x) for x in node.inputs]
        self.emit(Node("qconcat", inputs, [self.new_int(node.outputs[0])], {"axis": node.attrs["axis"] % rank},
                       node.name))

    def _emit_qreshape(self, node: Node) -> None:
        self.emit(Node("qreshape", [self.need_int(node.inputs[0])], [self.new_int(node.outputs[0])], {}, node.name))

    def _emit_qpad(self, node: Node) -> None:
        g = self.src
        x, y = node.inputs[0], node.outputs[0]
        pads = tuple(int(p) for p in g.constants[node.inputs[1]].reshape(-1))
        value = float(g.constants[node.inputs[2]].item()) if len(node.inputs) > 2 and node.inputs[2] else 0.0
        q = int(np.clip(np.round(value / self._scale(y)), -(self.qmax + 1), self.qmax))
        self.emit(Node("qpad", [self.need_int(x)], [self.new_int(y)], {"pads": pads, "value": q}, node.name))


def _ceil_extra(shape: tuple[int, ...], kernel: tuple[int, int], strides: tuple[int, int],
                pads: tuple[int, int, int, int], out_hw: tuple[int, int]) -> tuple[int, int]:
    """Bottom/right padding beyond `pads` that ceil mode needs for the last window."""
    extra = []
    for a in (0, 1):
        need = (out_hw[a] - 1) * strides[a] + kernel[a]
        extra.append(max(0, need - shape[2 + a] - pads[a] - pads[a + 2]))
    return extra[0], extra[1]


def _with_ceil(shape: tuple[int, ...], kernel: tuple[int, int], strides: tuple[int, int],
               pads: tuple[int, int, int, int], out_hw: tuple[int, int]) -> tuple[int, int, int, int]:
    eh, ew = _ceil_extra(shape, kernel, strides, pads, out_hw)
    return pads[0], pads[1], pads[2] + eh, pads[3] + ew


def quantize(config: AcceleratorConfig) -> Callable[[Graph], Graph]:
    """The quantization pass for `config` (Graph -> Graph), reading ``meta["calibration"]``."""

    def quantize_graph(graph: Graph) -> Graph:
        return _Quantizer(graph, config).run()

    return quantize_graph


_CLAMPS = ("max_imm", "min_imm", "max_vec", "min_vec")
_EPILOGUE_LAYERS = ("qconv2d", "qalu", "qavgpool")


def fuse_clamps(graph: Graph) -> Graph:
    """A clamp-only qalu (a ReLU or Clip that could not fuse in float, e.g. after a residual Add of two
    tensors) joins the epilogue of the integer layer before it, when it is that layer's only reader.
    Clamps commute with the saturating narrowing, so the result is bit-identical, one layer shorter."""
    g = graph.copy()
    producers, uses = g.producers(), g.consumers()
    dropped: set[str] = set()
    for node in g.nodes:
        steps = node.attrs.get("epilogue", ())
        if node.op != "qalu" or len(node.inputs) != 1 or not all(kind in _CLAMPS for kind, _ in steps):
            continue
        x = node.inputs[0]
        producer = producers.get(x)
        if producer is None or producer.op not in _EPILOGUE_LAYERS or x in g.outputs or len(uses.get(x, [])) != 1:
            continue
        if g.values[x].scale != g.values[node.outputs[0]].scale:
            continue
        producer.attrs["epilogue"] = (*producer.attrs["epilogue"], *steps)
        producer.outputs = list(node.outputs)
        producers[node.outputs[0]] = producer
        dropped.add(node.name)
    g.nodes = [n for n in g.nodes if n.name not in dropped]
    g.prune_values()
    return g
