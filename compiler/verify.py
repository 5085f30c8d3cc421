"""The graph verifier: the invariants every pass must keep, checked after each pass on request.

Structure (values defined once and before use, every value typed) for every graph; for integer layers,
the facts the back end relies on: integer dtypes and positive scales, scales shared where the op cannot
rescale, weights within ``wgt_width``, well-formed epilogues whose immediates fit the ALU's ``imm`` field,
and packed shapes that match the config's blocks.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from weft.compiler.partition import HOST_QOPS
from weft.compiler.pool_fusion import POOLS
from weft.config import AcceleratorConfig
from weft.core.epilogue import check_steps
from weft.core.errors import GraphError
from weft.core.float_ops import FLOAT_OPS, conv_out_size
from weft.core.ir import ACCEL_OPS, Graph, Node, Value, act_dtype_name, int_dtype_name, numpy_dtype
from weft.core.layout import packed_act_shape
from weft.isa.encoding import layout_of

__all__ = ["verify"]


class _Checker:
    def __init__(self, graph: Graph):
        self.g = graph
        cfg = graph.meta.get("config")
        self.config = AcceleratorConfig.from_dict(cfg) if cfg else None
        self.layout = graph.meta.get("layout")

    def fail(self, node: Node, message: str) -> GraphError:
        return GraphError(message, node=node.name, op=node.op)

    def int_value(self, node: Node, name: str) -> Value:
        v = self.g.value(name)
        want = act_dtype_name(self.config.inp_width) if self.config else "int8"
        if v.dtype != want or v.scale is None or not v.scale > 0:
            raise self.fail(node, f"'{name}' must be an {want} tensor with a positive scale, got {v.dtype} "
                                  f"scale {v.scale}")
        if v.packed:
            if self.layout is None:
                raise self.fail(node, f"'{name}' is packed but the graph has no layout")
            want = packed_act_shape(v.logical, self.layout["batch"], self.layout["block"])  # type: ignore[arg-type]
            if v.shape != want:
                raise self.fail(node, f"'{name}' has packed shape {list(v.shape)}, expected {list(want)} "  # type: ignore[arg-type]
                                      f"for logical {list(v.logical)}")  # type: ignore[arg-type]
        return v

    def channels(self, value: Value) -> int:
        return value.shape[1] * value.shape[5] if value.packed else value.shape[1]  # type: ignore[index]

    def epilogue(self, node: Node, out: Value, residual: bool) -> None:
        if self.config is None:
            raise self.fail(node, "integer layers need the graph's config (meta['config'])")
        imm = layout_of(self.config).formats["alu"].field("imm")
        try:
            check_steps(node.attrs["epilogue"], self.channels(out), self.config.acc_width, (imm.min, imm.max))
        except (ValueError, KeyError) as err:
            raise self.fail(node, f"bad epilogue: {err}") from None
        has_residual = any(kind == "residual" for kind, _ in node.attrs["epilogue"])
        if has_residual != residual:
            raise self.fail(node, "a residual input and a residual epilogue step go together")

    def same_scale(self, node: Node) -> None:
        scales = {self.g.value(x).scale for x in [*node.inputs, *node.outputs] if x}
        if len(scales) != 1:
            raise self.fail(node, f"inputs and output must share one scale, got {sorted(s or 0 for s in scales)}")

    # ---- per op ------------------------------------------------------------------------------------
    def qconv2d(self, node: Node) -> None:
        if len(node.inputs) not in (2, 3):
            raise self.fail(node, f"takes 2 or 3 inputs, got {len(node.inputs)}")
        x = self.int_value(node, node.inputs[0])
        out = self.int_value(node, node.outputs[0])
        w_name = node.inputs[1]
        if not self.g.is_constant(w_name):
            raise self.fail(node, "weights must be a constant")
        w = self.g.constants[w_name]
        bits = self.config.wgt_width if self.config else 8
        wmax = (1 << (bits - 1)) - 1
        dtype = int_dtype_name(bits)
        if self.g.value(w_name).dtype != dtype or w.dtype != numpy_dtype(dtype) or (w.size and np.abs(w).max() > wmax):
            raise self.fail(node, f"weights must be int{bits} within +-{wmax}")
        kh, kw = node.attrs["kernel"]
        if w.ndim == 6:
            c = self.config
            if c is None or w.shape[2:4] != (kh, kw) or w.shape[4:] != (c.block_out, c.block_in):
                raise self.fail(node, f"packed weights {list(w.shape)} do not match kernel {kh}x{kw} and the blocks")
            groups = node.attrs.get("super_groups", 1)
            if w.shape[1] * w.shape[5] * groups != self.channels(x) or w.shape[0] * w.shape[4] != self.channels(out):
                raise self.fail(node, "packed weight channels do not match the padded activations")
        elif w.ndim != 4 or w.shape[2:] != (kh, kw) or w.shape[0] != self.channels(out) \
                or w.shape[1] * node.attrs.get("group", 1) != self.channels(x):
            raise self.fail(node, f"weights {list(w.shape)} do not match the input and output channels")
        if len(node.inputs) == 3:
            r = self.int_value(node, node.inputs[2])
            if r.shape != out.shape:
                raise self.fail(node, f"residual shape {list(r.shape)} is not the output shape {list(out.shape)}")  # type: ignore[arg-type]
        self.epilogue(node, out, len(node.inputs) == 3)
        if "pool_kernel" in node.attrs:
            self.fused_pool(node, out)

    def fused_pool(self, node: Node, out: Value) -> None:
        """A max-pool fused into a convolution (weft.compiler.pool_fusion): a shape the back end pools and
        an output of the pooled size of the convolution's own."""
        try:
            (k, _), (s, _), pads = node.attrs["pool_kernel"], node.attrs["pool_strides"], node.attrs["pool_pads"]
            ho, wo = (int(d) for d in node.attrs["conv_hw"])
        except (KeyError, TypeError, ValueError):
            raise self.fail(node, "a fused max-pool needs pool_kernel, pool_strides, pool_pads and conv_hw") from None
        if (k, s, pads[0]) not in POOLS or len(set(pads)) != 1 or len(node.inputs) != 2:
            raise self.fail(node, f"fuses a {k}x{k}/{s} max-pool with pads {list(pads)} (fused: {sorted(POOLS)}, "
                                  "no residual)")
        want = [conv_out_size(d, k, s, pads[0], pads[0]) for d in (ho, wo)]
        shape = out.logical_shape
        if shape is None or len(shape) != 4 or list(shape[2:]) != want:
            raise self.fail(node, f"the pool of a {ho}x{wo} convolution output is {want[0]}x{want[1]}, "
                                  f"the output is {list(shape or ())}")

    def qavgpool(self, node: Node) -> None:
        self.int_value(node, node.inputs[0])
        self.epilogue(node, self.int_value(node, node.outputs[0]), False)

    def qalu(self, node: Node) -> None:
        for x in node.inputs:
            self.int_value(node, x)
        out = self.int_value(node, node.outputs[0])
        self.epilogue(node, out, len(node.inputs) == 2)

    def qmove(self, node: Node) -> None:
        for x in [*node.inputs, *node.outputs]:
            self.int_value(node, x)
        self.same_scale(node)

    def qim2col(self, node: Node) -> None:
        self.qmove(node)
        x, y = (self.g.value(v).logical_shape for v in (node.inputs[0], node.outputs[0]))
        kh, kw = node.attrs["kernel"]
        constants = node.attrs.get("constants", ())
        extra = len(constants)
        top = (1 << ((self.config.inp_width if self.config else 8) - 1)) - 1
        if not all(isinstance(v, int) and -top - 1 <= v <= top for v in constants):
            raise self.fail(node, f"constants {list(constants)} must be activations (within +-{top})")
        if len(x) != 4 or len(y) != 4 or y[1] != kh * kw * x[1] + extra or x[0] != y[0]:  # type: ignore[arg-type,index]
            raise self.fail(node, f"a {kh}x{kw} window of {list(x)} and {extra} constants do not give "  # type: ignore[arg-type]
                                  f"{list(y)}")  # type: ignore[arg-type]

    def quantize(self, node: Node) -> None:
        if self.g.value(node.inputs[0]).dtype != "float32":
            raise self.fail(node, "quantizes a float32 tensor")
        out = self.int_value(node, node.outputs[0])
        if node.attrs["scale"] != out.scale:
            raise self.fail(node, f"scale {node.attrs['scale']} differs from its output's {out.scale}")

    def dequantize(self, node: Node) -> None:
        x = self.int_value(node, node.inputs[0])
        if node.attrs["scale"] != x.scale or self.g.value(node.outputs[0]).dtype != "float32":
            raise self.fail(node, "must map its input's scale to a float32 tensor")

    def check(self) -> None:
        self.g.check_structure()
        checks: dict[str, Callable[[Node], None]] = {
            "qconv2d": self.qconv2d, "qavgpool": self.qavgpool, "qalu": self.qalu, "qmaxpool": self.qmove,
            "qconcat": self.qmove, "qreshape": self.qmove, "qpad": self.qmove, "quantize": self.quantize,
            "dequantize": self.dequantize, "qim2col": self.qim2col,
        }
        assert set(checks) == ACCEL_OPS | HOST_QOPS
        for node in self.g.nodes:
            check = checks.get(node.op)
            if check is not None:
                check(node)
            elif node.op not in FLOAT_OPS:
                raise self.fail(node, "unknown op")
            target = node.attrs.get("target")
            if target is not None and target not in ("accel", "host"):
                raise self.fail(node, f"target must be 'accel' or 'host', got {target!r}")
            if target == "accel" and node.op not in ACCEL_OPS:
                raise self.fail(node, "only integer layers can run on the accelerator")


def verify(graph: Graph) -> None:
    """Raise GraphError naming the node whose invariant is broken."""
    _Checker(graph).check()
