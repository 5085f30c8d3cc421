"""Partitioning: which layers run on the accelerator and which on the host, and why.

Every node gets ``attrs["target"]`` ("accel" or "host"); a host node of an accel compile also gets
``attrs["host_reason"]``. An integer layer goes to the accelerator only when the back end says it can
lower it (:func:`weft.compiler.backend.admit.check_layer`); otherwise it runs on the host in its integer
form, bit-exact, and the compile goes on. ``meta["partition"]`` lists the maximal runs of consecutive
nodes with one target (the segments a runtime hands to one device at a time); ``meta["fallbacks"]`` maps
each layer that runs on the host only because of an accelerator limit to the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from weft.core.float_ops import macs_of
from weft.core.ir import ACCEL_OPS, Graph, Node

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["HOST_QOPS", "layer_summary", "partition", "segments", "send_to_host"]

#: Integer ops that stay on the host: the float/int edges and pure data movement.
HOST_QOPS = frozenset({"quantize", "dequantize", "qconcat", "qreshape", "qpad", "qim2col"})
_EDGES = frozenset({"quantize", "dequantize"})
#: Float ops that would be integer on an integer input (the quantizer keeps them float after a float op).
_FOLLOWERS = frozenset({"Relu", "Clip", "Flatten", "Reshape", "Pad", "Concat"})


def _host_reason(node: Node) -> str:
    """Why a node of an accel compile that the back end was not asked about runs on the host."""
    if "host_reason" in node.attrs:  # the quantizer's own verdict (e.g. an accumulator overflow)
        return str(node.attrs["host_reason"])
    if node.op in _EDGES:
        return "float/int8 boundary"
    if node.op in HOST_QOPS:
        return "data movement, int8 on the host"
    if node.op in _FOLLOWERS:
        return f"{node.op} stays float (a float input, or not a rank-2 or rank-4 tensor)"
    return f"{node.op} has no integer form"


def partition(target: str, config: AcceleratorConfig | None = None) -> Callable[[Graph], Graph]:
    """The partition pass for a compile target: "accel" gives the integer layers that the back end can
    lower for `config` to the accelerator, "cpu" runs everything on the host."""

    def partition_graph(graph: Graph) -> Graph:
        g = graph.copy()
        fallbacks: dict[str, str] = {}
        for node in g.nodes:
            where = "host"
            if target == "accel":
                # A layer the accelerator would run but for a limit: the quantizer's verdict or the back end's.
                limited = "host_reason" in node.attrs or node.op in ACCEL_OPS
                refusal = _refusal(node, g, config)
                if refusal is None:
                    where = "accel"
                else:
                    node.attrs["host_reason"] = refusal
                    if limited:
                        fallbacks[node.name] = refusal
            node.attrs["target"] = where
        g.meta["partition"] = segments(g)
        g.meta["fallbacks"] = fallbacks
        return g

    return partition_graph


def segments(graph: Graph) -> list[dict]:
    """The maximal runs of consecutive nodes with one target."""
    runs: list[dict] = []
    for node in graph.nodes:
        where = node.attrs.get("target", "host")
        if not runs or runs[-1]["target"] != where:
            runs.append({"target": where, "nodes": []})
        runs[-1]["nodes"].append(node.name)
    return runs


def send_to_host(graph: Graph, node: Node, reason: str) -> None:
    """Move an accelerator layer of a partitioned `graph` (in place) to the host, recording why."""
    node.attrs.update(target="host", host_reason=reason)
    graph.meta.setdefault("fallbacks", {})[node.name] = reason
    graph.meta["partition"] = segments(graph)


def _refusal(node: Node, graph: Graph, config: AcceleratorConfig | None) -> str | None:
    """None for a layer the accelerator takes, else why it runs on the host."""
    if node.op not in ACCEL_OPS:
        return _host_reason(node)
    if config is None:
        return None
    from weft.compiler.backend.admit import check_layer  # cycle: the back end sends layers to the host here

    return check_layer(node, graph, config)


def layer_summary(graph: Graph) -> list[dict]:
    """One row per node: name, op, target, why it runs on the host (None on the accelerator or for the
    cpu target), input and output shapes (logical), MACs, and the max-pool fused into it (``pooled``: its
    name, or None; weft.compiler.pool_fusion)."""
    rows = []
    for node in graph.nodes:
        ins = [graph.values[x].logical_shape if x else None for x in node.inputs]
        outs = [graph.values[o].logical_shape for o in node.outputs]
        rows.append({
            "name": node.name, "op": node.op, "target": node.attrs.get("target", "host"),
            "host_reason": node.attrs.get("host_reason"),
            "inputs": [list(s) for s, x in zip(ins, node.inputs, strict=True)
                       if x and s is not None and not graph.is_constant(x)],
            "output": list(outs[0] or ()), "macs": macs_of(node, ins, outs),
            "pooled": node.attrs.get("pooled"),
        })
    return rows
