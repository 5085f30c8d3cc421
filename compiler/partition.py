"""Partitioning: which layers run on the accelerator and which on the host.

Every node gets ``attrs["target"]`` ("accel" or "host"), and ``meta["partition"]`` lists the maximal runs
of consecutive nodes with one target (the segments a runtime hands to one device at a time).
"""

from __future__ import annotations

from collections.abc import Callable

from weft.compiler.ir import Graph

__all__ = ["ACCEL_OPS", "HOST_QOPS", "layer_summary", "partition"]

#: Integer layers the accelerator runs (GEMM and ALU work); the back end lowers exactly these.
ACCEL_OPS = frozenset({"qconv2d", "qmaxpool", "qavgpool", "qalu"})
#: Integer ops that stay on the host: the float/int edges and pure data movement.
HOST_QOPS = frozenset({"quantize", "dequantize", "qconcat", "qreshape", "qpad"})


def partition(target: str) -> Callable[[Graph], Graph]:
    """The partition pass for a compile target: "accel" gives the integer layers to the accelerator,
    "cpu" runs everything on the host."""

    def partition_graph(graph: Graph) -> Graph:
        g = graph.copy()
        segments: list[dict] = []
        for node in g.nodes:
            where = "accel" if target == "accel" and node.op in ACCEL_OPS else "host"
            node.attrs["target"] = where
            if not segments or segments[-1]["target"] != where:
                segments.append({"target": where, "nodes": []})
            segments[-1]["nodes"].append(node.name)
        g.meta["partition"] = segments
        return g

    return partition_graph


def layer_summary(graph: Graph) -> list[dict]:
    """One row per node: name, op, target, input and output shapes (logical), MACs."""
    from weft.compiler.float_ops import macs_of

    rows = []
    for node in graph.nodes:
        ins = [graph.values[x].logical_shape if x else None for x in node.inputs]
        outs = [graph.values[o].logical_shape for o in node.outputs]
        rows.append({
            "name": node.name, "op": node.op, "target": node.attrs.get("target", "host"),
            "inputs": [list(s) for s, x in zip(ins, node.inputs, strict=True)
                       if x and s is not None and not graph.is_constant(x)],
            "output": list(outs[0] or ()), "macs": macs_of(node, ins, outs),
        })
    return rows
