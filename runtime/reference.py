"""The reference interpreter: runs an IR graph in numpy, node by node.

Quantized ops run the integer kernels of :mod:`weft.runtime.qkernels` (the oracle the accelerator back end
must match to the bit, layer by layer: with ``keep_intermediates`` every value, packed as it will sit in
DRAM, can be fetched by name); float ops run the kernels of :mod:`weft.compiler.float_ops` (host layers,
and whole float graphs for ``target="cpu"``). Calibration uses the same interpreter on the float graph
with an observer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from weft.compiler.float_ops import FLOAT_OPS, fused_conv, macs_of
from weft.compiler.ir import Graph, Node, Value, numpy_dtype
from weft.compiler.partition import ACCEL_OPS
from weft.errors import WeftError
from weft.runtime.qkernels import QKERNELS, Widths

__all__ = ["ACCEL_OPS", "FeedError", "RunResult", "check_feeds", "run_reference", "widths_of"]

#: observer(node, stage, name, array): stage "output" for each output value `name`, and "acc" (with the
#: output's name) for a FusedConv's conv + bias stage, before its residual and activation.
Observer = Callable[[Node, str, str, np.ndarray], None]


class FeedError(WeftError):
    """Inputs that do not match the graph: a missing or unknown name, a wrong shape or dtype."""


@dataclass
class RunResult:
    outputs: dict[str, np.ndarray]
    #: Every value computed (graph inputs and node outputs), when ``keep_intermediates`` was asked.
    values: dict[str, np.ndarray] = field(default_factory=dict)
    #: Per node: name, op, target, macs, shape (logical), seconds.
    layers: list[dict[str, Any]] = field(default_factory=list)


def widths_of(graph: Graph) -> Widths:
    """The data widths of the config a quantized graph was compiled for (8/8/32/8 for float graphs)."""
    config = graph.meta.get("config")
    if not config:
        return Widths(8, 8, 32, 8)
    return Widths(int(config["inp_width"]), int(config["wgt_width"]), int(config["acc_width"]),
                  int(config["out_width"]))


def check_feeds(graph: Graph, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The feeds as arrays of the graph inputs' dtypes; FeedError names the input that is wrong."""
    unknown = sorted(set(feeds) - set(graph.inputs))
    if unknown:
        raise FeedError(f"'{unknown[0]}' is not an input of the model (inputs: {', '.join(graph.inputs)})")
    out: dict[str, np.ndarray] = {}
    for name in graph.inputs:
        if name not in feeds:
            raise FeedError(f"input '{name}' is missing (inputs: {', '.join(graph.inputs)})")
        value = graph.values[name]
        array = np.asarray(feeds[name])
        want = numpy_dtype(value.dtype)
        if array.dtype != want:
            if not (np.issubdtype(array.dtype, np.floating) and np.issubdtype(want, np.floating)):
                raise FeedError(f"input '{name}' must be {value.dtype}, got {array.dtype}")
            array = array.astype(want)
        if tuple(array.shape) != value.shape:
            raise FeedError(f"input '{name}' must have shape {list(value.shape)}, got {list(array.shape)}")  # type: ignore[arg-type]
        out[name] = array
    return out


def _last_uses(graph: Graph) -> dict[str, int]:
    last: dict[str, int] = {}
    for k, node in enumerate(graph.nodes):
        for x in node.inputs:
            if x:
                last[x] = k
    return last


def _run_node(node: Node, args: list[Any], ins: list[Value | None], outs: list[Value], widths: Widths,
              observer: Observer | None) -> list[np.ndarray]:
    kernel = QKERNELS.get(node.op)
    if kernel is not None:
        return kernel(node, args, ins, outs, widths)
    if node.op == "FusedConv" and observer is not None:
        def see(acc: np.ndarray) -> None:
            observer(node, "acc", node.outputs[0], acc)

        return [fused_conv(node, args[0], args[1], args[2], args[3] if len(args) > 3 else None, see)]
    opdef = FLOAT_OPS.get(node.op)
    if opdef is None:
        raise WeftError(f"node '{node.name}' ({node.op}): the reference interpreter has no kernel for this op")
    return opdef.run(node, args)


def run_reference(graph: Graph, feeds: Mapping[str, Any], *, keep_intermediates: bool = False,
                  observer: Observer | None = None) -> RunResult:
    """Run `graph` on `feeds` (input name -> array); returns the outputs, per-layer records and, with
    `keep_intermediates`, every value by name (packed integer tensors for quantized layers)."""
    env: dict[str, Any] = dict(graph.constants)
    env.update(check_feeds(graph, feeds))
    widths = widths_of(graph)
    keep = set(graph.outputs)
    last = {} if keep_intermediates else _last_uses(graph)
    values: dict[str, np.ndarray] = dict(env) if keep_intermediates else {}
    layers: list[dict[str, Any]] = []
    for k, node in enumerate(graph.nodes):
        args = [env[x] if x else None for x in node.inputs]
        ins = [graph.values.get(x) if x else None for x in node.inputs]
        outs = [graph.values[o] for o in node.outputs]
        start = time.perf_counter()
        results = _run_node(node, args, ins, outs, widths, observer)
        seconds = time.perf_counter() - start
        for name, array in zip(node.outputs, results, strict=False):
            env[name] = array
            if keep_intermediates:
                values[name] = array
            if observer is not None:
                observer(node, "output", name, array)
        layers.append({
            "name": node.name, "op": node.op,
            "target": node.attrs.get("target", "accel" if node.op in ACCEL_OPS else "host"),
            "macs": macs_of(node, [v.logical_shape if v else None for v in ins], [v.logical_shape for v in outs]),
            "shape": list(outs[0].logical_shape or ()), "seconds": seconds,
        })
        if not keep_intermediates:
            for x in node.inputs:
                if x and last.get(x) == k and x not in keep and x not in graph.constants:
                    env.pop(x, None)
    return RunResult({name: env[name] for name in graph.outputs}, values, layers)
