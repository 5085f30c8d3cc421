"""Generic graph passes: shape inference, constant folding, identity and dead-node removal.

Each pass is a function Graph -> Graph that returns a new graph and leaves its argument untouched.
"""

from __future__ import annotations

import numpy as np

from weft.core.errors import CompileError, ModelError, UnsupportedError
from weft.core.float_ops import FLOAT_OPS
from weft.core.ir import Graph, Node, Value, numpy_dtype
from weft.core.limits import shape_problem

__all__ = ["fold_constants", "infer_shapes", "remove_dead", "remove_identity", "resolve_auto_pad"]

_WINDOW_OPS = ("Conv", "MaxPool", "AveragePool")
#: Ops whose result depends only on their input's (static) shape, so they always fold.
_SHAPE_OPS = ("Shape", "Size")


def resolve_auto_pad(node: Node, x_shape: tuple[int, ...], kernel: tuple[int, int]) -> None:
    """Replace ONNX's auto_pad (SAME_UPPER, SAME_LOWER, VALID) by explicit pads, in place."""
    mode = node.attrs.pop("auto_pad", "NOTSET")
    if mode in ("NOTSET", ""):
        return
    strides = node.attrs.get("strides", (1, 1))
    if mode == "VALID":
        node.attrs["pads"] = (0, 0, 0, 0)
        return
    if mode not in ("SAME_UPPER", "SAME_LOWER"):
        raise UnsupportedError(f"auto_pad '{mode}' is not supported", node=node.name, op=node.op)
    lo, hi = [0, 0], [0, 0]
    for a in (0, 1):
        size = x_shape[2 + a]
        total = max((-(-size // strides[a]) - 1) * strides[a] + kernel[a] - size, 0)
        small, big = total // 2, total - total // 2
        lo[a], hi[a] = (small, big) if mode == "SAME_UPPER" else (big, small)
    node.attrs["pads"] = (lo[0], lo[1], hi[0], hi[1])


def infer_shapes(graph: Graph) -> Graph:
    """Give every value a shape and dtype, in node order. Values that are statically known (constants,
    the Shape or Size of a static tensor, and ops on those) are evaluated on the way, so a Reshape whose target
    comes from a shape subgraph gets its shape; auto_pad becomes explicit pads."""
    g = graph.copy()
    known: dict[str, np.ndarray] = dict(g.constants)
    for x in g.inputs:
        if g.values.get(x) is None or g.values[x].shape is None:
            raise ModelError(f"graph input '{x}' has no static shape")
    for node in g.nodes:
        opdef = FLOAT_OPS.get(node.op)
        if opdef is None:
            if node.outputs and all(o in g.values and g.values[o].shape is not None for o in node.outputs):
                continue  # quantized ops carry their output types from the pass that made them
            raise UnsupportedError("no shape rule for this op", node=node.name, op=node.op)
        ins = [g.values.get(x) if x else None for x in node.inputs]
        for x, v in zip(node.inputs, ins, strict=True):
            if x and (v is None or v.shape is None):
                raise ModelError(f"input '{x}' has no known shape", node=node.name, op=node.op)
        if node.op in _WINDOW_OPS and node.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", ""):
            kernel = ins[1].shape[2:] if node.op == "Conv" else node.attrs["kernel_shape"]  # type: ignore[union-attr]
            if len(ins[0].shape) != 4 or len(kernel) != 2:  # type: ignore[union-attr]
                raise UnsupportedError("only 2-D windows on NCHW inputs are supported", node=node.name, op=node.op)
            resolve_auto_pad(node, ins[0].shape, tuple(kernel))  # type: ignore[union-attr,arg-type]
        results = opdef.infer(node, ins, lambda k, n=node: known.get(n.inputs[k]) if n.inputs[k] else None)
        if len(results) < len([o for o in node.outputs if o]):
            raise ModelError(f"has {len(node.outputs)} outputs, expected {len(results)}", node=node.name,
                             op=node.op)
        for out, (shape, dtype) in zip(node.outputs, results, strict=False):
            problem = shape_problem(shape, allow_zero=True) if out else None
            if problem is not None:  # before a constant input (ConstantOfShape) is evaluated at this size
                raise ModelError(f"output '{out}' would have the shape {list(shape)}: {problem}", node=node.name,
                                 op=node.op)
            if out:
                g.values[out] = Value(out, shape, dtype)
        if node.op in _SHAPE_OPS:
            known[node.outputs[0]] = opdef.run(node, [np.empty(ins[0].shape, np.uint8)])[0]  # type: ignore[union-attr]
        elif all(x in known for x in node.inputs if x) and any(node.inputs):
            try:
                outs = opdef.run(node, [known[x] if x else None for x in node.inputs])
            except CompileError:
                raise
            except (ValueError, IndexError, TypeError) as err:
                raise ModelError(f"cannot evaluate on its constant inputs: {err}", node=node.name,
                                 op=node.op) from None
            known.update({o: a for o, a in zip(node.outputs, outs, strict=False) if o})
    return g


def fold_constants(graph: Graph) -> Graph:
    """Replace every node whose inputs are all constants (and every Shape or Size of a static tensor) by the
    constants it computes; shape subgraphs such as ``Shape -> Gather -> Concat -> Reshape`` vanish."""
    g = graph.copy()
    kept: list[Node] = []
    for node in g.nodes:
        opdef = FLOAT_OPS.get(node.op)
        if opdef is None:
            kept.append(node)
            continue
        if node.op in _SHAPE_OPS:
            arrays = opdef.run(node, [np.empty(g.value(node.inputs[0]).shape, np.uint8)])  # type: ignore[arg-type]
        elif any(node.inputs) and all(g.is_constant(x) for x in node.inputs if x):
            arrays = opdef.run(node, [g.constants[x] if x else None for x in node.inputs])
        else:
            kept.append(node)
            continue
        for out, array in zip(node.outputs, arrays, strict=False):
            if out:
                expected = g.value(out).dtype
                g.set_constant(out, np.asarray(array).astype(_np(expected), copy=False), expected)
    g.nodes = kept
    g.prune_values()
    return g


def _np(dtype: str) -> np.dtype:
    return numpy_dtype(dtype)


def remove_identity(graph: Graph) -> Graph:
    """Drop Identity nodes (Dropout becomes Identity at import): readers use the input directly. When
    the identity defines a graph output, the producer of its input is renamed to keep the output name."""
    g = graph.copy()
    producers = g.producers()
    kept: list[Node] = []
    for node in g.nodes:
        if node.op != "Identity":
            kept.append(node)
            continue
        src, dst = node.inputs[0], node.outputs[0]
        if dst not in g.outputs:
            g.replace_uses(dst, src)
            continue
        producer = producers.get(src)
        if producer is None or src in g.outputs:
            kept.append(node)  # a graph input or constant passed straight to an output: keep the copy
            continue
        producer.outputs = [dst if o == src else o for o in producer.outputs]
        g.values[dst] = Value(dst, g.values[src].shape, g.values[src].dtype)
        g.replace_uses(src, dst)
        producers[dst] = producer
    g.nodes = kept
    g.prune_values()
    return g


def remove_dead(graph: Graph) -> Graph:
    """Drop nodes none of whose outputs reach a graph output, and unused constants."""
    g = graph.copy()
    live = set(g.outputs)
    kept: list[Node] = []
    for node in reversed(g.nodes):
        if any(o in live for o in node.outputs if o):
            kept.append(node)
            live.update(x for x in node.inputs if x)
    g.nodes = kept[::-1]
    g.prune_values()
    return g
