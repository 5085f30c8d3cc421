"""A max-pool fused into the convolution that feeds it: one accelerator layer, no pass over DRAM between.

After the partition, a ``qconv2d`` whose only reader is an accelerator ``qmaxpool`` of a shape the back end
pools in the convolution's epilogue (:data:`POOLS`: ResNet's 3x3/2 with pads of 1, the 3x3/2 and 2x2/2
without) becomes one ``qconv2d`` with ``pool_*`` attributes that writes the pooled tensor. The convolution's
own output (the largest activation of a ResNet) is then never written to DRAM and read back: the
epilogue takes the maximum over each window's columns, then over its rows, as the output rows come
(:mod:`weft.compiler.backend.conv`).

The attributes: ``pool_kernel``, ``pool_strides``, ``pool_pads`` (the max-pool's), ``conv_hw`` (the
convolution's output height and width before the pool) and ``pooled`` (the max-pool node's name, for
reports). Max commutes with the saturating narrowing (both are monotonic), so the fused layer computes
exactly the convolution then the pool: :func:`unfuse_pools` splits it back for the paths that run the two
as separate kernels (the LLVM host code, a config whose buffers cannot hold the fused tiles).
"""

from __future__ import annotations

from collections.abc import Callable

from weft.core.float_ops import conv_out_size
from weft.core.ir import Graph, Node, Value

__all__ = ["POOLS", "conv_hw", "fuse_pools", "pool_of", "unfuse_pool", "unfuse_pools"]

#: (kernel, stride, pad) of the square max-pools the epilogue runs: consecutive windows share at most one
#: row, which the two virtual threads' latest pooled rows hold (ResNet's stem; VGG's; AlexNet-style).
POOLS = frozenset({(3, 2, 1), (3, 2, 0), (2, 2, 0)})

_POOL_ATTRS = ("pool_kernel", "pool_strides", "pool_pads", "conv_hw", "pooled")


def pool_of(node: Node) -> tuple[int, int, int] | None:
    """(kernel, stride, pad) of the max-pool fused into `node`, or None."""
    if "pool_kernel" not in node.attrs:
        return None
    return int(node.attrs["pool_kernel"][0]), int(node.attrs["pool_strides"][0]), int(node.attrs["pool_pads"][0])


def conv_hw(node: Node) -> tuple[int, int] | None:
    """The convolution's own output height and width where a pool is fused into it, else None."""
    hw = node.attrs.get("conv_hw")
    return None if hw is None else (int(hw[0]), int(hw[1]))


def _pool_shape(node: Node) -> tuple[int, int, int] | None:
    kh, kw = node.attrs["kernel"]
    sh, sw = node.attrs["strides"]
    pads = tuple(node.attrs["pads"])
    if kh != kw or sh != sw or len(set(pads)) != 1 or node.attrs.get("ceil_mode", 0):
        return None
    shape = (int(kh), int(sh), int(pads[0]))
    return shape if shape in POOLS else None


def fuse_pools(can_fuse: Callable[[Node, Graph], bool] | None = None) -> Callable[[Graph], Graph]:
    """The pass: fuse each accelerator max-pool of a supported shape into the convolution before it, where
    `can_fuse(fused_node, graph)` (the back end's check that its buffers hold the fused tiles) agrees."""

    def run(graph: Graph) -> Graph:
        g = graph.copy()
        uses = g.consumers()
        dropped: set[str] = set()
        for k, node in enumerate(g.nodes):
            if node.op != "qconv2d" or node.attrs.get("target") != "accel" or len(node.inputs) != 2 \
                    or pool_of(node) is not None or node.attrs.get("super_groups", 1) != 1:
                continue
            readers = uses.get(node.outputs[0], [])
            if len(readers) != 1 or node.outputs[0] in g.outputs:
                continue
            pool = readers[0]
            if pool.op != "qmaxpool" or pool.attrs.get("target") != "accel" or _pool_shape(pool) is None:
                continue
            y, pooled = g.value(node.outputs[0]), g.value(pool.outputs[0])
            k_, s_, p_ = _pool_shape(pool)  # type: ignore[misc]
            if y.logical is None or len(y.logical) != 4 or pooled.logical is None \
                    or tuple(pooled.logical[2:]) != tuple(conv_out_size(d, k_, s_, p_, p_) for d in y.logical[2:]):
                continue
            attrs = {**node.attrs, "pool_kernel": tuple(pool.attrs["kernel"]),
                     "pool_strides": tuple(pool.attrs["strides"]), "pool_pads": tuple(pool.attrs["pads"]),
                     "conv_hw": (int(y.logical[2]), int(y.logical[3])), "pooled": pool.name}
            fused = Node("qconv2d", list(node.inputs), list(pool.outputs), attrs, node.name)
            if can_fuse is not None and not can_fuse(fused, g):
                continue
            g.nodes[k] = fused
            dropped.add(pool.name)
        g.nodes = [n for n in g.nodes if n.name not in dropped]
        g.prune_values()
        return g

    return run


def unfuse_pool(graph: Graph, node: Node) -> tuple[Node, Node]:
    """Split fused `node` of `graph` (in place) into its convolution and its max-pool; returns the two."""
    ho, wo = conv_hw(node)  # type: ignore[misc]
    y = graph.value(node.outputs[0])
    mid_name = f"{node.name}:unpooled"
    shape = None if y.shape is None else (y.shape[0], y.shape[1], ho, wo, *y.shape[4:])
    logical = None if y.logical is None else (y.logical[0], y.logical[1], ho, wo)
    graph.values[mid_name] = Value(mid_name, shape, y.dtype, y.scale, logical)
    target = node.attrs.get("target")
    conv_attrs = {k: v for k, v in node.attrs.items() if k not in _POOL_ATTRS}
    conv = Node("qconv2d", list(node.inputs), [mid_name], conv_attrs, node.name)
    pool_attrs = {"kernel": node.attrs["pool_kernel"], "strides": node.attrs["pool_strides"],
                  "pads": node.attrs["pool_pads"]}
    if target is not None:
        pool_attrs["target"] = target
    name = str(node.attrs.get("pooled", f"{node.name}:pool"))
    pool = Node("qmaxpool", [mid_name], list(node.outputs), pool_attrs, name)
    k = graph.nodes.index(node)
    graph.nodes[k:k + 1] = [conv, pool]
    return conv, pool


def unfuse_pools(graph: Graph) -> Graph:
    """`graph` with every fused max-pool split back out (a copy; the graph itself when it has none)."""
    if not any(pool_of(n) is not None for n in graph.nodes):
        return graph
    g = graph.copy()
    for node in [n for n in g.nodes if pool_of(n) is not None]:
        unfuse_pool(g, node)
    return g
