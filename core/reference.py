"""The reference interpreter: runs an IR graph in numpy, node by node.

Quantized ops run the integer kernels of :mod:`weft.core.qkernels` (the oracle the accelerator back end
must match to the bit, layer by layer: with ``keep_intermediates`` every value, packed as it will sit in
DRAM, can be fetched by name); float ops run the kernels of :mod:`weft.core.float_ops` (host layers,
and whole float graphs for ``target="cpu"``). It is the graph walker (:mod:`weft.core.walker`) with no
accelerator runner. Calibration uses the same interpreter on the float graph with an observer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from weft.core.float_ops import fused_conv
from weft.core.host import HostRunner, run_host_node
from weft.core.ir import Graph, Node, Value
from weft.core.qkernels import Widths
from weft.core.walker import RunResult, walk_graph

__all__ = ["Observer", "run_reference"]

#: observer(node, stage, name, array): stage "output" for each output value `name`, and "acc" (with the
#: output's name) for a FusedConv's conv + bias stage, before its residual and activation.
Observer = Callable[[Node, str, str, np.ndarray], None]


def _observed(observer: Observer) -> HostRunner:
    """The host dispatcher, showing `observer` every output and each FusedConv's accumulator."""

    def run(node: Node, args: list[Any], ins: list[Value | None], outs: list[Value],
            widths: Widths) -> list[np.ndarray]:
        if node.op == "FusedConv":
            def see(acc: np.ndarray) -> None:
                observer(node, "acc", node.outputs[0], acc)

            results = [fused_conv(node, args[0], args[1], args[2], args[3] if len(args) > 3 else None, see)]
        else:
            results = run_host_node(node, args, ins, outs, widths)
        for name, array in zip(node.outputs, results, strict=False):
            observer(node, "output", name, array)
        return results

    return run


def run_reference(graph: Graph, feeds: Mapping[str, Any], *, keep_intermediates: bool = False,
                  observer: Observer | None = None) -> RunResult:
    """Run `graph` on `feeds` (input name -> array); returns the outputs, per-layer records and, with
    `keep_intermediates`, every value by name (packed integer tensors for quantized layers)."""
    host = _observed(observer) if observer is not None else None
    return walk_graph(graph, feeds, keep_intermediates=keep_intermediates, host=host)
