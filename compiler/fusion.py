"""Float rewrites that shape the graph into accelerator layers before quantization.

The order in the pipeline matters: pads fold into the convolution that follows; Conv, Gemm and MatMul
with constant weights become ``FusedConv`` (conv + bias); BatchNorm and per-channel Mul/Add/Sub/Div fold
into the FusedConv before them; a flatten in front of a dense layer becomes a convolution whose kernel
covers the whole image; then the residual Add and the ReLU/Clip after a FusedConv fuse into it. What
remains of BatchNorm and per-channel arithmetic becomes ``ChannelAffine``.
"""

from __future__ import annotations

import numpy as np

from weft.core.ir import Graph, Node

__all__ = [
    "flatten_dense", "fold_affine", "fold_batchnorm", "fold_pad", "fuse_activation", "fuse_host_affine",
    "fuse_residual", "lower_affine", "lower_dense",
]


def _single_use(g: Graph, value: str, uses: dict[str, list[Node]]) -> Node | None:
    """The only node reading `value`, if exactly one does and it is not a graph output."""
    readers = uses.get(value, [])
    if len(readers) != 1 or value in g.outputs:
        return None
    return readers[0]


def _plain_conv(node: Node | None) -> bool:
    """A FusedConv that is still only conv + bias (nothing fused after it yet)."""
    return node is not None and node.op == "FusedConv" and node.attrs["act"] == "none" and len(node.inputs) == 3


def fold_pad(graph: Graph) -> Graph:
    """A constant-zero Pad of H and W in front of Conv (or AveragePool counting pads) becomes their pads."""
    g = graph.copy()
    uses = g.consumers()
    dropped: set[str] = set()
    for node in g.nodes:
        if node.op != "Pad" or not all(g.is_constant(x) for x in node.inputs[1:] if x):
            continue
        x_shape = g.value(node.inputs[0]).shape
        if x_shape is None or len(x_shape) != 4 or (len(node.inputs) > 3 and node.inputs[3]):
            continue
        pads = g.constants[node.inputs[1]].reshape(-1)
        value = g.constants[node.inputs[2]].item() if len(node.inputs) > 2 and node.inputs[2] else 0
        if value != 0 or np.any(pads < 0) or np.any(pads[[0, 1, 4, 5]] != 0):
            continue
        readers = uses.get(node.outputs[0], [])
        if not readers or node.outputs[0] in g.outputs or not all(_takes_pads(r) for r in readers):
            continue
        extra = (int(pads[2]), int(pads[3]), int(pads[6]), int(pads[7]))
        for r in readers:
            r.attrs["pads"] = tuple(a + b for a, b in zip(r.attrs.get("pads", (0, 0, 0, 0)), extra, strict=True))
            r.inputs = [node.inputs[0] if x == node.outputs[0] else x for x in r.inputs]
        dropped.add(node.name)
    g.nodes = [n for n in g.nodes if n.name not in dropped]
    g.prune_values()
    return g


def _takes_pads(node: Node) -> bool:
    if node.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", ""):
        return False
    return node.op == "Conv" or (node.op == "AveragePool" and node.attrs.get("count_include_pad", 0) == 1
                                 and not node.attrs.get("ceil_mode", 0))


def lower_dense(graph: Graph) -> Graph:
    """Conv, Gemm and MatMul with constant weights (and bias) become FusedConv: conv + bias, nothing else.
    Dense layers keep 2-D activations and a (O, K, 1, 1) weight (``out_rank`` 2)."""
    g = graph.copy()
    for k, node in enumerate(g.nodes):
        w_name = node.inputs[1] if len(node.inputs) > 1 else ""
        if not g.is_constant(w_name):
            continue
        bias_name = node.inputs[2] if len(node.inputs) > 2 else ""
        if bias_name and not g.is_constant(bias_name):
            continue
        w = g.constants[w_name]
        x_shape = g.value(node.inputs[0]).shape
        if node.op == "Conv" and w.ndim == 4:
            bias = g.constants[bias_name] if bias_name else np.zeros(w.shape[0], np.float32)
            weights, attrs = w, {"strides": node.attrs["strides"], "pads": node.attrs["pads"], "out_rank": 4}
            if node.attrs.get("group", 1) != 1:
                attrs["group"] = int(node.attrs["group"])
        elif node.op == "Gemm" and not node.attrs.get("transA", 0) and len(x_shape or ()) == 2:
            wt = (w if node.attrs.get("transB", 0) else w.T) * np.float32(node.attrs.get("alpha", 1.0))
            bias = np.zeros(wt.shape[0], np.float32)
            if bias_name:
                c = g.constants[bias_name] * np.float32(node.attrs.get("beta", 1.0))
                if c.size not in (1, wt.shape[0]) or (c.ndim == 2 and c.shape[0] != 1):
                    continue  # a per-row C is not a bias
                bias = np.broadcast_to(c.reshape(-1), bias.shape).astype(np.float32)
            weights, attrs = wt.reshape(*wt.shape, 1, 1), _dense_attrs()
        elif node.op == "MatMul" and w.ndim == 2 and len(x_shape or ()) == 2:
            weights, attrs = w.T.reshape(w.shape[1], w.shape[0], 1, 1), _dense_attrs()
            bias = np.zeros(w.shape[1], np.float32)
        else:
            continue
        w_new = g.set_constant(g.unique_name(f"{node.name}_w"), np.ascontiguousarray(weights, np.float32))
        b_new = g.set_constant(g.unique_name(f"{node.name}_b"), np.asarray(bias, np.float32))
        g.nodes[k] = Node("FusedConv", [node.inputs[0], w_new, b_new], node.outputs, {**attrs, "act": "none"},
                          node.name)
    g.prune_values()
    return g


def _dense_attrs() -> dict:
    return {"strides": (1, 1), "pads": (0, 0, 0, 0), "out_rank": 2}


def _channel_vector(c: np.ndarray, out_shape: tuple[int, ...]) -> np.ndarray | None:
    """`c` as one value per channel (axis 1) when it broadcasts to `out_shape` along channels only."""
    if c.ndim > len(out_shape) or len(out_shape) < 2:
        return None
    full = c.reshape((1,) * (len(out_shape) - c.ndim) + c.shape)
    if any(full.shape[a] != 1 for a in range(len(out_shape)) if a != 1) or full.shape[1] not in (1, out_shape[1]):
        return None
    return np.broadcast_to(full.reshape(-1), (out_shape[1],)).astype(np.float64)


def _as_affine(g: Graph, node: Node) -> tuple[str, np.ndarray, np.ndarray] | None:
    """(x, scale, shift) with node(x) == x * scale + shift per channel, for BN and arithmetic by a
    per-channel constant; None otherwise."""
    if node.op == "BatchNormalization":
        if not all(g.is_constant(x) for x in node.inputs[1:]):
            return None
        gamma, beta, mean, var = (g.constants[x].astype(np.float64) for x in node.inputs[1:])
        scale = gamma / np.sqrt(var + node.attrs.get("epsilon", 1e-5))
        return node.inputs[0], scale, beta - mean * scale
    if node.op not in ("Mul", "Add", "Sub", "Div") or len(node.inputs) != 2:
        return None
    a, b = node.inputs
    const_first = g.is_constant(a) and not g.is_constant(b)
    if not const_first and not (g.is_constant(b) and not g.is_constant(a)):
        return None
    x, c_name = (b, a) if const_first else (a, b)
    out_shape = g.value(node.outputs[0]).shape
    if g.value(x).shape != out_shape or g.value(x).dtype != "float32":
        return None
    c = _channel_vector(g.constants[c_name], out_shape)  # type: ignore[arg-type]
    if c is None:
        return None
    ones, zeros = np.ones_like(c), np.zeros_like(c)
    if node.op == "Mul":
        return x, c, zeros
    if node.op == "Add":
        return x, ones, c
    if node.op == "Sub":
        return (x, -ones, c) if const_first else (x, ones, -c)
    if const_first or np.any(c == 0):
        return None  # c / x is not affine in x
    return x, 1.0 / c, zeros


def _fold_affine_into_conv(g: Graph, conv: Node, scale: np.ndarray, shift: np.ndarray) -> None:
    w = g.constants[conv.inputs[1]].astype(np.float64)
    b = g.constants[conv.inputs[2]].astype(np.float64)
    w_name = g.set_constant(g.unique_name(f"{conv.name}_w"), (w * scale[:, None, None, None]).astype(np.float32))
    b_name = g.set_constant(g.unique_name(f"{conv.name}_b"), (b * scale + shift).astype(np.float32))
    conv.inputs = [conv.inputs[0], w_name, b_name]


def _fold_into_producer(graph: Graph, ops: tuple[str, ...]) -> Graph:
    g = graph.copy()
    producers, uses = g.producers(), g.consumers()
    dropped: set[str] = set()
    for node in g.nodes:
        if node.op not in ops:
            continue
        affine = _as_affine(g, node)
        if affine is None:
            continue
        x, scale, shift = affine
        conv = producers.get(x)
        if not _plain_conv(conv) or _single_use(g, x, uses) is not node:
            continue
        _fold_affine_into_conv(g, conv, scale, shift)  # type: ignore[arg-type]
        conv.outputs = [node.outputs[0]]  # type: ignore[union-attr]
        producers[node.outputs[0]] = conv  # type: ignore[assignment]
        dropped.add(node.name)
    g.nodes = [n for n in g.nodes if n.name not in dropped]
    g.prune_values()
    return g


def fold_batchnorm(graph: Graph) -> Graph:
    """BatchNormalization right after a FusedConv (its only reader) folds into the weights and bias."""
    return _fold_into_producer(graph, ("BatchNormalization",))


def fold_affine(graph: Graph) -> Graph:
    """Mul, Add, Sub or Div by a per-channel constant right after a FusedConv folds into it."""
    return _fold_into_producer(graph, ("Mul", "Add", "Sub", "Div"))


def flatten_dense(graph: Graph) -> Graph:
    """Flatten (or Reshape to (N, C*H*W)) of an NCHW tensor feeding a dense FusedConv becomes one
    convolution whose kernel covers the image: the accelerator never sees a flattened tensor."""
    g = graph.copy()
    producers, uses = g.producers(), g.consumers()
    dropped: set[str] = set()
    for node in g.nodes:
        if node.op != "FusedConv" or node.attrs["out_rank"] != 2 or len(g.value(node.inputs[0]).shape) != 2:  # type: ignore[arg-type]
            continue
        flat = producers.get(node.inputs[0])
        if flat is None or flat.op not in ("Flatten", "Reshape") or _single_use(g, flat.outputs[0], uses) is not node:
            continue
        x_shape = g.value(flat.inputs[0]).shape
        if x_shape is None or len(x_shape) != 4:
            continue
        if g.value(flat.outputs[0]).shape != (x_shape[0], int(np.prod(x_shape[1:]))):
            continue
        w = g.constants[node.inputs[1]]
        w_name = g.set_constant(g.unique_name(f"{node.name}_w"), w.reshape(w.shape[0], *x_shape[1:]))
        node.inputs = [flat.inputs[0], w_name, *node.inputs[2:]]
        dropped.add(flat.name)
    g.nodes = [n for n in g.nodes if n.name not in dropped]
    g.prune_values()
    return g


def fuse_residual(graph: Graph) -> Graph:
    """Add(conv_out, other) fuses into the FusedConv as its residual input; the fused layer takes the
    Add's place in the node order (both operands exist by then)."""
    g = graph.copy()
    producers, uses = g.producers(), g.consumers()
    order = {n.name: k for k, n in enumerate(g.nodes)}
    replaced: dict[str, Node] = {}
    dropped: set[str] = set()
    for node in g.nodes:
        if node.op != "Add" or len(node.inputs) != 2 or any(g.is_constant(x) for x in node.inputs):
            continue
        a, b = node.inputs
        if a == b or g.value(a).shape != g.value(b).shape or g.value(a).shape != g.value(node.outputs[0]).shape:
            continue
        candidates = [(x, other) for x, other in ((a, b), (b, a))
                      if _plain_conv(producers.get(x)) and producers[x].name not in dropped
                      and _single_use(g, x, uses) is node]
        if not candidates:
            continue
        # The conv with the most work takes the add: its residual load hides behind the longer compute
        # (a ResNet block's 3x3 conv rather than its 1x1 shortcut, which then stays a plain conv); on a tie
        # the later one.
        x, other = max(candidates, key=lambda c: (_conv_work(g, producers[c[0]]), order[producers[c[0]].name]))
        conv = producers[x]
        fused = Node("FusedConv", [*conv.inputs, other], node.outputs, conv.attrs, conv.name)
        replaced[node.name] = fused
        producers[node.outputs[0]] = fused
        dropped.add(conv.name)
    g.nodes = [replaced.get(n.name, n) for n in g.nodes if n.name not in dropped]
    g.prune_values()
    return g


def _conv_work(g: Graph, conv: Node) -> int:
    """Multiply-accumulates per output element of a FusedConv: its weights' size over its output channels."""
    w = g.constants.get(conv.inputs[1])
    return 0 if w is None else int(w.size // max(1, w.shape[0]))


def fuse_activation(graph: Graph) -> Graph:
    """Relu, or Clip with constant bounds, after a FusedConv (its only reader) fuses into it."""
    g = graph.copy()
    producers, uses = g.producers(), g.consumers()
    dropped: set[str] = set()
    for node in g.nodes:
        if node.op not in ("Relu", "Clip"):
            continue
        conv = producers.get(node.inputs[0])
        if conv is None or conv.op != "FusedConv" or conv.attrs["act"] != "none" \
                or _single_use(g, node.inputs[0], uses) is not node:
            continue
        if node.op == "Relu":
            conv.attrs["act"] = "relu"
        else:
            bounds = [*node.inputs[1:3], "", ""][:2]
            if not all(not x or g.is_constant(x) for x in bounds):
                continue
            lo, hi = (float(g.constants[x].item()) if x else None for x in bounds)
            conv.attrs["act"], conv.attrs["clip"] = "clip", (lo, hi)
        conv.outputs = [node.outputs[0]]
        producers[node.outputs[0]] = conv
        dropped.add(node.name)
    g.nodes = [n for n in g.nodes if n.name not in dropped]
    g.prune_values()
    return g


def lower_affine(graph: Graph) -> Graph:
    """BatchNorm, and Mul/Add/Sub/Div by a per-channel constant, left after folding become one
    ChannelAffine (x * scale + shift per channel): a single ALU layer once quantized."""
    g = graph.copy()
    for k, node in enumerate(g.nodes):
        if node.op not in ("BatchNormalization", "Mul", "Add", "Sub", "Div"):
            continue
        affine = _as_affine(g, node)
        if affine is None or len(g.value(node.outputs[0]).shape or ()) not in (2, 4):
            continue
        x, scale, shift = affine
        s_name = g.set_constant(g.unique_name(f"{node.name}_scale"), scale.astype(np.float32))
        t_name = g.set_constant(g.unique_name(f"{node.name}_shift"), shift.astype(np.float32))
        g.nodes[k] = Node("ChannelAffine", [x, s_name, t_name], node.outputs, {}, node.name)
    g.prune_values()
    return g


def fuse_host_affine(graph: Graph) -> Graph:
    """For the host planner only (the accelerator keeps each ALU layer): a ChannelAffine that reads another
    one, its only reader, becomes one (``x * (s1 * s2) + (t1 * s2 + t2)``, folded in float64), and a Relu
    after a ChannelAffine fuses into it (attribute ``act``): one pass over the tensor instead of several
    (an exported DenseNet's pre-activation BatchNorm is a Mul and an Add, then its Relu)."""
    g = graph.copy()
    changed = True
    while changed:
        changed = False
        producers, uses = g.producers(), g.consumers()
        for node in g.nodes:
            prev = producers.get(node.inputs[0]) if node.inputs else None
            if (prev is None or prev.op != "ChannelAffine" or prev.attrs.get("act", "none") != "none"
                    or _single_use(g, prev.outputs[0], uses) is not node):
                continue
            if node.op == "Relu":
                prev.attrs["act"] = "relu"
                prev.outputs = list(node.outputs)
            elif node.op == "ChannelAffine" and node.attrs.get("act", "none") == "none":
                s1, t1 = (g.constants[v].astype(np.float64) for v in prev.inputs[1:])
                s2, t2 = (g.constants[v].astype(np.float64) for v in node.inputs[1:])
                scale = g.set_constant(g.unique_name(f"{node.name}_scale"), (s1 * s2).astype(np.float32))
                shift = g.set_constant(g.unique_name(f"{node.name}_shift"), (t1 * s2 + t2).astype(np.float32))
                prev.inputs = [prev.inputs[0], scale, shift]
                prev.outputs = list(node.outputs)
            else:
                continue
            g.nodes = [n for n in g.nodes if n is not node]
            changed = True
            break
    g.prune_values()
    return g
